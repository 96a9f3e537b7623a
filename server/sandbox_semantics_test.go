package server

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/oci/ocitest"
	"github.com/pinrt/pinrt/sandbox"
)

// Labels and annotations come back in every List response; a pod or
// container with more than the API server's 256 KiB is refused, so a List
// response stays under the gRPC message limit.
func TestLabelsAndAnnotationsAreBounded(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	over := map[string]string{"big": strings.Repeat("x", validate.MaxMetadataBytes)}
	under := map[string]string{"big": strings.Repeat("x", validate.MaxMetadataBytes-len("big")-len("app")-len("web"))}
	for _, tc := range []struct {
		name        string
		labels, ann map[string]string
		want        error
	}{
		{"annotations over", map[string]string{"app": "web"}, over, errdefs.ErrInvalidArgument},
		{"labels over", over, nil, errdefs.ErrInvalidArgument},
		{"exactly at the bound", map[string]string{"app": "web"}, under, nil},
	} {
		t.Run(tc.name+"/pod", func(t *testing.T) {
			req := unitPod("big-"+strings.ReplaceAll(tc.name, " ", "-"), false)
			req.Config.Labels, req.Config.Annotations = tc.labels, tc.ann
			_, err := f.srv.RunPodSandbox(ctx, req)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("RunPodSandbox = %v, want %v", err, tc.want)
			}
		})
		t.Run(tc.name+"/container", func(t *testing.T) {
			cfg := unitCtr("c-" + strings.ReplaceAll(tc.name, " ", "-"))
			cfg.Labels, cfg.Annotations = tc.labels, tc.ann
			_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("CreateContainer = %v, want %v", err, tc.want)
			}
		})
	}
}

func usernsPod(name string, hostID, length uint32) *runtimeapi.RunPodSandboxRequest {
	req := unitPod(name, true)
	m := []*runtimeapi.IDMapping{{HostId: hostID, ContainerId: 0, Length: length}}
	req.Config.Linux.SecurityContext.NamespaceOptions.UsernsOptions.Uids = m
	req.Config.Linux.SecurityContext.NamespaceOptions.UsernsOptions.Gids = m
	return req
}

// Caller mappings valid for the kernel are accepted (critest sends host
// ID 1000, length 100000); one overlapping a live pod's range is refused
// naming that pod and range, also after a restart, which rebuilds the
// allocator from the records.
func TestCallerUsernsMappings(t *testing.T) {
	f := newPodFixture(t)
	ctx := context.Background()
	resp, err := f.srv.RunPodSandbox(ctx, usernsPod("critest", 1000, 100000))
	if err != nil {
		t.Fatalf("RunPodSandbox with host ID 1000, length 100000: %v", err)
	}
	first := resp.PodSandboxId
	st, err := f.srv.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: first})
	if err != nil {
		t.Fatal(err)
	}
	if u := st.Status.Linux.Namespaces.Options.UsernsOptions.Uids; len(u) != 1 || u[0].HostId != 1000 || u[0].Length != 100000 {
		t.Errorf("status mappings = %v, want host 1000 length 100000", u)
	}
	if _, err := f.srv.RunPodSandbox(ctx, usernsPod("odd", 300000, 12345)); err != nil {
		t.Errorf("unaligned caller range of 12345 IDs: %v", err)
	}
	// An allocated pod steps around both.
	if _, err := f.srv.RunPodSandbox(ctx, unitPod("alloc", true)); err != nil {
		t.Fatalf("allocated pod: %v", err)
	}

	check := func(srv *Server) {
		t.Helper()
		_, err := srv.RunPodSandbox(ctx, usernsPod("clash", 100000, 30000))
		want := "overlap the range of pod " + first + " (host uids 1000-100999)"
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "host uids 100000-129999") {
			t.Errorf("overlapping caller range = %v, want InvalidArgument containing %q", err, want)
		}
	}
	check(f.srv)

	// A restarted daemon rebuilds the allocator from the records.
	ids, err := nsmgr.NewAllocator(f.cfg.Userns.MinHostID, f.cfg.Userns.MaxHostID, f.cfg.Userns.MaxPods)
	if err != nil {
		t.Fatal(err)
	}
	srv := newTestServer(t, f.cfg, Deps{Network: f.net, Namespaces: f.ns, IDs: ids, Shm: f.shm, Images: f.srv.deps.Images})
	srv.Restore(ctx)
	check(srv)
	if _, err := srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: first}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.RunPodSandbox(ctx, usernsPod("clash", 100000, 30000)); err != nil {
		t.Errorf("range free again after the pod's removal: %v", err)
	}
}

// gatedRuntime holds Prepare until release is closed, after telling
// entered; it makes a CreateContainer that is mid-way deterministic.
type gatedRuntime struct {
	*ocitest.Runtime
	entered, release chan struct{}
}

func (g *gatedRuntime) Prepare(o oci.CreateOptions) error {
	close(g.entered)
	<-g.release
	return g.Runtime.Prepare(o)
}

// gatedNetwork holds Teardown the same way: a StopPodSandbox mid-way.
type gatedNetwork struct {
	Network
	entered, release chan struct{}
}

func (g *gatedNetwork) Teardown(ctx context.Context, pod cni.Pod) error {
	close(g.entered)
	<-g.release
	return g.Network.Teardown(ctx, pod)
}

