package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
