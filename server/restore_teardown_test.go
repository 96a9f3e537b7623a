package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/cni/cnitest"
	"github.com/pinrt/pinrt/internal/inotifytest"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/sandbox"
)

// A restart here is what TestCrashAtEveryStep does: the old server plays
// dead, and a new one, with a fresh ID allocator (the old one died with
// the daemon), restores from the same root and the same fakes.

// restartRig is a ctrFixture whose fakes outlive restarts.
type restartRig struct {
	*ctrFixture
	net *cnitest.Fake
	shm *fakeShm
	ids *nsmgr.Allocator
}

func newRestartRig(t *testing.T) *restartRig {
	t.Helper()
	r := &restartRig{ctrFixture: newCtrFixture(t), net: &cnitest.Fake{}, shm: &fakeShm{mounted: map[string]bool{}}}
	r.srv = r.server(t)
	return r
}

func (r *restartRig) server(t *testing.T) *Server {
	t.Helper()
	ids, err := nsmgr.NewAllocator(r.cfg.Userns.MinHostID, r.cfg.Userns.MaxHostID, r.cfg.Userns.MaxPods)
	if err != nil {
		t.Fatal(err)
	}
	r.ids = ids
	s := newTestServer(t, r.cfg, Deps{
		Network: r.net, Namespaces: r.ns, IDs: ids, Shm: r.shm, Images: r.images,
		Runtimes: map[string]ContainerRuntime{"runc": r.rt}, Cgroups: r.cg,
	})
	// The pause process needs no static binary in the fake runtime.
	s.pause.path = t.TempDir()
	return s
}

// restart kills the daemon and starts another over the same state.
func (r *restartRig) restart(t *testing.T) {
	t.Helper()
	playDead(r.srv)
	r.srv = r.server(t)
	r.srv.Restore(context.Background())
}

// pod runs a pod with a user namespace, sharing one PID namespace (so it
// has a pause process) if sharedPID.
func (r *restartRig) pod(t *testing.T, sharedPID bool) string {
	t.Helper()
	req := unitPod("p", true)
	if sharedPID {
		req.Config.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
	}
	id, _ := r.runPod(t, req)
	return id
}

func (r *restartRig) inRuntime(id string) bool {
	_, err := r.rt.State(context.Background(), id)
	return err == nil
}

// firstBlockHeld reports whether the allocator's first ID range, the one
// the test's first pod got, is still held.
func (r *restartRig) firstBlockHeld(t *testing.T) bool {
	t.Helper()
	m, err := r.ids.Allocate("probe")
	if err != nil {
		t.Fatal(err)
	}
	r.ids.Release("probe")
	return m.HostID != r.cfg.Userns.MinHostID
}

// podStays checks that a pod a restart could not take apart kept all it
// had: its record, network, pins and ID range.
func (r *restartRig) podStays(t *testing.T, pod string) {
	t.Helper()
	if _, err := os.Stat(r.srv.sandboxDir(pod)); err != nil {
		t.Errorf("the pod's directory is gone (%v): nothing will retry its teardown", err)
	}
	if _, ok := r.net.Attached()[pod]; !ok {
		t.Error("the pod's network was torn down")
	}
	if len(r.ns.Pinned(pod)) == 0 {
		t.Error("the pod's pins were removed")
	}
	if !r.firstBlockHeld(t) {
		t.Error("the pod's ID range is free for the next pod")
	}
}

// podGone checks that nothing of the pod, its pause process and its
// containers is left.
func (r *restartRig) podGone(t *testing.T, pod string) {
	t.Helper()
	for _, d := range []string{r.srv.sandboxDir(pod), r.srv.sandboxRunDir(pod)} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there (%v)", d, err)
		}
	}
	if ip, ok := r.net.Attached()[pod]; ok {
		t.Errorf("the pod still holds IP %s", ip)
	}
	if pins := r.ns.Pinned(pod); len(pins) > 0 {
		t.Errorf("the pod's pins remain: %v", pins)
	}
	if r.inRuntime(pod) {
		t.Error("the pod's pause process is still in the runtime")
	}
	if r.firstBlockHeld(t) {
		t.Error("the pod's ID range is still held")
	}
	if l, _ := r.srv.ListPodSandbox(context.Background(), &runtimeapi.ListPodSandboxRequest{}); len(l.GetItems()) > 0 {
		t.Errorf("%d pods listed", len(l.GetItems()))
	}
	r.nothingLeft(t)
}

