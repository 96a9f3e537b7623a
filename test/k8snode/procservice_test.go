package k8snode

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A respawned service that keeps failing is given up on after systemd's
// start limit, with its log; one that runs on is left running.
func TestProcServiceStartLimit(t *testing.T) {
	dir := t.TempDir()
	var gaveUp []string
	p := &procService{t: t, name: "failing", argv: []string{"/bin/sh", "-c", "echo cannot start; exit 3"},
		log: filepath.Join(dir, "failing.log"), respawn: true, pidFile: filepath.Join(dir, "failing.pid"),
		giveUp: func(format string, args ...any) { gaveUp = append(gaveUp, fmt.Sprintf(format, args...)) }}
	p.start()
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		p.stop()
		t.Fatal("a service that exits at once is still restarted after a minute")
	}
	if len(gaveUp) != 1 {
		t.Fatalf("given up %d times, want once: %q", len(gaveUp), gaveUp)
	}
	if !strings.Contains(gaveUp[0], "started 5 times within 10s") || !strings.Contains(gaveUp[0], "cannot start") {
		t.Errorf("the report names neither the limit nor the service's log: %s", gaveUp[0])
	}
	if n := strings.Count(readFile(p.log), "cannot start"); n != startLimitBurst {
		t.Errorf("%d starts, want %d", n, startLimitBurst)
	}

	// A service that stays up is not given up on.
	q := &procService{t: t, name: "steady", argv: []string{"/bin/sleep", "60"},
		log: filepath.Join(dir, "steady.log"), respawn: true,
		giveUp: func(format string, args ...any) { t.Errorf("steady: "+format, args...) }}
	q.start()
	first := q.mainPID()
	time.Sleep(1500 * time.Millisecond)
	if q.mainPID() != first {
		t.Errorf("the steady service was restarted: pid %d, then %d", first, q.mainPID())
	}
	q.stop()
}
