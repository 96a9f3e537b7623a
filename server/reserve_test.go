package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// spare gives the reserve back and writes again when the first write
// finds the disk full, once; without a reserve the error stands.
func TestSpareGivesBackTheReserve(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := &Server{reserve: newReserve(root)}
	s.reserve.fill(ctx)
	path := filepath.Join(root, "reserve")
	if fi, err := os.Stat(path); err != nil || fi.Size() != reserveSize {
		t.Fatalf("reserve after fill: %v, %v; want %d bytes", fi, err, reserveSize)
	}
	calls := 0
	fullOnce := func() error {
		if calls++; calls == 1 {
			return &os.PathError{Op: "write", Path: "state.json", Err: syscall.ENOSPC}
		}
		return nil
	}
	if err := s.spare(ctx, fullOnce); err != nil || calls != 2 {
		t.Errorf("spare with a reserve = %v after %d writes, want success after 2", err, calls)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("reserve after it was given back: %v", err)
	}
	calls = 0
	if err := s.spare(ctx, fullOnce); !isFull(err) || calls != 1 {
		t.Errorf("spare without a reserve = %v after %d writes, want the full disk after 1", err, calls)
	}
	// Other errors are not retried and keep the reserve.
	s.reserve.fill(ctx)
	calls = 0
	if err := s.spare(ctx, func() error { calls++; return os.ErrPermission }); !errors.Is(err, os.ErrPermission) || calls != 1 {
		t.Errorf("spare of a permission error = %v after %d writes", err, calls)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("reserve after an error that is no full disk: %v", err)
	}
	// A server without a root has no reserve and makes no file.
	none := newReserve("")
	none.fill(ctx)
	if none.release(ctx, none.seen()) {
		t.Error("a reserve without a root was released")
	}
}

// Two teardowns find the disk full at once: the one whose write failed
// after the other gave the reserve back writes again too, instead of
// failing a stop that now has room.
func TestSpareBesideAnotherGiveBack(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s := &Server{reserve: newReserve(root)}
	s.reserve.fill(ctx)
	full := &os.PathError{Op: "write", Path: "state.json", Err: syscall.ENOSPC}
	otherCalls, calls := 0, 0
	other := func() error {
		if otherCalls++; otherCalls == 1 {
			return full
		}
		return nil
	}
	// The first write fails while the other stop gives the reserve back.
	mine := func() error {
		if calls++; calls == 1 {
			if err := s.spare(ctx, other); err != nil || otherCalls != 2 {
				t.Fatalf("the other stop = %v after %d writes", err, otherCalls)
			}
			return full
		}
		return nil
	}
	if err := s.spare(ctx, mine); err != nil || calls != 2 {
		t.Errorf("spare beside another give-back = %v after %d writes, want success after 2", err, calls)
	}
	// The room is spent: a later full write, with no reserve, fails once.
	calls = 0
	if err := s.spare(ctx, func() error { calls++; return full }); !isFull(err) || calls != 1 {
		t.Errorf("spare after the reserve is spent = %v after %d writes, want the full disk after 1", err, calls)
	}
}