func (r *restartRig) removePod(t *testing.T, pod string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
}

var errInjected = fmt.Errorf("injected: %w", errdefs.ErrUnavailable)

// unreadableStates are state records a restart cannot load, each written
// over the one of object id at path.
var unreadableStates = []struct {
	name    string
	corrupt func(t *testing.T, path, id string)
}{
	{"garbage", func(t *testing.T, path, _ string) { writeTestFile(t, path, []byte("{garbage")) }},
	{"unknown version", func(t *testing.T, path, _ string) {
		var rec map[string]any
		if err := json.Unmarshal(readTestFile(t, path), &rec); err != nil {
			t.Fatal(err)
		}
		rec["version"] = 99
		b, _ := json.Marshal(rec)
		writeTestFile(t, path, b)
	}},
	{"another object's ID", func(t *testing.T, path, id string) {
		writeTestFile(t, path, bytes.ReplaceAll(readTestFile(t, path), []byte(id), []byte(strings.Repeat("ab", 32))))
	}},
}

func readTestFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeTestFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A container whose state record a restart cannot load was skipped: not
// restored, not torn down. It kept running under conmon, unlisted; its
// pod's removal released the pod's ID range, and the next pod got the
// same host IDs. It is torn down from what its directory holds.
func TestRestoreTearsDownUnreadableContainer(t *testing.T) {
	for _, tc := range unreadableStates {
		t.Run(tc.name, func(t *testing.T) {
			r := newRestartRig(t)
			pod := r.pod(t, false)
			cid := r.started(t, pod, "c")
			tc.corrupt(t, filepath.Join(r.srv.containerDir(cid), "state.json"), cid)
			r.restart(t)
			if r.inRuntime(cid) {
				t.Errorf("container %s still in the runtime after the restart, and not listed", cid)
			}
			if _, err := os.Stat(r.srv.containerDir(cid)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("its directory is still there (%v)", err)
			}
			// The pod itself is restored, and goes as usual.
			r.removePod(t, pod)
			r.podGone(t, pod)
		})
	}
}

// A pod whose state record a restart cannot load was skipped: its
// containers went as orphans, but its IP, pins and pause process stayed
// for good while its ID range went to the next pod. It is torn down from
// its config.json and infra bundle.
func TestRestoreTearsDownUnreadablePod(t *testing.T) {
	for _, tc := range unreadableStates {
		t.Run(tc.name, func(t *testing.T) {
			r := newRestartRig(t)
			pod := r.pod(t, true)
			cid := r.started(t, pod, "c")
			tc.corrupt(t, filepath.Join(r.srv.sandboxDir(pod), "state.json"), pod)
			r.restart(t)
			if r.inRuntime(cid) {
				t.Errorf("container %s of the pod still in the runtime", cid)
			}
			r.podGone(t, pod)
		})
	}
}

// A host-network pod that cannot be loaded is torn down as what its
// config.json says it is: without a CNI DEL, which on a node with no
// network config yet (host-network pods run before the CNI is installed)
// could never succeed, and would keep the pod for good.
func TestRestoreTearsDownUnreadableHostNetworkPod(t *testing.T) {
	r := newRestartRig(t)
	req := unitPod("h", false)
	req.Config.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
	pod, _ := r.runPod(t, req)
	writeTestFile(t, filepath.Join(r.srv.sandboxDir(pod), "state.json"), []byte("{garbage"))
	r.net.TeardownErr = fmt.Errorf("no network config found: %w", errdefs.ErrFailedPrecondition)
	r.restart(t)
	for _, c := range r.net.Calls() {
		if c.Op == "Teardown" {
			t.Errorf("CNI DEL of a host-network pod: %+v", c)
		}
	}
	r.podGone(t, pod)
}

