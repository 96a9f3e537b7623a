package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/nsmgr"
)

// fakeCgroups serves stats by cgroup path; a missing one is NotFound, as
// the real reader reports a cgroup that is not there.
type fakeCgroups struct {
	mu      sync.Mutex
	groups  map[string]cgroups.Stats
	updates []cgroupUpdate
	// ooms are the oom_kill counters OOMKills reports; a group without
	// one has no memory.events.
	ooms map[string]uint64
}

func (f *fakeCgroups) OOMKills(group string) (uint64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.ooms[group]
	return n, ok, nil
}

func (f *fakeCgroups) setOOMKills(group string, n uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ooms == nil {
		f.ooms = map[string]uint64{}
	}
	f.ooms[group] = n
}

func (f *fakeCgroups) Stat(group string) (*cgroups.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.groups[group]
	if !ok {
		return nil, fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
	}
	return &st, nil
}

func (f *fakeCgroups) set(group string, st cgroups.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[group] = st
}

type fakeNet map[string][]nsmgr.NetDev

func (f fakeNet) NetDev(pin string) ([]nsmgr.NetDev, error) {
	if d, ok := f[pin]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("netns %s: %w", pin, errdefs.ErrNotFound)
}

type statsFixture struct {
	*ctrFixture
	cg       *fakeCgroups
	pod, ctr string
	podGroup string
	ctrGroup string
	t0       time.Time
}

// newStatsFixture runs one pod with one started container whose cgroup
// the fake knows, and an eth0 in the pod's netns.
func newStatsFixture(t *testing.T) *statsFixture {
	f := &statsFixture{ctrFixture: newCtrFixture(t), cg: &fakeCgroups{groups: map[string]cgroups.Stats{}}, t0: time.Unix(1700000000, 0)}
	f.pod, _ = f.ctrFixture.pod(t, false)
	ctx := context.Background()
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: f.pod, Config: unitCtr("app")})
	if err != nil {
		t.Fatal(err)
	}
	f.ctr = resp.ContainerId
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: f.ctr}); err != nil {
		t.Fatal(err)
	}
	// The fake runtime writes no bundle; the stats read the cgroup from it.
	f.ctrGroup = f.rt.Specs[f.ctr].Linux.CgroupsPath
	if err := os.WriteFile(filepath.Join(f.cfg.Root, "containers", f.ctr, "config.json"), fmt.Appendf(nil, `{"linux":{"cgroupsPath":%q}}`, f.ctrGroup), 0o600); err != nil {
		t.Fatal(err)
	}
	f.podGroup = "/pinrt/" + f.pod
	sb, _ := f.srv.sandboxes.Get(f.pod)
	f.srv.deps.Cgroups = f.cg
	f.srv.deps.NetCounters = fakeNet{sb.Pins["net"]: {{Name: "eth0", RxBytes: 1000, TxBytes: 2000, RxPackets: 10, TxPackets: 20, RxErrors: 1, TxDropped: 2}}}
	f.cg.set(f.podGroup, cgroups.Stats{Timestamp: f.t0, CPUUsageNanos: 5e9, Pids: 4, Memory: cgroups.Memory{Usage: 300, WorkingSet: 200}})
	f.cg.set(f.ctrGroup, cgroups.Stats{Timestamp: f.t0, CPUUsageNanos: 2e9, Pids: 3, Memory: cgroups.Memory{
		Usage: 300, WorkingSet: 200, RSS: 100, PageFaults: 7, MajorPageFaults: 1, Limit: 1000,
	}})
	return f
}

