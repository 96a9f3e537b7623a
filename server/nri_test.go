package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	nriapi "github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/nri/nritest"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/oci/ocitest"
)

func newNRIFixture(t *testing.T) (*ctrFixture, *nritest.Fake) {
	t.Helper()
	f := newCtrFixture(t)
	fake := &nritest.Fake{}
	f.srv.SetNRI(fake)
	return f, fake
}

func TestNRILifecycleEvents(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	id := f.started(t, pod, "c")
	if _, err := f.srv.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	// A repeated stop of a stopped container is no new event.
	if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"RunPodSandbox p", "CreateContainer c", "PostCreateContainer c", "StartContainer c", "PostStartContainer c",
		"UpdateContainer c", "PostUpdateContainer c", "StopContainer c", "RemoveContainer c",
		"StopPodSandbox p", "RemovePodSandbox p",
	}
	if got := fake.Events(); !slices.Equal(got, want) {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := fake.Blocked(); n != 0 {
		t.Errorf("%d BlockSync holders left", n)
	}
}

func TestNRICreateAdjustment(t *testing.T) {
	f, fake := newNRIFixture(t)
	pod, _ := f.pod(t, true)
	fake.Adjust = &nriapi.ContainerAdjustment{}
	fake.Adjust.AddEnv("FROM_PLUGIN", "1")
	fake.Adjust.AddRlimit("RLIMIT_NOFILE", 100, 50)
	resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	spec := f.rt.Specs[resp.ContainerId]
	if !slices.Contains(spec.Process.Env, "FROM_PLUGIN=1") {
		t.Errorf("env = %q", spec.Process.Env)
	}
	if len(spec.Process.Rlimits) != 1 || spec.Process.Rlimits[0].Soft != 50 {
		t.Errorf("rlimits = %+v", spec.Process.Rlimits)
	}
}

// A plugin's device and bind mount in a userns pod come out as the pod's
// user namespace needs them (oci.ApplyNRIAdjustment has the details).
func TestNRICreateAdjustmentUserNS(t *testing.T) {
	f, fake := newNRIFixture(t)
	f.rt.FeaturesResult = &oci.Features{IDMapMounts: true}
	pod, _ := f.pod(t, true)
	share := t.TempDir()
	fake.Adjust = &nriapi.ContainerAdjustment{}
	fake.Adjust.AddDevice(&nriapi.LinuxDevice{Path: "/dev/nri-null", Type: "c", Major: 1, Minor: 3})
	fake.Adjust.AddMount(&nriapi.Mount{Destination: "/nri", Source: share, Type: "bind", Options: []string{"rbind", "ro"}})
	resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	spec := f.rt.Specs[resp.ContainerId]
	mounts := map[string]specs.Mount{}
	for _, m := range spec.Mounts {
		mounts[m.Destination] = m
	}
	if m, ok := mounts["/dev/nri-null"]; !ok || m.Source != "/dev/null" {
		t.Errorf("/dev/nri-null mount = %+v, want a bind of the host's /dev/null", m)
	}
	if m := mounts["/nri"]; len(m.UIDMappings) == 0 || len(m.GIDMappings) == 0 {
		t.Errorf("/nri mount = %+v, want the pod's mappings", m)
	}

	// Without idmapped mounts the plugin's bind is refused, leaving nothing.
	f.rt.FeaturesResult = &oci.Features{}
	_, err = f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("d")})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "/nri") {
		t.Fatalf("err = %v, want FailedPrecondition naming /nri", err)
	}
}