// A RunPodSandbox killed between its directory and its intent record made
// nothing: a restart removes the directory without a CNI DEL, which needs
// a network config the node may not have (a guard: a DEL without a cache
// entry or a config now fails, TestTeardownWithoutCacheOrConfig).
func TestRestoreEmptyPodDirWithoutNetworkConfig(t *testing.T) {
	r := newRestartRig(t)
	pod := strings.Repeat("cd", 32)
	if err := os.MkdirAll(r.srv.sandboxDir(pod), 0o700); err != nil {
		t.Fatal(err)
	}
	r.net.TeardownErr = fmt.Errorf("no network config found: %w", errdefs.ErrFailedPrecondition)
	r.restart(t)
	r.podGone(t, pod)
}

// A container a restart could neither load nor tear down may still run in
// its pod: until its teardown succeeds, the pod's stop and removal fail,
// and the pod keeps its network, pins and ID range.
func TestStrayContainerHoldsItsPod(t *testing.T) {
	r := newRestartRig(t)
	ctx := context.Background()
	pod := r.pod(t, false)
	cid := r.started(t, pod, "c")
	writeTestFile(t, filepath.Join(r.srv.containerDir(cid), "state.json"), []byte("{garbage"))
	r.rt.DeleteErr = errInjected
	r.restart(t)
	if !r.inRuntime(cid) {
		t.Fatal("the container's teardown did not fail as injected")
	}
	if _, err := r.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); !errors.Is(err, errInjected) {
		t.Errorf("StopPodSandbox = %v, want the container's teardown failure", err)
	}
	if _, err := r.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); !errors.Is(err, errInjected) {
		t.Errorf("RemovePodSandbox = %v, want the container's teardown failure", err)
	}
	r.podStays(t, pod)
	r.rt.DeleteErr = nil
	r.removePod(t, pod)
	if r.inRuntime(cid) {
		t.Errorf("container %s outlived its pod", cid)
	}
	r.podGone(t, pod)
}

// StopPodSandbox looks at the containers on disk that are not in the
// store, another pod's creations in flight among them. It once loaded
// them as left by a restart, and the load deleted temp files: the one
// another pod's CreateContainer had written its intent record to and was
// about to rename, which then failed ("recording creating intent: rename
// ...: no such file or directory", caught by critest run in parallel).
// Only a restart removes a killed write's temp, with the container.
func TestStopPodLeavesAnotherPodsCreationAlone(t *testing.T) {
	r := newRestartRig(t)
	ctx := context.Background()
	other := r.pod(t, false)
	pod, _ := r.runPod(t, unitPod("q", true))
	inFlight := filepath.Join(r.srv.containerDir(strings.Repeat("ef", 32)), ".creating.tmp123")
	if err := os.MkdirAll(filepath.Dir(inFlight), 0o700); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, inFlight, []byte(`{"id":"`+strings.Repeat("ef", 32)+`","sandboxId":"`+other+`"}`))
	if _, err := r.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	r.removePod(t, pod)
	if _, err := os.Stat(inFlight); err != nil {
		t.Fatalf("another pod's stop and removal deleted a creation's record in flight: %v", err)
	}
	r.restart(t)
	if _, err := os.Stat(filepath.Dir(inFlight)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a restart kept the directory of a creation killed before its intent record (%v)", err)
	}
	r.podStays(t, other)
}

// A daemon killed in the middle of a write leaves its temp file in the
// object's directory; loads no longer remove it, so restore does, for a
// pod and a container it keeps as for one it tears down.
func TestRestoreRemovesCrashTemps(t *testing.T) {
	r := newRestartRig(t)
	pod := r.pod(t, false)
	cid := r.started(t, pod, "c")
	temps := []string{
		filepath.Join(r.srv.sandboxDir(pod), ".state.json.tmp42"),
		filepath.Join(r.srv.containerDir(cid), ".state.json.tmp43"),
	}
	for _, p := range temps {
		writeTestFile(t, p, []byte(`{"vers`))
	}
	r.restart(t)
	if !r.inRuntime(cid) {
		t.Fatal("the container was not kept")
	}
	for _, p := range temps {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survived the restart (%v)", p, err)
		}
	}
	r.podStays(t, pod)
}

