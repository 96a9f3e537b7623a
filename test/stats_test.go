package test

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

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
	t.Run("Network", e.testStatsNetwork)
	t.Run("ManyPods", e.testStatsManyPods)
	t.Run("ImageFsInfo", e.testImageFsInfo)
	t.Run("PodMetrics", e.testPodMetrics)
	t.Run("Streams", e.testStreams)
}

func (e *ctrEnv) testPodMetrics(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stats-metrics"))
	id := e.run(t, pod, podCfg, e.ctr("app", "sleep", "3600"))
	resp, err := e.d.Runtime.ListPodSandboxMetrics(Ctx(t), &runtimeapi.ListPodSandboxMetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var pm *runtimeapi.PodSandboxMetrics
	for _, m := range resp.PodMetrics {
		if m.PodSandboxId == pod {
			pm = m
		}
	}
	if pm == nil || len(pm.ContainerMetrics) != 1 || pm.ContainerMetrics[0].ContainerId != id {
		t.Fatalf("metrics of pod %s: %v", pod, pm)
	}
	has := func(ms []*runtimeapi.Metric, name string, labels ...string) bool {
		for _, m := range ms {
			if m.Name == name && strings.Join(m.LabelValues, ",") == strings.Join(labels, ",") {
				return true
			}
		}
		return false
	}
	// The id label is the cgroup's directory, as cAdvisor names it: under
	// systemd, the pod's slice and the container's scope in it.
	podCg, ctrCg := "/pinrt/"+pod, "/pinrt/"+pod+"/pinrt-"+id
	if CgroupDriver() == "systemd" {
		podCg = "/pinrt.slice/pinrt-" + pod + ".slice"
		ctrCg = podCg + "/pinrt-" + id + ".scope"
	}
	if !has(pm.Metrics, "container_network_receive_bytes_total", "", podCg, "", pod, "e2e", "stats-metrics", "eth0") {
		t.Errorf("no pod network metric for eth0 in %v", pm.Metrics)
	}
	cm := pm.ContainerMetrics[0].Metrics
	if !has(cm, "container_memory_working_set_bytes", "app", ctrCg, e.busybox, id, "e2e", "stats-metrics") {
		t.Errorf("no container working set metric in %v", cm)
	}
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
