package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni/cnitest"
	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/image/imagetest"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/nsmgr/nsmgrtest"
	"github.com/pinrt/pinrt/sandbox"
)

// fakeShm records shm mounts instead of mounting tmpfs.
type fakeShm struct {
	mu      sync.Mutex
	mounted map[string]bool
}

func (f *fakeShm) Mount(path string, uid, gid uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mounted[path] = true
	return nil
}

func (f *fakeShm) Unmount(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.mounted, path)
	return nil
}

type podFixture struct {
	srv *Server
	ns  *nsmgrtest.Manager
	net *cnitest.Fake
	shm *fakeShm
	ids *nsmgr.Allocator
	cfg *conf.Config
}

func newPodFixture(t *testing.T) *podFixture {
	t.Helper()
	cfg := conf.Default()
	cfg.Root, cfg.RunRoot = t.TempDir(), t.TempDir()
	ids, err := nsmgr.NewAllocator(cfg.Userns.MinHostID, cfg.Userns.MaxHostID, cfg.Userns.MaxPods)
	if err != nil {
		t.Fatal(err)
	}
	f := &podFixture{ns: nsmgrtest.New(cfg.RunRoot), net: &cnitest.Fake{}, shm: &fakeShm{mounted: map[string]bool{}}, ids: ids, cfg: cfg}
	f.srv = newTestServer(t, cfg, Deps{Network: f.net, Namespaces: f.ns, IDs: ids, Shm: f.shm, Images: &ctrImages{Fake: &imagetest.Fake{}, mounted: map[string]image.MountRequest{}}})
	return f
}

// unitPod is a pod config as kubelet sends it, optionally with a user
// namespace.
func unitPod(name string, userns bool) *runtimeapi.RunPodSandboxRequest {
	ns := &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}
	if userns {
		ns.UsernsOptions = &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD}
	}
	return &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "u-" + name},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: ns}},
	}}
}

// assertNothingLeft checks that a failed RunPodSandbox undid every step.
func (f *podFixture) assertNothingLeft(t *testing.T) {
	t.Helper()
	for _, d := range []string{filepath.Join(f.cfg.Root, "sandboxes"), filepath.Join(f.cfg.RunRoot, "sandboxes")} {
		if entries, _ := os.ReadDir(d); len(entries) > 0 {
			t.Errorf("%s still has %d entries", d, len(entries))
		}
	}
	if a := f.net.Attached(); len(a) > 0 {
		t.Errorf("pods still attached to the network: %v", a)
	}
	if len(f.shm.mounted) > 0 {
		t.Errorf("shm still mounted: %v", f.shm.mounted)
	}
	for _, c := range f.ns.Calls() {
		if c.Method == "Create" && len(f.ns.Pinned(c.ID)) > 0 {
			t.Errorf("pins of %s remain: %v", c.ID, f.ns.Pinned(c.ID))
		}
	}
	// The first block is free again: the allocator released the range.
	m, err := f.ids.Allocate("probe")
	if err != nil || m.HostID != f.cfg.Userns.MinHostID {
		t.Errorf("allocator after rollback gave %+v, %v; want the first block %d", m, err, f.cfg.Userns.MinHostID)
	}
	f.ids.Release("probe")
}

func TestRunPodSandboxRollback(t *testing.T) {
	tests := []struct {
		name   string
		inject func(f *podFixture)
		want   error
	}{
		{"namespaces fail", func(f *podFixture) { f.ns.CreateErr = fmt.Errorf("clone: %w", errdefs.ErrUnavailable) }, errdefs.ErrUnavailable},
		{"network fails", func(f *podFixture) { f.net.SetupErr = fmt.Errorf("bridge: %w", errdefs.ErrUnknown) }, errdefs.ErrUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newPodFixture(t)
			tc.inject(f)
			_, err := f.srv.RunPodSandbox(context.Background(), unitPod("p", true))
			if !errors.Is(err, tc.want) {
				t.Fatalf("RunPodSandbox = %v, want %v", err, tc.want)
			}
			f.assertNothingLeft(t)
			// The name is free again.
			f.ns.CreateErr, f.net.SetupErr = nil, nil
			if _, err := f.srv.RunPodSandbox(context.Background(), unitPod("p", true)); err != nil {
				t.Errorf("retry after rollback: %v", err)
			}
		})
	}
}

