package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// hostCgroup creates an empty cgroup on the host's own hierarchy (every
// controller Stat reads, on v1) and returns its name and directories. They
// are removed when tb ends, if the test has not.
func hostCgroup(tb testing.TB, r *Reader) (string, []string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates a cgroup on the host's hierarchy")
	}
	group := fmt.Sprintf("/pinrt-cgroups-test-%d", os.Getpid())
	dirs := []string{filepath.Join(r.root, group)}
	if r.Mode() != Unified {
		dirs = nil
		for _, c := range []string{"memory", "cpuacct", "pids"} {
			dirs = append(dirs, filepath.Join(r.root, c, group))
		}
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = os.Remove(d) })
	}
	return group, dirs
}

// TestStatHost reads a real cgroup, then the same one once it is removed,
// which cgroupfs (unlike a recorded tree) reports through the files.
func TestStatHost(t *testing.T) {
	r := NewReader(DefaultRoot)
	group, dirs := hostCgroup(t, r)
	before := openFDs(t)
	st, err := r.Stat(group)
	if err != nil {
		t.Fatal(err)
	}
	if st.Timestamp.IsZero() || st.Pids != 0 {
		t.Errorf("empty cgroup: %+v", st)
	}
	for _, d := range dirs {
		if err := os.Remove(d); err != nil {
			t.Fatal(err)
		}
	}
	// The files the first Stat left open now read ENODEV.
	_, err = r.Stat(group)
	if !errors.Is(err, errdefs.ErrNotFound) || !errors.Is(err, unix.ENODEV) {
		t.Errorf("removed cgroup: err = %v, want NotFound from ENODEV", err)
	}
	if got := openFDs(t) - before; got != 0 {
		t.Errorf("%d files of the removed cgroup still open", got)
	}
	if _, err := r.Stat(group); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removed cgroup, read again: err = %v, want NotFound", err)
	}
}

// BenchmarkStat measures one Stat: on a recorded tree in a temp dir (the
// parsing and the syscalls, without cgroupfs) and, as root, on a cgroup
// created for it on the host's own hierarchy, which is what kubelet's
// stats polls cost per container.
func BenchmarkStat(b *testing.B) {
	const group = "/pinrt/pod1/pinrt-ctr1"
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"recorded-v1", v1Tree(group, "10485760", true)},
		{"recorded-v2", v2Tree(group, "max", true)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			root := b.TempDir()
			writeTree(b, root, tc.files)
			benchStat(b, NewReader(root), group)
		})
	}
	b.Run("host", func(b *testing.B) {
		r := NewReader(DefaultRoot)
		group, _ := hostCgroup(b, r)
		benchStat(b, r, group)
	})
	// Every file opened and closed again in each Stat: the cost without
	// the open files kept between polls.
	b.Run("host-reopen", func(b *testing.B) {
		r := NewReader(DefaultRoot)
		group, _ := hostCgroup(b, r)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Stat(group); err != nil {
				b.Fatal(err)
			}
			_ = r.Close()
		}
	})
}

func benchStat(b *testing.B, r *Reader, group string) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Stat(group); err != nil {
			b.Fatal(err)
		}
	}
}