func TestNRICreateRefused(t *testing.T) {
	tests := []struct {
		name   string
		inject func(fake *nritest.Fake)
		want   error
		msg    string
		// undone: plugins saw the create and are told it is gone.
		undone bool
	}{
		{"plugin refuses", func(fake *nritest.Fake) {
			fake.CreateErr = fmt.Errorf("plugin \"10-picky\" said no: %w", errdefs.ErrFailedPrecondition)
		}, errdefs.ErrFailedPrecondition, `10-picky`, false},
		{"namespace move", func(fake *nritest.Fake) {
			fake.Adjust = &nriapi.ContainerAdjustment{}
			fake.Adjust.AddOrReplaceNamespace(&nriapi.LinuxNamespace{Type: "network", Path: "/proc/1/ns/net"})
		}, errdefs.ErrInvalidArgument, "namespaces", true},
		{"checked before it is applied", func(fake *nritest.Fake) {
			fake.Check = true
			fake.Adjust = &nriapi.ContainerAdjustment{}
			fake.Adjust.AddRlimit("RLIMIT_BOGUS", 1, 1)
		}, errdefs.ErrInvalidArgument, "RLIMIT_BOGUS", false},
		{"cgroups path of another driver", func(fake *nritest.Fake) {
			fake.Check = true
			fake.Adjust = &nriapi.ContainerAdjustment{}
			fake.Adjust.SetLinuxCgroupsPath("system.slice:nri:moved")
		}, errdefs.ErrInvalidArgument, `"system.slice:nri:moved"`, false},
		{"root cgroup", func(fake *nritest.Fake) {
			fake.Adjust = &nriapi.ContainerAdjustment{}
			fake.Adjust.SetLinuxCgroupsPath("/")
		}, errdefs.ErrInvalidArgument, `cgroups path "/"`, true},
		{"the pod's cgroup", func(fake *nritest.Fake) {
			fake.Adjust = &nriapi.ContainerAdjustment{}
			fake.Adjust.SetLinuxCgroupsPath("/pinrt")
		}, errdefs.ErrInvalidArgument, `cgroups path "/pinrt"`, true},
		{"leave the user namespace", func(fake *nritest.Fake) {
			fake.Adjust = &nriapi.ContainerAdjustment{}
			fake.Adjust.RemoveNamespace(&nriapi.LinuxNamespace{Type: "user"})
		}, errdefs.ErrInvalidArgument, "namespaces", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, fake := newNRIFixture(t)
			pod, _ := f.pod(t, true)
			tc.inject(fake)
			_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			f.nothingLeft(t)
			if got := slices.Contains(fake.Events(), "RemoveContainer c"); got != tc.undone {
				t.Errorf("plugins told of the removal: %v, want %v (%q)", got, tc.undone, fake.Events())
			}
			if n := fake.Blocked(); n != 0 {
				t.Errorf("%d BlockSync holders left", n)
			}
			*fake = nritest.Fake{}
			if _, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")}); err != nil {
				t.Fatalf("the same name after the refusal: %v", err)
			}
		})
	}
}

func TestNRIRunPodRefused(t *testing.T) {
	f, fake := newNRIFixture(t)
	fake.RunPodErr = fmt.Errorf("plugin \"20-pods\": no: %w", errdefs.ErrFailedPrecondition)
	_, err := f.srv.RunPodSandbox(context.Background(), unitPod("p", false))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "20-pods") {
		t.Fatalf("err = %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(f.cfg.Root, "sandboxes")); len(entries) > 0 {
		t.Errorf("%d sandbox dirs left", len(entries))
	}
	if n := len(f.srv.sandboxes.List()); n != 0 {
		t.Errorf("%d pods in the store", n)
	}
}

// podCgroups records the pod cgroups a server removes, around the real
// cgroupfs driver's paths (removing one that is not there succeeds).
type podCgroups struct {
	cgroups.Driver
	mu      sync.Mutex
	removed []string
}

func (d *podCgroups) RemovePod(ctx context.Context, kubeletParent, sandboxID string) error {
	d.mu.Lock()
	d.removed = append(d.removed, sandboxID)
	d.mu.Unlock()
	return d.Driver.RemovePod(ctx, kubeletParent, sandboxID)
}

// A pod with a shared PID namespace gets its pause process, whose cgroup
// creation makes the pod cgroup, before NRI's RunPodSandbox: a refusal
// must remove that cgroup too, not only the infra process (critest's
// "should fail RunPodSandbox and clean up when the NRI hook errors" left
// one behind per run).
func TestNRIRunPodRefusedRemovesPodCgroup(t *testing.T) {
	f, fake := newNRIFixture(t)
	real, err := cgroups.New(cgroups.DriverCgroupfs, "/pinrt-unit-"+newID()[:8])
	if err != nil {
		t.Fatal(err)
	}
	drv := &podCgroups{Driver: real}
	f.srv.deps.CgroupDriver = drv
	// The pause rootfs as prepared: the test binary, which the fake
	// runtime never runs, need not be static.
	f.srv.pause.path = t.TempDir()
	fake.RunPodErr = fmt.Errorf("plugin \"00-refuse\": no: %w", errdefs.ErrFailedPrecondition)
	req := unitPod("p", false)
	req.Config.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
	if _, err := f.srv.RunPodSandbox(context.Background(), req); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "00-refuse") {
		t.Fatalf("RunPodSandbox: err = %v, want the plugin's refusal", err)
	}
	var infra string
	for _, c := range f.rt.Calls {
		if id, ok := strings.CutPrefix(c, "create "); ok {
			infra = id
		}
	}
	if infra == "" {
		t.Fatalf("no infra process was created (calls %v): the pod did not reach the step that makes its cgroup", f.rt.Calls)
	}
	// The infra process's ID is the pod's.
	if !slices.Equal(drv.removed, []string{infra}) {
		t.Errorf("pod cgroups removed: %v, want the refused pod's, %s", drv.removed, infra)
	}
	if n := len(f.srv.sandboxes.List()); n != 0 {
		t.Errorf("%d pods in the store", n)
	}
}