// recv waits a bounded time for ch: a regression must fail, not hang.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not happen within 10s", what)
	}
	var zero T
	return zero
}

// returned reports whether ch delivered within a short wait.
func returned(ch <-chan error) bool {
	select {
	case <-ch:
		return true
	case <-time.After(100 * time.Millisecond):
		return false
	}
}

// A RemovePodSandbox that arrives while CreateContainer is mid-way waits
// for it and then removes the new container too: nothing outlives the pod.
func TestRemovePodWaitsForCreateContainer(t *testing.T) {
	for _, rpc := range []string{"stop", "remove"} {
		t.Run(rpc, func(t *testing.T) {
			f := newCtrFixture(t)
			ctx := context.Background()
			pod, podCfg := f.pod(t, false)
			g := &gatedRuntime{Runtime: f.rt, entered: make(chan struct{}), release: make(chan struct{})}
			f.srv.deps.Runtimes["runc"] = g
			created := make(chan error, 1)
			go func() {
				_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c"), SandboxConfig: podCfg})
				created <- err
			}()
			recv(t, g.entered, "runtime create")
			done := make(chan error, 1)
			go func() {
				var err error
				if rpc == "stop" {
					_, err = f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
				} else {
					_, err = f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
				}
				done <- err
			}()
			if returned(done) {
				t.Fatalf("%s returned while CreateContainer was still running", rpc)
			}
			close(g.release)
			if err := recv(t, created, "CreateContainer"); err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			if err := recv(t, done, rpc); err != nil {
				t.Fatalf("%s: %v", rpc, err)
			}
			if rpc == "stop" {
				for _, c := range f.srv.containers.List() {
					if c.Status().State != sandbox.ContainerExited {
						t.Errorf("container %s is %s after its pod stopped", c.ID, c.Status().State)
					}
				}
				if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
					t.Fatal(err)
				}
			}
			f.nothingLeft(t)
		})
	}
}

// A CreateContainer that found the pod before a StopPodSandbox or
// RemovePodSandbox finished re-checks it under the pod's lock and is
// refused: FailedPrecondition for a stopped pod, NotFound for a removed one.
// RemovePodSandbox stops the pod first and may release the lock between
// the two steps, so a create racing it sees either.
func TestCreateContainerRechecksPodUnderLock(t *testing.T) {
	for _, tc := range []struct {
		rpc  string
		want []error
	}{{"stop", []error{errdefs.ErrFailedPrecondition}}, {"remove", []error{errdefs.ErrNotFound, errdefs.ErrFailedPrecondition}}} {
		t.Run(tc.rpc, func(t *testing.T) {
			f := newCtrFixture(t)
			ctx := context.Background()
			pod, podCfg := f.pod(t, false)
			g := &gatedNetwork{Network: f.srv.deps.Network, entered: make(chan struct{}), release: make(chan struct{})}
			f.srv.deps.Network = g
			done := make(chan error, 1)
			go func() {
				var err error
				if tc.rpc == "stop" {
					_, err = f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
				} else {
					_, err = f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
				}
				done <- err
			}()
			recv(t, g.entered, "network teardown") // the pod is still Ready and in the store
			created := make(chan error, 1)
			go func() {
				_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c"), SandboxConfig: podCfg})
				created <- err
			}()
			if returned(created) {
				t.Fatalf("CreateContainer returned while the pod's %s held its lock", tc.rpc)
			}
			close(g.release)
			if err := recv(t, done, tc.rpc); err != nil {
				t.Fatalf("%s: %v", tc.rpc, err)
			}
			err := recv(t, created, "CreateContainer")
			if !slices.ContainsFunc(tc.want, func(w error) bool { return errors.Is(err, w) }) {
				t.Errorf("CreateContainer = %v, want one of %v", err, tc.want)
			}
			f.nothingLeft(t)
		})
	}
}

// A container's directory, which holds its rootfs mount, is closed to
// other host users; a userns pod's root reaches it through the group.
func TestContainerDirIsPrivate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		userns bool
		mode   os.FileMode
	}{{"host userns", false, 0o700}, {"pod userns", true, 0o710}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			pod, podCfg := f.pod(t, tc.userns)
			resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c"), SandboxConfig: podCfg})
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(f.srv.containerDir(resp.ContainerId))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != tc.mode {
				t.Errorf("container dir mode = %v, want %v", fi.Mode().Perm(), tc.mode)
			}
			if os.Geteuid() != 0 || !tc.userns {
				return
			}
			sb, _ := f.srv.sandboxes.Get(pod)
			if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != rootOf(sb.GIDMappings) {
				t.Errorf("container dir group = %d, want the pod's root %d", gid, rootOf(sb.GIDMappings))
			}
		})
	}
}

// Without a hostname from kubelet the pod name is made into one; the
// result always passes the hostname rule.
func TestHostnameFromName(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"web-0", "web-0"},
		{"x_y", "x-y"},
		{"a..b", "a-b"},
		{"-édge-", "dge"},
		{strings.Repeat("n", 70), strings.Repeat("n", 63)},
	} {
		got := hostnameFromName(tc.name)
		if got != tc.want {
			t.Errorf("hostnameFromName(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if err := validate.Hostname(got); err != nil {
			t.Errorf("hostnameFromName(%q) = %q is not a valid hostname: %v", tc.name, got, err)
		}
	}
}
