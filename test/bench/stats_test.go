package bench

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func msd(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// The expected values are computed by hand with the nearest-rank rule:
// rank = ceil(p/100 * N), value = sorted[rank-1].
func TestPercentileNearestRank(t *testing.T) {
	oneToTen := msd(7, 3, 10, 1, 9, 2, 8, 6, 4, 5)
	tests := []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p50", msd(42), 50, 42 * time.Millisecond},
		{"single p99", msd(42), 99, 42 * time.Millisecond},
		{"1..10 p50 rank 5", oneToTen, 50, 5 * time.Millisecond},
		{"1..10 p90 rank 9", oneToTen, 90, 9 * time.Millisecond},
		{"1..10 p99 rank ceil(9.9)=10", oneToTen, 99, 10 * time.Millisecond},
		{"1..10 p100", oneToTen, 100, 10 * time.Millisecond},
		{"1..10 p0 clamps to rank 1", oneToTen, 0, 1 * time.Millisecond},
		{"five p30 rank ceil(1.5)=2", msd(50, 15, 40, 20, 35), 30, 20 * time.Millisecond},
		{"five p40 rank 2 exactly", msd(50, 15, 40, 20, 35), 40, 20 * time.Millisecond},
		{"five p50 rank ceil(2.5)=3", msd(50, 15, 40, 20, 35), 50, 35 * time.Millisecond},
		{"five p90 rank ceil(4.5)=5", msd(50, 15, 40, 20, 35), 90, 50 * time.Millisecond},
		{"duplicates", msd(5, 5, 5, 1), 50, 5 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			orig := append([]time.Duration(nil), tc.samples...)
			if got := Percentile(tc.samples, tc.p); got != tc.want {
				t.Fatalf("Percentile(%v, %v) = %v, want %v", tc.samples, tc.p, got, tc.want)
			}
			for i := range orig {
				if orig[i] != tc.samples[i] {
					t.Fatalf("Percentile modified its input")
				}
			}
		})
	}
}

func TestPercentileLarge(t *testing.T) {
	// 1..1000 ms shuffled: p50 is rank 500, p90 rank 900, p99 rank 990.
	s := make([]time.Duration, 1000)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Millisecond
	}
	rand.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	for p, want := range map[float64]time.Duration{50: 500, 90: 900, 99: 990, 99.9: 999} {
		if got := Percentile(s, p); got != want*time.Millisecond {
			t.Errorf("p%v = %v, want %v", p, got, want*time.Millisecond)
		}
	}
}

func TestThroughput(t *testing.T) {
	tests := []struct {
		name  string
		count int
		wall  time.Duration
		want  float64
	}{
		{"200 in 4s", 200, 4 * time.Second, 50},
		{"3 in 1.5s", 3, 1500 * time.Millisecond, 2},
		{"1 in 250ms", 1, 250 * time.Millisecond, 4},
		{"zero count", 0, time.Second, 0},
		{"zero wall", 5, 0, 0},
		{"negative wall", 5, -time.Second, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Throughput(tc.count, tc.wall); got != tc.want {
				t.Fatalf("Throughput(%d, %v) = %v, want %v", tc.count, tc.wall, got, tc.want)
			}
		})
	}
}

func TestRecorderSummaries(t *testing.T) {
	r := NewRecorder()
	r.Declare("a", "never")
	r.DeclareAggregate("e2e")
	for _, d := range msd(4, 1, 3, 2) {
		r.Observe("a", d)
	}
	for i := range 7 {
		r.Fail("a", errors.New("boom "+string(rune('0'+i))))
	}
	r.Fail("e2e", errors.New("derived"))
	got := r.Summaries(2 * time.Second)
	if len(got) != 3 || got[0].Name != "a" || got[1].Name != "never" || got[2].Name != "e2e" {
		t.Fatalf("rows = %+v, want a, never, e2e in declaration order", got)
	}
	a := got[0]
	want := OpSummary{Name: "a", Count: 4, Errors: 7, P50Ms: 2, P90Ms: 4, P99Ms: 4, MaxMs: 4, PerSec: 2}
	if a.Name != want.Name || a.Count != want.Count || a.Errors != want.Errors || a.P50Ms != want.P50Ms ||
		a.P90Ms != want.P90Ms || a.P99Ms != want.P99Ms || a.MaxMs != want.MaxMs || a.PerSec != want.PerSec {
		t.Fatalf("row a = %+v, want %+v", a, want)
	}
	if len(a.ErrorSamples) != maxErrorSamples || a.ErrorSamples[0] != "boom 0" {
		t.Fatalf("error samples = %q, want the first %d", a.ErrorSamples, maxErrorSamples)
	}
	if n := r.Errors(); n != 7 {
		t.Fatalf("Errors() = %d, want 7 (aggregate row excluded)", n)
	}
	if got[1].Count != 0 || got[1].MaxMs != 0 {
		t.Fatalf("empty row = %+v", got[1])
	}
}

func TestParseRSS(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		want    int64
		wantErr bool
	}{
		{"normal", "Name:\tpinrt\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nThreads:\t8\n", 12345, false},
		{"missing", "Name:\tkthreadd\nThreads:\t1\n", 0, true},
		{"bad unit", "VmRSS:\t 12 MB\n", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseRSS(tc.status)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parseRSS = %d, %v; want %d, err=%v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
