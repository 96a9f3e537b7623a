package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/cni/cnitest"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// A crash is simulated by freezing the request's goroutine right after
// its n-th side effect (the fake's state, like the kernel's, keeps it)
// and starting a new Server over the same state directory and fakes. The
// old Server is abandoned, as a SIGKILLed daemon is.

// crasher counts side effects and freezes the caller at the n-th.
type crasher struct {
	mu    sync.Mutex
	n     int
	at    int
	what  string
	hit   chan struct{}
	never chan struct{}
}

func (c *crasher) step(what string) {
	c.mu.Lock()
	c.n++
	hit := c.n == c.at
	if hit {
		c.what = what
	}
	c.mu.Unlock()
	if hit {
		close(c.hit)
		<-c.never
	}
}

type crashNetwork struct {
	Network
	c *crasher
}

func (n crashNetwork) Setup(ctx context.Context, pod cni.Pod) (*cni.Result, error) {
	r, err := n.Network.Setup(ctx, pod)
	n.c.step("CNI ADD")
	return r, err
}

func (n crashNetwork) Teardown(ctx context.Context, pod cni.Pod) error {
	err := n.Network.Teardown(ctx, pod)
	n.c.step("CNI DEL")
	return err
}

type crashNamespaces struct {
	Namespaces
	c *crasher
}

func (n crashNamespaces) Create(ctx context.Context, req nsmgr.CreateRequest) (nsmgr.Pins, error) {
	p, err := n.Namespaces.Create(ctx, req)
	n.c.step("pin")
	return p, err
}

func (n crashNamespaces) Remove(ctx context.Context, id string) error {
	err := n.Namespaces.Remove(ctx, id)
	n.c.step("unpin")
	return err
}

type crashShm struct {
	Shm
	c *crasher
}

func (s crashShm) Mount(path string, uid, gid uint32) error {
	err := s.Shm.Mount(path, uid, gid)
	s.c.step("shm mount")
	return err
}

func (s crashShm) Unmount(path string) error {
	err := s.Shm.Unmount(path)
	s.c.step("shm unmount")
	return err
}

type crashImages struct {
	Images
	c *crasher
}

func (i crashImages) MountRootfs(ctx context.Context, req image.MountRequest) (string, error) {
	p, err := i.Images.MountRootfs(ctx, req)
	i.c.step("rootfs mount")
	return p, err
}

func (i crashImages) UnmountRootfs(ctx context.Context, id, podID, dir string) error {
	err := i.Images.UnmountRootfs(ctx, id, podID, dir)
	i.c.step("rootfs unmount")
	return err
}

type crashRuntime struct {
	ContainerRuntime
	c *crasher
}

func (r crashRuntime) Create(ctx context.Context, o oci.CreateOptions) (int, error) {
	pid, err := r.ContainerRuntime.Create(ctx, o)
	r.c.step("runtime create")
	return pid, err
}

func (r crashRuntime) Prepare(o oci.CreateOptions) error {
	err := r.ContainerRuntime.Prepare(o)
	r.c.step("runtime prepare")
	return err
}

func (r crashRuntime) CreatePrepared(ctx context.Context, id string) (int, error) {
	pid, err := r.ContainerRuntime.CreatePrepared(ctx, id)
	r.c.step("runtime create")
	return pid, err
}

func (r crashRuntime) Start(ctx context.Context, id string) error {
	err := r.ContainerRuntime.Start(ctx, id)
	r.c.step("runtime start")
	return err
}

func (r crashRuntime) Stop(ctx context.Context, id string, sig syscall.Signal, d time.Duration) error {
	err := r.ContainerRuntime.Stop(ctx, id, sig, d)
	r.c.step("runtime stop")
	return err
}

func (r crashRuntime) Delete(ctx context.Context, id string, force bool) error {
	err := r.ContainerRuntime.Delete(ctx, id, force)
	r.c.step("runtime delete")
	return err
}