// The verbose status lists a pod's pins while it has them, and none once
// the stop removed them; so does its runtimeSpec, where node agents
// (Multus) look for the pod's network namespace as containerd and CRI-O
// give it.
func TestPodInfoPinsOnlyWhilePinned(t *testing.T) {
	f := newPodFixture(t)
	ctx := context.Background()
	req := unitPod("pins", true)
	req.Config.Hostname = "pins-host"
	resp, err := f.srv.RunPodSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	type podInfo struct {
		Pins        map[string]string `json:"pins"`
		RuntimeSpec *specs.Spec       `json:"runtimeSpec"`
		Pid         *int              `json:"pid"`
	}
	info := func() podInfo {
		t.Helper()
		st, err := f.srv.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		var info podInfo
		if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
			t.Fatal(err)
		}
		return info
	}
	pinned := f.ns.Pinned(resp.PodSandboxId)
	ready := info()
	if p := ready.Pins; p["net"] == "" || p["net"] != pinned[nsmgr.Net] {
		t.Errorf("Ready pod's pins = %v, want its pinned namespaces %v", p, pinned)
	}
	spec := ready.RuntimeSpec
	if spec == nil || spec.Linux == nil {
		t.Fatalf("Ready pod's runtimeSpec = %+v, want its namespaces", spec)
	}
	got := map[specs.LinuxNamespaceType]string{}
	for _, ns := range spec.Linux.Namespaces {
		got[ns.Type] = ns.Path
	}
	want := map[specs.LinuxNamespaceType]string{
		specs.NetworkNamespace: pinned[nsmgr.Net], specs.IPCNamespace: pinned[nsmgr.IPC],
		specs.UTSNamespace: pinned[nsmgr.UTS], specs.UserNamespace: pinned[nsmgr.User],
	}
	if !maps.Equal(got, want) {
		t.Errorf("runtimeSpec namespaces = %v, want the pins %v", got, want)
	}
	if len(spec.Linux.UIDMappings) != 1 || spec.Linux.UIDMappings[0].HostID != f.cfg.Userns.MinHostID || len(spec.Linux.GIDMappings) != 1 {
		t.Errorf("runtimeSpec ID mappings = %v / %v, want the allocated block", spec.Linux.UIDMappings, spec.Linux.GIDMappings)
	}
	if spec.Version == "" || spec.Hostname != "pins-host" || spec.Annotations[sandbox.AnnotationSandboxID] != resp.PodSandboxId || spec.Process != nil {
		t.Errorf("runtimeSpec = version %q, hostname %q, annotations %v, process %v", spec.Version, spec.Hostname, spec.Annotations, spec.Process)
	}
	if ready.Pid != nil {
		t.Errorf("pid = %d for a pod without a process of its own", *ready.Pid)
	}
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Fatal(err)
	}
	if stopped := info(); len(stopped.Pins) != 0 || stopped.RuntimeSpec != nil {
		t.Errorf("stopped pod's pins = %v, runtimeSpec = %+v, want neither", stopped.Pins, stopped.RuntimeSpec)
	}
}

func TestRunPodSandboxNamespaceKinds(t *testing.T) {
	f := newPodFixture(t)
	resp, err := f.srv.RunPodSandbox(context.Background(), unitPod("kinds", true))
	if err != nil {
		t.Fatal(err)
	}
	pins := f.ns.Pinned(resp.PodSandboxId)
	for _, k := range []nsmgr.Kind{nsmgr.User, nsmgr.Net, nsmgr.UTS} {
		if pins[k] == "" {
			t.Errorf("no %s pin: %v", k, pins)
		}
	}
	if pins[nsmgr.IPC] == "" {
		t.Errorf("no ipc pin: %v", pins)
	}
	if len(f.shm.mounted) != 1 {
		t.Errorf("shm mounts = %v, want the pod's one", f.shm.mounted)
	}
	st, err := f.srv.PodSandboxStatus(context.Background(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.Network.GetIp() != "10.89.0.2" {
		t.Errorf("IP = %q, want the fake's first address", st.Status.Network.GetIp())
	}
	u := st.Status.Linux.Namespaces.Options.UsernsOptions
	if u.Mode != runtimeapi.NamespaceMode_POD || len(u.Uids) != 1 || u.Uids[0].HostId != f.cfg.Userns.MinHostID || u.Uids[0].Length != 65536 {
		t.Errorf("userns options = %v, want the allocated first block", u)
	}
}

func TestStopAndRemoveAreIdempotent(t *testing.T) {
	f := newPodFixture(t)
	ctx := context.Background()
	resp, err := f.srv.RunPodSandbox(ctx, unitPod("idem", false))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.PodSandboxId
	for range 2 {
		if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if a := f.net.Attached(); len(a) != 0 {
		t.Errorf("still attached after stop: %v", a)
	}
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("second remove = %v, want success (api.proto)", err)
	}
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Errorf("stop of a removed pod = %v, want success", err)
	}
	f.assertNothingLeft(t)
}

func TestStopFailsCleanlyAndRetries(t *testing.T) {
	f := newPodFixture(t)
	ctx := context.Background()
	resp, err := f.srv.RunPodSandbox(ctx, unitPod("retry", false))
	if err != nil {
		t.Fatal(err)
	}
	f.net.TeardownErr = fmt.Errorf("plugin busy: %w", errdefs.ErrUnavailable)
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("stop with a failing teardown = %v, want Unavailable", err)
	}
	st, _ := f.srv.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId})
	// NotReady is recorded before the teardown starts, so a half-stopped
	// pod never reads as Ready; kubelet retries the stop of a NotReady pod
	// as of any other.
	if st.Status.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("state after a failed stop = %v, want NOTREADY", st.Status.State)
	}
	f.net.TeardownErr = nil
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId}); err != nil {
		t.Errorf("retried stop: %v", err)
	}
}

