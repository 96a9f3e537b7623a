package test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// statsConfig measures writable layers often, so the layer test does not
// wait for the one-minute default.
const statsConfig = `
[metrics]
disk_usage_interval = "200ms"
`

func TestStats(t *testing.T) {
	e := newCtrEnvWith(t, statsConfig)
	t.Run("CPU", e.testStatsCPU)
	t.Run("WritableLayer", e.testStatsWritableLayer)
	t.Run("Memory", e.testStatsMemory)
	t.Run("Pressure", e.testStatsPressure)
	t.Run("Network", e.testStatsNetwork)
	t.Run("ManyPods", e.testStatsManyPods)
	t.Run("ImageFsInfo", e.testImageFsInfo)
	t.Run("PodMetrics", e.testPodMetrics)
	t.Run("Streams", e.testStreams)
}

// criMetrics are the cAdvisor metrics critest (cri-tools v1.37.0) expects
// for a pod with a running container and that pinrt reports, with what
// a plausible value is: at least min, or exactly exact where the
// container's configuration fixes it. io marks those that exist only
// where the kernel accounts the container's block I/O.
var criMetrics = []struct {
	name     string
	min      uint64
	io       bool
	hugetlb  bool
	exactV1  uint64
	exactAny uint64
}{
	// Only where the host has the hugetlb controller and the cgroup its
	// files; 0 bytes of huge pages in use.
	{name: "container_hugetlb_usage_bytes", hugetlb: true},
	{name: "container_hugetlb_max_usage_bytes", hugetlb: true},
	{name: "container_blkio_device_usage_total", io: true},
	{name: "container_cpu_cfs_periods_total", min: 1},
	{name: "container_cpu_cfs_throttled_periods_total"},
	{name: "container_cpu_cfs_throttled_seconds_total"},
	{name: "container_cpu_system_seconds_total"},
	{name: "container_cpu_usage_seconds_total"},
	{name: "container_cpu_user_seconds_total"},
	// Two processes' stdio at least.
	{name: "container_file_descriptors", min: 6},
	{name: "container_fs_inodes_free", min: 1},
	// The upper directory and the ten files critest writes.
	{name: "container_fs_inodes_total", min: 11},
	{name: "container_fs_limit_bytes", min: 1 << 20},
	{name: "container_fs_reads_bytes_total", io: true},
	{name: "container_fs_reads_total", io: true},
	{name: "container_fs_usage_bytes", min: 1},
	{name: "container_fs_writes_bytes_total", io: true},
	{name: "container_fs_writes_total", io: true},
	{name: "container_last_seen", min: 1},
	{name: "container_memory_cache", min: 1},
	{name: "container_memory_failcnt"},
	{name: "container_memory_failures_total", min: 1},
	{name: "container_memory_kernel_usage", min: 1},
	// nc's busybox copy is mapped.
	{name: "container_memory_mapped_file", min: 1},
	{name: "container_memory_max_usage_bytes", min: 1},
	{name: "container_memory_rss", min: 1},
	{name: "container_memory_swap"},
	{name: "container_memory_usage_bytes", min: 1},
	{name: "container_memory_working_set_bytes", min: 1},
	// The network counters are the pod's, of its netns.
	{name: "container_network_receive_bytes_total"},
	{name: "container_network_receive_errors_total"},
	{name: "container_network_receive_packets_dropped_total"},
	{name: "container_network_receive_packets_total"},
	{name: "container_network_transmit_bytes_total"},
	{name: "container_network_transmit_errors_total"},
	{name: "container_network_transmit_packets_dropped_total"},
	{name: "container_network_transmit_packets_total"},
	{name: "container_oom_events_total"},
	{name: "container_processes", min: 2},
	// nc's listening socket.
	{name: "container_sockets", min: 1},
	{name: "container_spec_cpu_period", exactAny: 100000},
	// runc writes shares as a v2 weight, which reads back as other shares.
	{name: "container_spec_cpu_shares", min: 2, exactV1: 1024},
	{name: "container_spec_memory_limit_bytes", exactAny: 64 << 20},
	// v1's memory+swap limit; v2's swap alone, which is 0 here.
	{name: "container_spec_memory_swap_limit_bytes", exactV1: 64 << 20},
	// kubelet sets no reservation (v1's soft limit, v2's memory.min).
	{name: "container_spec_memory_reservation_limit_bytes"},
	// The open files limit of the container's first process.
	{name: "container_ulimits_soft", min: 1},
	{name: "container_start_time_seconds", min: 1},
	{name: "container_threads", min: 2},
	{name: "container_threads_max"},
}