// A RunPodSandbox whose rollback failed to undo a step removed the pod's
// intent record and released its ID range all the same: nothing ever
// retried the undo (an IP stayed reserved, a pause process ran on), and
// the next pod got the range. The record and the range are kept for the
// next start's teardown.
func TestRunPodSandboxRollbackKeepsRecordOfFailedUndo(t *testing.T) {
	tests := []struct {
		name      string
		sharedPID bool
		inject    func(r *restartRig)
	}{
		{"rollback DEL fails", true, func(r *restartRig) { r.rt.CreateErr, r.net.TeardownErr = errInjected, errInjected }},
		{"pause process removal fails", true, func(r *restartRig) { r.rt.StartErr, r.rt.DeleteErr = errInjected, errInjected }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRestartRig(t)
			tc.inject(r)
			req := unitPod("p", true)
			if tc.sharedPID {
				req.Config.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
			}
			if _, err := r.srv.RunPodSandbox(context.Background(), req); err == nil {
				t.Fatal("RunPodSandbox succeeded")
			}
			dirs, _ := os.ReadDir(filepath.Join(r.cfg.Root, "sandboxes"))
			if len(dirs) != 1 {
				t.Fatalf("%d sandbox directories after the failed rollback, want the pod's kept", len(dirs))
			}
			pod := dirs[0].Name()
			if in, _ := sandbox.ReadIntent(r.srv.sandboxDir(pod), &sandbox.Metadata{}); in != sandbox.IntentCreating {
				t.Errorf("intent record = %q, want creating", in)
			}
			if !r.firstBlockHeld(t) {
				t.Error("the pod's ID range was released")
			}
			r.rt.CreateErr, r.rt.StartErr, r.rt.DeleteErr = nil, nil, nil
			r.net.RollbackErr, r.net.TeardownErr = nil, nil
			r.restart(t)
			r.podGone(t, pod)
		})
	}
}

// An ADD the network refused, whose own DEL failed too (a broken
// configuration: host-local refuses its subnet both ways), keeps nothing:
// kubelet retries with a new pod each time, and a record kept per retry
// would pile up and hold ID ranges until a restart.
func TestRunPodSandboxRefusedNetworkKeepsNothing(t *testing.T) {
	r := newRestartRig(t)
	r.net.RollbackErr = errInjected
	_, err := r.srv.RunPodSandbox(context.Background(), unitPod("p", true))
	if !errors.Is(err, errInjected) || !errors.Is(err, cni.ErrRollback) {
		t.Fatalf("RunPodSandbox: %v, want the ADD's error and its DEL's", err)
	}
	if dirs, _ := os.ReadDir(filepath.Join(r.cfg.Root, "sandboxes")); len(dirs) != 0 {
		t.Errorf("%d sandbox directories after a refused ADD", len(dirs))
	}
	if r.firstBlockHeld(t) {
		t.Error("the refused pod's ID range is still held")
	}
}

// An intent record torn by a kill (one written in place, between its
// open and its write) tore the pod down from defaults: its pause process
// was never removed. Restore falls back on the pod's state record.
func TestRestoreTornIntentRecord(t *testing.T) {
	for _, torn := range []string{"", `{"id":"`} {
		t.Run(fmt.Sprintf("%q", torn), func(t *testing.T) {
			r := newRestartRig(t)
			pod := r.pod(t, true)
			writeTestFile(t, filepath.Join(r.srv.sandboxDir(pod), string(sandbox.IntentRemoving)), []byte(torn))
			r.restart(t)
			r.podGone(t, pod)
		})
	}
}