func TestPodRequestValidation(t *testing.T) {
	f := newPodFixture(t)
	mk := func(mut func(r *runtimeapi.RunPodSandboxRequest)) *runtimeapi.RunPodSandboxRequest {
		r := unitPod("v", false)
		mut(r)
		return r
	}
	tests := []struct {
		name string
		req  *runtimeapi.RunPodSandboxRequest
		want error
	}{
		{"nil config", &runtimeapi.RunPodSandboxRequest{}, errdefs.ErrInvalidArgument},
		{"namespace with slash", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Metadata.Namespace = "a/b" }), errdefs.ErrInvalidArgument},
		{"uid with newline", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Metadata.Uid = "a\nb" }), errdefs.ErrInvalidArgument},
		{"name breaking CNI_ARGS", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Metadata.Name = "a;K8S_POD_NAMESPACE=kube-system" }), errdefs.ErrInvalidArgument},
		{"uid with '='", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Metadata.Uid = "=" }), errdefs.ErrInvalidArgument},
		{"log dir too long", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.LogDirectory = strings.Repeat("/d", 2048) }), errdefs.ErrInvalidArgument},
		{"unclean log dir", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.LogDirectory = "/var/log/../etc" }), errdefs.ErrInvalidArgument},
		{"log dir with ':'", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.LogDirectory = "/var/log/pods/a:b" }), errdefs.ErrInvalidArgument},
		{"hostname with space", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Hostname = "a b" }), errdefs.ErrInvalidArgument},
		{"net sysctl on host network", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
			r.Config.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "1"}
		}), errdefs.ErrInvalidArgument},
		{"userns with host network", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.Linux.SecurityContext.NamespaceOptions.Network = runtimeapi.NamespaceMode_NODE
			r.Config.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD}
		}), errdefs.ErrInvalidArgument},
		{"mappings without userns", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.Linux.SecurityContext.NamespaceOptions.UsernsOptions = &runtimeapi.UserNamespace{
				Mode: runtimeapi.NamespaceMode_NODE, Uids: []*runtimeapi.IDMapping{{HostId: 65536, Length: 65536}},
			}
		}), errdefs.ErrInvalidArgument},
		{"pid target", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_TARGET
		}), errdefs.ErrInvalidArgument},
		// Hostile values that would add lines to resolv.conf, hosts or
		// hostname, or reach procfs and the portmap plugin.
		{"DNS option with a nameserver line", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.DnsConfig = &runtimeapi.DNSConfig{Options: []string{"ndots:5\nnameserver 6.6.6.6"}}
		}), errdefs.ErrInvalidArgument},
		{"DNS search with a space", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.DnsConfig = &runtimeapi.DNSConfig{Searches: []string{"a options rotate"}}
		}), errdefs.ErrInvalidArgument},
		{"DNS server not an IP", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.DnsConfig = &runtimeapi.DNSConfig{Servers: []string{"dns.example"}}
		}), errdefs.ErrInvalidArgument},
		{"hostname with newline", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Hostname = "a\n6.6.6.6 evil" }), errdefs.ErrInvalidArgument},
		{"hostname with underscore", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Hostname = "a_b" }), errdefs.ErrInvalidArgument},
		{"hostname too long", mk(func(r *runtimeapi.RunPodSandboxRequest) { r.Config.Hostname = strings.Repeat("h", 65) }), errdefs.ErrInvalidArgument},
		{"sysctl value with newline", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.Linux.Sysctls = map[string]string{"net.ipv4.ip_forward": "1\n"}
		}), errdefs.ErrInvalidArgument},
		{"unknown port protocol", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.PortMappings = []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol(7), ContainerPort: 80}}
		}), errdefs.ErrInvalidArgument},
		{"container port 0", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 0, HostPort: 8080}}
		}), errdefs.ErrInvalidArgument},
		{"host port too big", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 80, HostPort: 65536}}
		}), errdefs.ErrInvalidArgument},
		{"host_ip not an IP", mk(func(r *runtimeapi.RunPodSandboxRequest) {
			r.Config.PortMappings = []*runtimeapi.PortMapping{{ContainerPort: 80, HostPort: 8080, HostIp: "0.0.0.0 --evil"}}
		}), errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := f.srv.RunPodSandbox(context.Background(), tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("RunPodSandbox = %v, want %v", err, tc.want)
			}
			if calls := f.ns.Calls(); len(calls) != 0 {
				t.Errorf("namespaces touched for an invalid request: %v", calls)
			}
		})
	}
}

