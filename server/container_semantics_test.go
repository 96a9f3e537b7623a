package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/oci/ocitest"
)

func withSC(edit func(sc *runtimeapi.LinuxContainerSecurityContext)) func(c *runtimeapi.ContainerConfig) {
	return func(c *runtimeapi.ContainerConfig) {
		if c.Linux == nil {
			c.Linux = &runtimeapi.LinuxContainerConfig{}
		}
		if c.Linux.SecurityContext == nil {
			c.Linux.SecurityContext = &runtimeapi.LinuxContainerSecurityContext{}
		}
		edit(c.Linux.SecurityContext)
	}
}

func TestSeccompUnset(t *testing.T) {
	tests := []struct {
		name          string
		defaultUnset  bool
		edit          func(c *runtimeapi.ContainerConfig)
		wantConfined  bool
		wantErrSubstr string
	}{
		{name: "no security context", wantConfined: false},
		{name: "security context without seccomp", edit: withSC(func(*runtimeapi.LinuxContainerSecurityContext) {}), wantConfined: false},
		{name: "runtime default", edit: withSC(func(sc *runtimeapi.LinuxContainerSecurityContext) {
			sc.Seccomp = &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_RuntimeDefault}
		}), wantConfined: true},
		{name: "unset with seccomp_default_when_unset", defaultUnset: true, wantConfined: true},
		{name: "explicit unconfined with seccomp_default_when_unset", defaultUnset: true, edit: withSC(func(sc *runtimeapi.LinuxContainerSecurityContext) {
			sc.Seccomp = &runtimeapi.SecurityProfile{ProfileType: runtimeapi.SecurityProfile_Unconfined}
		}), wantConfined: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			f.cfg.Runtime.SeccompDefaultWhenUnset = tc.defaultUnset
			pod, _ := f.pod(t, false)
			cfg := unitCtr("c")
			if tc.edit != nil {
				tc.edit(cfg)
			}
			resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			if got := f.rt.Specs[resp.ContainerId].Linux.Seccomp != nil; got != tc.wantConfined {
				t.Errorf("seccomp confined = %v, want %v", got, tc.wantConfined)
			}
		})
	}
}

func TestRunAsGroupNeedsUser(t *testing.T) {
	i64 := func(v int64) *runtimeapi.Int64Value { return &runtimeapi.Int64Value{Value: v} }
	tests := []struct {
		name    string
		sc      func(sc *runtimeapi.LinuxContainerSecurityContext)
		wantErr error
		msg     string
	}{
		{"group alone", func(sc *runtimeapi.LinuxContainerSecurityContext) { sc.RunAsGroup = i64(5) }, errdefs.ErrInvalidArgument,
			"container: run_as_group 5 without run_as_user or run_as_username: invalid argument"},
		{"group with uid", func(sc *runtimeapi.LinuxContainerSecurityContext) { sc.RunAsGroup, sc.RunAsUser = i64(5), i64(0) }, nil, ""},
		{"group with username", func(sc *runtimeapi.LinuxContainerSecurityContext) { sc.RunAsGroup, sc.RunAsUsername = i64(5), "root" }, nil, ""},
		{"uid alone", func(sc *runtimeapi.LinuxContainerSecurityContext) { sc.RunAsUser = i64(0) }, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			pod, _ := f.pod(t, false)
			cfg := unitCtr("c")
			withSC(tc.sc)(cfg)
			_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr != nil && err.Error() != tc.msg) {
				t.Fatalf("err = %v, want %v %q", err, tc.wantErr, tc.msg)
			}
			if tc.wantErr != nil {
				f.nothingLeft(t)
			}
		})
	}
}

func TestPodRunAsGroupNeedsUser(t *testing.T) {
	f := newCtrFixture(t)
	req := unitPod("p", false)
	req.Config.Linux.SecurityContext.RunAsGroup = &runtimeapi.Int64Value{Value: 5}
	_, err := f.srv.RunPodSandbox(context.Background(), req)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "pod: run_as_group 5 without run_as_user") {
		t.Fatalf("err = %v, want InvalidArgument naming run_as_group", err)
	}
	req.Config.Linux.SecurityContext.RunAsUser = &runtimeapi.Int64Value{Value: 0}
	if _, err := f.srv.RunPodSandbox(context.Background(), req); err != nil {
		t.Fatalf("with run_as_user: %v", err)
	}
}

