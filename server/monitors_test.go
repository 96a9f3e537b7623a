package server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/sandbox"
)

// fakeMonitor starts a process whose command line names container id, as
// conmon's does, and records it as the container's monitor.
func fakeMonitor(t *testing.T, dir, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 600; :", id)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := os.WriteFile(filepath.Join(dir, "conmon.pid"), fmt.Append(nil, cmd.Process.Pid), 0o600); err != nil {
		t.Fatal(err)
	}
	// Start returns once the exec has begun; the command line reads
	// empty until the kernel has laid it out. conmon writes its pid file
	// only after that.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, alive, _ := monitorPid(dir, id); alive {
			return cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fake monitor of %s is not taken for one", id)
		}
	}
}

// startWatched creates and starts a container whose monitor is a fake
// one, and checks that the start watches it.
func startWatched(t *testing.T, f *ctrFixture, name string) (*sandbox.Container, *exec.Cmd) {
	t.Helper()
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr(name), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := f.srv.containers.Get(resp.ContainerId)
	mon := fakeMonitor(t, c.Dir, c.ID)
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ID}); err != nil {
		t.Fatal(err)
	}
	if !f.srv.monitorWatched(c.ID) {
		t.Fatalf("container %s: its monitor is not watched after the start", name)
	}
	return c, mon
}

// A started container's conmon is watched through a pidfd: its death
// without an exit file is recorded as MonitorGone at once, with no status
// call asking.
func TestMonitorWatch(t *testing.T) {
	f := newCtrFixture(t)
	f.rt.NoExitFiles = true // a killed conmon writes none
	c, mon := startWatched(t, f, "killed")
	if err := mon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = mon.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for c.Status().State != sandbox.ContainerExited && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := c.Status(); st.State != sandbox.ContainerExited || st.Reason != reasonMonitorGone {
		t.Fatalf("after its monitor died: %v %q, want Exited %s without a status call", st.State, st.Reason, reasonMonitorGone)
	}
	if f.srv.monitorWatched(c.ID) {
		t.Error("a dead monitor is still watched")
	}
}

// A removal stops the watch and leaves the process alone.
func TestMonitorUnwatched(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	c, mon := startWatched(t, f, "removed")
	if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.ID}); err != nil {
		t.Fatal(err)
	}
	if f.srv.monitorWatched(c.ID) {
		t.Error("a removed container's monitor is still watched")
	}
	if err := mon.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the watch did something to the monitor: %v", err)
	}
}

func TestCloseMonitors(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("app"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := f.srv.containers.Get(resp.ContainerId)
	fakeMonitor(t, c.Dir, c.ID)
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ID}); err != nil {
		t.Fatal(err)
	}
	f.srv.closeMonitors()
	if f.srv.monitorWatched(c.ID) {
		t.Error("watched after closeMonitors")
	}
	if st := c.Status(); st.State != sandbox.ContainerRunning {
		t.Errorf("closing the watches changed the container: %v", st.State)
	}
}
