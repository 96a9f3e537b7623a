// Package metrics holds the Prometheus collectors of pinrt's own
// operations (CRI calls, image pulls, CNI, namespace creation, restores,
// pods and containers by state) and the opt-in HTTP listener that serves
// them, with pprof when asked.
//
// The listener is off unless configured: it is unauthenticated, and the
// CRI socket is the only interface pinrt needs. Every method works on a
// nil *Metrics, so code paths need no "metrics enabled?" checks.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/pinrt/pinrt/version"
)

const namespace = "pinrt"

// Metrics are the daemon's collectors in their own registry.
type Metrics struct {
	reg *prometheus.Registry

	rpcs        *prometheus.CounterVec
	rpcErrors   *prometheus.CounterVec
	rpcDuration *prometheus.HistogramVec

	pulls        *prometheus.CounterVec
	pullBytes    prometheus.Counter
	pullDuration prometheus.Histogram

	cniDuration *prometheus.HistogramVec
	cniErrors   *prometheus.CounterVec

	nsDuration prometheus.Histogram
	nsErrors   prometheus.Counter

	restores *prometheus.CounterVec
}

// Latency buckets from 1ms to about a minute: a CRI call ranges from a
// map lookup to an image pull.
var buckets = prometheus.ExponentialBuckets(0.001, 2.5, 13)

// New returns the collectors, registered with Go runtime and process
// collectors in a fresh registry.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "grpc_requests_total", Help: "CRI calls by method and gRPC status code.",
		}, []string{"method", "code"}),
		rpcErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "grpc_request_errors_total", Help: "Failed CRI calls by method and gRPC status code.",
		}, []string{"method", "code"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "grpc_request_duration_seconds", Help: "Latency of CRI calls by method.", Buckets: buckets,
		}, []string{"method"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "image_pulls_total", Help: "Image pulls by result (success, failure).",
		}, []string{"result"}),
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "image_pull_bytes_total", Help: "Compressed size of the images pulled successfully.",
		}),
		pullDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "image_pull_duration_seconds", Help: "Duration of image pulls, failed ones included.", Buckets: buckets,
		}),
		cniDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "cni_operation_duration_seconds", Help: "Latency of CNI operations (add, del).", Buckets: buckets,
		}, []string{"operation"}),
		cniErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "cni_operation_errors_total", Help: "Failed CNI operations (add, del).",
		}, []string{"operation"}),
		nsDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "namespace_create_duration_seconds", Help: "Latency of creating and pinning a pod's namespaces.", Buckets: buckets,
		}),
		nsErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "namespace_create_errors_total", Help: "Failed pod namespace creations.",
		}),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "restores_total", Help: "Pods and containers loaded from disk at start, by kind and result.",
		}, []string{"kind", "result"}),
	}
	// The version as the CRI Version call reports it, to tell the
	// builds of a fleet apart.
	buildInfo := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info", Help: "Always 1; the labels are the pinrt version (semver) and the CRI API version it serves.",
		ConstLabels: prometheus.Labels{"version": version.Version, "cri_version": version.CRIVersion},
	}, func() float64 { return 1 })
	m.reg.MustRegister(
		buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.rpcs, m.rpcErrors, m.rpcDuration, m.pulls, m.pullBytes, m.pullDuration,
		m.cniDuration, m.cniErrors, m.nsDuration, m.nsErrors, m.restores,
	)
	return m
}

// Registry is where the collectors live, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveRPC records one finished CRI call; err is what the client sees.
func (m *Metrics) ObserveRPC(method string, d time.Duration, err error) {
	if m == nil {
		return
	}
	code := status.Code(err).String()
	m.rpcs.WithLabelValues(method, code).Inc()
	if err != nil {
		m.rpcErrors.WithLabelValues(method, code).Inc()
	}
	m.rpcDuration.WithLabelValues(method).Observe(d.Seconds())
}

// UnaryInterceptor records every unary call. It goes first in the chain,
// so it sees the gRPC status the error interceptor mapped.
func (m *Metrics) UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.ObserveRPC(info.FullMethod, time.Since(start), err)
	return resp, err
}

// StreamInterceptor records every stream when it ends.
func (m *Metrics) StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := handler(srv, ss)
	m.ObserveRPC(info.FullMethod, time.Since(start), err)
	return err
}

// ObservePull records an image pull of size bytes.
func (m *Metrics) ObservePull(d time.Duration, size int64, err error) {
	if m == nil {
		return
	}
	m.pullDuration.Observe(d.Seconds())
	if err != nil {
		m.pulls.WithLabelValues("failure").Inc()
		return
	}
	m.pulls.WithLabelValues("success").Inc()
	if size > 0 {
		m.pullBytes.Add(float64(size))
	}
}

// ObserveCNI records a CNI operation ("add" or "del").
func (m *Metrics) ObserveCNI(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.cniDuration.WithLabelValues(op).Observe(d.Seconds())
	if err != nil {
		m.cniErrors.WithLabelValues(op).Inc()
	}
}

// ObserveNamespaces records the creation of a pod's namespaces.
func (m *Metrics) ObserveNamespaces(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.nsDuration.Observe(d.Seconds())
	if err != nil {
		m.nsErrors.Inc()
	}
}

// ObserveRestore records loading one pod or container at start.
func (m *Metrics) ObserveRestore(kind string, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.restores.WithLabelValues(kind, result).Inc()
}

// Counts are pods and containers by state at one instant.
type Counts struct {
	Pods       map[string]int
	Containers map[string]int
}

// stateCollector reads the stores at scrape time, so the gauges can never
// drift from the truth the way incremented gauges do after a missed path.
type stateCollector struct {
	read       func() Counts
	pods, ctrs *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.pods; ch <- c.ctrs }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.read()
	for st, v := range n.Pods {
		ch <- prometheus.MustNewConstMetric(c.pods, prometheus.GaugeValue, float64(v), st)
	}
	for st, v := range n.Containers {
		ch <- prometheus.MustNewConstMetric(c.ctrs, prometheus.GaugeValue, float64(v), st)
	}
}

// CollectStates registers gauges of pods and containers by state, computed
// by read at every scrape.
func (m *Metrics) CollectStates(read func() Counts) error {
	if m == nil {
		return nil
	}
	return m.reg.Register(&stateCollector{
		read: read,
		pods: prometheus.NewDesc(namespace+"_pods", "Pod sandboxes by state.", []string{"state"}, nil),
		ctrs: prometheus.NewDesc(namespace+"_containers", "Containers by state.", []string{"state"}, nil),
	})
}

// Handler serves /metrics, and /debug/pprof/ when pprof is set.
func (m *Metrics) Handler(withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Listener is the running HTTP server of the metrics.
type Listener struct {
	srv  *http.Server
	addr string
	done chan error
}

// Addr is the address the listener is bound to (the real port when the
// configured one was 0).
func (s *Listener) Addr() string { return s.addr }

// Serve listens on addr and serves h until Close. The listen error comes
// back at once: a configured address that cannot be bound is a
// configuration error the daemon reports at start.
func Serve(addr string, h http.Handler) (*Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	s := &Listener{
		// Slow clients must not hold connections forever; a profile takes
		// 30 s by default, so writes get more.
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 2 * time.Minute},
		addr: l.Addr().String(),
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(l) }()
	return s, nil
}

// Close stops the listener, letting scrapes in flight finish until ctx
// ends.
func (s *Listener) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
