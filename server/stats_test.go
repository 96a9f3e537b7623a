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
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/nri/nritest"
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
	// forgotten are the groups Forget was called for.
	forgotten []string
	// updateErr fails Update, as a write the kernel refuses.
	updateErr error
}

// Forget records that the server let go of group.
func (f *fakeCgroups) Forget(group string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, group)
}

func (f *fakeCgroups) forgot(group string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.forgotten, group)
}

// OpenFilesLimit gives every process the same limit, 1024 more than its
// pid so that the pid read shows.
func (f *fakeCgroups) OpenFilesLimit(pid int) (uint64, bool) { return uint64(pid) + 1024, pid > 0 }

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

// Stat leaves the task count out, as cgroups.Reader's does.
func (f *fakeCgroups) Stat(group string) (*cgroups.Stats, error) {
	st, err := f.StatPod(group)
	if err != nil {
		return nil, err
	}
	st.Pids = 0
	return st, nil
}

func (f *fakeCgroups) StatPod(group string) (*cgroups.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.groups[group]
	if !ok {
		return nil, fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
	}
	return &st, nil
}

// StatAll serves the same stats: the fake's carry every field.
func (f *fakeCgroups) StatAll(group string) (*cgroups.Stats, error) {
	return f.StatPod(group)
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
	f.cg.set(f.podGroup, cgroups.Stats{Timestamp: f.t0, CPUUsageNanos: 5e9, Pids: 4, Memory: cgroups.Memory{Usage: 300, WorkingSet: 200},
		IOPressure: &cgroups.Pressure{Some: cgroups.PressureData{Avg60: 2, TotalNanos: 42000}, Full: cgroups.PressureData{TotalNanos: 41000}}})
	f.cg.set(f.ctrGroup, cgroups.Stats{Timestamp: f.t0, CPUUsageNanos: 2e9, Pids: 3, Memory: cgroups.Memory{
		Usage: 300, WorkingSet: 200, RSS: 100, PageFaults: 7, MajorPageFaults: 1, Limit: 1000,
	},
		CPUPressure:    &cgroups.Pressure{Some: cgroups.PressureData{Avg10: 1.5, Avg60: 0.5, Avg300: 0.25, TotalNanos: 1234000}, Full: cgroups.PressureData{Avg10: 0.75, TotalNanos: 567000}},
		MemoryPressure: &cgroups.Pressure{Some: cgroups.PressureData{TotalNanos: 89000}},
	})
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
	// PSI as read; none for I/O where the kernel has none.
	if p := st.Cpu.Psi; p.GetSome().GetTotal() != 1234000 || p.GetSome().GetAvg10() != 1.5 || p.GetSome().GetAvg60() != 0.5 ||
		p.GetSome().GetAvg300() != 0.25 || p.GetFull().GetTotal() != 567000 || p.GetFull().GetAvg10() != 0.75 {
		t.Errorf("CPU PSI = %v, want some 1234 µs at 1.5/0.5/0.25 %%, full 567 µs at 0.75 %%", p)
	}
	if p := st.Memory.Psi; p.GetSome().GetTotal() != 89000 || p.GetFull() == nil {
		t.Errorf("memory PSI = %v, want some 89 µs and a full line", p)
	}
	if st.Io != nil {
		t.Errorf("I/O usage = %v for a cgroup without I/O pressure", st.Io)
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

// TestStatsForgetRemoved: removing a container, then its pod, lets go of
// what their stats kept: the cgroup files the reader holds open (which
// keep a removed cgroup in the kernel's memory) and the cached cgroup;
// and the server keeps nothing else by their IDs.
func TestStatsForgetRemoved(t *testing.T) {
	f := newStatsFixture(t)
	ctx := context.Background()
	if _, err := f.srv.ListPodSandboxStats(ctx, &runtimeapi.ListPodSandboxStatsRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.UpdatePodSandboxResources(ctx, &runtimeapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: f.pod, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 512},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: f.ctr}); err != nil {
		t.Fatal(err)
	}
	if held := perIDState(f.srv); len(held) == 0 {
		t.Fatal("perIDState sees nothing of a running pod: it checks nothing")
	}
	if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: f.ctr}); err != nil {
		t.Fatal(err)
	}
	if !f.cg.forgot(f.ctrGroup) {
		t.Errorf("RemoveContainer left the container's cgroup %s to the reader (forgot %v)", f.ctrGroup, f.cg.forgotten)
	}
	if f.cg.forgot(f.podGroup) {
		t.Error("RemoveContainer let go of the pod's cgroup")
	}
	f.srv.stats.mu.Lock()
	_, group := f.srv.stats.groups[f.ctr]
	_, layer := f.srv.stats.layers[f.ctr]
	f.srv.stats.mu.Unlock()
	if group || layer {
		t.Errorf("the removed container's cgroup (%v) or layer (%v) is still cached", group, layer)
	}
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: f.pod}); err != nil {
		t.Fatal(err)
	}
	if !f.cg.forgot(f.podGroup) {
		t.Errorf("RemovePodSandbox left the pod's cgroup %s to the reader (forgot %v)", f.podGroup, f.cg.forgotten)
	}
	if held := perIDState(f.srv); len(held) > 0 {
		t.Errorf("the server still keeps, by the IDs of a removed pod and container: %v", held)
	}
}

