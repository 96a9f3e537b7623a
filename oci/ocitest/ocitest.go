// Package ocitest provides a hand-written fake of the oci.Runtime method
// set for unit tests of its consumers (server/, sandbox/).
package ocitest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/oci"
)

// ExecResult is what ExecSync returns for a command.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int32
	Err            error
}

// Runtime is an in-memory fake runtime. Containers move created → running
// → stopped like the real one. Set the *Err fields to make the matching
// call fail; Calls records every call as "method id".
type Runtime struct {
	mu sync.Mutex

	CreateErr, StartErr, KillErr, StopErr, DeleteErr, StateErr, UpdateErr, ReopenErr, CheckpointErr error
	// CreatePreparedErr fails CreatePrepared alone: the runtime refusing
	// a container at its start.
	CreatePreparedErr error
	// ProbeErr is what Probe reports: the runtime cannot run containers.
	ProbeErr error
	// RestoredFrom is, by container, the pstree.img of the images a
	// container was restored from (CreateOptions.Restore).
	RestoredFrom map[string]string
	// Probes counts Probe calls.
	Probes int
	// FeaturesResult is returned by Features; nil means no features.
	FeaturesResult *oci.Features
	// Exec is returned by ExecSync for every command.
	Exec ExecResult
	// StateLagsStart makes Start succeed while State keeps reporting the
	// container created, as runc's state does for tens of milliseconds
	// after `runc start` returned.
	StateLagsStart bool
	// AfterState, if set, runs after every State answer with the stored
	// state, which it may change: a container that exits between two
	// reads.
	AfterState func(id string, st *oci.State)
	// NoExitFiles stops the fake from writing exit files, as when conmon
	// is dead.
	NoExitFiles bool
	// StopExitCode is the exit code Kill/Stop record (default 137 for SIGKILL,
	// 143 otherwise).
	StopExitCode *int32

	Containers map[string]*oci.State
	Specs      map[string]*specs.Spec
	Resources  map[string]*specs.LinuxResources
	Calls      []string
	// states counts State calls (not in Calls: every status read used
	// to make one).
	states   int
	nextPid  int
	exitDirs map[string]string
	// prepared are the containers Prepare wrote and CreatePrepared has
	// not created yet.
	prepared map[string]oci.CreateOptions
}

// New returns an empty fake.
func New() *Runtime {
	return &Runtime{Containers: map[string]*oci.State{}, Specs: map[string]*specs.Spec{}, Resources: map[string]*specs.LinuxResources{}, nextPid: 1000}
}

func (r *Runtime) record(call, id string) { r.Calls = append(r.Calls, call+" "+id) }

func (r *Runtime) get(id string) (*oci.State, error) {
	st, ok := r.Containers[id]
	if !ok {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	return st, nil
}

// Create records the container as created.
func (r *Runtime) Create(_ context.Context, o oci.CreateOptions) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("create", o.ID)
	return r.createLocked(o)
}

// Prepare writes the bundle and keeps o for CreatePrepared; the
// container is not in the runtime (State says NotFound) until then.
// CreateErr fails it too.
func (r *Runtime) Prepare(o oci.CreateOptions) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("prepare", o.ID)
	if r.CreateErr != nil {
		return r.CreateErr
	}
	if _, ok := r.Containers[o.ID]; ok {
		return fmt.Errorf("container %s: %w", o.ID, errdefs.ErrAlreadyExists)
	}
	if err := writeBundle(o); err != nil {
		return err
	}
	if r.prepared == nil {
		r.prepared = map[string]oci.CreateOptions{}
	}
	r.prepared[o.ID] = o
	r.Specs[o.ID] = o.Spec
	return nil
}

// CreatePrepared creates a prepared container; CreatePreparedErr fails
// it (and forgets it, as the real one deletes the container).
func (r *Runtime) CreatePrepared(_ context.Context, id string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("create", id)
	o, ok := r.prepared[id]
	if !ok {
		return 0, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	delete(r.prepared, id)
	if r.CreatePreparedErr != nil {
		return 0, r.CreatePreparedErr
	}
	if res, ok := r.Resources[id]; ok && o.Spec != nil && o.Spec.Linux != nil {
		o.Spec.Linux.Resources = res
	}
	return r.createLocked(o)
}

// WaitRestore reports a container the fake restored (RestoredFrom)
// that runs.
func (r *Runtime) WaitRestore(_ context.Context, id string, _ time.Duration) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("waitrestore", id)
	st, ok := r.Containers[id]
	if _, restored := r.RestoredFrom[id]; !ok || !restored || st.Status != oci.StatusRunning {
		return 0, false
	}
	return st.Pid, true
}

// Reset makes a created (never started) container prepared again.
func (r *Runtime) Reset(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("reset", id)
	if st, ok := r.Containers[id]; ok && st.Status == oci.StatusCreated {
		if r.prepared == nil {
			r.prepared = map[string]oci.CreateOptions{}
		}
		r.prepared[id] = oci.CreateOptions{ID: id, Bundle: st.Bundle, Spec: r.Specs[id], ExitDir: r.exitDirs[id]}
		delete(r.Containers, id)
	}
	return nil
}

