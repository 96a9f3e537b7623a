package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// The pull image is the same bytes on every run: its digests, and so the
// pulls being compared, do not depend on when or where it was made.
func TestGeneratePullImageDeterministic(t *testing.T) {
	for _, tool := range []string{"tar", "gzip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	ctx := context.Background()
	a, err := GeneratePullImage(ctx, t.TempDir()+"/a", 0.002)
	if err != nil {
		t.Fatal(err)
	}
	b, err := GeneratePullImage(ctx, t.TempDir()+"/b", 0.002)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 3 || len(b) != 3 {
		t.Fatalf("layers %v and %v, want 3 each", a, b)
	}
	for i := range a {
		x, err := os.ReadFile(a[i])
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(b[i])
		if err != nil {
			t.Fatal(err)
		}
		if len(x) == 0 || !bytes.Equal(x, y) {
			t.Errorf("layer %d differs between two generations (%d and %d bytes)", i, len(x), len(y))
		}
	}
	img, err := PullImage(a)
	if err != nil {
		t.Fatal(err)
	}
	if ls, err := img.Layers(); err != nil || len(ls) != 3 {
		t.Errorf("image layers = %d, %v; want 3", len(ls), err)
	}
}

// The limiter spreads bytes over time at its rate, shared by all writers.
func TestLimiter(t *testing.T) {
	l := &limiter{rate: 10e6} // 10 MB/s
	start := time.Now()
	done := make(chan struct{})
	for range 2 {
		go func() {
			for range 10 {
				l.wait(100e3)
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	// 2 MB at 10 MB/s: 200 ms.
	if took := time.Since(start); took < 180*time.Millisecond || took > 2*time.Second {
		t.Errorf("2 MB at 10 MB/s took %s, want about 200ms", took)
	}
}
