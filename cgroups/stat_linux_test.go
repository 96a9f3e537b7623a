package cgroups

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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
		for _, c := range []string{"memory", "cpuacct", "pids", "cpu", "blkio"} {
			dirs = append(dirs, filepath.Join(r.root, c, group))
		}
		// runc makes a container's cgroup in a hybrid host's v2
		// hierarchy too, where its pressure stall information is.
		if r.Mode() == Hybrid {
			dirs = append(dirs, filepath.Join(r.root, "unified", group))
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
	// A kernel that tracks pressure (psi=1) has it for every v2 cgroup.
	if _, err := os.Stat("/proc/pressure/cpu"); err == nil && r.Mode() != Legacy {
		if st.CPUPressure == nil || st.MemoryPressure == nil || st.IOPressure == nil {
			t.Errorf("pressure of a %v host with PSI: cpu %v memory %v io %v, want all three", r.Mode(), st.CPUPressure, st.MemoryPressure, st.IOPressure)
		}
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

// startIn starts a sleep in the host cgroup made by hostCgroup, holding
// one end of a socket pair besides its stdio, and returns its pid.
func startIn(tb testing.TB, dirs []string) int {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	sock := os.NewFile(uintptr(fds[0]), "socket")
	defer sock.Close()
	defer unix.Close(fds[1])
	cmd := exec.Command("sleep", "600")
	cmd.ExtraFiles = []*os.File{sock}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	// Registered after hostCgroup's removals, so run before them: the
	// cgroups are empty again when they are removed.
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return cmd.Process.Pid
}

// countFDs counts the descriptors of pid, and the sockets among them.
func countFDs(t *testing.T, pid int) (fds, sockets uint64) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join(dir, e.Name())); strings.HasPrefix(l, "socket:") {
			sockets++
		}
	}
	return uint64(len(ents)), sockets
}

// TestStatAllHost reads a real cgroup with a process in it: the process,
// its descriptors and socket, its task, and the default CPU limits.
func TestStatAllHost(t *testing.T) {
	r := NewReader(DefaultRoot)
	group, dirs := hostCgroup(t, r)
	pid := startIn(t, dirs)
	// stdin, stdout, stderr on /dev/null, the socket, and whatever the
	// test binary inherited without close-on-exec: counted here the
	// slow way, before and after the read. sleep opens and closes its
	// locale files as it starts, so the counts are compared once all
	// three agree: a read in the middle of such a change is retried, and
	// a read that is always wrong fails after the hundredth.
	var st *Stats
	var fds, sockets uint64
	for range 100 {
		before, _ := countFDs(t, pid)
		var err error
		if st, err = r.StatAll(group); err != nil {
			t.Fatal(err)
		}
		if fds, sockets = countFDs(t, pid); fds == before && st.Processes.FDs == fds {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p := st.Processes; p.Count != 1 || p.FDs != fds || p.FDs < 4 || p.Sockets != sockets || p.Sockets < 1 {
		t.Errorf("processes = %+v, want 1 process with %d descriptors, %d of them sockets", p, fds, sockets)
	}
	if st.Pids != 1 || st.PidsLimit != 0 {
		t.Errorf("tasks %d, limit %d; want 1, unlimited", st.Pids, st.PidsLimit)
	}
	if pod, err := r.StatPod(group); err != nil || pod.Pids != 1 {
		t.Errorf("StatPod = %+v, %v; want 1 task", pod, err)
	}
	// v1's swap in use is memory.stat's total_swap, which the kernel
	// prints exactly where it accounts swap (memory.memsw.* exist).
	if r.Mode() != Unified {
		b, err := os.ReadFile(filepath.Join(dirs[0], "memory.stat"))
		if err != nil {
			t.Fatal(err)
		}
		if printed := strings.Contains("\n"+string(b), "\ntotal_swap "); printed != r.memsw || st.Memory.HasSwap != r.memsw {
			t.Errorf("swap accounting %v, total_swap printed %v, HasSwap %v", r.memsw, printed, st.Memory.HasSwap)
		}
	}
	// A new cgroup has the defaults: shares 1024 (weight 100 on v2, which
	// reads back as 2597), a 100ms period and no quota.
	want := CPUSpec{Period: 100000, Shares: 1024, Known: true}
	if r.Mode() == Unified {
		want.Shares = 2597
	}
	if st.CPU.Spec != want && (r.Mode() != Unified || st.CPU.Spec.Known) {
		t.Errorf("CPU limits = %+v, want %+v", st.CPU.Spec, want)
	}
	if st.Memory.Usage > 0 && st.Memory.MaxUsage < st.Memory.Usage && (r.Mode() != Unified || st.Memory.MaxUsage != 0) {
		t.Errorf("peak memory %d below the usage %d", st.Memory.MaxUsage, st.Memory.Usage)
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
	// What ListPodSandboxMetrics reads per container: every file, and the
	// descriptors of the one process in it.
	b.Run("host-all", func(b *testing.B) {
		r := NewReader(DefaultRoot)
		group, dirs := hostCgroup(b, r)
		startIn(b, dirs)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.StatAll(group); err != nil {
				b.Fatal(err)
			}
		}
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
