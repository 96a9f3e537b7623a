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
	reason := func(id string) string {
		t.Helper()
		st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.ExitCode != sigkillExit {
			t.Fatalf("exit code %d, want %d", st.Status.ExitCode, sigkillExit)
		}
		return st.Status.Reason
	}
	// A SIGKILL exit of the container's own, with no oom file from
	// conmon.
	killedAlone := func(id string) string {
		t.Helper()
		if err := f.rt.Exit(id, sigkillExit); err != nil {
			t.Fatal(err)
		}
		return reason(id)
	}

	a, b, c := run("a"), run("b"), run("c")
	if r := killedAlone(a); r != reasonError {
		t.Errorf("a SIGKILL with no new OOM kill: reason %q, want %q (older kills are not attributed)", r, reasonError)
	}
	f.cg.setOOMKills(group, 6)
	if r := killedAlone(b); r != reasonOOMKilled {
		t.Errorf("a SIGKILL after the pod's oom_kill rose: reason %q, want %q", r, reasonOOMKilled)
	}
	// Asked again, b keeps its answer; the one rise is used up, so c,
	// killed after it, is not an OOM kill.
	if r := reason(b); r != reasonOOMKilled {
		t.Errorf("b's reason changed to %q", r)
	}
	if r := killedAlone(c); r != reasonError {
		t.Errorf("c after the rise was used: reason %q, want %q", r, reasonError)
	}

	// A stop that ends in SIGKILL (the grace period over) is the stop's,
	// even after a rise the OOM kill of some child process in the pod
	// made; the rise stays for an exit of the container's own.
	d, e := run("d"), run("e")
	f.cg.setOOMKills(group, 7)
	killed := int32(sigkillExit)
	f.rt.StopExitCode = &killed
	if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: d, Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	if r := reason(d); r != reasonError {
		t.Errorf("a stop ended by SIGKILL after a rise: reason %q, want %q", r, reasonError)
	}
	if r := killedAlone(e); r != reasonOOMKilled {
		t.Errorf("a SIGKILL of its own after the stop: reason %q, want %q", r, reasonOOMKilled)
	}
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if len(f.srv.oom.seen) != 0 || len(f.srv.oom.decided) != 0 {
		t.Errorf("after the pod's removal podOOM keeps %v %v", f.srv.oom.seen, f.srv.oom.decided)
	}
}
