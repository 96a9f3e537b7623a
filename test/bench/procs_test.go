package bench

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// The watch counts a child and its exec by name, and nothing of other
// processes.
func TestWatchProcs(t *testing.T) {
	// The first exec of a Go process also forks once to probe for
	// pidfd support; do it before counting.
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	w, err := WatchProcs(os.Getpid())
	if err != nil {
		t.Skipf("no process events connector (needs root): %v", err)
	}
	defer w.Close()
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
	if err := exec.Command("true").Run(); err != nil {
		t.Fatal(err)
	}
	w, err := WatchProcs(os.Getpid())
	if err != nil {
		t.Skipf("no process events connector (needs root): %v", err)
	}
	defer w.Close()
	if w.tasks == nil {
		t.Skip("no taskstats in this kernel (or no CAP_NET_ADMIN)")
	}
	before := w.Counts()
	// awk spins for about 300 ms of user time after sleep lets its
	// command line be read.
	burn := exec.Command("sh", "-c", `sleep 0.2; awk 'BEGIN { t = systime() + 1; while (systime() < t) n++ }'`)
	if err := burn.Run(); err != nil {
		t.Fatal(err)
	}
	var d ProcCounts
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if d = w.Counts().Sub(before); d.CPU["awk"] > 0 {
			break
		}
	}
	// systime() counts whole seconds: awk spins between 0 and 1 s.
	if got := d.CPU["awk"]; got <= 0 || got > 2*time.Second {
		t.Errorf("awk's CPU = %v, want (0, 1s]; all: %v", got, d.CPU)
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
