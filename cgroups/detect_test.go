package cgroups

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		types map[string]int64
		want  Mode
	}{
		{"unified", map[string]int64{"/c": unix.CGROUP2_SUPER_MAGIC}, Unified},
		{"hybrid", map[string]int64{"/c": unix.TMPFS_MAGIC, "/c/unified": unix.CGROUP2_SUPER_MAGIC}, Hybrid},
		{"legacy", map[string]int64{"/c": unix.TMPFS_MAGIC}, Legacy},
		{"nothing mounted", nil, Legacy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := detect("/c", func(p string) (int64, error) {
				if v, ok := tc.types[p]; ok {
					return v, nil
				}
				return 0, errors.New("ENOENT")
			})
			if got != tc.want {
				t.Errorf("detect = %v, want %v", got, tc.want)
			}
		})
	}
}