// writeBundle writes the spec as config.json, in a directory made if
// missing (the infra process's is), as the real runtime does.
func writeBundle(o oci.CreateOptions) error {
	if o.Bundle == "" || o.Spec == nil {
		return nil
	}
	b, err := json.Marshal(o.Spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.Bundle, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.Bundle, "config.json"), b, 0o600)
}

func (r *Runtime) createLocked(o oci.CreateOptions) (int, error) {
	if r.CreateErr != nil {
		return 0, r.CreateErr
	}
	if _, ok := r.Containers[o.ID]; ok {
		return 0, fmt.Errorf("container %s: %w", o.ID, errdefs.ErrAlreadyExists)
	}
	r.nextPid++
	if err := writeBundle(o); err != nil {
		return 0, err
	}
	if r.exitDirs == nil {
		r.exitDirs = map[string]string{}
	}
	r.exitDirs[o.ID] = o.ExitDir
	st := &oci.State{ID: o.ID, Status: oci.StatusCreated, Pid: r.nextPid, Bundle: o.Bundle, Created: time.Now(), ExitCode: -1}
	if o.Restore != "" {
		// runc restore leaves it running, from the images it was given.
		st.Status = oci.StatusRunning
		if r.RestoredFrom == nil {
			r.RestoredFrom = map[string]string{}
		}
		pstree, err := os.ReadFile(filepath.Join(o.Restore, "pstree.img"))
		if err != nil {
			return 0, fmt.Errorf("restore %s: %w", o.ID, err)
		}
		r.RestoredFrom[o.ID] = string(pstree)
	}
	r.Containers[o.ID] = st
	r.Specs[o.ID] = o.Spec
	return r.nextPid, nil
}