func TestContainerStats(t *testing.T) {
	f := newStatsFixture(t)
	ctx := context.Background()
	resp, err := f.srv.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: f.ctr})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Stats
	if st.Attributes.Id != f.ctr || st.Attributes.Metadata.Name != "app" {
		t.Errorf("attributes = %v", st.Attributes)
	}
	if st.Cpu.UsageCoreNanoSeconds.Value != 2e9 || st.Cpu.UsageNanoCores != nil || st.Cpu.Timestamp != f.t0.UnixNano() {
		t.Errorf("first CPU sample = %v, want 2e9 ns and no rate yet", st.Cpu)
	}
	m := st.Memory
	if m.WorkingSetBytes.Value != 200 || m.UsageBytes.Value != 300 || m.RssBytes.Value != 100 ||
		m.PageFaults.Value != 7 || m.MajorPageFaults.Value != 1 || m.AvailableBytes.GetValue() != 800 {
		t.Errorf("memory = %v", m)
	}
	if st.Swap != nil {
		t.Errorf("swap = %v on a host without swap accounting", st.Swap)
	}
	if st.WritableLayer == nil || st.WritableLayer.UsedBytes == nil {
		t.Errorf("writable layer = %v", st.WritableLayer)
	}
	// Two seconds later, one more core-second: half a core.
	f.cg.set(f.ctrGroup, cgroups.Stats{Timestamp: f.t0.Add(2 * time.Second), CPUUsageNanos: 3e9})
	resp, err = f.srv.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: f.ctr})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Stats.Cpu.GetUsageNanoCores().GetValue(); got != 5e8 {
		t.Errorf("usage_nano_cores = %d, want 5e8", got)
	}
	// A container whose cgroup is gone still has stats, without CPU.
	f.cg.mu.Lock()
	delete(f.cg.groups, f.ctrGroup)
	f.cg.mu.Unlock()
	resp, err = f.srv.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: f.ctr})
	if err != nil || resp.Stats.Cpu != nil || resp.Stats.Memory != nil {
		t.Errorf("stats without a cgroup = %v, %v", resp.GetStats(), err)
	}
	if _, err := f.srv.ContainerStats(ctx, &runtimeapi.ContainerStatsRequest{ContainerId: "ffffffffffff"}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown container: %v, want NotFound", err)
	}
}

func TestListContainerStatsFilters(t *testing.T) {
	f := newStatsFixture(t)
	tests := []struct {
		name   string
		filter *runtimeapi.ContainerStatsFilter
		want   int
	}{
		{"no filter", nil, 1},
		{"by short ID", &runtimeapi.ContainerStatsFilter{Id: f.ctr[:12]}, 1},
		{"by pod", &runtimeapi.ContainerStatsFilter{PodSandboxId: f.pod}, 1},
		{"other pod", &runtimeapi.ContainerStatsFilter{PodSandboxId: "ffff"}, 0},
		{"label miss", &runtimeapi.ContainerStatsFilter{LabelSelector: map[string]string{"a": "b"}}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := f.srv.ListContainerStats(context.Background(), &runtimeapi.ListContainerStatsRequest{Filter: tc.filter})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Stats) != tc.want {
				t.Errorf("%d stats, want %d", len(resp.Stats), tc.want)
			}
		})
	}
}

func TestPodSandboxStats(t *testing.T) {
	f := newStatsFixture(t)
	resp, err := f.srv.PodSandboxStats(context.Background(), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: f.pod})
	if err != nil {
		t.Fatal(err)
	}
	l := resp.Stats.Linux
	if l.Cpu.UsageCoreNanoSeconds.Value != 5e9 || l.Memory.WorkingSetBytes.Value != 200 || l.Process.ProcessCount.Value != 4 {
		t.Errorf("pod cgroup stats: cpu %v memory %v process %v", l.Cpu, l.Memory, l.Process)
	}
	if l.Memory.AvailableBytes != nil {
		t.Errorf("available = %v for an unlimited pod", l.Memory.AvailableBytes)
	}
	eth := l.Network.GetDefaultInterface()
	if eth.GetName() != "eth0" || eth.RxBytes.Value != 1000 || eth.TxBytes.Value != 2000 || eth.RxErrors.Value != 1 || len(l.Network.Interfaces) != 1 {
		t.Errorf("network = %v", l.Network)
	}
	if len(l.Containers) != 1 || l.Containers[0].Attributes.Id != f.ctr {
		t.Errorf("containers = %v", l.Containers)
	}
}

