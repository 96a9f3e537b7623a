package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni/cnitest"
	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/image/imagetest"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/nsmgr/nsmgrtest"
)

// fakeRecorder counts observations by name and outcome.
type fakeRecorder struct {
	mu  sync.Mutex
	got map[string]int
}

func (r *fakeRecorder) note(what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		what += " failed"
	}
	r.got[what]++
}

func (r *fakeRecorder) ObservePull(_ time.Duration, size int64, err error) {
	r.note(fmt.Sprintf("pull %d", size), err)
}
func (r *fakeRecorder) ObserveCNI(op string, _ time.Duration, err error) { r.note("cni "+op, err) }
func (r *fakeRecorder) ObserveNamespaces(_ time.Duration, err error)     { r.note("namespaces", err) }
func (r *fakeRecorder) ObserveRestore(kind string, err error)            { r.note("restore "+kind, err) }

func TestOperationsAreRecorded(t *testing.T) {
	cfg := conf.Default()
	cfg.Root, cfg.RunRoot = t.TempDir(), t.TempDir()
	ids, err := nsmgr.NewAllocator(cfg.Userns.MinHostID, cfg.Userns.MaxHostID, cfg.Userns.MaxPods)
	if err != nil {
		t.Fatal(err)
	}
	rec := &fakeRecorder{got: map[string]int{}}
	net := &cnitest.Fake{}
	ns := nsmgrtest.New(cfg.RunRoot)
	images := &imagetest.Fake{Registry: map[string]image.Image{"busybox": {ID: testImageID, Size: 1234}}}
	deps := Deps{Network: net, Namespaces: ns, IDs: ids, Shm: &fakeShm{mounted: map[string]bool{}}, Images: &ctrImages{Fake: images, mounted: map[string]image.MountRequest{}}, Metrics: rec}
	s := newTestServer(t, cfg, deps)
	ctx := context.Background()

	resp, err := s.RunPodSandbox(ctx, unitPod("m", false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	net.SetupErr = fmt.Errorf("bridge: %w", errdefs.ErrUnknown)
	if _, err := s.RunPodSandbox(ctx, unitPod("m2", false)); err == nil {
		t.Fatal("RunPodSandbox with a failing network succeeded")
	}
	if _, err := s.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "busybox"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "nope"}}); err == nil {
		t.Fatal("pull of an unknown image succeeded")
	}
	// A restart restores nothing broken: no pod is left.
	newTestServer(t, cfg, deps).Restore(ctx)

	want := map[string]int{
		"namespaces": 2, "cni add": 1, "cni add failed": 1, "cni del": 1,
		"pull 1234": 1, "pull 0 failed": 1,
	}
	for k, v := range want {
		if rec.got[k] != v {
			t.Errorf("%q recorded %d times, want %d (all: %v)", k, rec.got[k], v, rec.got)
		}
	}

	counts := s.StateCounts()
	if counts.Pods["ready"] != 0 || counts.Pods["notready"] != 0 || len(counts.Containers) != 4 {
		t.Errorf("state counts = %+v, want every state listed at 0", counts)
	}
}
