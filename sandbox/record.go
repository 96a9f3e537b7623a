package sandbox

import (
	"fmt"
	"path/filepath"
	"sync"

	"github.com/containerd/errdefs"
)

// versioned is the on-disk envelope of meta.json and status.json: a format
// version plus either the immutable metadata or the mutable status.
type versioned[M, S any] struct {
	Version  int `json:"version"`
	Metadata *M  `json:"metadata,omitempty"`
	Status   *S  `json:"status,omitempty"`
}

// record is what sandboxes and containers share: a directory, a status
// changed only through UpdateStatus, and a lock for lifecycle operations.
type record[M any, S comparable] struct {
	// Dir is the persistent directory; "" keeps the status in memory only.
	Dir string

	mu     sync.Mutex
	status S
	// opMu serialises lifecycle operations (Start, Stop, Remove).
	opMu sync.Mutex
}

// Status returns a copy of the current status.
func (r *record[M, S]) Status() S {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// UpdateStatus is the one way to change a status: fn edits a copy, the
// copy is persisted (if there is a directory), and only then becomes the
// status. A failed write leaves the old status in place; an unchanged
// status is not written again.
func (r *record[M, S]) UpdateStatus(fn func(*S)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := r.status
	fn(&next)
	if next == r.status {
		return nil
	}
	if r.Dir != "" {
		if err := writeJSON(r.Dir, statusFile, versioned[M, S]{Version: stateVersion, Status: &next}); err != nil {
			return err
		}
	}
	r.status = next
	return nil
}

// Lock serialises lifecycle operations on one object.
func (r *record[M, S]) Lock() func() {
	r.opMu.Lock()
	return r.opMu.Unlock
}

// files returns meta.json and status.json as the envelopes to marshal.
func (r *record[M, S]) files(md *M) map[string]any {
	st := r.Status()
	return map[string]any{
		metaFile:   versioned[M, S]{Version: stateVersion, Metadata: md},
		statusFile: versioned[M, S]{Version: stateVersion, Status: &st},
	}
}

// loadRecord reads dir's meta.json, checks its version and that idOf names
// the directory, and reads status.json; a missing or unreadable status
// gives fallback, since the daemon may have died between the two writes.
func loadRecord[M any, S comparable](dir string, idOf func(*M) string, fallback S) (*M, S, error) {
	var meta versioned[M, S]
	if err := readJSON(filepath.Join(dir, metaFile), &meta); err != nil {
		return nil, fallback, err
	}
	if meta.Version != stateVersion || meta.Metadata == nil {
		return nil, fallback, fmt.Errorf("%s: unsupported state version %d: %w", dir, meta.Version, errdefs.ErrFailedPrecondition)
	}
	if id := idOf(meta.Metadata); ValidateID(id) != nil || id != filepath.Base(dir) {
		return nil, fallback, fmt.Errorf("%s: ID %q does not match its directory: %w", dir, id, errdefs.ErrFailedPrecondition)
	}
	var st versioned[M, S]
	if err := readJSON(filepath.Join(dir, statusFile), &st); err == nil && st.Status != nil {
		return meta.Metadata, *st.Status, nil
	}
	return meta.Metadata, fallback, nil
}