// crashLifecycle is a pod's whole life, as kubelet drives it, with its
// logs under logDir.
func crashLifecycle(ctx context.Context, s *Server, logDir string) error {
	req := unitPod("crash", true)
	req.Config.LogDirectory = logDir
	pod, err := s.RunPodSandbox(ctx, req)
	if err != nil {
		return fmt.Errorf("RunPodSandbox: %w", err)
	}
	ctr, err := s.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod.PodSandboxId, Config: unitCtr("c"), SandboxConfig: req.Config})
	if err != nil {
		return fmt.Errorf("CreateContainer: %w", err)
	}
	if _, err := s.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		return fmt.Errorf("StartContainer: %w", err)
	}
	if _, err := s.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
		return fmt.Errorf("StopPodSandbox: %w", err)
	}
	if _, err := s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.PodSandboxId}); err != nil {
		return fmt.Errorf("RemovePodSandbox: %w", err)
	}
	return nil
}

// TestCrashAtEveryStep kills the daemon after each side effect of a pod's
// life in turn (RunPodSandbox, CreateContainer, StartContainer,
// StopPodSandbox, RemovePodSandbox), restarts it, removes whatever it
// lists over CRI, and requires that nothing is left: no pin, no network
// attachment, no shm, no rootfs, no runtime container, no directory, no
// ID range.
func TestCrashAtEveryStep(t *testing.T) {
	for at := 1; ; at++ {
		f := newCtrFixture(t)
		net := &cnitest.Fake{}
		shm := &fakeShm{mounted: map[string]bool{}}
		c := &crasher{at: at, hit: make(chan struct{}), never: make(chan struct{})}
		deps := Deps{
			Network: net, Namespaces: f.ns, IDs: f.srv.deps.IDs, Shm: shm, Images: f.images,
			Runtimes: map[string]ContainerRuntime{"runc": f.rt},
		}
		crashing := deps
		crashing.Network, crashing.Namespaces = crashNetwork{net, c}, crashNamespaces{f.ns, c}
		crashing.Shm, crashing.Images = crashShm{shm, c}, crashImages{f.images, c}
		crashing.Runtimes = map[string]ContainerRuntime{"runc": crashRuntime{f.rt, c}}
		old := newTestServer(t, f.cfg, crashing)
		old.Restore(context.Background())
		done := make(chan error, 1)
		finished := make(chan struct{})
		logDir := t.TempDir()
		go func() {
			done <- crashLifecycle(context.Background(), old, logDir)
			close(finished)
		}()
		// The frozen request resumes only once the test is over, and is
		// waited for: its writes must not race the removal of the dirs.
		t.Cleanup(func() {
			close(c.never)
			select {
			case <-finished:
			case <-time.After(10 * time.Second):
			}
		})
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("lifecycle without a crash: %v", err)
			}
			if at < 10 {
				t.Fatalf("only %d side effects in a pod's life", at-1)
			}
			return // every step has had its crash
		case <-c.hit:
			playDead(old)
		case <-time.After(10 * time.Second):
			t.Fatalf("crash %d: neither finished nor reached", at)
		}
		t.Run(fmt.Sprintf("%02d-after-%s", at, c.what), func(t *testing.T) {
			// A fresh allocator: the in-memory one died with the daemon.
			ids, err := nsmgr.NewAllocator(f.cfg.Userns.MinHostID, f.cfg.Userns.MaxHostID, f.cfg.Userns.MaxPods)
			if err != nil {
				t.Fatal(err)
			}
			deps.IDs = ids
			s := newTestServer(t, f.cfg, deps)
			ctx := context.Background()
			s.Restore(ctx)
			checkRestoredReady(t, s, net)
			removeEverything(t, s)
			f.srv = s
			f.nothingLeft(t)
			pf := &podFixture{srv: s, ns: f.ns, net: net, shm: shm, ids: ids, cfg: f.cfg}
			pf.assertNothingLeft(t)
		})
	}
}

// playDead stops what of the crashed server would still write to disk on
// its own, as a killed daemon does not: its exit watcher, which shares
// the exit files with the restarted one (the fake runtime is the same),
// and every status write. Without it the old server recorded the exit the
// new one's RemoveContainer caused, in the directory being removed.
func playDead(s *Server) {
	if s.exits.w != nil {
		_ = s.exits.w.Close()
	}
	for _, c := range s.containers.List() {
		c.Detach()
	}
	for _, sb := range s.sandboxes.List() {
		sb.Detach()
	}
}

