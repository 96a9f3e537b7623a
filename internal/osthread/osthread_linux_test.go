package osthread

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func init() { runtime.LockOSThread() } // TestMain starts on the main thread

// onMain is where run, called on the main thread, ran its work.
var onMain struct {
	tid int
	cwd string
	err error
}

func TestMain(m *testing.M) {
	// As a goroutine that lands on the main thread would: run there.
	dir, err := os.MkdirTemp("", "osthread")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	run(func() {
		onMain.tid = unix.Gettid()
		onMain.err = chdirThread(dir)
		onMain.cwd, _ = os.Getwd()
	})
	code := m.Run()
	os.Remove(dir)
	os.Exit(code)
}

// chdirThread changes the working directory of the calling thread alone.
func chdirThread(dir string) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return err
	}
	return unix.Chdir(dir)
}

// threadEnds fails t unless thread tid of this process ends soon.
func threadEnds(t *testing.T, tid int) {
	t.Helper()
	task := fmt.Sprintf("/proc/self/task/%d", tid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			return
		}
	}
	t.Errorf("thread %d still runs after its work returned", tid)
}

func TestWorkOffTheMainThread(t *testing.T) {
	if onMain.err != nil {
		t.Fatal(onMain.err)
	}
	if onMain.tid == unix.Getpid() {
		t.Fatal("the work ran on the main thread, which cannot end")
	}
	if onMain.cwd == "" || onMain.cwd == mustGetwd(t) {
		t.Errorf("the work's working directory %q, want its own", onMain.cwd)
	}
	threadEnds(t, onMain.tid)
}

func TestThreadEndsWithTheWork(t *testing.T) {
	before := mustGetwd(t)
	for range 20 {
		tids := make(chan int, 1)
		Go(func() {
			if err := chdirThread(t.TempDir()); err != nil {
				t.Error(err)
			}
			tids <- unix.Gettid()
		})
		tid := <-tids
		threadEnds(t, tid)
	}
	if got := mustGetwd(t); got != before {
		t.Errorf("the process's working directory moved to %s", got)
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}