// perIDState counts the entries of each map the server keeps by pod or
// container ID, leaving out the empty ones.
func perIDState(s *Server) map[string]int {
	held := map[string]int{}
	count := func(name string, n int) {
		if n > 0 {
			held[name] = n
		}
	}
	syncLen := func(m *sync.Map) int {
		n := 0
		m.Range(func(any, any) bool { n++; return true })
		return n
	}
	count("podResources", syncLen(&s.podResources))
	count("resources", syncLen(&s.resources.m))
	count("exits.unwatched", syncLen(&s.exits.unwatched))
	count("exits.own", syncLen(&s.exits.own))
	s.stats.mu.Lock()
	count("stats.groups", len(s.stats.groups))
	count("stats.layers", len(s.stats.layers))
	s.stats.mu.Unlock()
	s.oom.mu.Lock()
	count("oom.seen", len(s.oom.seen))
	count("oom.decided", len(s.oom.decided))
	s.oom.mu.Unlock()
	s.monitors.mu.Lock()
	count("monitors", len(s.monitors.files))
	s.monitors.mu.Unlock()
	count("sandboxes", len(s.sandboxes.List()))
	count("containers", len(s.containers.List()))
	return held
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

// ListContainerStats reads the containers side by side, and keeps the
// store's order; a container's cgroup comes from its creation, so its
// config.json is not read back (nor needed).
func TestListContainerStatsMany(t *testing.T) {
	f := newStatsFixture(t)
	ctx := context.Background()
	for i := range 12 {
		resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: f.pod, Config: unitCtr(fmt.Sprintf("c%d", i))})
		if err != nil {
			t.Fatal(err)
		}
		id := resp.ContainerId
		f.cg.set(f.rt.Specs[id].Linux.CgroupsPath, cgroups.Stats{Timestamp: f.t0, CPUUsageNanos: uint64(i+1) * 1e9})
		if err := os.Remove(filepath.Join(f.cfg.Root, "containers", id, "config.json")); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	resp, err := f.srv.ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range f.srv.filterContainerStats(nil) {
		want = append(want, c.ID)
	}
	if len(resp.Stats) != len(want) || len(want) != 13 {
		t.Fatalf("%d stats for %d containers, want 13", len(resp.Stats), len(want))
	}
	for i, st := range resp.Stats {
		if st.Attributes.Id != want[i] {
			t.Fatalf("stats[%d] is %s, want %s (the store's order)", i, st.Attributes.Id, want[i])
		}
		if st.Attributes.Id != f.ctr && st.GetCpu().GetUsageCoreNanoSeconds() == nil {
			t.Errorf("container %s (%s) has no CPU figures without its config.json", st.Attributes.Id, st.Attributes.Metadata.Name)
		}
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
	if io := l.Io; io.GetTimestamp() != f.t0.UnixNano() || io.GetPsi().GetSome().GetAvg60() != 2 || io.GetPsi().GetSome().GetTotal() != 42000 || io.GetPsi().GetFull().GetTotal() != 41000 {
		t.Errorf("pod I/O = %v, want its cgroup's pressure in ns", io)
	}
	if l.Cpu.Psi != nil || l.Memory.Psi != nil {
		t.Errorf("pod CPU PSI %v memory PSI %v for a cgroup without them", l.Cpu.Psi, l.Memory.Psi)
	}
	eth := l.Network.GetDefaultInterface()
	if eth.GetName() != "eth0" || eth.RxBytes.Value != 1000 || eth.TxBytes.Value != 2000 || eth.RxErrors.Value != 1 || len(l.Network.Interfaces) != 1 {
		t.Errorf("network = %v", l.Network)
	}
	if len(l.Containers) != 1 || l.Containers[0].Attributes.Id != f.ctr {
		t.Errorf("containers = %v", l.Containers)
	}
}

// criticalMetrics are the names critest (cri-tools v1.37.0,
// pkg/validate/pod.go) expects in ListMetricDescriptors and, for a pod
// with a running container, in ListPodSandboxMetrics, less those it
// lists as not implemented by every runtime.
var criticalMetrics = []string{
	"container_blkio_device_usage_total", "container_cpu_cfs_periods_total", "container_cpu_cfs_throttled_periods_total",
	"container_cpu_cfs_throttled_seconds_total", "container_cpu_system_seconds_total", "container_cpu_usage_seconds_total",
	"container_cpu_user_seconds_total", "container_file_descriptors", "container_fs_inodes_free", "container_fs_inodes_total",
	"container_fs_limit_bytes", "container_fs_reads_bytes_total", "container_fs_reads_total", "container_fs_usage_bytes",
	"container_fs_writes_bytes_total", "container_fs_writes_total", "container_last_seen", "container_memory_cache",
	"container_memory_failcnt", "container_memory_failures_total", "container_memory_kernel_usage",
	"container_memory_mapped_file", "container_memory_max_usage_bytes", "container_memory_rss", "container_memory_swap",
	"container_memory_usage_bytes", "container_memory_working_set_bytes", "container_network_receive_bytes_total",
	"container_network_receive_errors_total", "container_network_receive_packets_dropped_total",
	"container_network_receive_packets_total", "container_network_transmit_bytes_total",
	"container_network_transmit_errors_total", "container_network_transmit_packets_dropped_total",
	"container_network_transmit_packets_total", "container_oom_events_total", "container_processes", "container_sockets",
	"container_spec_cpu_period", "container_spec_cpu_shares", "container_spec_memory_limit_bytes",
	"container_spec_memory_swap_limit_bytes", "container_start_time_seconds", "container_threads", "container_threads_max",
}

// fullStats is a container cgroup as StatAll reads it, every number
// distinct.
var fullStats = cgroups.Stats{
	CPUUsageNanos: 2e9, Pids: 5, PidsLimit: 1024, OOMKills: 1,
	CPU: cgroups.CPU{
		UserNanos: 3e9, SystemNanos: 4e9, Periods: 50, ThrottledPeriods: 9, ThrottledNanos: 6e9,
		Spec: cgroups.CPUSpec{Period: 100000, Quota: 20000, Shares: 1024, Known: true},
	},
	Memory: cgroups.Memory{
		Usage: 300, WorkingSet: 200, RSS: 100, PageFaults: 7, MajorPageFaults: 1, Limit: 1000,
		Cache: 400, MappedFile: 40, Kernel: 30, MaxUsage: 500, Failcnt: 11, SwapLimit: 2000, Reservation: 600,
		LocalPageFaults: 6, LocalMajorPageFaults: 2,
	},
	IO:        []cgroups.DeviceIO{{Major: 254, Minor: 0, Device: "/dev/vda", ReadBytes: 8192, WriteBytes: 4096, Reads: 2, Writes: 1}},
	Processes: cgroups.Processes{Count: 2, FDs: 8, Sockets: 3},
	Hugetlb:   []cgroups.Hugetlb{{PageSize: "2MB", Usage: 4 << 20, MaxUsage: 6 << 20}, {PageSize: "1GB", MaxUsage: 1 << 30}},
	// In nanoseconds, as cgroups converts the kernel's microseconds.
	CPUPressure:    &cgroups.Pressure{Some: cgroups.PressureData{TotalNanos: 13_900_000_000}, Full: cgroups.PressureData{TotalNanos: 12_000_001_000}},
	MemoryPressure: &cgroups.Pressure{Some: cgroups.PressureData{TotalNanos: 15_000_000_000}, Full: cgroups.PressureData{TotalNanos: 14_000_000_000}},
	IOPressure:     &cgroups.Pressure{Some: cgroups.PressureData{TotalNanos: 17_000_000_000}, Full: cgroups.PressureData{TotalNanos: 16_000_000_000}},
}

// podMetrics lists the fixture's pod metrics and checks what critest
// checks: every descriptor has help and labels, every sample has a
// descriptor and as many label values as it has keys.
func (f *statsFixture) podMetrics(t *testing.T) (pod, ctr map[string]*runtimeapi.Metric, descs map[string]*runtimeapi.MetricDescriptor) {
	t.Helper()
	ctx := context.Background()
	dr, err := f.srv.ListMetricDescriptors(ctx, &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	descs = map[string]*runtimeapi.MetricDescriptor{}
	for _, d := range dr.Descriptors {
		if d.Help == "" || len(d.LabelKeys) == 0 {
			t.Errorf("descriptor %s: help %q, labels %q", d.Name, d.Help, d.LabelKeys)
		}
		descs[d.Name] = d
	}
	resp, err := f.srv.ListPodSandboxMetrics(ctx, &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.PodMetrics) != 1 || len(resp.PodMetrics[0].ContainerMetrics) != 1 {
		t.Fatalf("metrics = %v", resp.PodMetrics)
	}
	pm := resp.PodMetrics[0]
	index := func(ms []*runtimeapi.Metric) map[string]*runtimeapi.Metric {
		out := map[string]*runtimeapi.Metric{}
		for _, m := range ms {
			d, ok := descs[m.Name]
			if !ok {
				t.Errorf("%s has no descriptor", m.Name)
				continue
			}
			if len(d.LabelKeys) != len(m.LabelValues) {
				t.Errorf("%s has %d label values for %d keys", m.Name, len(m.LabelValues), len(d.LabelKeys))
				continue
			}
			// Keyed by name and the extra labels' values.
			key := strings.Join(append([]string{m.Name}, m.LabelValues[len(baseLabels):]...), "/")
			if _, dup := out[key]; dup {
				t.Errorf("%s twice", key)
			}
			out[key] = m
		}
		return out
	}
	return index(pm.Metrics), index(pm.ContainerMetrics[0].Metrics), descs
}

// TestPodSandboxMetrics checks every metric of a container against the
// cgroup numbers it comes from, with cAdvisor's type and labels.
func TestPodSandboxMetrics(t *testing.T) {
	f := newStatsFixture(t)
	f.cg.set(f.ctrGroup, fullStats)
	f.srv.stats.mu.Lock()
	f.srv.stats.layers[f.ctr] = fsUsage{at: f.t0, bytes: 1 << 20, inodes: 12, limit: 100 << 30, inodesFree: 5000}
	f.srv.stats.mu.Unlock()
	before := time.Now().Unix()
	pod, ctr, _ := f.podMetrics(t)
	c, _ := f.srv.containers.Get(f.ctr)
	tests := []struct {
		key   string
		value uint64
		typ   runtimeapi.MetricType
	}{
		{"container_cpu_usage_seconds_total", 2, counter},
		{"container_cpu_user_seconds_total", 3, counter},
		{"container_cpu_system_seconds_total", 4, counter},
		{"container_cpu_cfs_periods_total", 50, counter},
		{"container_cpu_cfs_throttled_periods_total", 9, counter},
		{"container_cpu_cfs_throttled_seconds_total", 6, counter},
		{"container_spec_cpu_period", 100000, gauge},
		{"container_spec_cpu_quota", 20000, gauge},
		{"container_spec_cpu_shares", 1024, gauge},
		{"container_memory_working_set_bytes", 200, gauge},
		{"container_memory_usage_bytes", 300, gauge},
		{"container_memory_max_usage_bytes", 500, gauge},
		{"container_memory_rss", 100, gauge},
		{"container_memory_cache", 400, gauge},
		{"container_memory_mapped_file", 40, gauge},
		{"container_memory_kernel_usage", 30, gauge},
		{"container_memory_swap", 0, gauge},
		{"container_memory_failcnt", 11, counter},
		{"container_memory_failures_total/pgfault/container", 6, counter},
		{"container_memory_failures_total/pgmajfault/container", 2, counter},
		{"container_memory_failures_total/pgfault/hierarchy", 7, counter},
		{"container_memory_failures_total/pgmajfault/hierarchy", 1, counter},
		{"container_oom_events_total", 1, counter},
		{"container_spec_memory_limit_bytes", 1000, gauge},
		{"container_spec_memory_swap_limit_bytes", 2000, gauge},
		{"container_spec_memory_reservation_limit_bytes", 600, gauge},
		{"container_ulimits_soft/max_open_files", uint64(c.Status().Pid) + 1024, gauge},
		{"container_processes", 2, gauge},
		{"container_threads", 5, gauge},
		{"container_threads_max", 1024, gauge},
		{"container_file_descriptors", 8, gauge},
		{"container_sockets", 3, gauge},
		{"container_fs_reads_bytes_total//dev/vda", 8192, counter},
		{"container_fs_reads_total//dev/vda", 2, counter},
		{"container_fs_writes_bytes_total//dev/vda", 4096, counter},
		{"container_fs_writes_total//dev/vda", 1, counter},
		{"container_blkio_device_usage_total//dev/vda/254/0/Read", 8192, counter},
		{"container_blkio_device_usage_total//dev/vda/254/0/Write", 4096, counter},
		{"container_fs_usage_bytes/" + c.Dir, 1 << 20, gauge},
		{"container_fs_inodes_total/" + c.Dir, 12, gauge},
		{"container_fs_limit_bytes/" + c.Dir, 100 << 30, gauge},
		{"container_fs_inodes_free/" + c.Dir, 5000, gauge},
		{"container_hugetlb_usage_bytes/2MB", 4 << 20, gauge},
		{"container_hugetlb_max_usage_bytes/2MB", 6 << 20, gauge},
		{"container_hugetlb_usage_bytes/1GB", 0, gauge},
		{"container_hugetlb_max_usage_bytes/1GB", 1 << 30, gauge},
		// Whole seconds: stalled is full, waiting is some.
		{"container_pressure_cpu_stalled_seconds_total", 12, counter},
		{"container_pressure_cpu_waiting_seconds_total", 13, counter},
		{"container_pressure_memory_stalled_seconds_total", 14, counter},
		{"container_pressure_memory_waiting_seconds_total", 15, counter},
		{"container_pressure_io_stalled_seconds_total", 16, counter},
		{"container_pressure_io_waiting_seconds_total", 17, counter},
	}
	for _, tc := range tests {
		m, ok := ctr[tc.key]
		if !ok {
			t.Errorf("no %s", tc.key)
			continue
		}
		if m.Value.Value != tc.value || m.MetricType != tc.typ {
			t.Errorf("%s = %d (%v), want %d (%v)", tc.key, m.Value.Value, m.MetricType, tc.value, tc.typ)
		}
		if want := []string{"app", f.ctrGroup, "docker.io/library/busybox:latest", f.ctr, "ns", "p"}; fmt.Sprint(m.LabelValues[:len(baseLabels)]) != fmt.Sprint(want) {
			t.Errorf("%s labels = %q, want %q", tc.key, m.LabelValues, want)
		}
	}
	if m := ctr["container_last_seen"]; m == nil || int64(m.Value.Value) < before || int64(m.Value.Value) > time.Now().Unix() {
		t.Errorf("container_last_seen = %v, want the time of the call (%d)", m, before)
	}
	// The pod: its cgroup's numbers, with an empty container name, and
	// the network counters of its netns.
	podTests := []struct {
		key   string
		value uint64
		typ   runtimeapi.MetricType
	}{
		{"container_cpu_usage_seconds_total", 5, counter},
		{"container_threads", 4, gauge},
		{"container_network_receive_bytes_total/eth0", 1000, counter},
		{"container_network_transmit_packets_dropped_total/eth0", 2, counter},
	}
	for _, tc := range podTests {
		m, ok := pod[tc.key]
		if !ok {
			t.Errorf("pod: no %s", tc.key)
			continue
		}
		if m.Value.Value != tc.value || m.MetricType != tc.typ {
			t.Errorf("pod: %s = %d (%v), want %d (%v)", tc.key, m.Value.Value, m.MetricType, tc.value, tc.typ)
		}
		if want := []string{"", f.podGroup, "", f.pod, "ns", "p"}; fmt.Sprint(m.LabelValues[:len(baseLabels)]) != fmt.Sprint(want) {
			t.Errorf("pod: %s labels = %q, want %q", tc.key, m.LabelValues, want)
		}
	}
	// The pod cgroup has no quota and no cpu controller in the fake: no
	// CFS counters and no CPU limits, as cAdvisor leaves them out; no
	// I/O on any device.
	for _, name := range []string{"container_cpu_cfs_periods_total", "container_spec_cpu_shares", "container_spec_cpu_quota", "container_fs_reads_total"} {
		for key := range pod {
			if strings.HasPrefix(key, name) {
				t.Errorf("pod has %s", key)
			}
		}
	}
}

// TestPodSandboxMetricsCritest checks what critest checks: every name it
// expects is described and reported for a pod with a running container,
// with as many label values as the descriptor has keys.
func TestPodSandboxMetricsCritest(t *testing.T) {
	f := newStatsFixture(t)
	f.cg.set(f.ctrGroup, fullStats)
	pod, ctr, descs := f.podMetrics(t)
	found := map[string]bool{}
	for _, ms := range []map[string]*runtimeapi.Metric{pod, ctr} {
		for _, m := range ms {
			found[m.Name] = true
		}
	}
	for _, name := range criticalMetrics {
		if descs[name] == nil {
			t.Errorf("no descriptor for %s", name)
		}
		if !found[name] {
			t.Errorf("no %s for the pod or its container", name)
		}
	}
	// critest also wants every descriptor reported, bar the ones it knows
	// runtimes lack.
	for name := range descs {
		if !found[name] && name != "container_spec_cpu_quota" {
			t.Errorf("%s is described but not reported", name)
		}
	}
}

// TestPodSandboxMetricsMeasuresLayer: a container whose writable layer
// the background loop has not measured yet is measured on the spot, so
// its fs metrics are there on the first call, with the size of the
// filesystem its directory is on.
func TestPodSandboxMetricsMeasuresLayer(t *testing.T) {
	f := newStatsFixture(t)
	_, ctr, _ := f.podMetrics(t)
	c, _ := f.srv.containers.Get(f.ctr)
	var fs unix.Statfs_t
	if err := unix.Statfs(c.Dir, &fs); err != nil {
		t.Fatal(err)
	}
	if m := ctr["container_fs_limit_bytes/"+c.Dir]; m == nil || m.Value.Value != fs.Blocks*uint64(fs.Bsize) {
		t.Errorf("container_fs_limit_bytes = %v, want %d", m, fs.Blocks*uint64(fs.Bsize))
	}
	if m := ctr["container_fs_inodes_free/"+c.Dir]; m == nil || m.Value.Value == 0 {
		t.Errorf("container_fs_inodes_free = %v", m)
	}
	for _, name := range []string{"container_fs_usage_bytes", "container_fs_inodes_total"} {
		if ctr[name+"/"+c.Dir] == nil {
			t.Errorf("no %s", name)
		}
	}
	f.srv.stats.mu.Lock()
	_, ok := f.srv.stats.layers[f.ctr]
	f.srv.stats.mu.Unlock()
	if !ok {
		t.Error("the measurement was not kept for the next call")
	}
}

func (f *fakeCgroups) Update(group string, res *specs.LinuxResources) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.groups[group]; !ok {
		return fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
	}
	if f.updateErr != nil {
		return f.updateErr
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

// Pod resources the kernel or runc would refuse are refused before
// anything sees them, as a container's are: negative values would reach
// the cgroup as huge unsigned ones. An update that fails is not recorded.
func TestUpdatePodSandboxResourcesRefused(t *testing.T) {
	f := newStatsFixture(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name                string
		resources, overhead *runtimeapi.LinuxContainerResources
	}{
		{name: "negative cpu shares", resources: &runtimeapi.LinuxContainerResources{CpuShares: -1}},
		{name: "negative cpu period", resources: &runtimeapi.LinuxContainerResources{CpuPeriod: -5}},
		{name: "negative memory", resources: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: -100}},
		{name: "unified path", resources: &runtimeapi.LinuxContainerResources{Unified: map[string]string{"../cpu.max": "1"}}},
		{name: "negative overhead", resources: &runtimeapi.LinuxContainerResources{CpuShares: 512}, overhead: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: -1}},
		{name: "negative overhead quota", overhead: &runtimeapi.LinuxContainerResources{CpuQuota: -2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.srv.UpdatePodSandboxResources(ctx, &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: f.pod, Resources: tc.resources, Overhead: tc.overhead})
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
			if len(f.cg.updates) != 0 {
				t.Errorf("the pod cgroup was updated with %+v", f.cg.updates[0].res)
			}
			if r, ok := f.srv.podResources.Load(f.pod); ok {
				t.Errorf("the refused update was recorded: %v", r)
			}
		})
	}
	// A RuntimeClass's overhead may be below a container's minimums.
	small := &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: f.pod, Overhead: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 20, CpuShares: 1}}
	if _, err := f.srv.UpdatePodSandboxResources(ctx, small); err != nil {
		t.Fatalf("a 1 MiB overhead: %v", err)
	}
	f.srv.podResources.Delete(f.pod)
	f.cg.updateErr = fmt.Errorf("write cpu.weight: %w", unix.EINVAL)
	req := &runtimeapi.UpdatePodSandboxResourcesRequest{PodSandboxId: f.pod, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 512}}
	if _, err := f.srv.UpdatePodSandboxResources(ctx, req); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("err = %v, want the cgroup's EINVAL", err)
	}
	if r, ok := f.srv.podResources.Load(f.pod); ok {
		t.Errorf("an update that failed was recorded: %v", r)
	}
}