func TestNRISnapshotAndUpdates(t *testing.T) {
	f, _ := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	var ids []string
	for _, name := range []string{"a", "b"} {
		resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr(name)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.ContainerId)
	}
	pods, ctrs, err := f.srv.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].GetId() != pod || pods[0].GetName() != "p" {
		t.Errorf("pods = %v", pods)
	}
	if len(ctrs) != 2 || ctrs[0].GetPodSandboxId() != pod || ctrs[0].GetState() != nriapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("containers = %v", ctrs)
	}

	up := &nriapi.ContainerUpdate{}
	up.SetContainerId(ids[0])
	up.SetLinuxCPUShares(777)
	gone := &nriapi.ContainerUpdate{}
	gone.SetContainerId("ffff")
	gone.SetLinuxCPUShares(1)
	ignored := &nriapi.ContainerUpdate{}
	ignored.SetContainerId("eeee")
	ignored.SetLinuxCPUShares(1)
	ignored.SetIgnoreFailure()
	failed, err := f.srv.UpdateContainers(ctx, []*nriapi.ContainerUpdate{up, gone, ignored})
	if len(failed) != 1 || failed[0].GetContainerId() != "ffff" || !errdefs.IsNotFound(err) {
		t.Errorf("failed = %v, err = %v; want only ffff, not found", failed, err)
	}
	if r := f.rt.Resources[ids[0]]; r == nil || r.CPU == nil || r.CPU.Shares == nil || *r.CPU.Shares != 777 {
		t.Errorf("resources of %s = %+v, want the plugin's shares", ids[0], r)
	}
}

// A plugin's answer to UpdateContainer replaces the requested limits.
func TestNRIUpdateReplaced(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	id := f.started(t, pod, "c")
	up := &nriapi.ContainerUpdate{}
	up.SetContainerId(id)
	up.SetLinuxCPUShares(999)
	fake.UpdateReply = []*nriapi.ContainerUpdate{up}
	if _, err := f.srv.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512}}); err != nil {
		t.Fatal(err)
	}
	if r := f.rt.Resources[id]; r == nil || r.CPU == nil || r.CPU.Shares == nil || *r.CPU.Shares != 999 {
		t.Errorf("resources = %+v, want the plugin's 999 shares", r)
	}
}

// A plugin's memory limit in its answer to UpdateContainer keeps swap
// off where the request had it off: the plugins see the request's limits,
// without the swap limit pinrt gives a memory limit, and a swap limit
// equal to the memory (kubelet's on cgroup v1) would otherwise stay below
// a raised one. Where the kernel does not account swap, none is set.
func TestNRIUpdateMemoryKeepsSwapOff(t *testing.T) {
	accounted := oci.ProbeHost().SwapController
	for _, tc := range []struct {
		name                string
		reqSwap, pluginSwap int64 // 0: none
		want                int64 // where swap is accounted; 0: none
	}{
		{"no swap limit asked", 0, 0, 128 << 20},
		{"swap off as kubelet asks", 64 << 20, 0, 128 << 20},
		{"swap allowed", 256 << 20, 0, 256 << 20},
		{"the plugin's swap limit", 0, 512 << 20, 512 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, fake := newNRIFixture(t)
			ctx := context.Background()
			pod, _ := f.pod(t, false)
			id := f.started(t, pod, "c")
			up := &nriapi.ContainerUpdate{}
			up.SetContainerId(id)
			up.SetLinuxMemoryLimit(128 << 20)
			if tc.reqSwap != 0 {
				up.SetLinuxMemorySwap(tc.reqSwap) // the request's, as the plugins got it
			}
			if tc.pluginSwap != 0 {
				up.SetLinuxMemorySwap(tc.pluginSwap)
			}
			fake.UpdateReply = []*nriapi.ContainerUpdate{up}
			req := &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: tc.reqSwap}
			if _, err := f.srv.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: req}); err != nil {
				t.Fatal(err)
			}
			m := f.rt.Resources[id].Memory
			if m == nil || m.Limit == nil || *m.Limit != 128<<20 {
				t.Fatalf("memory = %+v, want the plugin's 128 MiB", m)
			}
			want := tc.want
			if !accounted {
				want = max(tc.reqSwap, tc.pluginSwap)
			}
			if got := m.Swap; (want == 0) != (got == nil) || (got != nil && *got != want) {
				t.Errorf("swap limit %v, want %d (0: none)", got, want)
			}
		})
	}
}