// api.proto: StopPodSandbox, RemovePodSandbox, StopContainer and
// RemoveContainer of an ID that does not exist must not return an error.
// An ID that is not in ID syntax is still refused as a caller bug.
func TestStopAndRemoveOfUnknownIDs(t *testing.T) {
	f := newPodFixture(t)
	ctx := context.Background()
	calls := map[string]func(id string) error{
		"StopPodSandbox": func(id string) error {
			_, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
			return err
		},
		"RemovePodSandbox": func(id string) error {
			_, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
			return err
		},
		"StopContainer": func(id string) error {
			_, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id})
			return err
		},
		"RemoveContainer": func(id string) error {
			_, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		},
	}
	for _, tc := range []struct {
		name string
		id   string
		want error
	}{
		{"unknown full ID", strings.Repeat("ab", 32), nil},
		{"unknown prefix", "0123abcd", nil},
		{"empty", "", errdefs.ErrInvalidArgument},
		{"path", "../etc", errdefs.ErrInvalidArgument},
		{"newline", "abc\ndef", errdefs.ErrInvalidArgument},
	} {
		for rpc, call := range calls {
			t.Run(tc.name+"/"+rpc, func(t *testing.T) {
				err := call(tc.id)
				if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
					t.Errorf("%s(%q) = %v, want %v", rpc, tc.id, err, tc.want)
				}
			})
		}
	}
}

// Pods whose metadata differ only in where an underscore falls are
// different pods, not an AlreadyExists collision.
func TestPodNamesWithUnderscoresDoNotCollide(t *testing.T) {
	f := newPodFixture(t)
	ctx := context.Background()
	for _, md := range []*runtimeapi.PodSandboxMetadata{
		{Name: "x_y", Namespace: "z", Uid: "u"},
		{Name: "x", Namespace: "y_z", Uid: "u"},
		{Name: "x", Namespace: "y", Uid: "z_u"},
	} {
		req := unitPod("p", false)
		req.Config.Metadata = md
		if _, err := f.srv.RunPodSandbox(ctx, req); err != nil {
			t.Errorf("RunPodSandbox(%v) = %v, want success", md, err)
		}
	}
	req := unitPod("p", false)
	req.Config.Metadata = &runtimeapi.PodSandboxMetadata{Name: "x_y", Namespace: "z", Uid: "u"}
	if _, err := f.srv.RunPodSandbox(ctx, req); !errdefs.IsAlreadyExists(err) {
		t.Errorf("true duplicate = %v, want AlreadyExists", err)
	}
}

// TestOneNetworkTeardownPerPod: a pod's CNI DEL runs once, in the first
// successful stop; Remove after it does not run DEL again. A pod restored
// NotReady after a reboot, whose DEL never ran, still gets one.
func TestOneNetworkTeardownPerPod(t *testing.T) {
	teardowns := func(net *cnitest.Fake) int {
		n := 0
		for _, c := range net.Calls() {
			if c.Op == "Teardown" {
				n++
			}
		}
		return n
	}
	tests := []struct {
		name   string
		stops  int
		reboot bool
	}{
		{"stop then remove", 1, false},
		{"two stops then remove", 2, false},
		{"remove without stop", 0, false},
		{"restored after a reboot, then stop and remove", 1, true},
		{"restored after a reboot, then remove", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newPodFixture(t)
			ctx := context.Background()
			resp, err := f.srv.RunPodSandbox(ctx, unitPod("once", false))
			if err != nil {
				t.Fatal(err)
			}
			id := resp.PodSandboxId
			srv, net := f.srv, f.net
			if tc.reboot {
				// A new daemon on the same root, with the pins gone.
				net = &cnitest.Fake{}
				srv = newTestServer(t, f.cfg, Deps{Network: net, Namespaces: nsmgrtest.New(t.TempDir()), IDs: f.ids, Shm: f.shm, Images: &ctrImages{Fake: &imagetest.Fake{}, mounted: map[string]image.MountRequest{}}})
				srv.Restore(ctx)
				st, err := srv.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
				if err != nil || st.Status.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
					t.Fatalf("restored pod = %v, %v; want NOTREADY", st, err)
				}
			}
			for range tc.stops {
				if _, err := srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
				t.Fatal(err)
			}
			if n := teardowns(net); n != 1 {
				t.Errorf("CNI teardowns = %d, want 1: %+v", n, net.Calls())
			}
		})
	}
}
