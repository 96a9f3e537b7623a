package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// WriteComparison prints, for the runs of one scenario against runtime A
// and runtime B (alternated A, B, A, B to spread the host's noise evenly),
// the mean over the rounds of each operation's p50, p99 and pods/s and of
// each metric, and the ratio B/A.
func WriteComparison(w io.Writer, a, b []*Result) error {
	if len(a) == 0 || len(b) == 0 {
		return fmt.Errorf("compare: no results (A %d, B %d)", len(a), len(b))
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "== compare %s variant=%s n=%d p=%d rounds=%d\n", a[0].Scenario, a[0].Variant, a[0].N, a[0].P, len(a))
	fmt.Fprintf(&sb, "A: %s\nB: %s\n", a[0].Runtime, b[0].Runtime)
	fmt.Fprintf(&sb, "%-30s %-8s %12s %12s %8s\n", "OPERATION", "VALUE", "A", "B", "B/A")
	ratio := func(x, y float64) string {
		if x == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", y/x)
	}
	for _, op := range a[0].Ops {
		for _, v := range []struct {
			name string
			get  func(OpSummary) float64
		}{
			{"p50 ms", func(o OpSummary) float64 { return o.P50Ms }},
			{"p99 ms", func(o OpSummary) float64 { return o.P99Ms }},
			{"pods/s", func(o OpSummary) float64 { return o.PerSec }},
		} {
			ma, okA := meanOp(a, op.Name, v.get)
			mb, okB := meanOp(b, op.Name, v.get)
			if !okA || !okB {
				continue
			}
			fmt.Fprintf(&sb, "%-30s %-8s %12.2f %12.2f %8s\n", op.Name, v.name, ma, mb, ratio(ma, mb))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(a[0].Metrics)) {
		ma, okA := meanMetric(a, k)
		mb, okB := meanMetric(b, k)
		if okA && okB {
			fmt.Fprintf(&sb, "%-39s %12.2f %12.2f %8s\n", k, ma, mb, ratio(ma, mb))
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

func meanOp(rs []*Result, name string, get func(OpSummary) float64) (float64, bool) {
	sum, n := 0.0, 0
	for _, r := range rs {
		for _, o := range r.Ops {
			if o.Name == name {
				sum += get(o)
				n++
			}
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}

func meanMetric(rs []*Result, k string) (float64, bool) {
	sum, n := 0.0, 0
	for _, r := range rs {
		if v, ok := r.Metrics[k]; ok {
			sum += v
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}
