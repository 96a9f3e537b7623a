package server

import (
	"context"
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
	mCPU          = metricDef{"container_cpu_usage_seconds_total", "Cumulative cpu time consumed in seconds.", counter, nil}
	mWorkingSet   = metricDef{"container_memory_working_set_bytes", "Current working set in bytes.", gauge, nil}
	mMemUsage     = metricDef{"container_memory_usage_bytes", "Current memory usage in bytes, including all memory regardless of when it was accessed.", gauge, nil}
	mRSS          = metricDef{"container_memory_rss", "Size of RSS in bytes.", gauge, nil}
	mSwap         = metricDef{"container_memory_swap", "Container swap usage in bytes.", gauge, nil}
	mMemLimit     = metricDef{"container_spec_memory_limit_bytes", "Memory limit for the container.", gauge, nil}
	mProcesses    = metricDef{"container_processes", "Number of processes running inside the container.", gauge, nil}
	mStart        = metricDef{"container_start_time_seconds", "Start time of the container since unix epoch in seconds.", gauge, nil}
	mFsUsage      = metricDef{"container_fs_usage_bytes", "Number of bytes that are consumed by the container on this filesystem.", gauge, []string{"device"}}
	mFsInodes     = metricDef{"container_fs_inodes_total", "Number of Inodes", gauge, []string{"device"}}
	mRxBytes      = metricDef{"container_network_receive_bytes_total", "Cumulative count of bytes received", counter, []string{"interface"}}
	mTxBytes      = metricDef{"container_network_transmit_bytes_total", "Cumulative count of bytes transmitted", counter, []string{"interface"}}
	mRxPackets    = metricDef{"container_network_receive_packets_total", "Cumulative count of packets received", counter, []string{"interface"}}
	mTxPackets    = metricDef{"container_network_transmit_packets_total", "Cumulative count of packets transmitted", counter, []string{"interface"}}
	mRxErrors     = metricDef{"container_network_receive_errors_total", "Cumulative count of errors encountered while receiving", counter, []string{"interface"}}
	mTxErrors     = metricDef{"container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting", counter, []string{"interface"}}
	mRxDropped    = metricDef{"container_network_receive_packets_dropped_total", "Cumulative count of packets dropped while receiving", counter, []string{"interface"}}
	mTxDropped    = metricDef{"container_network_transmit_packets_dropped_total", "Cumulative count of packets dropped while transmitting", counter, []string{"interface"}}
	allMetricDefs = []metricDef{
		mCPU, mWorkingSet, mMemUsage, mRSS, mSwap, mMemLimit, mProcesses, mStart, mFsUsage, mFsInodes,
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
	m.out = append(m.out, &runtimeapi.Metric{
		Name: d.name, Timestamp: m.at, MetricType: d.typ,
		LabelValues: append(append([]string{}, m.labels...), extra...),
		Value:       &runtimeapi.UInt64Value{Value: v},
	})
}

func (m *metricSet) cgroup(st *cgroups.Stats) {
	if st == nil {
		return
	}
	m.add(mCPU, st.CPUUsageNanos/uint64(time.Second))
	m.add(mWorkingSet, st.Memory.WorkingSet)
	m.add(mMemUsage, st.Memory.Usage)
	m.add(mRSS, st.Memory.RSS)
	if st.Memory.HasSwap {
		m.add(mSwap, st.Memory.Swap)
	}
	m.add(mMemLimit, st.Memory.Limit)
	m.add(mProcesses, st.Pids)
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
	now := time.Now().UnixNano()
	group := s.podCgroup(sb)
	pod := &metricSet{at: now, labels: []string{"", group, "", sb.ID, sb.Namespace, sb.Name}}
	pod.cgroup(s.readCgroup(ctx, sb.ID, group))
	if pin := sb.Pins["net"]; pin != "" && sb.Status().State == sandbox.StateReady {
		if devs, err := s.deps.NetCounters.NetDev(pin); err == nil {
			pod.network(devs)
		}
	}
	out := &runtimeapi.PodSandboxMetrics{PodSandboxId: sb.ID, Metrics: pod.out}
	for _, c := range ctrs {
		cg := s.containerCgroup(c)
		set := &metricSet{at: now, labels: []string{c.Name, cg, c.Image, c.ID, sb.Namespace, sb.Name}}
		if cg != "" {
			set.cgroup(s.readCgroup(ctx, c.ID, cg))
		}
		if st := c.Status(); !st.StartedAt.IsZero() {
			set.add(mStart, uint64(st.StartedAt.Unix()))
		}
		s.stats.mu.Lock()
		u, ok := s.stats.layers[c.ID]
		s.stats.mu.Unlock()
		if ok {
			set.add(mFsUsage, u.bytes, c.Dir)
			set.add(mFsInodes, u.inodes, c.Dir)
		}
		out.ContainerMetrics = append(out.ContainerMetrics, &runtimeapi.ContainerMetrics{ContainerId: c.ID, Metrics: set.out})
	}
	return out
}
