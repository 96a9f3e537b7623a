package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/mem"
)

// A second lock on a held directory fails naming the directory; flock
// conflicts between two opens, so this works within one process.
func TestLockDirRefusesSecondHolder(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDir(dir, "root")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	start := time.Now()
	_, err = lockDir(dir, "root")
	if err == nil || !strings.Contains(err.Error(), "already running on root "+dir) {
		t.Fatalf("second lock = %v, want 'already running on root %s'", err, dir)
	}
	// A live pinrt holding it is refused at once, not after lockWait.
	if took := time.Since(start); took >= lockWait {
		t.Errorf("refusal took %s, the whole wait for a dead holder", took)
	}
	first.Close()
	again, err := lockDir(dir, "root")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
}

// holdLock starts flock(1) holding path's lock in another process, as a
// child forked by a killed daemon holds it, with pid recorded in the
// file as the pinrt that took it; the returned func ends the holder.
func holdLock(t *testing.T, path, recorded string) (*exec.Cmd, func()) {
	t.Helper()
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("needs flock(1) (util-linux)")
	}
	if err := os.WriteFile(path, []byte(recorded), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(flock, "--exclusive", "--no-fork", path, "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }) }
	t.Cleanup(stop)
	// flock(1) has the lock once the lock file is held by a process.
	deadline := time.Now().Add(10 * time.Second)
	for len(lockHolders(path, -1)) == 0 || !flockedByOther(path) {
		if time.Now().After(deadline) {
			t.Fatal("flock(1) did not take the lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd, stop
}

// flockedByOther says whether /proc/locks has a lock on path.
func flockedByOther(path string) bool {
	fi, err := os.Stat(path)
	if err != nil {
		return false
	}
	locks, _ := os.ReadFile("/proc/locks")
	ino := ":" + strconv.FormatUint(inode(fi), 10) + " "
	return strings.Contains(string(locks), ino)
}

// TestLockDirWaitsForOrphanHolder: the pinrt recorded in the lock is
// gone and another process still holds the lock (a child it forked,
// between fork and exec): the start waits, and takes the lock once that
// process lets it go.
func TestLockDirWaitsForOrphanHolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "pinrt.lock")
	_, stop := holdLock(t, path, "2147483646") // no such pid
	go func() {
		time.Sleep(300 * time.Millisecond)
		stop()
	}()
	f, err := lockDir(dir, "run dir")
	if err != nil {
		t.Fatalf("lock held by an orphan that lets it go: %v", err)
	}
	defer f.Close()
	if b, _ := os.ReadFile(path); string(b) != strconv.Itoa(os.Getpid()) {
		t.Errorf("lock file says %q, want our pid", b)
	}
}

// TestLockDirNamesHolder: a lock still held after lockWait by a process
// that is not the recorded pinrt is refused, naming that process; a lock
// whose recorded pinrt is among its holders is refused at once.
func TestLockDirNamesHolder(t *testing.T) {
	old := lockWait
	lockWait = 200 * time.Millisecond
	t.Cleanup(func() { lockWait = old })
	dir := t.TempDir()
	path := filepath.Join(dir, "pinrt.lock")
	holder, _ := holdLock(t, path, "2147483646")
	_, err := lockDir(dir, "run dir")
	want := "pid " + strconv.Itoa(holder.Process.Pid) + " ("
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "sleep 60") || !strings.Contains(err.Error(), "(pid 2147483646) is gone") {
		t.Fatalf("lock held past the wait = %v, want an error naming %s...sleep 60) and the gone pid", err, want)
	}

	if err := os.WriteFile(path, []byte(strconv.Itoa(holder.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = lockDir(dir, "run dir")
	if err == nil || !strings.Contains(err.Error(), "another pinrt (pid "+strconv.Itoa(holder.Process.Pid)+") is already running") {
		t.Fatalf("lock held by the recorded pid = %v, want 'already running'", err)
	}
}

// A reply is marshalled into a buffer of at most twice its size: a full
// node's ListContainers (96 KB at 220 containers) no longer takes gRPC's
// next size class, 1 MiB.
// It is gRPC's default pool, which its proto codec marshals into.
func TestMessageBuffers(t *testing.T) {
	for name, pool := range map[string]mem.BufferPool{"messageBuffers": messageBuffers(), "gRPC's default": mem.DefaultBufferPool()} {
		for _, n := range []int{100, 506, 62 << 10, 96 << 10, 300 << 10, 3 << 20, maxMsgSize} {
			b := pool.Get(n)
			if len(*b) != n || cap(*b) < n || cap(*b) >= 2*max(n, 256) {
				t.Errorf("%s: Get(%d): len %d, cap %d; want the length and a capacity below %d", name, n, len(*b), cap(*b), 2*max(n, 256))
			}
			pool.Put(b)
		}
	}
}

// inode is a file's inode number.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