func TestSupplementalGroupsPolicy(t *testing.T) {
	tests := []struct {
		name   string
		policy runtimeapi.SupplementalGroupsPolicy
		want   []int64
	}{
		// The fake rootfs's /etc/group makes root a member of group 10;
		// the primary group 7 is reported under both policies, as the
		// CRI conformance suite expects.
		{"merge", runtimeapi.SupplementalGroupsPolicy_Merge, []int64{7, 10, 99}},
		{"strict", runtimeapi.SupplementalGroupsPolicy_Strict, []int64{7, 99}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			f.images.group = "root:x:0:\nwheel:x:10:root\n"
			pod, _ := f.pod(t, false)
			cfg := unitCtr("c")
			withSC(func(sc *runtimeapi.LinuxContainerSecurityContext) {
				sc.RunAsUser, sc.RunAsGroup = &runtimeapi.Int64Value{Value: 0}, &runtimeapi.Int64Value{Value: 7}
				sc.SupplementalGroups, sc.SupplementalGroupsPolicy = []int64{99}, tc.policy
			})(cfg)
			resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			st, err := f.srv.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
			if err != nil {
				t.Fatal(err)
			}
			u := st.Status.GetUser().GetLinux()
			if u.GetUid() != 0 || u.GetGid() != 7 || !reflect.DeepEqual(u.GetSupplementalGroups(), tc.want) {
				t.Errorf("user = %d:%d %v, want 0:7 %v", u.GetUid(), u.GetGid(), u.GetSupplementalGroups(), tc.want)
			}
		})
	}
	f := newCtrFixture(t)
	resp, err := f.srv.Status(context.Background(), &runtimeapi.StatusRequest{})
	if err != nil || !resp.GetFeatures().GetSupplementalGroupsPolicy() {
		t.Errorf("Status features %v, %v: want supplemental_groups_policy", resp.GetFeatures(), err)
	}
}

func TestStartContainerMeansRunning(t *testing.T) {
	f := newCtrFixture(t)
	f.rt.StateLagsStart = true
	pod, _ := f.pod(t, false)
	ctx := context.Background()
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.Status.StartedAt == 0 {
		t.Fatalf("status right after start: %v %v, want RUNNING with a start time", st.GetStatus().GetState(), err)
	}
	list, _ := f.srv.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if len(list.Containers) != 1 || list.Containers[0].State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("list right after start: %v, want one RUNNING", list.Containers)
	}
}

func TestBrokenHandlerNotAdvertised(t *testing.T) {
	f := newCtrFixture(t)
	crun := ocitest.New()
	crun.ProbeErr = fmt.Errorf("runtime \"crun\" (/usr/bin/crun) has no features command and writes OCI spec 1.0.0: %w", errdefs.ErrFailedPrecondition)
	f.srv.deps.Runtimes["crun"] = crun
	f.cfg.Runtime.Runtimes["crun"] = conf.Handler{Binary: "crun"}
	f.cfg.Runtime.Runtimes["missing"] = conf.Handler{Binary: "/nonexistent"}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		resp, err := f.srv.Status(ctx, &runtimeapi.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, h := range resp.RuntimeHandlers {
			got = append(got, fmt.Sprintf("%q", h.Name))
		}
		if strings.Join(got, " ") != `"runc" ""` {
			t.Errorf("handlers %v, want only runc and the default", got)
		}
	}
	if crun.Probes != 1 || f.rt.Probes != 1 {
		t.Errorf("probes: crun %d, runc %d; want each probed once", crun.Probes, f.rt.Probes)
	}
	// A new pod of the broken handler is refused: no container could
	// ever run in it.
	for _, h := range []string{"crun", "missing"} {
		req := unitPod("p-"+h, false)
		req.RuntimeHandler = h
		if _, err := f.srv.RunPodSandbox(ctx, req); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `runtime handler "`+h+`"`) {
			t.Errorf("RunPodSandbox with the broken handler %s: %v, want FailedPrecondition saying why", h, err)
		}
	}
	if n := len(f.srv.sandboxes.List()); n != 0 {
		t.Fatalf("%d pods after the refusals", n)
	}
	// A pod of it from before the handler broke (restored after a
	// runtime upgrade) gets no container either.
	pod, _ := f.pod(t, false)
	sb, err := f.srv.sandboxes.Get(pod)
	if err != nil {
		t.Fatal(err)
	}
	sb.Handler = "crun"
	_, err = f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `runtime handler "crun" cannot run containers: runtime "crun" (/usr/bin/crun) has no features command`) {
		t.Fatalf("create with the broken handler: %v, want FailedPrecondition saying why", err)
	}
	f.nothingLeft(t)
}