// checkRestoredReady: a pod restored Ready is still attached to the
// network; a pod whose network was torn down is never Ready.
func checkRestoredReady(t *testing.T, s *Server, net *cnitest.Fake) {
	t.Helper()
	attached := net.Attached()
	for _, sb := range s.sandboxes.List() {
		if sb.Status().State != "ready" {
			continue
		}
		if _, ok := attached[sb.ID]; !ok {
			t.Errorf("pod %s restored Ready without its network", sb.ID)
		}
	}
}

func removeEverything(t *testing.T, s *Server) {
	t.Helper()
	ctx := context.Background()
	ctrs, err := s.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctrs.Containers {
		if _, err := s.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
			t.Errorf("RemoveContainer(%s): %v", c.Id, err)
		}
	}
	pods, err := s.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if _, err := s.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("RemovePodSandbox(%s): %v", p.Id, err)
		}
	}
}

// TestFailThenRestart fails one step of a pod's life with the fakes' error
// injection, restarts the daemon over the same state with the failure
// gone, and requires that removing what it lists leaves nothing.
func TestFailThenRestart(t *testing.T) {
	boom := fmt.Errorf("injected: %w", errdefs.ErrUnavailable)
	tests := []struct {
		name   string
		inject func(f *ctrFixture, net *cnitest.Fake)
	}{
		{"pin", func(f *ctrFixture, _ *cnitest.Fake) { f.ns.CreateErr = boom }},
		{"CNI ADD", func(_ *ctrFixture, n *cnitest.Fake) { n.SetupErr = boom }},
		{"rootfs mount", func(f *ctrFixture, _ *cnitest.Fake) { f.images.MountErr = boom }},
		{"runtime create", func(f *ctrFixture, _ *cnitest.Fake) { f.rt.CreateErr = boom }},
		{"runtime start", func(f *ctrFixture, _ *cnitest.Fake) { f.rt.StartErr = boom }},
		{"runtime stop", func(f *ctrFixture, _ *cnitest.Fake) { f.rt.StopErr = boom }},
		{"CNI DEL", func(_ *ctrFixture, n *cnitest.Fake) { n.TeardownErr = boom }},
		{"runtime delete", func(f *ctrFixture, _ *cnitest.Fake) { f.rt.DeleteErr = boom }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			net := &cnitest.Fake{}
			shm := &fakeShm{mounted: map[string]bool{}}
			deps := Deps{
				Network: net, Namespaces: f.ns, IDs: f.srv.deps.IDs, Shm: shm, Images: f.images,
				Runtimes: map[string]ContainerRuntime{"runc": f.rt},
			}
			old := newTestServer(t, f.cfg, deps)
			tc.inject(f, net)
			if err := crashLifecycle(context.Background(), old, t.TempDir()); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("lifecycle = %v, want the injected failure", err)
			}
			// The old daemon is dead: its exit watcher must not record
			// the new one's stops in the directories it removes.
			if old.exits.w != nil {
				_ = old.exits.w.Close()
			}
			f.ns.CreateErr, net.SetupErr, net.TeardownErr, f.images.MountErr = nil, nil, nil, nil
			f.rt.CreateErr, f.rt.StartErr, f.rt.StopErr, f.rt.DeleteErr = nil, nil, nil, nil
			ids, err := nsmgr.NewAllocator(f.cfg.Userns.MinHostID, f.cfg.Userns.MaxHostID, f.cfg.Userns.MaxPods)
			if err != nil {
				t.Fatal(err)
			}
			deps.IDs = ids
			s := newTestServer(t, f.cfg, deps)
			s.Restore(context.Background())
			checkRestoredReady(t, s, net)
			removeEverything(t, s)
			f.srv = s
			f.nothingLeft(t)
			(&podFixture{srv: s, ns: f.ns, net: net, shm: shm, ids: ids, cfg: f.cfg}).assertNothingLeft(t)
		})
	}
}

