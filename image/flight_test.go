package image

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// The shared call outlives any one caller and ends when the last leaves.
func TestFlightGroupDetachesFromCallers(t *testing.T) {
	var g flightGroup
	var calls atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	fnCtx := make(chan context.Context, 1)
	fn := func(ctx context.Context) (*Image, error) {
		calls.Add(1)
		fnCtx <- ctx
		close(started)
		select {
		case <-release:
			return &Image{ID: "sha256:x"}, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	res1 := make(chan error, 1)
	go func() { _, err := g.do(ctx1, "k", fn); res1 <- err }()
	<-started
	res2 := make(chan *Image, 1)
	go func() {
		img, err := g.do(context.Background(), "k", func(context.Context) (*Image, error) {
			t.Error("a second call ran while the first was in flight")
			return nil, nil
		})
		if err != nil {
			t.Error(err)
		}
		res2 <- img
	}()
	for {
		g.mu.Lock()
		n := g.calls["k"].waiters
		g.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel1()
	if err := <-res1; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller = %v, want context.Canceled", err)
	}
	shared := <-fnCtx
	if shared.Err() != nil {
		t.Fatal("the shared call was cancelled with its first caller")
	}
	close(release)
	if img := <-res2; img == nil || img.ID != "sha256:x" {
		t.Fatalf("second caller got %v", img)
	}
	if calls.Load() != 1 {
		t.Fatalf("fn ran %d times", calls.Load())
	}

	// A lone caller leaving cancels the call, with a cause that says so.
	ctx3, cancel3 := context.WithCancel(context.Background())
	fnCtx3 := make(chan context.Context, 1)
	go func() {
		_, _ = g.do(ctx3, "k", func(ctx context.Context) (*Image, error) {
			fnCtx3 <- ctx
			<-ctx.Done()
			return nil, ctx.Err()
		})
	}()
	c3 := <-fnCtx3
	cancel3()
	select {
	case <-c3.Done():
		if !errors.Is(context.Cause(c3), errNoWaiters) {
			t.Errorf("cause %v, want errNoWaiters", context.Cause(c3))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call kept running after its only caller left")
	}
}

func TestKeyedMutexLockCtx(t *testing.T) {
	var k keyedMutex
	unlock := k.lock("a")
	// Another key is independent.
	unlockB, err := k.lockCtx(context.Background(), "b")
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	cause := errors.New("caller gone")
	ctx, cancel := context.WithCancelCause(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := k.lockCtx(ctx, "a")
		got <- err
	}()
	cancel(cause)
	select {
	case err := <-got:
		if !errors.Is(err, cause) {
			t.Fatalf("lockCtx = %v, want the context's cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lockCtx kept waiting after its context ended")
	}
	unlock()
	// The abandoned wait left no reference behind: the lock is free and
	// dropped once unlocked.
	unlock = k.lock("a")
	unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.locks) != 0 {
		t.Errorf("%d locks left in the map", len(k.locks))
	}
}