func TestContainerResourcesUpdateAndStatus(t *testing.T) {
	f := newCtrFixture(t)
	pod, _ := f.pod(t, false)
	ctx := context.Background()
	cfg := unitCtr("c")
	cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuShares: 512, MemoryLimitInBytes: 64 << 20, OomScoreAdj: 100}}
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	status := func() *runtimeapi.LinuxContainerResources {
		t.Helper()
		st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		return st.Status.GetResources().GetLinux()
	}
	if r := status(); r.GetCpuShares() != 512 || r.GetMemoryLimitInBytes() != 64<<20 || r.GetOomScoreAdj() != 100 {
		t.Errorf("resources after create: %v, want shares 512, memory 64 MiB, oom 100", r)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	upd := &runtimeapi.LinuxContainerResources{CpuShares: 1024, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 128 << 20}
	if _, err := f.srv.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: upd}); err != nil {
		t.Fatal(err)
	}
	r := status()
	if r.GetCpuShares() != 1024 || r.GetCpuQuota() != 50000 || r.GetCpuPeriod() != 100000 || r.GetMemoryLimitInBytes() != 128<<20 {
		t.Errorf("resources after update: %v, want the updated limits", r)
	}
	// The bundle's config.json has them, and keeps its device rules.
	spec := readSpec(t, f, id)
	if got := spec.Linux.Resources; got.Memory == nil || *got.Memory.Limit != 128<<20 || len(got.Devices) == 0 {
		t.Errorf("config.json resources %+v, want memory 128 MiB and the device rules kept", got)
	}

	tests := []struct {
		name string
		res  *runtimeapi.LinuxContainerResources
		msg  string
	}{
		{"negative memory", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: -1}, "memory_limit_in_bytes -1 is negative: invalid argument"},
		{"memory below 6 MiB", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 20}, "memory_limit_in_bytes 1048576 is below the minimum of 6291456 (6 MiB): invalid argument"},
		{"cpu shares 1", &runtimeapi.LinuxContainerResources{CpuShares: 1}, "cpu_shares 1 is outside [2, 262144]: invalid argument"},
		{"negative cpu shares", &runtimeapi.LinuxContainerResources{CpuShares: -2}, "cpu_shares -2 is outside [2, 262144]: invalid argument"},
		{"cpu quota -5", &runtimeapi.LinuxContainerResources{CpuQuota: -5}, "cpu_quota -5 must be -1 (unlimited), 0 (unset) or in [1000, 17592186044415] microseconds: invalid argument"},
		{"cpu period too long", &runtimeapi.LinuxContainerResources{CpuPeriod: 2000000}, "cpu_period 2000000 is outside [1000, 1000000] microseconds: invalid argument"},
		{"swap below memory", &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 32 << 20}, "memory_swap_limit_in_bytes 33554432 (memory plus swap) is below memory_limit_in_bytes 67108864: invalid argument"},
		{"bad cpuset", &runtimeapi.LinuxContainerResources{CpusetCpus: "3-1"}, `cpuset_cpus "3-1": "3-1" is not a valid range: invalid argument`},
		{"oom score", &runtimeapi.LinuxContainerResources{OomScoreAdj: 2000}, "oom_score_adj 2000 is outside [-1000, 1000]: invalid argument"},
		{"unified path", &runtimeapi.LinuxContainerResources{Unified: map[string]string{"../../memory.max": "1"}},
			`unified cgroup setting "../../memory.max"="1": the key must be a file name of the cgroup: invalid argument`},
		{"unified dot dot", &runtimeapi.LinuxContainerResources{Unified: map[string]string{"..": "1"}},
			`unified cgroup setting ".."="1": the key must be a file name of the cgroup: invalid argument`},
		{"hugepage size a path", &runtimeapi.LinuxContainerResources{HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB/../../x", Limit: 1}}},
			`hugepage page size "2MB/../../x" is not a size like 2MB or 1GB: invalid argument`},
		{"hugepage size bogus", &runtimeapi.LinuxContainerResources{HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "bogus", Limit: 1}}},
			`hugepage page size "bogus" is not a size like 2MB or 1GB: invalid argument`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls := len(f.rt.Calls)
			_, err := f.srv.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: tc.res})
			if !errdefs.IsInvalidArgument(err) || err.Error() != tc.msg {
				t.Fatalf("update: %v, want InvalidArgument %q", err, tc.msg)
			}
			if len(f.rt.Calls) != calls {
				t.Errorf("the runtime was called: %v", f.rt.Calls[calls:])
			}
			c := unitCtr("bad-" + strings.ReplaceAll(tc.name, " ", "-"))
			c.Linux = &runtimeapi.LinuxContainerConfig{Resources: tc.res}
			_, err = f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: c})
			if !errdefs.IsInvalidArgument(err) || err.Error() != tc.msg {
				t.Fatalf("create: %v, want InvalidArgument %q", err, tc.msg)
			}
		})
	}
	if r := status(); r.GetMemoryLimitInBytes() != 128<<20 {
		t.Errorf("a refused update changed the reported limits: %v", r)
	}
}

