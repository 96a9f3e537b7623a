package nsmgr

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

// BenchmarkCreateRemove measures one pod's full set: user, net, IPC and
// UTS namespaces with mappings, created, pinned and removed. It reports
// the median and p90 of Create+Remove besides the mean ns/op.
func BenchmarkCreateRemove(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates namespaces and bind mounts")
	}
	m, err := NewManager(b.TempDir(), "")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req := fullRequest("bench", 20, nil)
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := m.Create(ctx, req); err != nil {
			b.Fatal(err)
		}
		if err := m.Remove(ctx, req.ID); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(start))
	}
	slices.Sort(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(durs[len(durs)*9/10].Nanoseconds()), "p90-ns")
}