func TestNRIEviction(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("victim")})
	if err != nil {
		t.Fatal(err)
	}
	victim := resp.ContainerId
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: victim}); err != nil {
		t.Fatal(err)
	}
	fake.Evict = []*nriapi.ContainerEviction{{ContainerId: victim, Reason: "test"}}
	if _, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("newcomer")}); err != nil {
		t.Fatal(err)
	}
	c, err := f.srv.containers.Get(victim)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(fake.Events(), "StopContainer victim") {
		if time.Now().After(deadline) {
			t.Fatalf("evicted container is %s; events %q", c.Status().State, fake.Events())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A container that exits on its own is a StopContainer to plugins too.
func TestNRIExitIsStop(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Kill(ctx, resp.ContainerId, 9, false); err != nil {
		t.Fatal(err)
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("status = %v, %v", st, err)
	}
	// The exit watcher records the exit, then tells the plugins: the
	// event may trail the status by a moment.
	var stops int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		stops = 0
		for _, e := range fake.Events() {
			if e == "StopContainer c" {
				stops++
			}
		}
		if stops > 0 || time.Now().After(deadline) {
			break
		}
	}
	if stops != 1 {
		t.Errorf("plugins saw %d StopContainer for one exit: %q", stops, fake.Events())
	}
}

func TestNRIUpdatePodSandbox(t *testing.T) {
	f, fake := newNRIFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	req := &runtimeapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: pod,
		Overhead:     &runtimeapi.LinuxContainerResources{CpuShares: 10},
		Resources:    &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 64 << 20},
	}
	if _, err := f.srv.UpdatePodSandboxResources(ctx, req); err != nil {
		t.Fatal(err)
	}
	want := []string{"RunPodSandbox p", "UpdatePodSandbox p", "PostUpdatePodSandbox p"}
	if got := fake.Events(); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if r := fake.PodResources; r.GetCpu().GetShares().GetValue() != 512 || r.GetMemory().GetLimit().GetValue() != 64<<20 {
		t.Errorf("plugins were told resources %v", r)
	}
	if o := fake.PodOverhead; o.GetCpu().GetShares().GetValue() != 10 {
		t.Errorf("plugins were told overhead %v", o)
	}

	// A refusal fails the update, naming the plugin, and records nothing.
	fake.UpdatePodErr = fmt.Errorf("plugin \"30-pods\": no: %w", errdefs.ErrFailedPrecondition)
	refused := &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: pod, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 1024}}
	_, err := f.srv.UpdatePodSandboxResources(ctx, refused)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "30-pods") {
		t.Fatalf("err = %v, want FailedPrecondition naming 30-pods", err)
	}
	if r, _ := f.srv.podResources.Load(pod); r != req {
		t.Errorf("the refused update was recorded: %v", r)
	}
	if got := fake.Events(); len(got) != 4 || got[3] != "UpdatePodSandbox p" {
		t.Errorf("events after the refusal %q, want no PostUpdatePodSandbox", got)
	}
}

