package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/contrib"
)

// TestSystemdUnit runs the daemon from contrib/pinrt.service, as a node
// does, with systemd as PID 1 (make test-vm runs it): the unit is
// Type=notify, so `systemctl start` returns only once the socket serves,
// and KillMode=process keeps containers running across a restart of the
// unit and across a SIGKILL of the daemon.
func TestSystemdUnit(t *testing.T) {
	RequireRoot(t)
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		t.Skip("needs systemd as PID 1 (make test-vm runs this test in a VM that has it)")
	}
	e := newCtrEnv(t)
	d := e.d
	// The harness started the daemon to pull the image; from here on
	// systemd runs it, with the same flags.
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	unit := "pinrt-e2e-" + randHex(4) + ".service"
	unitFile := filepath.Join("/run/systemd/system", unit)
	dropIn := unitFile + ".d"
	if err := os.WriteFile(unitFile, []byte(contrib.SystemdUnit), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dropIn, 0o755); err != nil {
		t.Fatal(err)
	}
	override := "[Service]\nExecStart=\nExecStart=" + Binary(t) + " " + strings.Join(d.Args(), " ") +
		"\nStandardOutput=append:" + d.LogPath + "\nStandardError=append:" + d.LogPath +
		"\n# The test restarts the unit itself.\nRestart=no\n"
	if err := os.WriteFile(filepath.Join(dropIn, "e2e.conf"), []byte(override), 0o644); err != nil {
		t.Fatal(err)
	}
	systemctl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("systemctl", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	systemctl("daemon-reload")
	t.Cleanup(func() {
		if d.conn != nil {
			d.removeAllPods()
		}
		_ = exec.Command("systemctl", "stop", unit).Run()
		_ = os.RemoveAll(dropIn)
		_ = os.Remove(unitFile)
		_ = exec.Command("systemctl", "daemon-reload").Run()
	})
	// start is the daemon's READY=1: with Type=notify, systemctl start
	// returns only then, so the socket must answer at once.
	start := func() {
		t.Helper()
		d.closeConn()
		systemctl("start", unit)
		if st := systemctl("show", "-P", "ActiveState", unit); st != "active" {
			t.Fatalf("%s is %q after start, want active", unit, st)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.dial(ctx); err != nil {
			t.Fatalf("the socket does not answer after systemctl start returned: %v", err)
		}
	}
	start()

	pod, podCfg := e.pod(t, PodConfig("unit"))
	id := e.run(t, pod, podCfg, e.ctr("sleeper", "sleep", "600"))
	if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container %v under the unit, want RUNNING", st.State)
	}
	stillRunning := func(after string) {
		t.Helper()
		st := e.status(t, id)
		if st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("after %s the container is %v (%s), want RUNNING", after, st.State, st.Reason)
		}
		if out := e.mustExec(t, id, "echo", "alive"); strings.TrimSpace(out) != "alive" {
			t.Fatalf("exec after %s: %q", after, out)
		}
	}

	systemctl("restart", unit)
	start()
	stillRunning("systemctl restart")

	pid, err := strconv.Atoi(systemctl("show", "-P", "MainPID", unit))
	if err != nil || pid <= 0 {
		t.Fatalf("MainPID %d: %v", pid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the unit to notice the SIGKILL", func() bool {
		st, _ := exec.Command("systemctl", "show", "-P", "ActiveState", unit).Output()
		s := strings.TrimSpace(string(st))
		return s == "failed" || s == "inactive"
	})
	_ = exec.Command("systemctl", "reset-failed", unit).Run()
	start()
	stillRunning("a SIGKILL of the daemon and a new start")
}