// Start moves a created container to running.
func (r *Runtime) Start(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("start", id)
	if r.StartErr != nil {
		return r.StartErr
	}
	st, err := r.get(id)
	if err != nil {
		return err
	}
	if st.Status != oci.StatusCreated {
		return fmt.Errorf("container %s is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	if !r.StateLagsStart {
		st.Status = oci.StatusRunning
	}
	return nil
}

func (r *Runtime) stop(st *oci.State, sig syscall.Signal) {
	code := int32(128 + int(sig))
	if r.StopExitCode != nil {
		code = *r.StopExitCode
	}
	st.Status, st.ExitCode, st.FinishedAt, st.Pid = oci.StatusStopped, code, time.Now(), 0
	r.writeExitFile(st.ID, code)
}

// writeExitFile writes <exit dir>/<id> as conmon does when the container
// dies, so the server's exit watcher and read path see the exit.
func (r *Runtime) writeExitFile(id string, code int32) {
	if d := r.exitDirs[id]; d != "" && !r.NoExitFiles {
		_ = os.WriteFile(filepath.Join(d, id), []byte(fmt.Sprint(code)), 0o600) // the bundle may be gone
	}
}

// Exit makes a running container exit with code, as if its process ended
// on its own: the state says stopped and the exit file is written.
func (r *Runtime) Exit(id string, code int32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.get(id)
	if err != nil {
		return err
	}
	st.Status, st.ExitCode, st.FinishedAt, st.Pid = oci.StatusStopped, code, time.Now(), 0
	r.writeExitFile(id, code)
	return nil
}

// Kill stops the container as if sig killed it.
func (r *Runtime) Kill(_ context.Context, id string, sig syscall.Signal, _ bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("kill", id)
	if r.KillErr != nil {
		return r.KillErr
	}
	st, err := r.get(id)
	if err != nil {
		return err
	}
	if st.Status == oci.StatusStopped {
		return fmt.Errorf("container %s not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	r.stop(st, sig)
	return nil
}

// Stop stops the container; stopping a stopped one is fine.
func (r *Runtime) Stop(_ context.Context, id string, sig syscall.Signal, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("stop", id)
	if r.StopErr != nil {
		return r.StopErr
	}
	st, err := r.get(id)
	if err != nil {
		return err
	}
	if st.Status != oci.StatusStopped {
		r.stop(st, sig)
	}
	return nil
}

// Delete forgets the container; unknown IDs are fine.
func (r *Runtime) Delete(_ context.Context, id string, force bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("delete", id)
	if r.DeleteErr != nil {
		return r.DeleteErr
	}
	if st, ok := r.Containers[id]; ok && st.Status == oci.StatusRunning && !force {
		return fmt.Errorf("container %s is running: %w", id, errdefs.ErrFailedPrecondition)
	}
	delete(r.Containers, id)
	delete(r.Specs, id)
	delete(r.prepared, id)
	return nil
}

// Reap drops a stopped container from the runtime's list of live ones
// and keeps its state, as the real runtime keeps its record and exit
// file; a running container is refused.
func (r *Runtime) Reap(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("reap", id)
	st, ok := r.Containers[id]
	if !ok || st.Status != oci.StatusStopped {
		return fmt.Errorf("container %s has not exited: %w", id, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// ExitState reports a stopped container whose exit file was written,
// as the real runtime does from conmon's files.
func (r *Runtime) ExitState(id string) (*oci.State, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.Containers[id]
	if !ok || st.Status != oci.StatusStopped {
		return nil, false
	}
	if _, err := os.Stat(filepath.Join(r.exitDirs[id], id)); err != nil {
		return nil, false
	}
	c := *st
	return &c, true
}

// MoveExitDir makes id's exit file go to dir from now on, as for a
// container created with another exit directory.
func (r *Runtime) MoveExitDir(id, dir string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exitDirs[id] = dir
}

// ExitFile is where the container's exit file is written, "" for one
// never created.
func (r *Runtime) ExitFile(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.exitDirs[id]
	if !ok {
		return ""
	}
	return filepath.Join(d, id)
}

// StateCalls is how many times State was called.
func (r *Runtime) StateCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.states
}

// State returns a copy of the container's state.
func (r *Runtime) State(_ context.Context, id string) (*oci.State, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states++
	if r.StateErr != nil {
		return nil, r.StateErr
	}
	st, err := r.get(id)
	if err != nil {
		return nil, err
	}
	c := *st
	if r.AfterState != nil {
		r.AfterState(id, st)
	}
	return &c, nil
}

// ExecSync returns r.Exec for a running container.
func (r *Runtime) ExecSync(_ context.Context, id string, _ []string, _ time.Duration) ([]byte, []byte, int32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("exec", id)
	st, err := r.get(id)
	if err != nil {
		return nil, nil, -1, err
	}
	if st.Status != oci.StatusRunning {
		return nil, nil, -1, fmt.Errorf("container %s is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	return r.Exec.Stdout, r.Exec.Stderr, r.Exec.ExitCode, r.Exec.Err
}

// ExecStream records a streaming exec and returns r.Exec's exit code for
// a running container; it writes nothing to the streams.
func (r *Runtime) ExecStream(_ context.Context, id string, _ oci.ExecOptions) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("exec-stream", id)
	st, err := r.get(id)
	if err != nil {
		return -1, err
	}
	if st.Status != oci.StatusRunning {
		return -1, fmt.Errorf("container %s is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	return int(r.Exec.ExitCode), r.Exec.Err
}

// Attach records an attach and returns at once.
func (r *Runtime) Attach(_ context.Context, id string, _ oci.AttachOptions) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("attach", id)
	_, err := r.get(id)
	return err
}

// Update records the new resources.
func (r *Runtime) Update(_ context.Context, id string, res *specs.LinuxResources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("update", id)
	if r.UpdateErr != nil {
		return r.UpdateErr
	}
	var bundle string
	if o, ok := r.prepared[id]; !ok {
		st, err := r.get(id)
		if err != nil {
			return err
		}
		bundle = st.Bundle
	} else {
		bundle = o.Bundle
	}
	r.Resources[id] = res
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err == nil {
		return oci.UpdateBundleResources(bundle, res)
	}
	return nil
}

// FinishUpdate records the call: the fake's updates are never cut short.
func (r *Runtime) FinishUpdate(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("finish-update", id)
	return nil
}

// ReopenLog records the call.
func (r *Runtime) ReopenLog(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("reopen", id)
	if r.ReopenErr != nil {
		return r.ReopenErr
	}
	_, err := r.get(id)
	return err
}

// Features returns FeaturesResult (or no features).
func (r *Runtime) Features(context.Context) (*oci.Features, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.FeaturesResult == nil {
		return &oci.Features{}, nil
	}
	return r.FeaturesResult, nil
}

// CheckIDMap fails like the real runtime when idmap is missing.
func (r *Runtime) CheckIDMap(ctx context.Context) error {
	f, _ := r.Features(ctx)
	if !f.IDMapMounts {
		return fmt.Errorf("runtime %q (%s) lacks idmapped mounts (features: linux.mountExtensions.idmap.enabled is not true): %w", "fake", "fake", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Probe returns ProbeErr.
func (r *Runtime) Probe(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Probes++
	return r.ProbeErr
}

// Checkpoint records the call and, for a running container, writes a
// stand-in image file into imageDir and a dump.log into workDir, as CRIU
// does; CheckpointErr fails it after the files are written, as a dump
// that fails halfway leaves some.
func (r *Runtime) Checkpoint(_ context.Context, id, imageDir, workDir string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.record("checkpoint", id)
	st, err := r.get(id)
	if err != nil {
		return err
	}
	if st.Status != oci.StatusRunning {
		return fmt.Errorf("container %s is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	for name, body := range map[string]string{"pstree.img": "fake pstree of " + id, "inventory.img": "fake inventory"} {
		if err := os.WriteFile(filepath.Join(imageDir, name), []byte(body), 0o600); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(workDir, "dump.log"), []byte("fake dump of "+id+"\n"), 0o600); err != nil {
		return err
	}
	return r.CheckpointErr
}