// testPodMetrics runs a container the way critest's metrics spec does
// (its limits, ten small files written and synced) and checks that
// ListPodSandboxMetrics reports every metric critest expects, with
// cAdvisor's labels and a plausible value.
func (e *ctrEnv) testPodMetrics(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stats-metrics"))
	// nc runs from a copy of busybox the container wrote itself, so that
	// the page cache it maps is charged to the container's cgroup, not to
	// whoever read the image's busybox first.
	cfg := e.ctr("app", "sh", "-c", "mkdir /tmp/bb && cp /bin/busybox /tmp/bb/ && /tmp/bb/busybox nc -l -p 8080 & exec sleep 3600")
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 20000, CpuShares: 1024,
		MemoryLimitInBytes: 64 << 20, MemorySwapLimitInBytes: 64 << 20,
	}
	id := e.run(t, pod, podCfg, cfg)
	e.mustExec(t, id, "sh", "-c", "mkdir -p /var/lib/mydisktest && for i in $(seq 1 10); do echo hi >> /var/lib/mydisktest/inode_test_file_$i; done; sync")
	// Direct I/O reaches the disk as the container's own bios, which v2's
	// io controller accounts to its cgroup, and v1's blk-throttle too once
	// the device has a rule.
	if !CgroupV2() {
		throttleV1(t, e, id)
	}
	e.mustExec(t, id, "dd", "if=/dev/zero", "of=/direct", "bs=1M", "count=8", "oflag=direct")

	descs, err := e.d.Runtime.ListMetricDescriptors(Ctx(t), &runtimeapi.ListMetricDescriptorsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]int{}
	for _, d := range descs.Descriptors {
		keys[d.Name] = len(d.LabelKeys)
	}
	var pm *runtimeapi.PodSandboxMetrics
	var before int64
	// nc may not listen yet, the background loop (every 200ms here) may
	// have measured the writable layer before the files were written, and
	// the kernel counts a CFS period only when the period's timer (100ms)
	// first expires after the container ran.
	waitFor(t, 10*time.Second, "nc's socket and the written files in the metrics", func() bool {
		before = time.Now().Unix()
		resp, err := e.d.Runtime.ListPodSandboxMetrics(Ctx(t), &runtimeapi.ListPodSandboxMetricsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		pm = nil
		for _, m := range resp.PodMetrics {
			if m.PodSandboxId == pod {
				pm = m
			}
		}
		if pm == nil || len(pm.ContainerMetrics) != 1 || pm.ContainerMetrics[0].ContainerId != id {
			t.Fatalf("metrics of pod %s: %v", pod, pm)
		}
		var sockets, inodes, periods uint64
		for _, m := range pm.ContainerMetrics[0].Metrics {
			switch m.Name {
			case "container_sockets":
				sockets = m.Value.GetValue()
			case "container_fs_inodes_total":
				inodes = m.Value.GetValue()
			case "container_cpu_cfs_periods_total":
				periods = m.Value.GetValue()
			}
		}
		return sockets > 0 && inodes >= 11 && periods > 0
	})
	// The id label is the cgroup's directory, as cAdvisor names it: under
	// systemd, the pod's slice and the container's scope in it.
	podCg, ctrCg := "/pinrt/"+pod, "/pinrt/"+pod+"/pinrt-"+id
	if CgroupDriver() == "systemd" {
		podCg = "/pinrt.slice/pinrt-" + pod + ".slice"
		ctrCg = podCg + "/pinrt-" + id + ".scope"
	}
	podLabels := []string{"", podCg, "", pod, "e2e", "stats-metrics"}
	ctrLabels := []string{"app", ctrCg, e.busybox, id, "e2e", "stats-metrics"}
	// The largest value of each name, its labels checked.
	values := map[string]uint64{}
	for _, set := range []struct {
		ms     []*runtimeapi.Metric
		labels []string
	}{{pm.Metrics, podLabels}, {pm.ContainerMetrics[0].Metrics, ctrLabels}} {
		for _, m := range set.ms {
			n, ok := keys[m.Name]
			if !ok {
				t.Errorf("%s has no descriptor", m.Name)
				continue
			}
			if len(m.LabelValues) != n || strings.Join(m.LabelValues[:len(set.labels)], ",") != strings.Join(set.labels, ",") {
				t.Errorf("%s labels %q: want %d starting with %q", m.Name, m.LabelValues, n, set.labels)
				continue
			}
			if set.labels[0] == "" && !strings.HasPrefix(m.Name, "container_network_") {
				continue
			}
			values[m.Name] = max(values[m.Name], m.Value.GetValue())
		}
	}
	accounted, huge := ioAccounted(t, e, id), hugetlbFiles(t, e, id)
	for _, want := range criMetrics {
		if _, ok := keys[want.name]; !ok {
			t.Errorf("no descriptor for %s", want.name)
		}
		v, ok := values[want.name]
		switch {
		case !ok && want.io && !accounted:
			t.Logf("%s: none, the kernel accounts no block I/O to the container here", want.name)
		case !ok && want.hugetlb && !huge:
			t.Logf("%s: none, the container's cgroup has no hugetlb controller here", want.name)
		case ok && want.hugetlb && !huge:
			t.Errorf("%s = %d for a cgroup without the hugetlb controller", want.name, v)
		case !ok:
			t.Errorf("no %s", want.name)
		case want.exactAny != 0 && v != want.exactAny:
			t.Errorf("%s = %d, want %d", want.name, v, want.exactAny)
		case want.exactV1 != 0 && !CgroupV2() && v != want.exactV1:
			t.Errorf("%s = %d, want %d on cgroup v1", want.name, v, want.exactV1)
		case v < want.min:
			t.Errorf("%s = %d, want at least %d", want.name, v, want.min)
		}
	}
	if accounted && values["container_fs_writes_bytes_total"] < 8<<20 {
		t.Errorf("container_fs_writes_bytes_total = %d after 8 MiB of direct writes", values["container_fs_writes_bytes_total"])
	}
	if v := int64(values["container_last_seen"]); v < before || v > time.Now().Unix() {
		t.Errorf("container_last_seen = %d, want the time of the call, %d", v, before)
	}
}