func TestPodSandboxMetrics(t *testing.T) {
	f := newStatsFixture(t)
	ctx := context.Background()
	descs, err := f.srv.ListMetricDescriptors(ctx, &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for _, d := range descs.Descriptors {
		keys[d.Name] = len(d.LabelKeys)
	}
	resp, err := f.srv.ListPodSandboxMetrics(ctx, &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.PodMetrics) != 1 || len(resp.PodMetrics[0].ContainerMetrics) != 1 {
		t.Fatalf("metrics = %v", resp.PodMetrics)
	}
	pm := resp.PodMetrics[0]
	got := map[string]*runtimeapi.Metric{}
	for _, m := range append(append([]*runtimeapi.Metric{}, pm.Metrics...), pm.ContainerMetrics[0].Metrics...) {
		n, ok := keys[m.Name]
		if !ok {
			t.Errorf("%s has no descriptor", m.Name)
		} else if n != len(m.LabelValues) {
			t.Errorf("%s has %d label values for %d keys", m.Name, len(m.LabelValues), n)
		}
		key := m.Name + "/" + m.LabelValues[0]
		got[key] = m
	}
	tests := []struct {
		key    string
		value  uint64
		typ    runtimeapi.MetricType
		labels []string
	}{
		{"container_cpu_usage_seconds_total/app", 2, counter, []string{"app", f.ctrGroup, "docker.io/library/busybox:latest", f.ctr, "ns", "p"}},
		{"container_cpu_usage_seconds_total/", 5, counter, []string{"", f.podGroup, "", f.pod, "ns", "p"}},
		{"container_memory_working_set_bytes/app", 200, gauge, nil},
		{"container_spec_memory_limit_bytes/app", 1000, gauge, nil},
		{"container_processes/app", 3, gauge, nil},
		{"container_network_receive_bytes_total/", 1000, counter, []string{"", f.podGroup, "", f.pod, "ns", "p", "eth0"}},
		{"container_network_transmit_packets_dropped_total/", 2, counter, nil},
	}
	for _, tc := range tests {
		m, ok := got[tc.key]
		if !ok {
			t.Errorf("no %s", tc.key)
			continue
		}
		if m.Value.Value != tc.value || m.MetricType != tc.typ {
			t.Errorf("%s = %d (%v), want %d (%v)", tc.key, m.Value.Value, m.MetricType, tc.value, tc.typ)
		}
		if tc.labels != nil && fmt.Sprint(m.LabelValues) != fmt.Sprint(tc.labels) {
			t.Errorf("%s labels = %q, want %q", tc.key, m.LabelValues, tc.labels)
		}
	}
}

func (f *fakeCgroups) Update(group string, res *specs.LinuxResources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.groups[group]; !ok {
		return fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
	}
	f.updates = append(f.updates, cgroupUpdate{group, res})
	return nil
}

type cgroupUpdate struct {
	group string
	res   *specs.LinuxResources
}

func TestUpdatePodSandboxResources(t *testing.T) {
	f := newStatsFixture(t)
	ctx := context.Background()
	req := &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: f.pod, Resources: &runtimeapi.LinuxContainerResources{
		CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 64 << 20,
	}}
	if _, err := f.srv.UpdatePodSandboxResources(ctx, req); err != nil {
		t.Fatal(err)
	}
	if len(f.cg.updates) != 1 || f.cg.updates[0].group != f.podGroup {
		t.Fatalf("updates = %v, want one of %s", f.cg.updates, f.podGroup)
	}
	res := f.cg.updates[0].res
	if res.Memory == nil || *res.Memory.Limit != 64<<20 || res.CPU == nil || *res.CPU.Shares != 512 || *res.CPU.Quota != 50000 {
		t.Errorf("applied %+v", res)
	}
	st, err := f.srv.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: f.pod, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Info["info"], `"resources"`) || !strings.Contains(st.Info["info"], "67108864") {
		t.Errorf("verbose status does not show the recorded resources: %s", st.Info["info"])
	}
	// No pod cgroup yet: recorded, nothing to apply, no error.
	f.cg.mu.Lock()
	delete(f.cg.groups, f.podGroup)
	f.cg.mu.Unlock()
	if _, err := f.srv.UpdatePodSandboxResources(ctx, req); err != nil {
		t.Errorf("update before the pod cgroup exists: %v", err)
	}
	if _, err := f.srv.UpdatePodSandboxResources(ctx, &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: "ffffffffffff"}); !errdefs.IsNotFound(err) {
		t.Errorf("unknown pod: %v, want NotFound", err)
	}
}