// markRemoving records the removal of pod, as RemovePodSandbox does
// first: the daemon is killed right after.
func (r *restartRig) markRemoving(t *testing.T, pod string) {
	t.Helper()
	sb, err := r.srv.sandboxes.Get(pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := sandbox.MarkIntent(sb.Dir, sandbox.IntentRemoving, sb.Metadata); err != nil {
		t.Fatal(err)
	}
}

// A pod a restart tears down held no ID range: when its teardown failed,
// its pins and IP stayed while the next pod got the range. The range is
// held until the teardown succeeds.
func TestRestoreHoldsRangeOfPodsToTearDown(t *testing.T) {
	r := newRestartRig(t)
	pod := r.pod(t, false)
	r.markRemoving(t, pod)
	r.net.TeardownErr = errInjected
	r.restart(t)
	// The other steps ran, as they should: only the network stays.
	if _, err := os.Stat(r.srv.sandboxDir(pod)); err != nil {
		t.Errorf("the pod's directory is gone (%v): nothing will retry its teardown", err)
	}
	if _, ok := r.net.Attached()[pod]; !ok {
		t.Error("the pod's network was torn down")
	}
	if !r.firstBlockHeld(t) {
		t.Error("the pod's ID range is free for the next pod while its network stays")
	}
	r.net.TeardownErr = nil
	r.restart(t)
	r.podGone(t, pod)
}

// A pod a restart tears down was torn down even when one of its
// containers' teardown failed: the container ran on in a pod whose IP,
// pins and ID range were gone. The pod waits for the next start.
func TestRestoreDefersPodTeardownWhileAContainerStays(t *testing.T) {
	r := newRestartRig(t)
	pod := r.pod(t, false)
	cid := r.started(t, pod, "c")
	r.markRemoving(t, pod)
	r.rt.DeleteErr = errInjected
	r.restart(t)
	if !r.inRuntime(cid) {
		t.Fatal("the container's teardown did not fail as injected")
	}
	r.podStays(t, pod)
	r.rt.DeleteErr = nil
	r.restart(t)
	if r.inRuntime(cid) {
		t.Errorf("container %s is still in the runtime", cid)
	}
	r.podGone(t, pod)
}

// A removal deleted its directory in directory order, which could take
// the intent record before state.json: a daemon killed in between brought
// the removed object back, whole, at the next start. The records restore
// loads go before the intent record.
func TestRemovalDeletesRecordsBeforeIntent(t *testing.T) {
	tests := []struct {
		name string
		// run sets up the object and returns its directory and the removal.
		run func(t *testing.T, r *restartRig) (string, func())
	}{
		{"RemovePodSandbox", func(t *testing.T, r *restartRig) (string, func()) {
			pod := r.pod(t, false)
			return r.srv.sandboxDir(pod), func() {
				_, err := r.srv.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
				if err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"pod teardown at restart", func(t *testing.T, r *restartRig) (string, func()) {
			pod := r.pod(t, false)
			r.markRemoving(t, pod)
			return r.srv.sandboxDir(pod), func() { r.restart(t) }
		}},
		{"container teardown at restart", func(t *testing.T, r *restartRig) (string, func()) {
			cid := r.started(t, r.pod(t, false), "c")
			c, err := r.srv.containers.Get(cid)
			if err != nil {
				t.Fatal(err)
			}
			if err := sandbox.MarkIntent(c.Dir, sandbox.IntentRemoving, c.ContainerMetadata); err != nil {
				t.Fatal(err)
			}
			return c.Dir, func() { r.restart(t) }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRestartRig(t)
			dir, remove := tc.run(t, r)
			got := inotifytest.Deletions(t, dir, remove)
			intent := slices.Index(got, string(sandbox.IntentRemoving))
			for _, rec := range []string{"state.json", "config.json"} {
				if i := slices.Index(got, rec); i < 0 || intent >= 0 && i > intent {
					t.Errorf("deleted in the order %q: %s after the intent record", got, rec)
				}
			}
			if intent < 0 {
				t.Errorf("deleted %q: no intent record", got)
			}
		})
	}
}
