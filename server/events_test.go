package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/pinrt/pinrt/sandbox"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestEventBusDropsSlowSubscriber(t *testing.T) {
	b := newEventBus()
	slow, fast := b.subscribe(), b.subscribe()
	for i := range subscriberBuffer + 1 {
		b.publish(&runtimeapi.ContainerEventResponse{ContainerId: "c", CreatedAt: int64(i)})
		// fast keeps up.
		if ev := <-fast.ch; ev.CreatedAt != int64(i) {
			t.Fatalf("fast got event %d, want %d", ev.CreatedAt, i)
		}
	}
	select {
	case <-slow.dropped:
	default:
		t.Fatal("a subscriber that fell a full buffer behind was not dropped")
	}
	if got := len(slow.ch); got != subscriberBuffer {
		t.Errorf("slow kept %d queued events, want %d", got, subscriberBuffer)
	}
	if !errdefs.IsResourceExhausted(slow.err) {
		t.Errorf("slow subscriber's error = %v, want ResourceExhausted", slow.err)
	}
	select {
	case <-fast.dropped:
		t.Fatal("the subscriber that kept up was dropped")
	default:
	}
	b.unsubscribe(slow) // dropped already: must not close twice
	b.close()
	select {
	case <-fast.dropped:
	default:
		t.Fatal("close left a subscriber open")
	}
	if fast.err != nil {
		t.Errorf("a subscriber ended by close has error %v, want a clean end", fast.err)
	}
	if late := b.subscribe(); late == nil {
		t.Fatal("subscribe after close returned nil")
	} else {
		select {
		case <-late.dropped:
		default:
			t.Fatal("a subscriber after close is not dropped at once")
		}
	}
}

