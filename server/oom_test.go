package server

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Under the systemd driver conmon often misses an OOM kill (its scope is
// gone before it reads memory.events); the pod cgroup's counter, which
// outlives the scope, tells it. Each rise accounts for one SIGKILL exit,
// and counts from before the pod or a restart are not attributed.
func TestExitTakenAsOOMKillFromPodCounter(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	sb, err := f.srv.sandboxes.Get(pod)
	if err != nil {
		t.Fatal(err)
	}
	group := f.srv.podCgroup(sb)
	f.cg.setOOMKills(group, 5) // kills before the pod was known...
	f.srv.notePodOOMBase(ctx, sb)

	run := func(name string) string { t.Helper(); return f.started(t, pod, name) }
	// Every stop ends in a SIGKILL exit, with no oom file from conmon.
	killed := int32(sigkillExit)
	f.rt.StopExitCode = &killed
	stopAndReason := func(id string) string {
		t.Helper()
		if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
			t.Fatal(err)
		}
		st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.ExitCode != sigkillExit {
			t.Fatalf("exit code %d, want %d", st.Status.ExitCode, sigkillExit)
		}
		return st.Status.Reason
	}

	a, b, c := run("a"), run("b"), run("c")
	if r := stopAndReason(a); r != reasonError {
		t.Errorf("a SIGKILL with no new OOM kill: reason %q, want %q (older kills are not attributed)", r, reasonError)
	}
	f.cg.setOOMKills(group, 6)
	if r := stopAndReason(b); r != reasonOOMKilled {
		t.Errorf("a SIGKILL after the pod's oom_kill rose: reason %q, want %q", r, reasonOOMKilled)
	}
	// Asked again, b keeps its answer; the one rise is used up, so c,
	// killed after it, is not an OOM kill.
	st, _ := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: b})
	if st.Status.Reason != reasonOOMKilled {
		t.Errorf("b's reason changed to %q", st.Status.Reason)
	}
	if r := stopAndReason(c); r != reasonError {
		t.Errorf("c after the rise was used: reason %q, want %q", r, reasonError)
	}
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if len(f.srv.oom.seen) != 0 || len(f.srv.oom.decided) != 0 {
		t.Errorf("after the pod's removal podOOM keeps %v %v", f.srv.oom.seen, f.srv.oom.decided)
	}
}
