package server

import (
	"context"
	"strconv"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/sandbox"
)

// This file serves the metrics kubelet exposes on /metrics/cadvisor when
// its PodAndContainerStatsFromCRI gate is on. kubelet turns each
// descriptor into a Prometheus description with LabelKeys as variable
// labels and each Metric into a constant sample, so the names, types and
// labels are cAdvisor's: dashboards and HPA rules written for cAdvisor
// keep working. CRI carries values as integers, so the *_seconds_total
// counters are whole seconds, as in the other CRI runtimes.

// cAdvisor's labels: the container name, the cgroup path as "id", the
// image, the runtime's name for the container, and the pod. Pod-level
// series have an empty container name, as cAdvisor gives the pod cgroup.
var baseLabels = []string{"container", "id", "image", "name", "namespace", "pod"}

type metricDef struct {
	name, help string
	typ        runtimeapi.MetricType
	extra      []string
}

const (
	counter = runtimeapi.MetricType_COUNTER
	gauge   = runtimeapi.MetricType_GAUGE
)

var (
	mCPU           = metricDef{"container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", counter, nil}
	mCPUUser       = metricDef{"container_cpu_user_seconds_total", "Cumulative user cpu time consumed in seconds.", counter, nil}
	mCPUSystem     = metricDef{"container_cpu_system_seconds_total", "Cumulative system cpu time consumed in seconds.", counter, nil}
	mCFSPeriods    = metricDef{"container_cpu_cfs_periods_total", "Number of elapsed enforcement period intervals.", counter, nil}
	mCFSThrottled  = metricDef{"container_cpu_cfs_throttled_periods_total", "Number of throttled period intervals.", counter, nil}
	mCFSThrottledS = metricDef{"container_cpu_cfs_throttled_seconds_total", "Total time duration the container has been throttled.", counter, nil}
	mWorkingSet    = metricDef{"container_memory_working_set_bytes", "Current working set in bytes.", gauge, nil}
	mMemUsage      = metricDef{"container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed.", gauge, nil}
	mMemMaxUsage   = metricDef{"container_memory_max_usage_bytes", "Maximum memory usage recorded in bytes", gauge, nil}
	mRSS           = metricDef{"container_memory_rss", "Size of RSS in bytes.", gauge, nil}
	mCache         = metricDef{"container_memory_cache", "Number of bytes of page cache memory.", gauge, nil}
	mMappedFile    = metricDef{"container_memory_mapped_file", "Size of memory mapped files in bytes.", gauge, nil}
	mKernel        = metricDef{"container_memory_kernel_usage", "Size of kernel memory allocated in bytes.", gauge, nil}
	mSwap          = metricDef{"container_memory_swap", "Container swap usage in bytes.", gauge, nil}
	mFailcnt       = metricDef{"container_memory_failcnt", "Number of memory usage hits limits", counter, nil}
	mFailures      = metricDef{"container_memory_failures_total", "Cumulative count of memory allocation failures.", counter, []string{"failure_type", "scope"}}
	mOOM           = metricDef{"container_oom_events_total", "Count of out of memory events observed for the container", counter, nil}
	mMemLimit      = metricDef{"container_spec_memory_limit_bytes", "Memory limit for the container.", gauge, nil}
	mMemReserve    = metricDef{"container_spec_memory_reservation_limit_bytes", "Memory reservation limit for the container.", gauge, nil}
	mUlimitsSoft   = metricDef{"container_ulimits_soft", "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice", gauge, []string{"ulimit"}}
	mSwapLimit     = metricDef{"container_spec_memory_swap_limit_bytes", "Memory swap limit for the container.", gauge, nil}
	mCPUPeriod     = metricDef{"container_spec_cpu_period", "CPU period of the container.", gauge, nil}
	mCPUQuota      = metricDef{"container_spec_cpu_quota", "CPU quota of the container.", gauge, nil}
	mCPUShares     = metricDef{"container_spec_cpu_shares", "CPU share of the container.", gauge, nil}
	mProcesses     = metricDef{"container_processes", "Number of processes running inside the container.", gauge, nil}
	mThreads       = metricDef{"container_threads", "Number of threads running inside the container", gauge, nil}
	mThreadsMax    = metricDef{"container_threads_max", "Maximum number of threads allowed inside the container, infinity if value is zero", gauge, nil}
	mFDs           = metricDef{"container_file_descriptors", "Number of open file descriptors for the container.", gauge, nil}
	mSockets       = metricDef{"container_sockets", "Number of open sockets for the container.", gauge, nil}
	mStart         = metricDef{"container_start_time_seconds", "Start time of the container since unix epoch in seconds.", gauge, nil}
	mLastSeen      = metricDef{"container_last_seen", "Last time a container was seen by the exporter", gauge, nil}
	mFsUsage       = metricDef{"container_fs_usage_bytes", "Number of bytes that are consumed by the container on this filesystem.", gauge, []string{"device"}}
	mFsLimit       = metricDef{"container_fs_limit_bytes", "Number of bytes that can be consumed by the container on this filesystem.", gauge, []string{"device"}}
	mFsInodes      = metricDef{"container_fs_inodes_total", "Number of Inodes", gauge, []string{"device"}}
	mFsInodesFree  = metricDef{"container_fs_inodes_free", "Number of available Inodes", gauge, []string{"device"}}
	mFsReadBytes   = metricDef{"container_fs_reads_bytes_total", "Cumulative count of bytes read", counter, []string{"device"}}
	mFsReads       = metricDef{"container_fs_reads_total", "Cumulative count of reads completed", counter, []string{"device"}}
	mFsWriteBytes  = metricDef{"container_fs_writes_bytes_total", "Cumulative count of bytes written", counter, []string{"device"}}
	mFsWrites      = metricDef{"container_fs_writes_total", "Cumulative count of writes completed", counter, []string{"device"}}
	mBlkio         = metricDef{"container_blkio_device_usage_total", "Blkio Device bytes usage", counter, []string{"device", "major", "minor", "operation"}}
	mHugeUsage     = metricDef{"container_hugetlb_usage_bytes", "Current hugepage usage in bytes", gauge, []string{"pagesize"}}
	mHugeMaxUsage  = metricDef{"container_hugetlb_max_usage_bytes", "Maximum hugepage usages in bytes", gauge, []string{"pagesize"}}
	mCPUStalled    = metricDef{"container_pressure_cpu_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to CPU congestion.", counter, nil}
	mCPUWaiting    = metricDef{"container_pressure_cpu_waiting_seconds_total", "Total time duration tasks in the container have waited due to CPU congestion.", counter, nil}
	mMemStalled    = metricDef{"container_pressure_memory_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to memory congestion.", counter, nil}
	mMemWaiting    = metricDef{"container_pressure_memory_waiting_seconds_total", "Total time duration tasks in the container have waited due to memory congestion.", counter, nil}
	mIOStalled     = metricDef{"container_pressure_io_stalled_seconds_total", "Total time duration no tasks in the container could make progress due to IO congestion.", counter, nil}
	mIOWaiting     = metricDef{"container_pressure_io_waiting_seconds_total", "Total time duration tasks in the container have waited due to IO congestion.", counter, nil}
	mRxBytes       = metricDef{"container_network_receive_bytes_total", "Cumulative count of bytes received", counter, []string{"interface"}}
	mTxBytes       = metricDef{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", counter, []string{"interface"}}
	mRxPackets     = metricDef{"container_network_receive_packets_total", "Cumulative count of packets received", counter, []string{"interface"}}
	mTxPackets     = metricDef{"container_network_transmit_packets_total", "Cumulative count of packets transmitted", counter, []string{"interface"}}
	mRxErrors      = metricDef{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", counter, []string{"interface"}}
	mTxErrors      = metricDef{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", counter, []string{"interface"}}
	mRxDropped     = metricDef{"container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving", counter, []string{"interface"}}
	mTxDropped     = metricDef{"container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting", counter, []string{"interface"}}
	allMetricDefs  = []metricDef{
		mCPU, mCPUUser, mCPUSystem, mCFSPeriods, mCFSThrottled, mCFSThrottledS,
		mWorkingSet, mMemUsage, mMemMaxUsage, mRSS, mCache, mMappedFile, mKernel, mSwap, mFailcnt, mFailures, mOOM,
		mMemLimit, mMemReserve, mSwapLimit, mCPUPeriod, mCPUQuota, mCPUShares, mUlimitsSoft,
		mProcesses, mThreads, mThreadsMax, mFDs, mSockets, mStart, mLastSeen,
		mFsUsage, mFsLimit, mFsInodes, mFsInodesFree, mFsReadBytes, mFsReads, mFsWriteBytes, mFsWrites, mBlkio,
		mCPUStalled, mCPUWaiting, mMemStalled, mMemWaiting, mIOStalled, mIOWaiting, mHugeUsage, mHugeMaxUsage,
		mRxBytes, mTxBytes, mRxPackets, mTxPackets, mRxErrors, mTxErrors, mRxDropped, mTxDropped,
	}
)

// ListMetricDescriptors describes every metric ListPodSandboxMetrics
// returns.
func (s *Server) ListMetricDescriptors(ctx context.Context, req *runtimeapi.ListMetricDescriptorsRequest) (*runtimeapi.ListMetricDescriptorsResponse, error) {
	out := make([]*runtimeapi.MetricDescriptor, 0, len(allMetricDefs))
	for _, d := range allMetricDefs {
		out = append(out, &runtimeapi.MetricDescriptor{Name: d.name, Help: d.help, LabelKeys: append(append([]string{}, baseLabels...), d.extra...)})
	}
	return &runtimeapi.ListMetricDescriptorsResponse{Descriptors: out}, nil
}

// ListPodSandboxMetrics reports the cAdvisor metrics of every pod and its
// containers.
func (s *Server) ListPodSandboxMetrics(ctx context.Context, req *runtimeapi.ListPodSandboxMetricsRequest) (*runtimeapi.ListPodSandboxMetricsResponse, error) {
	pods, ctrs := s.sandboxes.List(), s.containersByPod()
	out := make([]*runtimeapi.PodSandboxMetrics, 0, len(pods))
	for _, sb := range pods {
		out = append(out, s.podMetrics(ctx, sb, ctrs[sb.ID]))
	}
	return &runtimeapi.ListPodSandboxMetricsResponse{PodMetrics: out}, nil
}

// metricSet accumulates samples that share their base labels.
type metricSet struct {
	at     int64
	labels []string
	out    []*runtimeapi.Metric
}

func (m *metricSet) add(d metricDef, v uint64, extra ...string) {
	// The samples without extra labels share the base ones: nothing
	// changes them once the response is built.
	labels := m.labels
	if len(extra) > 0 {
		labels = append(m.labels[:len(m.labels):len(m.labels)], extra...)
	}
	m.out = append(m.out, &runtimeapi.Metric{
		Name: d.name, Timestamp: m.at, MetricType: d.typ,
		LabelValues: labels,
		Value:       &runtimeapi.UInt64Value{Value: v},
	})
}

// seconds truncates nanoseconds to the whole seconds CRI can carry.
func seconds(ns uint64) uint64 { return ns / uint64(time.Second) }

// cgroup adds what StatAll read. As in cAdvisor, the CFS counters are
// there only for a cgroup with a CPU quota and the CPU limits only for
// one with the cpu controller; block I/O only for the devices the kernel
// accounted I/O on.
func (m *metricSet) cgroup(st *cgroups.Stats) {
	if st == nil {
		return
	}
	c := st.CPU
	m.add(mCPU, seconds(st.CPUUsageNanos))
	m.add(mCPUUser, seconds(c.UserNanos))
	m.add(mCPUSystem, seconds(c.SystemNanos))
	if c.Spec.Quota != 0 {
		m.add(mCFSPeriods, c.Periods)
		m.add(mCFSThrottled, c.ThrottledPeriods)
		m.add(mCFSThrottledS, seconds(c.ThrottledNanos))
	}
	if c.Spec.Known {
		m.add(mCPUPeriod, c.Spec.Period)
		if c.Spec.Quota != 0 {
			m.add(mCPUQuota, c.Spec.Quota)
		}
		m.add(mCPUShares, c.Spec.Shares)
	}
	mem := st.Memory
	m.add(mWorkingSet, mem.WorkingSet)
	m.add(mMemUsage, mem.Usage)
	m.add(mMemMaxUsage, mem.MaxUsage)
	m.add(mRSS, mem.RSS)
	m.add(mCache, mem.Cache)
	m.add(mMappedFile, mem.MappedFile)
	m.add(mKernel, mem.Kernel)
	// 0 without swap accounting, as cAdvisor reports it.
	m.add(mSwap, mem.Swap)
	m.add(mFailcnt, mem.Failcnt)
	m.add(mFailures, mem.LocalPageFaults, "pgfault", "container")
	m.add(mFailures, mem.LocalMajorPageFaults, "pgmajfault", "container")
	m.add(mFailures, mem.PageFaults, "pgfault", "hierarchy")
	m.add(mFailures, mem.MajorPageFaults, "pgmajfault", "hierarchy")
	m.add(mOOM, st.OOMKills)
	m.add(mMemLimit, mem.Limit)
	m.add(mMemReserve, mem.Reservation)
	m.add(mSwapLimit, mem.SwapLimit)
	m.add(mProcesses, st.Processes.Count)
	m.add(mThreads, st.Pids)
	m.add(mThreadsMax, st.PidsLimit)
	m.add(mFDs, st.Processes.FDs)
	m.add(mSockets, st.Processes.Sockets)
	// As cAdvisor: "stalled" is the time all tasks waited (full),
	// "waiting" the time some did; only where the kernel keeps PSI.
	for _, p := range []struct {
		psi              *cgroups.Pressure
		stalled, waiting metricDef
	}{{st.CPUPressure, mCPUStalled, mCPUWaiting}, {st.MemoryPressure, mMemStalled, mMemWaiting}, {st.IOPressure, mIOStalled, mIOWaiting}} {
		if p.psi != nil {
			m.add(p.stalled, seconds(p.psi.Full.TotalNanos))
			m.add(p.waiting, seconds(p.psi.Some.TotalNanos))
		}
	}
	for _, h := range st.Hugetlb {
		m.add(mHugeUsage, h.Usage, h.PageSize)
		m.add(mHugeMaxUsage, h.MaxUsage, h.PageSize)
	}
	for _, d := range st.IO {
		m.add(mFsReadBytes, d.ReadBytes, d.Device)
		m.add(mFsReads, d.Reads, d.Device)
		m.add(mFsWriteBytes, d.WriteBytes, d.Device)
		m.add(mFsWrites, d.Writes, d.Device)
		maj, mnr := strconv.FormatUint(uint64(d.Major), 10), strconv.FormatUint(uint64(d.Minor), 10)
		m.add(mBlkio, d.ReadBytes, d.Device, maj, mnr, "Read")
		m.add(mBlkio, d.WriteBytes, d.Device, maj, mnr, "Write")
	}
}

// layer adds the writable layer's usage on its filesystem: the bytes and
// inodes it uses (cAdvisor's inodes_total for CRI-O is the layer's
// inodes too) and the filesystem's size and free inodes.
func (m *metricSet) layer(u fsUsage, device string) {
	m.add(mFsUsage, u.bytes, device)
	m.add(mFsInodes, u.inodes, device)
	m.add(mFsLimit, u.limit, device)
	m.add(mFsInodesFree, u.inodesFree, device)
}

func (m *metricSet) network(devs []nsmgr.NetDev) {
	for _, d := range devs {
		m.add(mRxBytes, d.RxBytes, d.Name)
		m.add(mTxBytes, d.TxBytes, d.Name)
		m.add(mRxPackets, d.RxPackets, d.Name)
		m.add(mTxPackets, d.TxPackets, d.Name)
		m.add(mRxErrors, d.RxErrors, d.Name)
		m.add(mTxErrors, d.TxErrors, d.Name)
		m.add(mRxDropped, d.RxDropped, d.Name)
		m.add(mTxDropped, d.TxDropped, d.Name)
	}
}

func (s *Server) podMetrics(ctx context.Context, sb *sandbox.Sandbox, ctrs []*sandbox.Container) *runtimeapi.PodSandboxMetrics {
	at := time.Now()
	now, seen := at.UnixNano(), uint64(at.Unix())
	group := s.podCgroup(sb)
	pod := &metricSet{at: now, labels: []string{"", group, "", sb.ID, sb.Namespace, sb.Name}}
	pod.add(mLastSeen, seen)
	pod.cgroup(s.readCgroupAll(ctx, sb.ID, group))
	if pin := sb.Pins["net"]; pin != "" && sb.Status().State == sandbox.StateReady {
		if devs, err := s.deps.NetCounters.NetDev(pin); err == nil {
			pod.network(devs)
		}
	}
	out := &runtimeapi.PodSandboxMetrics{PodSandboxId: sb.ID, Metrics: pod.out}
	for _, c := range ctrs {
		cg := s.containerCgroup(c)
		set := &metricSet{at: now, labels: []string{c.Name, cg, c.Image, c.ID, sb.Namespace, sb.Name}}
		set.add(mLastSeen, seen)
		if cg != "" {
			set.cgroup(s.readCgroupAll(ctx, c.ID, cg))
		}
		st := c.Status()
		if !st.StartedAt.IsZero() {
			set.add(mStart, uint64(st.StartedAt.Unix()))
		}
		// cAdvisor's one ulimit, of the container's first process.
		if st.State == sandbox.ContainerRunning && st.Pid > 0 {
			if n, ok := s.deps.Cgroups.OpenFilesLimit(st.Pid); ok {
				set.add(mUlimitsSoft, n, "max_open_files")
			}
		}
		s.stats.mu.Lock()
		u, ok := s.stats.layers[c.ID]
		s.stats.mu.Unlock()
		if !ok {
			// Not measured yet: once now, as ContainerStats does.
			u = s.measureLayer(ctx, c)
		}
		set.layer(u, c.Dir)
		out.ContainerMetrics = append(out.ContainerMetrics, &runtimeapi.ContainerMetrics{ContainerId: c.ID, Metrics: set.out})
	}
	return out
}