// throttleV1 sets a write limit far above what the test writes on the
// disk under the daemon's root, in the container's v1 blkio cgroup:
// blk-throttle on recent kernels accounts no I/O on a device without a
// rule. A partition or a device that takes no rule leaves it unaccounted.
func throttleV1(t *testing.T, e *ctrEnv, id string) {
	var st unix.Stat_t
	if err := unix.Stat(e.d.Root, &st); err != nil {
		t.Fatal(err)
	}
	dir := CgroupDir(t, e.info(t, id).Pid, "blkio")
	rule := fmt.Sprintf("%d:%d %d", unix.Major(st.Dev), unix.Minor(st.Dev), uint64(1)<<40)
	if err := os.WriteFile(filepath.Join(dir, "blkio.throttle.write_bps_device"), []byte(rule), 0o644); err != nil {
		t.Logf("no throttle rule %q for the container: %v", rule, err)
	}
}

// ioAccounted tells whether the kernel counted any block I/O for the
// container's cgroup; critest too accepts no I/O series where it did
// not.
func ioAccounted(t *testing.T, e *ctrEnv, id string) bool {
	pid := e.info(t, id).Pid
	if CgroupV2() {
		b, _ := os.ReadFile(filepath.Join(CgroupDir(t, pid, ""), "io.stat"))
		return len(strings.TrimSpace(string(b))) > 0
	}
	b, _ := os.ReadFile(filepath.Join(CgroupDir(t, pid, "blkio"), "blkio.throttle.io_service_bytes_recursive"))
	return strings.Contains(string(b), ":")
}

