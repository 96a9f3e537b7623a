package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/errdefs"
)

func TestSendPages(t *testing.T) {
	tests := []struct {
		name  string
		n     int
		pages []int
	}{
		{"none", 0, nil},
		{"one short page", 3, []int{3}},
		{"exactly a page", streamPage, []int{streamPage}},
		{"a page and one", streamPage + 1, []int{streamPage, 1}},
		{"250", 250, []int{100, 100, 50}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			items := make([]int, tc.n)
			for i := range items {
				items[i] = i
			}
			var pages []int
			next := 0
			err := sendPages(items, func(int) int { return 1 }, func(p []int) error {
				pages = append(pages, len(p))
				for _, v := range p {
					if v != next {
						return fmt.Errorf("item %d out of order, want %d", v, next)
					}
					next++
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(pages) != fmt.Sprint(tc.pages) {
				t.Errorf("pages = %v, want %v", pages, tc.pages)
			}
		})
	}
	// Large items: pages stop at streamPageBytes, and an item larger than
	// that still goes out, alone.
	var sizes []int
	err := sendPages([]int{3 << 20, 3 << 20, 1 << 20, 5 << 20, 10}, func(v int) int { return v }, func(p []int) error {
		sizes = append(sizes, len(p))
		return nil
	})
	if err != nil || fmt.Sprint(sizes) != "[1 2 1 1]" {
		t.Errorf("pages by bytes = %v, %v; want [1 2 1 1]", sizes, err)
	}
	stop := fmt.Errorf("client gone: %w", errdefs.ErrUnavailable)
	calls := 0
	err = sendPages(make([]int, 250), func(int) int { return 1 }, func([]int) error { calls++; return stop })
	if !errors.Is(err, errdefs.ErrUnavailable) || calls != 1 {
		t.Errorf("a failed send: err %v after %d calls, want the error after 1", err, calls)
	}
}
