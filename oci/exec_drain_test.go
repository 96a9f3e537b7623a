package oci

import (
	"context"
	"io"
	"os"
	"testing"
	"time"
)

// none is a pipe with nothing unread.
func none() int { return 0 }

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
	waitDrained(context.Background(), done, p, none)
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
	waitDrained(context.Background(), done, p, none)
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
	waitDrained(context.Background(), never, p, none)
	if d := time.Since(start); d < execWaitDelay || d > 3*execWaitDelay {
		t.Errorf("idle pipes cut after %s, want about %s", d, execWaitDelay)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	waitDrained(ctx, never, p, none)
	if d := time.Since(start); d > execWaitDelay/2 {
		t.Errorf("with the client gone, cut after %s", d)
	}
}

// Bytes still in the pipe are waited for however long the copy stalls: a
// daemon starved of CPU stalled its copy for execWaitDelay between two
// writes, and the timer closed the pipe on the tail of a 20 MB `tar c`,
// which the client got with exit code 0.
func TestWaitDrainedWaitsForUnreadBytes(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if _, err := w.Write([]byte("the tail")); err != nil {
		t.Fatal(err)
	}
	p := &progress{}
	done := make(chan struct{})
	took := make(chan struct{})
	go func() {
		// The copy, stalled for longer than execWaitDelay.
		time.Sleep(execWaitDelay + execWaitDelay/2)
		b := make([]byte, 64)
		n, _ := r.Read(b)
		_, _ = p.writer(io.Discard).Write(b[:n])
		close(took)
	}()
	waitDrained(context.Background(), done, p, func() int { return unreadBytes(r) })
	select {
	case <-took:
	default:
		t.Fatalf("waitDrained returned with %d bytes unread in the pipe", unreadBytes(r))
	}
}

// unreadBytes counts what a pipe holds, and nothing once it was read.
func TestUnreadBytes(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if n := unreadBytes(r); n != 0 {
		t.Fatalf("empty pipe: %d unread", n)
	}
	if _, err := w.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if n := unreadBytes(r, r); n != 2000 {
		t.Fatalf("1000 bytes in the pipe, counted twice: %d unread, want 2000", n)
	}
	if _, err := io.ReadFull(r, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if n := unreadBytes(r); n != 0 {
		t.Fatalf("drained pipe: %d unread", n)
	}
}