// Exit files live on the run root, one directory for all: a removed
// container takes its own along, and a restart removes those no
// container or pod owns (a conmon that wrote it after the removal),
// keeping the others.
func TestExitFilesOnTheRunRoot(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	var ids []string
	for _, name := range []string{"kept", "removed"} {
		resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr(name), SandboxConfig: podCfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.ContainerId)
	}
	exitFile := func(id string) string { return filepath.Join(f.cfg.RunRoot, "exits", id) }
	for _, id := range ids {
		if _, err := os.Stat(exitFile(id)); err != nil {
			t.Fatalf("exit file of a stopped container: %v", err)
		}
	}
	if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ids[1]}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(exitFile(ids[1])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("exit file of a removed container: %v, want it gone", err)
	}
	// Written by its conmon after the removal, just before a crash.
	if err := os.WriteFile(exitFile(ids[1]), []byte("137"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A conmon writing now: its temporary file is not touched.
	if err := os.WriteFile(exitFile(ids[0])+".XY12AB", []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.srv.pruneExits(ctx)
	if _, err := os.Stat(exitFile(ids[0]) + ".XY12AB"); err != nil {
		t.Errorf("a conmon's temporary file after the prune: %v", err)
	}
	_ = os.Remove(exitFile(ids[0]) + ".XY12AB")
	if _, err := os.Stat(exitFile(ids[1])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale exit file after the restore's prune: %v, want it gone", err)
	}
	if _, err := os.Stat(exitFile(ids[0])); err != nil {
		t.Errorf("a known container's exit file after the prune: %v", err)
	}
}

// A container created before the exit files moved to the run root keeps
// its own in its directory: once restored, its exit is seen there, by
// the watcher, with no status call.
func TestExitFileInTheContainerDir(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("old"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	c, err := f.srv.containers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	f.rt.MoveExitDir(id, c.Dir)
	// What restoreContainer does.
	f.srv.adoptExitFile(c)
	f.srv.watchExit(ctx, c)
	if err := f.rt.Exit(id, 3); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := c.Status(); st.State != sandbox.ContainerExited || st.ExitCode != 3; st = c.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("container still %s (exit %d) 10s after its exit file appeared in its directory", st.State, st.ExitCode)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, own := f.srv.exits.own.Load(id); own {
		t.Error("the removed container's exit file is still remembered")
	}
}

// drainEvents returns the types of the events queued for sub.
func drainEvents(sub *subscriber) []runtimeapi.ContainerEventType {
	var got []runtimeapi.ContainerEventType
	for len(sub.ch) > 0 {
		got = append(got, (<-sub.ch).ContainerEventType)
	}
	return got
}

// A container stopped before its start exits as any stopped container
// does: kubelet gets its STOPPED event and plugins their StopContainer.
func TestStopBeforeStartIsAnExit(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := f.srv.containers.Get(resp.ContainerId); !c.Status().RuntimePending {
		t.Fatal("a created container is in the runtime already: the test covers nothing")
	}
	sub := f.srv.events.subscribe()
	defer f.srv.events.unsubscribe(sub)
	for range 2 { // a repeated stop is no new exit
		if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("status %v, %v; want EXITED", st.GetStatus().GetState(), err)
	}
	if got := drainEvents(sub); !slices.Equal(got, []runtimeapi.ContainerEventType{runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT}) {
		t.Errorf("events %v, want one STOPPED", got)
	}
	want := []string{"RunPodSandbox p", "CreateContainer c", "PostCreateContainer c", "StopContainer c"}
	if got := fake.Events(); !slices.Equal(got, want) {
		t.Errorf("NRI events %q, want %q", got, want)
	}
}

// A removal that waited for another of the same container finds it
// removed and does nothing: one DELETED event, one RemoveContainer for
// plugins.
func TestRemoveContainerOnce(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	id := f.started(t, pod, "c")
	c, err := f.srv.containers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	sub := f.srv.events.subscribe()
	defer f.srv.events.unsubscribe(sub)
	// Both looked c up before either took its lock.
	for range 2 {
		if err := f.srv.removeContainer(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	deleted := 0
	for _, typ := range drainEvents(sub) {
		if typ == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
			deleted++
		}
	}
	if deleted != 1 {
		t.Errorf("%d DELETED events, want 1", deleted)
	}
	removes := 0
	for _, e := range fake.Events() {
		if e == "RemoveContainer c" {
			removes++
		}
	}
	if removes != 1 {
		t.Errorf("plugins were told %d RemoveContainer: %q", removes, fake.Events())
	}
}

// A shared-PID pod whose pause process exited (a container's `kill 1`)
// is NotReady: its PID namespace is gone with every process in it. The
// exit is seen as it happens, and at a restart when it happened while
// the daemon was down; a pod whose pause runs stays Ready.
func TestPauseExitMakesPodNotReady(t *testing.T) {
	f := newCtrFixture(t)
	f.srv.pause.path = t.TempDir() // the fake runtime never runs it
	ctx := context.Background()
	sharedPID := func(name string) string {
		req := unitPod(name, false)
		req.Config.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
		id, _ := f.runPod(t, req)
		return id
	}
	state := func(id string) runtimeapi.PodSandboxState {
		resp, err := f.srv.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Status.State
	}
	exited := func(id string) {
		if err := os.WriteFile(filepath.Join(f.cfg.RunRoot, "exits", id), []byte("143"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	live, dead, downed := sharedPID("live"), sharedPID("dead"), sharedPID("downed")
	if f.srv.exitWatch(ctx) == nil {
		t.Fatal("no exit watcher")
	}
	exited(dead)
	deadline := time.Now().Add(10 * time.Second)
	for state(dead) != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		if time.Now().After(deadline) {
			t.Fatal("the pod whose pause exited is still Ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: dead, Config: unitCtr("late")})
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("CreateContainer in the pod whose pause exited: %v, want FailedPrecondition", err)
	}
	// What a restart finds: the exit file, written while nobody watched.
	f.srv.exits.w.Close()
	exited(downed)
	f.srv.pruneExits(ctx)
	if got := state(downed); got != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("pod whose pause exited while the daemon was down: %v, want NotReady", got)
	}
	if got := state(live); got != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod whose pause runs: %v, want Ready", got)
	}
	for _, id := range []string{live, dead, downed} {
		if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("StopPodSandbox %s: %v", id, err)
		}
	}
}

// An exit the watcher noticed is told before a stop or removal that saw
// it: while a plugin has not yet answered the watcher's StopContainer,
// StopContainer and RemoveContainer wait, and the plugin hears
// StopContainer before RemoveContainer, kubelet STOPPED before DELETED.
// They went out in either order when the removal came first.
func TestWatchedExitToldBeforeRemoval(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	id := f.started(t, pod, "c")
	entered, held := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(held) })
	t.Cleanup(release)
	enter := sync.OnceFunc(func() { close(entered) })
	fake.BeforeStop = func() {
		enter()
		<-held
	}
	sub := f.srv.events.subscribe()
	defer f.srv.events.unsubscribe(sub)
	if err := f.rt.Exit(id, 3); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no StopContainer for plugins 10s after the container's exit file appeared")
	}
	removed := make(chan error, 1)
	go func() {
		if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
			removed <- err
			return
		}
		_, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
		removed <- err
	}()
	// Nothing may come of the stop and removal while the exit is untold;
	// a wait this short can only miss an early return, never invent one.
	select {
	case err := <-removed:
		t.Fatalf("the removal returned (%v) before the plugin heard of the exit", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	select {
	case err := <-removed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the removal still waits 10s after the plugin answered")
	}
	if got, want := fake.Events()[len(fake.Events())-2:], []string{"StopContainer c", "RemoveContainer c"}; !slices.Equal(got, want) {
		t.Errorf("the plugin's last events %q, want %q", got, want)
	}
	want := []runtimeapi.ContainerEventType{runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT}
	if got := drainEvents(sub); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}
