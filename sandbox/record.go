package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// versioned is the on-disk envelope of an object's state: a format version
// plus the immutable metadata and the mutable status. Since version 2 both
// live in one file, state.json, so a crash between two renames can no
// longer leave metadata without its status (version 1 kept them in
// meta.json and status.json, and a missing status.json silently read as
// another state).
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
	// md is the owner's metadata, written with every status change.
	md *M

	mu     sync.Mutex
	status S
	// detached stops status writes: the directory is being removed.
	detached bool
	// loaded marks a record read from disk, whose directory may still
	// hold the version 1 files until its next write drops them; a new
	// record's never does, so its writes look for none.
	loaded bool
	// opMu serialises lifecycle operations (Start, Stop, Remove).
	opMu sync.Mutex
	// evMu orders a status change with the events that announce it
	// (LockEvents).
	evMu sync.Mutex
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
	if r.Dir != "" && !r.detached {
		if err := r.write(next); err != nil {
			return err
		}
	}
	r.status = next
	return nil
}

// Detach stops writing status changes to the directory, which is about
// to be removed: an exit noticed during a removal would otherwise write
// state.json into the directory as it is emptied, and the removal fail
// with "directory not empty". Once it returns no write is in progress.
func (r *record[M, S]) Detach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detached = true
}

// save writes the whole record with the current status.
func (r *record[M, S]) save() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.write(r.status)
}

// write replaces state.json with metadata and st, atomically and durably,
// and drops the files of the version 1 layout a loaded record may have,
// which would otherwise be read again by an older loader.
func (r *record[M, S]) write(st S) error {
	if err := writeJSON(r.Dir, stateFile, versioned[M, S]{Version: stateVersion, Metadata: r.md, Status: &st}); err != nil {
		return err
	}
	if !r.loaded {
		return nil
	}
	for _, f := range []string{legacyMetaFile, legacyStatusFile} {
		if err := os.Remove(filepath.Join(r.Dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	r.loaded = false
	return nil
}

// Lock serialises lifecycle operations on one object.
func (r *record[M, S]) Lock() func() {
	r.opMu.Lock()
	return r.opMu.Unlock
}

// LockEvents is held from a status change until the events announcing
// it are sent, by a change made without Lock: an exit noticed by a
// watcher or a status read. AwaitEvents waits until such a change's
// events are out, so that an operation that saw the new status sends
// its own after them: a plugin hears StopContainer before
// RemoveContainer, kubelet gets STOPPED before DELETED.
func (r *record[M, S]) LockEvents() func() {
	r.evMu.Lock()
	return r.evMu.Unlock
}

// AwaitEvents waits for the events of a status change made under
// LockEvents.
func (r *record[M, S]) AwaitEvents() {
	r.evMu.Lock()
	r.evMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
}

// RemoveCrashTemps deletes the temp files of writes into dir that a
// killed daemon left. A write in flight has one too, so it runs only
// where nothing writes dir: restore, before requests are served. Loads
// once did it, and StopPodSandbox, which loads the containers on disk
// that are not in the store, deleted the temp of another pod's
// CreateContainer between its write and its rename: the creation failed
// ("recording creating intent: rename ...: no such file or directory").
func RemoveCrashTemps(dir string) { atomicfile.RemoveTemps(dir) }

// loadRecord reads dir's state.json, checks its version and that idOf
// names the directory. A directory in the version 1 layout (meta.json and
// status.json) is read too; its status must be there, since a missing one
// cannot be told from a crash between the two writes: the record is then
// refused with ErrDataLoss rather than read as a state it never had.
// A load only reads: see RemoveCrashTemps.
func loadRecord[M any, S comparable](dir string, idOf func(*M) string) (*M, S, error) {
	var zero S
	var rec versioned[M, S]
	err := readJSON(filepath.Join(dir, stateFile), &rec)
	if errdefs.IsNotFound(err) {
		return loadLegacyRecord[M, S](dir, idOf)
	}
	if err != nil {
		return nil, zero, err
	}
	if rec.Version != stateVersion || rec.Metadata == nil || rec.Status == nil {
		return nil, zero, fmt.Errorf("%s: unsupported state version %d: %w", dir, rec.Version, errdefs.ErrFailedPrecondition)
	}
	if err := checkID(dir, idOf(rec.Metadata)); err != nil {
		return nil, zero, err
	}
	return rec.Metadata, *rec.Status, nil
}

func loadLegacyRecord[M any, S comparable](dir string, idOf func(*M) string) (*M, S, error) {
	var zero S
	var meta, st versioned[M, S]
	if err := readJSON(filepath.Join(dir, legacyMetaFile), &meta); err != nil {
		return nil, zero, err
	}
	if meta.Version != 1 || meta.Metadata == nil {
		return nil, zero, fmt.Errorf("%s: unsupported state version %d: %w", dir, meta.Version, errdefs.ErrFailedPrecondition)
	}
	if err := checkID(dir, idOf(meta.Metadata)); err != nil {
		return nil, zero, err
	}
	if err := readJSON(filepath.Join(dir, legacyStatusFile), &st); err != nil || st.Status == nil {
		return meta.Metadata, zero, fmt.Errorf("%s: metadata without its status: %w", dir, errdefs.ErrDataLoss)
	}
	return meta.Metadata, *st.Status, nil
}

func checkID(dir, id string) error {
	if ValidateID(id) != nil || id != filepath.Base(dir) {
		return fmt.Errorf("%s: ID %q does not match its directory: %w", dir, id, errdefs.ErrFailedPrecondition)
	}
	return nil
}
