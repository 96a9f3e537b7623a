package nsmgr

import (
	"context"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCreateRemove measures one pod's namespaces created, pinned and
// removed: user, net, IPC and UTS with mappings (through unshare and cat),
// and net, IPC and UTS alone (on a thread). It reports the median and p90
// of Create+Remove besides the mean ns/op, and the CPU time per op of the
// reaped children (rusage) and of the test process.
func BenchmarkCreateRemove(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: creates namespaces and bind mounts")
	}
	for _, tc := range []struct {
		name   string
		userns bool
	}{{"userns", true}, {"no-userns", false}} {
		b.Run(tc.name, func(b *testing.B) {
			m, err := NewManager(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			req := fullRequest("bench", 20, nil)
			if !tc.userns {
				req = CreateRequest{ID: "bench", Kinds: []Kind{Net, IPC, UTS}}
			}
			durs := make([]time.Duration, 0, b.N)
			cpu0, self0 := childCPU(), selfCPU()
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
			b.ReportMetric(float64((childCPU()-cpu0).Nanoseconds())/float64(len(durs)), "child-cpu-ns/op")
			b.ReportMetric(float64((selfCPU()-self0).Nanoseconds())/float64(len(durs)), "parent-cpu-ns/op")
		})
	}
}

// childCPU is the user+system time of all reaped children so far.
func childCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfCPU is the user+system time of this process, the children's parent.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