// removingPlugin removes the pod while plugins are told of its update.
type removingPlugin struct {
	*nritest.Fake
	srv     *Server
	removed chan error
}

func (p *removingPlugin) UpdatePodSandbox(ctx context.Context, pod *nriapi.PodSandbox, overhead, res *nriapi.LinuxResources) error {
	go func() {
		_, err := p.srv.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod.GetId()})
		p.removed <- err
	}()
	// Long enough for the removal to end, unless the update holds the pod.
	select {
	case err := <-p.removed:
		p.removed <- err
	case <-time.After(time.Second):
	}
	return p.Fake.UpdatePodSandbox(ctx, pod, overhead, res)
}

// A pod removed while its resources are updated keeps no record of them.
func TestUpdatePodSandboxResourcesRacesRemoval(t *testing.T) {
	f := newStatsFixture(t)
	plugin := &removingPlugin{Fake: &nritest.Fake{}, srv: f.srv, removed: make(chan error, 1)}
	f.srv.SetNRI(plugin)
	_, err := f.srv.UpdatePodSandboxResources(context.Background(), &runtimeapi.UpdatePodSandboxResourcesRequest{
		PodSandboxId: f.pod, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 512},
	})
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatalf("err = %v, want success or NotFound", err)
	}
	select {
	case err := <-plugin.removed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the removal did not end")
	}
	if r, ok := f.srv.podResources.Load(f.pod); ok {
		t.Errorf("the removed pod's resources are kept: %v", r)
	}
}