// hugetlbFiles tells whether the container's cgroup has the hugetlb
// controller's files: v2 enables it where the parents do, v1 where the
// host mounts its hierarchy.
func hugetlbFiles(t *testing.T, e *ctrEnv, id string) bool {
	pid := e.info(t, id).Pid
	dir := ""
	if CgroupV2() {
		dir = CgroupDir(t, pid, "")
	} else if _, err := os.Stat("/sys/fs/cgroup/hugetlb"); err == nil {
		dir = CgroupDir(t, pid, "hugetlb")
	}
	m, _ := filepath.Glob(filepath.Join(dir, "hugetlb.*B.*"))
	return dir != "" && len(m) > 0
}

func (e *ctrEnv) testStreams(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stats-stream"))
	e.run(t, pod, podCfg, e.ctr("app", "sleep", "3600"))
	list, err := e.d.Runtime.ListPodSandbox(Ctx(t), &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.d.Runtime.StreamPodSandboxes(Ctx(t), &runtimeapi.StreamPodSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		page, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n += len(page.PodSandboxes)
	}
	if n != len(list.Items) || n == 0 {
		t.Errorf("StreamPodSandboxes sent %d pods, ListPodSandbox %d", n, len(list.Items))
	}
	stats, err := e.d.Runtime.StreamContainerStats(Ctx(t), &runtimeapi.StreamContainerStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	page, err := stats.Recv()
	if err != nil || len(page.ContainerStats) == 0 {
		t.Errorf("StreamContainerStats first page: %v, %v", page, err)
	}
}

func (e *ctrEnv) ctrStats(t testing.TB, id string) *runtimeapi.ContainerStats {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStats(Ctx(t), &runtimeapi.ContainerStatsRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStats(%s): %v", id, err)
	}
	return resp.Stats
}

func (e *ctrEnv) podStats(t testing.TB, id string) *runtimeapi.PodSandboxStats {
	t.Helper()
	resp, err := e.d.Runtime.PodSandboxStats(Ctx(t), &runtimeapi.PodSandboxStatsRequest{PodSandboxId: id})
	if err != nil {
		t.Fatalf("PodSandboxStats(%s): %v", id, err)
	}
	return resp.Stats
}

func (e *ctrEnv) testStatsCPU(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stats-cpu"))
	id := e.run(t, pod, podCfg, e.ctr("burn", "sh", "-c", "while :; do :; done"))
	first := e.ctrStats(t, id)
	if first.GetCpu().GetUsageCoreNanoSeconds() == nil {
		t.Fatalf("no CPU usage: %v", first)
	}
	time.Sleep(time.Second)
	second := e.ctrStats(t, id)
	used := second.Cpu.UsageCoreNanoSeconds.Value - first.Cpu.UsageCoreNanoSeconds.Value
	// A busy loop gets most of a core on an idle machine; this one is
	// shared, so ask for a tenth.
	if used < uint64(100*time.Millisecond) {
		t.Errorf("a busy loop used %v of CPU in a second", time.Duration(used))
	}
	if rate := second.Cpu.GetUsageNanoCores().GetValue(); rate < 1e8 {
		t.Errorf("usage_nano_cores = %d, want at least a tenth of a core", rate)
	}
	if got := second.Attributes.GetMetadata().GetName(); got != "burn" {
		t.Errorf("attributes name = %q", got)
	}
	ps := e.podStats(t, pod)
	if ps.Linux.GetCpu().GetUsageCoreNanoSeconds().GetValue() < second.Cpu.UsageCoreNanoSeconds.Value {
		t.Errorf("pod CPU %d below its container's %d", ps.Linux.Cpu.UsageCoreNanoSeconds.Value, second.Cpu.UsageCoreNanoSeconds.Value)
	}
	if n := ps.Linux.GetProcess().GetProcessCount().GetValue(); n < 1 {
		t.Errorf("pod process count = %d", n)
	}
	if len(ps.Linux.Containers) != 1 || ps.Linux.Containers[0].Attributes.Id != id {
		t.Errorf("pod stats containers = %v", ps.Linux.Containers)
	}
}

// testStatsPressure: a busy loop held to a tenth of a CPU stalls most of
// the time, which the kernel's pressure stall information counts and CRI
// reports, in the container's stats, the pod's and the cAdvisor metrics.
// On a hybrid host it is read from the v2 hierarchy runc puts every
// container in beside the v1 ones.
func (e *ctrEnv) testStatsPressure(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/cpu"); err != nil {
		t.Skipf("the kernel keeps no pressure stall information (booted with psi=0, or without CONFIG_PSI): %v", err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err != nil && !CgroupV2() {
		t.Skip("cgroup v1 without a v2 hierarchy: no pressure per cgroup")
	}
	pod, podCfg := e.pod(t, PodConfig("stats-pressure"))
	cfg := e.ctr("throttled", "sh", "-c", "while :; do :; done")
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 10000}
	id := e.run(t, pod, podCfg, cfg)
	var st *runtimeapi.ContainerStats
	// The kernel updates the averages every 2 seconds.
	waitFor(t, 20*time.Second, "a second of CPU stall and its average in the throttled container's stats", func() bool {
		st = e.ctrStats(t, id)
		return st.GetCpu().GetPsi().GetSome().GetTotal() >= uint64(time.Second) && st.Cpu.Psi.Some.Avg10 > 0
	})
	cpu := st.Cpu.Psi
	// Throttling stalls every task of the cgroup: full as much as some.
	if cpu.Full == nil || cpu.Full.Total == 0 || cpu.Some.Avg10 > 100 {
		t.Errorf("CPU PSI %v: want full stall time and a 10 s average in (0, 100]", cpu)
	}
	if st.Memory.GetPsi().GetSome() == nil || st.Memory.Psi.GetFull() == nil || st.GetIo().GetPsi().GetSome() == nil || st.Io.Timestamp == 0 {
		t.Errorf("memory PSI %v, I/O %v: want both, with some and full", st.Memory.GetPsi(), st.GetIo())
	}
	// The pod's cgroup counts its containers' stalls (not all of the
	// time its throttled child does: the kernel accounts a stall to each
	// level by its own runnable and running tasks).
	ps := e.podStats(t, pod)
	if got := ps.Linux.GetCpu().GetPsi().GetSome().GetTotal(); got == 0 {
		t.Errorf("pod CPU PSI some total %v, want its container's stalls", time.Duration(got))
	}
	if ps.Linux.GetIo().GetPsi() == nil || ps.Linux.GetMemory().GetPsi() == nil {
		t.Errorf("pod I/O %v memory PSI %v, want both", ps.Linux.GetIo(), ps.Linux.GetMemory().GetPsi())
	}
	resp, err := e.d.Runtime.ListPodSandboxMetrics(Ctx(t), &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]uint64{}
	for _, pm := range resp.PodMetrics {
		for _, cm := range pm.ContainerMetrics {
			if cm.ContainerId != id {
				continue
			}
			for _, m := range cm.Metrics {
				values[m.Name] = m.Value.GetValue()
			}
		}
	}
	for _, name := range []string{"container_pressure_cpu_waiting_seconds_total", "container_pressure_cpu_stalled_seconds_total"} {
		if v, ok := values[name]; !ok || v < 1 {
			t.Errorf("%s = %d (%v), want at least a second", name, v, ok)
		}
	}
	for _, name := range []string{"memory_stalled", "memory_waiting", "io_stalled", "io_waiting"} {
		if _, ok := values["container_pressure_"+name+"_seconds_total"]; !ok {
			t.Errorf("no container_pressure_%s_seconds_total", name)
		}
	}
}

func (e *ctrEnv) testStatsWritableLayer(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stats-layer"))
	id := e.run(t, pod, podCfg, e.ctr("writer", "sh", "-c", "sleep 3600"))
	before := e.ctrStats(t, id).GetWritableLayer().GetUsedBytes().GetValue()
	e.mustExec(t, id, "dd", "if=/dev/zero", "of=/big", "bs=1M", "count=50")
	const want = 50 << 20
	var got uint64
	waitFor(t, 10*time.Second, "the writable layer to grow by 50 MiB", func() bool {
		got = e.ctrStats(t, id).GetWritableLayer().GetUsedBytes().GetValue()
		return got-before >= want*9/10
	})
	if got-before > want*12/10 {
		t.Errorf("writable layer grew by %d bytes, want about %d", got-before, want)
	}
	if inodes := e.ctrStats(t, id).WritableLayer.GetInodesUsed().GetValue(); inodes < 2 {
		t.Errorf("inodes used = %d, want the upper dir and /big at least", inodes)
	}
}

func (e *ctrEnv) testStatsMemory(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stats-mem"))
	id := e.run(t, pod, podCfg, e.ctr("alloc", "sh", "-c", "sleep 3600"))
	base := e.ctrStats(t, id).GetMemory().GetWorkingSetBytes().GetValue()
	// tmpfs pages are charged to the writer's cgroup and are never
	// inactive file cache, so they count in the working set.
	e.mustExec(t, id, "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=40")
	st := e.ctrStats(t, id).GetMemory()
	if st == nil {
		t.Fatal("no memory statistics for a running container")
	}
	if grew := st.GetWorkingSetBytes().GetValue() - base; grew < 35<<20 {
		t.Errorf("working set grew by %d bytes after writing 40 MiB to tmpfs", grew)
	}
	if st.GetUsageBytes().GetValue() < st.GetWorkingSetBytes().GetValue() {
		t.Errorf("usage %d below the working set %d", st.UsageBytes.Value, st.WorkingSetBytes.Value)
	}
	if st.GetPageFaults().GetValue() == 0 {
		t.Error("no page faults counted")
	}
	if st.AvailableBytes != nil {
		t.Errorf("available_bytes = %d for a container without a limit", st.AvailableBytes.Value)
	}
}

func ifaceUsage(ps *runtimeapi.PodSandboxStats) *runtimeapi.NetworkInterfaceUsage {
	return ps.GetLinux().GetNetwork().GetDefaultInterface()
}

func (e *ctrEnv) testStatsNetwork(t *testing.T) {
	podA, cfgA := e.pod(t, PodConfig("stats-net-a"))
	podB, cfgB := e.pod(t, PodConfig("stats-net-b"))
	a := e.run(t, podA, cfgA, e.ctr("pinger", "sleep", "3600"))
	e.run(t, podB, cfgB, e.ctr("target", "sleep", "3600"))
	st, _ := e.d.PodStatus(t, podB)
	ipB := st.GetNetwork().GetIp()
	if ipB == "" {
		t.Fatal("pod B has no IP")
	}
	beforeA, beforeB := ifaceUsage(e.podStats(t, podA)), ifaceUsage(e.podStats(t, podB))
	if beforeA == nil || beforeA.Name != "eth0" || beforeB == nil {
		t.Fatalf("default interfaces: %v, %v", beforeA, beforeB)
	}
	// 20 echo requests of 1000 bytes each way, plus headers.
	out, code := e.exec(t, a, "ping", "-c", "20", "-i", "0.2", "-s", "1000", "-W", "5", ipB)
	if code != 0 {
		t.Fatalf("ping %s: exit %d: %s", ipB, code, out)
	}
	afterA, afterB := ifaceUsage(e.podStats(t, podA)), ifaceUsage(e.podStats(t, podB))
	const min = 20 * 1000
	for _, c := range []struct {
		what          string
		before, after uint64
	}{
		{"A tx", beforeA.TxBytes.GetValue(), afterA.TxBytes.GetValue()},
		{"A rx", beforeA.RxBytes.GetValue(), afterA.RxBytes.GetValue()},
		{"B tx", beforeB.TxBytes.GetValue(), afterB.TxBytes.GetValue()},
		{"B rx", beforeB.RxBytes.GetValue(), afterB.RxBytes.GetValue()},
	} {
		if c.after-c.before < min {
			t.Errorf("%s grew by %d bytes during the ping, want at least %d", c.what, c.after-c.before, min)
		}
	}
	if afterA.RxErrors.GetValue() != 0 || afterA.TxErrors.GetValue() != 0 {
		t.Errorf("errors on A: rx %d tx %d", afterA.RxErrors.GetValue(), afterA.TxErrors.GetValue())
	}
}

func (e *ctrEnv) testStatsManyPods(t *testing.T) {
	const n = 20
	ids := map[string]bool{}
	for i := range n {
		cfg := PodConfig(fmt.Sprintf("stats-many-%d", i))
		cfg.Labels = map[string]string{"batch": "stats-many"}
		id, _ := e.pod(t, cfg)
		ids[id] = true
	}
	start := time.Now()
	resp, err := e.d.Runtime.ListPodSandboxStats(Ctx(t), &runtimeapi.ListPodSandboxStatsRequest{
		Filter: &runtimeapi.PodSandboxStatsFilter{LabelSelector: map[string]string{"batch": "stats-many"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ListPodSandboxStats of %d pods took %v", n, time.Since(start))
	if len(resp.Stats) != n {
		t.Fatalf("ListPodSandboxStats returned %d entries, want %d", len(resp.Stats), n)
	}
	for _, ps := range resp.Stats {
		if !ids[ps.Attributes.Id] {
			t.Errorf("unexpected pod %s", ps.Attributes.Id)
		}
		if ifaceUsage(ps) == nil {
			t.Errorf("pod %s has no network stats", ps.Attributes.Id)
		}
		// No container ever ran: the pod cgroup does not exist yet.
		if ps.Linux.Cpu != nil || len(ps.Linux.Containers) != 0 {
			t.Errorf("pod %s without containers has CPU %v, containers %v", ps.Attributes.Id, ps.Linux.Cpu, ps.Linux.Containers)
		}
	}
	one, err := e.d.Runtime.ListPodSandboxStats(Ctx(t), &runtimeapi.ListPodSandboxStatsRequest{
		Filter: &runtimeapi.PodSandboxStatsFilter{Id: resp.Stats[0].Attributes.Id[:12]},
	})
	if err != nil || len(one.Stats) != 1 {
		t.Errorf("filter by short ID: %d entries, %v", len(one.GetStats()), err)
	}
}

func (e *ctrEnv) testImageFsInfo(t *testing.T) {
	resp, err := e.d.Image.ImageFsInfo(Ctx(t), &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ImageFilesystems) != 1 || len(resp.ContainerFilesystems) != 1 {
		t.Fatalf("ImageFsInfo = %v", resp)
	}
	if mp := resp.ContainerFilesystems[0].FsId.GetMountpoint(); !strings.HasPrefix(mp, e.d.Root) {
		t.Errorf("container filesystem %q is not under the root %s", mp, e.d.Root)
	}
}