// A plugin's cgroups path is where pinrt reads the container's stats and
// metrics from.
func TestNRICgroupsPathAdjustment(t *testing.T) {
	f, fake := newNRIFixture(t)
	cg := &fakeCgroups{groups: map[string]cgroups.Stats{}}
	f.srv.deps.Cgroups = cg
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	fake.Adjust = &nriapi.ContainerAdjustment{}
	fake.Adjust.SetLinuxCgroupsPath("/nri/moved")
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	if got := f.rt.Specs[id].Linux.CgroupsPath; got != "/nri/moved" {
		t.Fatalf("spec cgroups path = %q", got)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	cg.set("/nri/moved", cgroups.Stats{Timestamp: time.Unix(1700000000, 0), CPUUsageNanos: 7e9, Memory: cgroups.Memory{WorkingSet: 4242}})
	st, err := f.srv.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if st.Stats.GetCpu().GetUsageCoreNanoSeconds().GetValue() != 7e9 || st.Stats.GetMemory().GetWorkingSetBytes().GetValue() != 4242 {
		t.Errorf("stats = %v, want the moved cgroup's", st.Stats)
	}
	m, err := f.srv.ListPodSandboxMetrics(ctx, &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, pm := range m.PodMetrics {
		for _, cm := range pm.ContainerMetrics {
			for _, x := range cm.Metrics {
				if slices.Contains(x.LabelValues, "/nri/moved") {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("no container metric labelled with the moved cgroup: %v", m.PodMetrics)
	}
}

// crossPlugin answers the UpdateContainer or StopContainer of each of a
// pair of containers with an update of the other's CPU shares, as a
// plugin balancing a shared CPU pool does. The two calls meet before
// either answers: each is made while its caller holds its container.
type crossPlugin struct {
	*nritest.Fake
	mu    sync.Mutex
	other map[string]string // a container → the one its answer updates
	met   sync.WaitGroup
}

func (p *crossPlugin) pair(a, b string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.other = map[string]string{a: b, b: a}
	p.met.Add(2)
}

func (p *crossPlugin) answer(id string) []*nriapi.ContainerUpdate {
	p.mu.Lock()
	o, ok := p.other[id]
	delete(p.other, id)
	p.mu.Unlock()
	if !ok {
		return nil
	}
	p.met.Done()
	p.met.Wait()
	u := &nriapi.ContainerUpdate{}
	u.SetContainerId(o)
	u.SetLinuxCPUShares(256)
	return []*nriapi.ContainerUpdate{u}
}

func (p *crossPlugin) UpdateContainer(ctx context.Context, pod *nriapi.PodSandbox, c *nriapi.Container, res *nriapi.LinuxResources) ([]*nriapi.ContainerUpdate, []*nriapi.ContainerEviction, error) {
	_, _, _ = p.Fake.UpdateContainer(ctx, pod, c, res)
	return p.answer(c.GetId()), nil, nil
}

func (p *crossPlugin) StopContainer(ctx context.Context, pod *nriapi.PodSandbox, c *nriapi.Container) ([]*nriapi.ContainerUpdate, error) {
	_, _ = p.Fake.StopContainer(ctx, pod, c)
	return p.answer(c.GetId()), nil
}

// sharesRuntime records the CPU shares of every update, safe to read
// while updates run.
type sharesRuntime struct {
	*ocitest.Runtime
	mu     sync.Mutex
	shares map[string][]uint64
}

func (r *sharesRuntime) Update(ctx context.Context, id string, res *specs.LinuxResources) error {
	if err := r.Runtime.Update(ctx, id, res); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if res.CPU != nil && res.CPU.Shares != nil {
		r.shares[id] = append(r.shares[id], *res.CPU.Shares)
	}
	return nil
}

func (r *sharesRuntime) sharesOf(id string) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.shares[id])
}

// A plugin's updates of other containers are applied once the container
// whose event it answered is unlocked: two containers whose events a
// plugin answers with an update of the other must not wait for each
// other for good.
func TestNRIUpdatesOfOthersOutsideTheLock(t *testing.T) {
	update := func(f *ctrFixture, id string) error {
		_, err := f.srv.UpdateContainerResources(context.Background(), &runtimeapi.UpdateContainerResourcesRequest{
			ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512},
		})
		return err
	}
	stop := func(f *ctrFixture, id string) error {
		_, err := f.srv.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: id})
		return err
	}
	for _, tc := range []struct {
		name       string
		onA        func(*ctrFixture, string) error
		wantA      []uint64 // the shares a is given
		wantB      []uint64 // the shares b is given, in order
		noExitFile bool
	}{
		// Each update sets its own shares first, under its lock.
		{name: "two updates", onA: update, wantA: []uint64{512, 256}, wantB: []uint64{512, 256}},
		// The stop's exit is recorded under a's lock, not by the exit
		// watcher; the update's answer finds a exited.
		{name: "a stop and an update", onA: stop, wantB: []uint64{512, 256}, noExitFile: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			rt := &sharesRuntime{Runtime: f.rt, shares: map[string][]uint64{}}
			f.srv.deps.Runtimes["runc"] = rt
			plugin := &crossPlugin{Fake: &nritest.Fake{}}
			f.srv.SetNRI(plugin)
			pod, _ := f.pod(t, false)
			a, b := f.started(t, pod, "a"), f.started(t, pod, "b")
			f.rt.NoExitFiles = tc.noExitFile
			plugin.pair(a, b)
			done := make(chan error, 2)
			go func() { done <- tc.onA(f, a) }()
			go func() { done <- update(f, b) }()
			for range 2 {
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("deadlock: each call waits for the container the other holds")
				}
			}
			// A stop's answer is applied in the background.
			for deadline := time.Now().Add(5 * time.Second); len(rt.sharesOf(b)) < len(tc.wantB) && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if got := rt.sharesOf(a); !slices.Equal(got, tc.wantA) {
				t.Errorf("shares of a %v, want %v", got, tc.wantA)
			}
			if got := rt.sharesOf(b); !slices.Equal(got, tc.wantB) {
				t.Errorf("shares of b %v, want %v", got, tc.wantB)
			}
		})
	}
}