func readSpec(t *testing.T, f *ctrFixture, id string) *specs.Spec {
	t.Helper()
	c, err := f.srv.containers.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.Dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// exitAtStartRuntime is a runtime whose containers exit as they start,
// the exit noticed (as the exit watcher notices it, with no container
// lock) before runc start has returned.
type exitAtStartRuntime struct {
	*ocitest.Runtime
	noticed func(id string)
}

func (r exitAtStartRuntime) Start(ctx context.Context, id string) error {
	if err := r.Runtime.Start(ctx, id); err != nil {
		return err
	}
	if err := r.Exit(id, 0); err != nil {
		return err
	}
	r.noticed(id)
	return nil
}

// A command that ends at once (`true`) is exited once StartContainer
// returns, never running again, and kubelet hears of its start before
// its exit.
func TestStartOfAContainerThatExitsAtOnce(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	f.srv.deps.Runtimes["runc"] = exitAtStartRuntime{Runtime: f.rt, noticed: func(id string) {
		if c, err := f.srv.containers.Get(id); err == nil {
			f.srv.refreshContainer(ctx, c, false)
		}
	}}
	pod, _ := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	sub := f.srv.events.subscribe()
	defer f.srv.events.unsubscribe(sub)
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	var got []runtimeapi.ContainerEventType
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(got, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT) && time.Now().Before(deadline); {
		select {
		case ev := <-sub.ch:
			got = append(got, ev.ContainerEventType)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The list takes the recorded state as it is (the container is watched).
	list, err := f.srv.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil || len(list.Containers) != 1 || list.Containers[0].State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("list after the start: %v, %v; want one EXITED", list.GetContainers(), err)
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Status; s.State != runtimeapi.ContainerState_CONTAINER_EXITED || s.ExitCode != 0 || s.StartedAt == 0 || s.FinishedAt < s.StartedAt {
		t.Errorf("status %v exit %d started %d finished %d; want EXITED 0, started before it finished", s.State, s.ExitCode, s.StartedAt, s.FinishedAt)
	}
	for len(sub.ch) > 0 {
		got = append(got, (<-sub.ch).ContainerEventType)
	}
	want := []runtimeapi.ContainerEventType{runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}
