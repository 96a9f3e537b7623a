package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// reserveSize is the room pinrt keeps in its root for the writes that
// free room: thousands of state and intent records.
const reserveSize = 8 << 20

// reserve is a file of reserveSize bytes in pinrt's root, given back to
// the file system when a write that a stop or a removal needs finds it
// full. Containers' writable layers live in the root: a container that
// writes until no block is left would otherwise make every stop and
// removal fail on its first record, and kubelet's eviction of that very
// container, the one way to free the room, could never finish. The file
// is made again once there is room (at start and after removals).
type reserve struct {
	path string
	mu   sync.Mutex
	// given counts the times the reserve was given back. A write that
	// found the disk full retries when the count moved since it began:
	// a stop beside it gave the room back first.
	given uint64
}

// newReserve keeps the reserve in root; without a root (a server that
// keeps nothing on disk) there is none.
func newReserve(root string) *reserve {
	if root == "" {
		return &reserve{}
	}
	return &reserve{path: filepath.Join(root, "reserve")}
}

// fill makes the reserve if it is missing and the room is there.
func (r *reserve) fill(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.path == "" {
		return
	}
	if fi, err := os.Stat(r.path); err == nil && fi.Size() == reserveSize {
		return
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err == nil {
		err = unix.Fallocate(int(f.Fd()), 0, 0, reserveSize)
		if err == nil {
			err = f.Sync()
		}
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		_ = os.Remove(r.path)
		switch {
		case isFull(err):
			// Made again after the next removal.
		case errors.Is(err, unix.EOPNOTSUPP):
			log.G(ctx).WithField("path", r.path).Warn("the root's file system cannot preallocate: no reserve for writes on a full disk")
			r.path = ""
		default:
			log.G(ctx).WithError(err).WithField("path", r.path).Warn("making the reserve for writes on a full disk")
		}
	}
}

// seen is the count of give-backs, read before a write that may need
// the reserve.
func (r *reserve) seen() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.given
}

// release gives the reserve back and reports whether room came back
// since seen: by this call, or by another write's after seen was read.
func (r *reserve) release(ctx context.Context, seen uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.given != seen {
		return true
	}
	if r.path == "" || os.Remove(r.path) != nil {
		return false
	}
	r.given++
	log.G(ctx).WithField("path", r.path).Warnf("pinrt's root is full: gave back its %d MiB reserve to finish a stop or removal", reserveSize>>20)
	return true
}

// isFull reports whether err is a full file system or quota.
func isFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// spare runs write, a record a stop or a removal needs; when the root
// is full it gives back the reserve and writes once more. Two teardowns
// that find the disk full at once both write again: the first gives the
// reserve back, the second finds it given since its write began.
func (s *Server) spare(ctx context.Context, write func() error) error {
	seen := s.reserve.seen()
	err := write()
	if !isFull(err) || !s.reserve.release(ctx, seen) {
		return err
	}
	return write()
}
