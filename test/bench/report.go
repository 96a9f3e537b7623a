package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// WriteTable prints the result as an aligned plain-text table followed by
// the first error messages and a RESULT line.
func (res *Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "== %s variant=%s n=%d p=%d run=%s runtime=%q wall=%.1fms\n",
		res.Scenario, res.Variant, res.N, res.P, res.RunID, res.Runtime, res.WallMs)
	width := len("OPERATION")
	for _, o := range res.Ops {
		width = max(width, len([]rune(o.Name)))
	}
	row := func(name string, cols ...string) {
		b.WriteString(name + strings.Repeat(" ", width-len([]rune(name))))
		for _, c := range cols {
			fmt.Fprintf(&b, " %10s", c)
		}
		b.WriteString("\n")
	}
	row("OPERATION", "COUNT", "ERRORS", "P50", "P90", "P99", "MAX", "PODS/S")
	f := func(v float64) string { return fmt.Sprintf("%.2fms", v) }
	for _, o := range res.Ops {
		row(o.Name, fmt.Sprint(o.Count), fmt.Sprint(o.Errors), f(o.P50Ms), f(o.P90Ms), f(o.P99Ms), f(o.MaxMs), fmt.Sprintf("%.2f", o.PerSec))
	}
	for _, k := range slices.Sorted(maps.Keys(res.Metrics)) {
		fmt.Fprintf(&b, "%s = %.1f\n", k, res.Metrics[k])
	}
	for _, o := range res.Ops {
		if o.Errors == 0 {
			continue
		}
		samples := o.ErrorSamples
		if o.Aggregate && len(samples) > 1 {
			// Derived rows repeat the failing operation's messages.
			samples = samples[:1]
		}
		fmt.Fprintf(&b, "errors in %s (%d, first %d):\n", o.Name, o.Errors, len(samples))
		for _, m := range samples {
			fmt.Fprintf(&b, "  %s\n", m)
		}
	}
	b.WriteString(res.ResultLine() + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ResultLine is "RESULT: ok" or "RESULT: <n> errors".
func (res *Result) ResultLine() string {
	if res.Errors == 0 {
		return "RESULT: ok"
	}
	return fmt.Sprintf("RESULT: %d errors", res.Errors)
}

// WriteJSON writes the result as indented JSON.
func (res *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
