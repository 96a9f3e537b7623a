// Package bench measures a CRI runtime from the outside: it drives any CRI v1
// endpoint (pinrt, CRI-O, containerd) over gRPC through the same scenarios
// and reports latency percentiles and throughput, so that runtimes can be
// compared side by side with one tool. Nothing in it is pinrt-specific.
package bench

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// maxErrorSamples bounds how many error messages each operation keeps. The
// count is always exact; the messages are only there to tell what went wrong.
const maxErrorSamples = 5

// Percentile returns the p-th percentile of samples by the nearest-rank
// definition: sort ascending, take the value at rank ceil(p/100*N) (1-based).
// Unlike interpolating definitions it always returns a value that was really
// observed, which is what a latency report should show. p is clamped to
// (0, 100]; an empty slice yields 0. samples is not modified.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	// The epsilon absorbs binary rounding: 99.9/100*1000 is 999.0000000000001
	// in float64, and a plain Ceil would skip to rank 1000.
	rank := int(math.Ceil(p/100*float64(len(s)) - 1e-9))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// Throughput is completed operations per second of wall-clock time. A zero
// or negative wall time yields 0 rather than +Inf so JSON stays valid.
func Throughput(count int, wall time.Duration) float64 {
	if wall <= 0 || count <= 0 {
		return 0
	}
	return float64(count) / wall.Seconds()
}

// OpSummary is the report line of one operation.
type OpSummary struct {
	Name string `json:"name"`
	// Count is the number of successful, timed executions.
	Count int `json:"count"`
	// Errors is the number of failed executions.
	Errors int `json:"errors"`
	// Aggregate marks derived rows (end to end, pod to Running) whose
	// failures are already counted on the operation that failed.
	Aggregate bool    `json:"aggregate,omitempty"`
	P50Ms     float64 `json:"p50_ms"`
	P90Ms     float64 `json:"p90_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	// PerSec is Count divided by the scenario's wall time (pods/s, since
	// every pod runs each operation once).
	PerSec       float64  `json:"per_sec"`
	ErrorSamples []string `json:"error_samples,omitempty"`
}

type opStats struct {
	aggregate bool
	samples   []time.Duration
	errors    int
	msgs      []string
}

// Recorder collects timings and failures per operation. It is safe for
// concurrent use by the scenario workers. Operations are reported in the
// order they were first seen.
type Recorder struct {
	mu    sync.Mutex
	order []string
	ops   map[string]*opStats
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{ops: map[string]*opStats{}}
}

func (r *Recorder) op(name string, aggregate bool) *opStats {
	o, ok := r.ops[name]
	if !ok {
		o = &opStats{aggregate: aggregate}
		r.ops[name] = o
		r.order = append(r.order, name)
	}
	return o
}

// Declare registers operations up front so that they appear in the report,
// in this order, even when no worker ever reached them.
func (r *Recorder) Declare(names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		r.op(n, false)
	}
}

// DeclareAggregate is Declare for derived rows, whose errors are not added
// to the run's error total.
func (r *Recorder) DeclareAggregate(names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		r.op(n, true).aggregate = true
	}
}

// Observe records one successful execution of op that took d.
func (r *Recorder) Observe(op string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.op(op, false)
	o.samples = append(o.samples, d)
}

// Fail records one failed execution of op.
func (r *Recorder) Fail(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.op(op, false)
	o.errors++
	if len(o.msgs) < maxErrorSamples {
		o.msgs = append(o.msgs, err.Error())
	}
}

// Errors is the number of failures on non-aggregate operations.
func (r *Recorder) Errors() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, o := range r.ops {
		if !o.aggregate {
			n += o.errors
		}
	}
	return n
}

// Summaries computes the report rows; wall is the scenario's wall time used
// for the throughput column.
func (r *Recorder) Summaries(wall time.Duration) []OpSummary {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]OpSummary, 0, len(r.order))
	for _, name := range r.order {
		o := r.ops[name]
		s := slices.Clone(o.samples)
		slices.Sort(s)
		sum := OpSummary{
			Name:         name,
			Count:        len(s),
			Errors:       o.errors,
			Aggregate:    o.aggregate,
			P50Ms:        ms(percentileSorted(s, 50)),
			P90Ms:        ms(percentileSorted(s, 90)),
			P99Ms:        ms(percentileSorted(s, 99)),
			PerSec:       Throughput(len(s), wall),
			ErrorSamples: slices.Clone(o.msgs),
		}
		if len(s) > 0 {
			sum.MaxMs = ms(s[len(s)-1])
		}
		out = append(out, sum)
	}
	return out
}

func ms(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// timed runs f, records its duration under op on success or its error on
// failure, and returns the error.
func (r *Recorder) timed(op string, f func() error) error {
	start := time.Now()
	if err := f(); err != nil {
		r.Fail(op, err)
		return fmt.Errorf("%s: %w", op, err)
	}
	r.Observe(op, time.Since(start))
	return nil
}
