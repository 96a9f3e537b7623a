package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// watchSelf watches the test's own children; it is closed at the end.
func watchSelf(t *testing.T) *ProcWatch {
	t.Helper()
	// The first exec of a Go process also forks once to probe for
	// pidfd support; do it before counting.
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	w, err := WatchProcs(os.Getpid())
	if err != nil {
		t.Skipf("no process events connector (needs root): %v", err)
	}
	t.Cleanup(w.Close)
	return w
}

// The watch counts a child and its exec by name, and nothing of other
// processes.
func TestWatchProcs(t *testing.T) {
	w := watchSelf(t)
	before := w.Counts()
	// sleep lives long enough for its command line to be read.
	if err := exec.Command("sleep", "0.3").Run(); err != nil {
		t.Fatal(err)
	}
	var d ProcCounts
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if d = w.Counts().Sub(before); d.Execs["sleep"] > 0 {
			break
		}
	}
	if d.Forks != 1 || d.Execs["sleep"] != 1 {
		t.Errorf("counts after one child = %+v, want 1 fork and 1 exec of sleep", d)
	}
}

func TestFormatExecs(t *testing.T) {
	got := FormatExecs(map[string]int{"runc state": 4, "conmon": 2, "bridge": 2}, 2)
	if want := "runc state=2.00 bridge=1.00 conmon=1.00"; got != want {
		t.Errorf("FormatExecs = %q, want %q", got, want)
	}
}

// With taskstats, a child's CPU time is added up under its command when
// it exits: a shell that burns a known amount shows it, and a process of
// no descendant's does not.
func TestWatchProcsCPU(t *testing.T) {
	w := watchSelf(t)
	if w.tasks == nil {
		t.Skip("no taskstats in this kernel (or no CAP_NET_ADMIN)")
	}
	before := w.Counts()
	// awk adds up six million numbers, a third of a second of user time
	// here, after sleep lets the watch read its command line.
	burn := exec.Command("sh", "-c", `sleep 0.2; awk 'BEGIN { for (i = 0; i < 6000000; i++) n += i }'`)
	if err := burn.Run(); err != nil {
		t.Fatal(err)
	}
	var d ProcCounts
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if d = w.Counts().Sub(before); d.CPU["awk"] > 0 {
			break
		}
	}
	if got := d.CPU["awk"]; got < 50*time.Millisecond || got > 10*time.Second {
		t.Errorf("awk's CPU = %v, want its loop's, a fraction of a second; all: %v", got, d.CPU)
	}
	if got := d.CPU["sleep"]; got > 100*time.Millisecond {
		t.Errorf("sleep's CPU = %v, want next to none", got)
	}
	for name := range d.CPU {
		if name != "awk" && name != "sleep" && name != "sh" {
			t.Errorf("CPU counted for %q, which the test did not run", name)
		}
	}
}
