package cgroups

import (
	"errors"
	"os"
	"path/filepath"
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

func TestV2Controllers(t *testing.T) {
	for _, tc := range []struct {
		name           string
		subtree, ctrls string
		want           []string
	}{
		{"subtree control wins", "cpu memory\n", "cpu memory pids hugetlb\n", []string{"cpu", "memory"}},
		{"empty subtree control falls back", "\n", "cpu io\n", []string{"cpu", "io"}},
		{"nothing", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.subtree != "" {
				_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(tc.subtree), 0o644)
			}
			if tc.ctrls != "" {
				_ = os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte(tc.ctrls), 0o644)
			}
			got := V2Controllers(dir)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for _, c := range tc.want {
				if !got[c] {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}
