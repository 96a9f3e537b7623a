package server

import (
	"context"
	"time"

	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/metrics"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/sandbox"
)

// This file feeds the daemon's own Prometheus metrics (package metrics).
// CRI call latency and codes are recorded by metrics' interceptor; what is
// recorded here are the operations inside the calls. CNI and namespace
// timings come from decorators around the dependencies, so the pod paths
// carry no metrics code.

// Recorder takes the measurements of pinrt's operations (package
// metrics, *metrics.Metrics; a nil one records nothing).
type Recorder interface {
	ObservePull(d time.Duration, size int64, err error)
	ObserveCNI(op string, d time.Duration, err error)
	ObserveNamespaces(d time.Duration, err error)
	ObserveRestore(kind string, err error)
}

var _ Recorder = (*metrics.Metrics)(nil)

// timedNetwork records CNI ADD and DEL.
type timedNetwork struct {
	Network
	rec Recorder
}

func (n timedNetwork) Setup(ctx context.Context, pod cni.Pod) (*cni.Result, error) {
	start := time.Now()
	res, err := n.Network.Setup(ctx, pod)
	n.rec.ObserveCNI("add", time.Since(start), err)
	return res, err
}

func (n timedNetwork) Teardown(ctx context.Context, pod cni.Pod) error {
	start := time.Now()
	err := n.Network.Teardown(ctx, pod)
	n.rec.ObserveCNI("del", time.Since(start), err)
	return err
}

// timedNamespaces records the creation of pod namespaces.
type timedNamespaces struct {
	Namespaces
	rec Recorder
}

func (n timedNamespaces) Create(ctx context.Context, req nsmgr.CreateRequest) (nsmgr.Pins, error) {
	start := time.Now()
	pins, err := n.Namespaces.Create(ctx, req)
	n.rec.ObserveNamespaces(time.Since(start), err)
	return pins, err
}

// instrumentDeps wraps the dependencies whose operations are measured.
func instrumentDeps(d *Deps) {
	if d.Metrics == nil {
		d.Metrics = (*metrics.Metrics)(nil)
	}
	if d.Network != nil {
		d.Network = timedNetwork{Network: d.Network, rec: d.Metrics}
	}
	if d.Namespaces != nil {
		d.Namespaces = timedNamespaces{Namespaces: d.Namespaces, rec: d.Metrics}
	}
}

// StateCounts counts pods and containers by state for the metrics
// collector. It reads the recorded states and starts no runtime call: a
// scrape must not cost a runc exec per container.
func (s *Server) StateCounts() metrics.Counts {
	n := metrics.Counts{Pods: map[string]int{}, Containers: map[string]int{}}
	for _, st := range []sandbox.State{sandbox.StateReady, sandbox.StateNotReady} {
		n.Pods[string(st)] = 0
	}
	for _, st := range []sandbox.ContainerState{sandbox.ContainerCreated, sandbox.ContainerRunning, sandbox.ContainerExited, sandbox.ContainerUnknown} {
		n.Containers[string(st)] = 0
	}
	for _, sb := range s.sandboxes.List() {
		n.Pods[string(sb.Status().State)]++
	}
	for _, c := range s.containers.List() {
		n.Containers[string(c.Status().State)]++
	}
	return n
}

func (s *Server) observePull(start time.Time, img *image.Image, err error) {
	var size int64
	if img != nil {
		size = int64(img.Size)
	}
	s.deps.Metrics.ObservePull(time.Since(start), size, err)
}