// A container that exits just as its status is asked: the runtime still
// said running, then conmon wrote the exit file and exited. That is an
// exit, not a dead monitor.
func TestMonitorExitedWithItsContainer(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("quick"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	// conmon is gone (as after it wrote the exit file), and the runtime
	// says stopped from the second read on.
	if err := os.WriteFile(filepath.Join(f.cfg.Root, "containers", id, "conmon.pid"), []byte(fmt.Sprint(os.Getpid())), 0o600); err != nil {
		t.Fatal(err)
	}
	f.rt.AfterState = func(cid string, st *oci.State) {
		if cid == id && st.Status == oci.StatusRunning {
			st.Status, st.ExitCode = oci.StatusStopped, 0
		}
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Status.Reason == reasonMonitorGone || st.Status.ExitCode != 0 {
		t.Errorf("status = %v %q exit %d, want EXITED with exit 0, not %s", st.Status.State, st.Status.Reason, st.Status.ExitCode, reasonMonitorGone)
	}
}

// An exit another path records (a stop, the exit watcher) while a
// refresh is asking the runtime stays as recorded: the refresh's older
// answer, running, does not bring the container back, and a monitor found
// dead afterwards does not turn the exit into MonitorGone.
func TestExitRecordedDuringRefreshStays(t *testing.T) {
	for _, tc := range []struct {
		name        string
		monitorDead bool
		atRead      int // the runtime read after which the exit is recorded
	}{
		{"runtime said running", false, 1},
		{"monitor found dead", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			pod, _ := f.pod(t, false)
			id := f.started(t, pod, "c")
			c, err := f.srv.containers.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if tc.monitorDead {
				f.rt.NoExitFiles = true
				if err := os.WriteFile(filepath.Join(f.cfg.Root, "containers", id, "conmon.pid"), []byte(fmt.Sprint(os.Getpid())), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			reads := 0
			f.rt.AfterState = func(cid string, _ *oci.State) {
				if cid != id {
					return
				}
				if reads++; reads == tc.atRead {
					if err := c.UpdateStatus(func(st *sandbox.ContainerStatus) {
						st.State, st.ExitCode, st.Reason, st.FinishedAt = sandbox.ContainerExited, 0, reasonCompleted, time.Now()
					}); err != nil {
						t.Error(err)
					}
				}
			}
			f.srv.refreshContainer(context.Background(), c, false)
			if reads < tc.atRead {
				t.Fatalf("the runtime was read %d times, want at least %d: the test checks nothing", reads, tc.atRead)
			}
			if st := c.Status(); st.State != sandbox.ContainerExited || st.ExitCode != 0 || st.Reason != reasonCompleted {
				t.Errorf("after the refresh: %v exit %d %q, want the exit recorded meanwhile (Exited 0 %s)", st.State, st.ExitCode, st.Reason, reasonCompleted)
			}
		})
	}
}

// A container whose conmon is gone (conmon.pid names a process that is not
// its monitor) cannot be started, and a live one is reported Exited with
// reason MonitorGone and killed, so its stop does not wait for an exit
// file nobody will write.
func TestMonitorGone(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	create := func(name string) string {
		resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr(name), SandboxConfig: podCfg})
		if err != nil {
			t.Fatal(err)
		}
		return resp.ContainerId
	}
	killMonitor := func(id string) {
		f.rt.NoExitFiles = true // a dead conmon writes none
		// This test process is nobody's conmon: its command line does not
		// name the container, as a recycled pid's would not.
		if err := os.WriteFile(filepath.Join(f.cfg.Root, "containers", id, "conmon.pid"), []byte(fmt.Sprint(os.Getpid())), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	created := create("created")
	// Created in the runtime (a start a crash cut short, or a record from
	// before containers were created there at their start).
	if _, err := f.rt.CreatePrepared(ctx, created); err != nil {
		t.Fatal(err)
	}
	c, _ := f.srv.containers.Get(created)
	if err := c.UpdateStatus(func(st *sandbox.ContainerStatus) { st.RuntimePending = false }); err != nil {
		t.Fatal(err)
	}
	killMonitor(created)
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("StartContainer without a monitor = %v, want FailedPrecondition", err)
	}

	running := create("running")
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: running}); err != nil {
		t.Fatal(err)
	}
	killMonitor(running)
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: running})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Status.Reason != reasonMonitorGone {
		t.Errorf("status without a monitor = %v %q, want EXITED %q", st.Status.State, st.Status.Reason, reasonMonitorGone)
	}
	if rs, err := f.rt.State(ctx, running); err != nil || rs.Status != oci.StatusStopped {
		t.Errorf("runtime state = %+v, %v; want the container killed", rs, err)
	}
	stopped := make(chan error, 1)
	go func() {
		_, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
		stopped <- err
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("StopPodSandbox = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("StopPodSandbox hangs on a container without a monitor")
	}
	removeEverything(t, f.srv)
	f.nothingLeft(t)
}
