package oci

import (
	"context"
	"io"
	"testing"
	"time"
)

// blockingWriter takes each write only when release says so, as a client
// behind a slow link does.
type blockingWriter struct{ release chan struct{} }

func (w blockingWriter) Write(b []byte) (int, error) {
	<-w.release
	return len(b), nil
}

// A write the client is still taking is waited for past execWaitDelay:
// cutting the stream then lost the tail of a 20 MB `tar c` to a client
// behind kubelet and the API server, with exit code 0.
func TestWaitDrainedWaitsForASlowClient(t *testing.T) {
	p := &progress{}
	w := p.writer(blockingWriter{release: make(chan struct{})})
	done := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		_, _ = w.Write([]byte("tail"))
		close(wrote)
		close(done)
	}()
	bw := w.(progressWriter).w.(blockingWriter)
	go func() {
		time.Sleep(execWaitDelay + execWaitDelay/2)
		close(bw.release)
	}()
	start := time.Now()
	waitDrained(context.Background(), done, p)
	select {
	case <-wrote:
	default:
		t.Fatalf("waitDrained returned after %s with a write in flight", time.Since(start))
	}
}

// Output that keeps moving is waited for, however long it takes.
func TestWaitDrainedWaitsWhileOutputMoves(t *testing.T) {
	p := &progress{}
	w := p.writer(io.Discard)
	done := make(chan struct{})
	go func() {
		for range 4 {
			time.Sleep(execWaitDelay / 2)
			_, _ = w.Write([]byte("x"))
		}
		close(done)
	}()
	waitDrained(context.Background(), done, p)
	select {
	case <-done:
	default:
		t.Fatal("waitDrained returned while output was still moving")
	}
}

// Pipes a background process holds open with nothing written are cut
// after execWaitDelay; so is the wait when the client has gone.
func TestWaitDrainedCutsIdlePipes(t *testing.T) {
	p := &progress{}
	never := make(chan struct{})
	start := time.Now()
	waitDrained(context.Background(), never, p)
	if d := time.Since(start); d < execWaitDelay || d > 3*execWaitDelay {
		t.Errorf("idle pipes cut after %s, want about %s", d, execWaitDelay)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	waitDrained(ctx, never, p)
	if d := time.Since(start); d > execWaitDelay/2 {
		t.Errorf("with the client gone, cut after %s", d)
	}
}
