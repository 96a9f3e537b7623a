package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testMonitorKilled SIGKILLs a running container's conmon, as the OOM
// killer or an operator might. Nothing will ever write its exit file;
// the daemon must notice on its own (no ContainerStatus asking: kubelet
// learns of exits from ListContainers), report the container EXITED with
// reason MonitorGone and kill what the monitor left running. The same
// after a restart, where the monitors are watched again as the
// containers are restored.
func (e *ctrEnv) testMonitorKilled(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("monitor"))
	before := e.run(t, pod, podCfg, e.ctr("before", "sleep", "1000"))
	after := e.run(t, pod, podCfg, e.ctr("after", "sleep", "1000"))
	e.killMonitor(t, before)
	if err := e.d.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	e.killMonitor(t, after)
}

// killMonitor kills container id's conmon and waits for the daemon to
// list the container EXITED, then checks its reason and its processes.
func (e *ctrEnv) killMonitor(t *testing.T, id string) {
	t.Helper()
	pid := e.info(t, id).Pid
	b, err := os.ReadFile(filepath.Join(e.d.Root, "containers", id, "conmon.pid"))
	if err != nil {
		t.Fatal(err)
	}
	conmon, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(conmon, syscall.SIGKILL); err != nil {
		t.Fatalf("killing conmon %d: %v", conmon, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := e.d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{Id: id}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Containers) == 1 && resp.Containers[0].State == runtimeapi.ContainerState_CONTAINER_EXITED {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still listed %v 15s after its conmon was killed", id, resp.Containers)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := e.status(t, id); st.Reason != "MonitorGone" {
		t.Errorf("container %s: reason %q, want MonitorGone", id, st.Reason)
	}
	// The container's init is killed: a zombie until its reaper (init,
	// conmon being gone) collects it.
	deadline = time.Now().Add(10 * time.Second)
	for {
		s, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil || strings.Contains(string(s), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the container's process %d still runs after its monitor was found gone", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
