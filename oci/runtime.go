package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// Handler is one configured runtime handler.
type Handler struct {
	Name string
	// Binary is the runtime executable, absolute or looked up in PATH.
	Binary string
	// Root is passed as `--root`; empty means the runtime's default.
	Root string
	// Type is "oci" (the only supported type).
	Type string
	// MonitorPath is conmon; empty means "conmon" from PATH.
	MonitorPath string
	// ExtraArgs are global flags on every runtime call, from the cgroup
	// driver (runc's --systemd-cgroup).
	ExtraArgs []string
	// ExecHelper runs package exechelper for streaming execs: pinrt-exec;
	// empty means the daemon's own binary (/proc/self/exe).
	ExecHelper string
}

// Runtime drives one OCI runtime binary through its CLI, with conmon as the
// per-container monitor. It keeps no container state in memory: everything
// State needs is on disk, so a fresh Runtime after a daemon restart sees
// the same containers.
type Runtime struct {
	h          Handler
	binary     string
	monitor    string
	execHelper string
	stateDir   string
	// reaped holds the containers Reap deleted from the OCI runtime in
	// this process: their Delete is pinrt's records alone. After a
	// restart it is empty, and Delete asks the runtime again.
	reaped sync.Map
	// started holds when this process started each container (Start),
	// for awaitStopHandler; Delete drops it.
	started sync.Map
}

// Status is a container's runtime status.
type Status string

const (
	StatusCreated Status = "created"
	StatusRunning Status = "running"
	StatusStopped Status = "stopped"
	// StatusPaused and StatusCreating are reported by runc in edge cases.
	StatusPaused   Status = "paused"
	StatusCreating Status = "creating"
)

// State is a container's status as seen by the runtime and conmon.
type State struct {
	ID      string
	Status  Status
	Pid     int
	Bundle  string
	Created time.Time
	// ExitCode and FinishedAt come from conmon's exit file once stopped;
	// ExitCode is -1 when the exit file is not there.
	ExitCode   int32
	FinishedAt time.Time
	OOMKilled  bool
}

// CreateOptions describe a container to create.
type CreateOptions struct {
	ID string
	// Bundle is the bundle directory: config.json and conmon's files.
	Bundle string
	Spec   *specs.Spec
	// LogPath is the CRI log file; "" means no log.
	LogPath               string
	Stdin, StdinOnce, Tty bool
	// ExitDir is where conmon writes the exit code file named ID.
	ExitDir string
	// Restore, when set, is a directory of CRIU images: the container is
	// restored from them (`runtime restore`) instead of created, and
	// runs once CreatePrepared returns.
	Restore string
}

// record is what a fresh Runtime needs to find a container's files.
type record struct {
	Version int    `json:"version"`
	ID      string `json:"id"`
	Bundle  string `json:"bundle"`
	ExitDir string `json:"exitDir"`
	LogPath string `json:"logPath,omitempty"`
	// StdinOnce and Tty shape Attach: the end of an attached client's
	// stdin closes a stdin_once container's stdin, unless it is a TTY.
	StdinOnce bool `json:"stdinOnce,omitempty"`
	Tty       bool `json:"tty,omitempty"`
	// Stdin keeps the container's stdin open to attach (conmon -i), for
	// a CreatePrepared after Prepare.
	Stdin bool `json:"stdin,omitempty"`
	// Restore is CreateOptions.Restore, for a CreatePrepared after
	// Prepare.
	Restore string `json:"restore,omitempty"`
}

const recordVersion = 1

// NewRuntime resolves the binaries and prepares stateDir (per daemon, for
// container records; the attach sockets are in the bundles).
func NewRuntime(h Handler, stateDir string) (*Runtime, error) {
	if h.Type != "" && h.Type != "oci" {
		return nil, fmt.Errorf("runtime %q: unsupported type %q: %w", h.Name, h.Type, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(stateDir) {
		return nil, fmt.Errorf("runtime state dir %q is not absolute: %w", stateDir, errdefs.ErrInvalidArgument)
	}
	bin, err := exec.LookPath(h.Binary)
	if err != nil {
		return nil, fmt.Errorf("runtime %q binary %q: %w: %w", h.Name, h.Binary, err, errdefs.ErrNotFound)
	}
	mon := h.MonitorPath
	if mon == "" {
		mon = "conmon"
	}
	mon, err = exec.LookPath(mon)
	if err != nil {
		return nil, fmt.Errorf("runtime %q monitor: %w: %w", h.Name, err, errdefs.ErrNotFound)
	}
	dirs := []string{stateDir, filepath.Join(stateDir, "containers")}
	// The runtime's own root lives on tmpfs too. After a reboot it is gone
	// until the first create, and `runc state` on a missing root fails in
	// a way that cannot be told from a real error: every container would
	// stay unknown instead of not found, and could never be removed.
	if h.Root != "" {
		dirs = append(dirs, h.Root)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create runtime state dir: %w", err)
		}
	}
	// A daemon killed in the middle of writing a record leaves its temp
	// file; nothing else writes here before the daemon serves.
	temps, _ := filepath.Glob(filepath.Join(stateDir, "containers", ".*.tmp*"))
	for _, t := range temps {
		_ = os.Remove(t)
	}
	pruneLegacyAttachLinks(stateDir)
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	helper := h.ExecHelper
	if helper == "" {
		helper = "/proc/self/exe"
	}
	return &Runtime{h: h, binary: abs, monitor: mon, execHelper: helper, stateDir: stateDir}, nil
}

// Binary is the resolved runtime path.
func (r *Runtime) Binary() string { return r.binary }

func (r *Runtime) globalArgs() []string {
	var args []string
	if r.h.Root != "" {
		args = []string{"--root", r.h.Root}
	}
	return append(args, r.h.ExtraArgs...)
}

// run runs the runtime with args and returns stdout. A failure carries
// the runtime's stderr for the message and its exit status, classed
// Unknown: what it means is decided from the runtime's state (see
// failure), never from the wording of its stderr.
func (r *Runtime) run(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.binary, append(r.globalArgs(), args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A runtime forking a helper that keeps stdout open must not hold us.
	cmd.WaitDelay = 5 * time.Second
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s: %w", filepath.Base(r.binary), args[0], err, msg, errdefs.ErrUnknown)
	}
	return stdout.Bytes(), nil
}

// runtimeState asks the runtime for id's state. ok is false when the
// runtime does not know the container, which `list` (structured output)
// tells apart from a state command that failed for another reason.
func (r *Runtime) runtimeState(ctx context.Context, id string) (rs *runcState, ok bool, err error) {
	out, stateErr := r.run(ctx, nil, "state", id)
	if stateErr == nil {
		rs = &runcState{}
		if err := json.Unmarshal(out, rs); err != nil {
			return nil, false, fmt.Errorf("parse runtime state of %s: %w: %w", id, err, errdefs.ErrUnknown)
		}
		return rs, true, nil
	}
	known, err := r.known(ctx, id)
	if err != nil {
		return nil, false, fmt.Errorf("%w (and listing containers: %w)", stateErr, err)
	}
	if known {
		return nil, true, stateErr
	}
	return nil, false, nil
}

// known reports whether the runtime lists id.
func (r *Runtime) known(ctx context.Context, id string) (bool, error) {
	out, err := r.run(ctx, nil, "list", "--format", "json")
	if err != nil {
		return false, err
	}
	var list []runcState
	// runc prints "null" for no containers.
	if err := json.Unmarshal(out, &list); err != nil {
		return false, fmt.Errorf("parse runtime list: %w: %w", err, errdefs.ErrUnknown)
	}
	for _, c := range list {
		if c.ID == id {
			return true, nil
		}
	}
	return false, nil
}

// failure classifies a failed op on id by the runtime's state after it:
// a container the runtime does not know is NotFound; one whose state makes
// op moot (allowed reports which) is not an error; anything else keeps
// opErr, classed Unknown. A missing cgroup file or an EPERM from kill
// thus stays an error even though its stderr says "no such file".
func (r *Runtime) failure(ctx context.Context, id string, opErr error, moot func(Status) bool, precondition func(Status) bool) error {
	rs, ok, err := r.runtimeState(ctx, id)
	switch {
	case err != nil:
		return fmt.Errorf("%w (state after the failure: %w)", opErr, err)
	case !ok:
		return fmt.Errorf("container %s: the runtime does not know it: %w", id, errdefs.ErrNotFound)
	case moot != nil && moot(Status(rs.Status)):
		return nil
	case precondition != nil && precondition(Status(rs.Status)):
		return fmt.Errorf("container %s is %s: %w", id, rs.Status, errdefs.ErrFailedPrecondition)
	}
	return opErr
}

func (r *Runtime) recordPath(id string) string {
	return filepath.Join(r.stateDir, "containers", id+".json")
}

func (r *Runtime) loadRecord(id string) (*record, error) {
	b, err := os.ReadFile(r.recordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("container %s record: %w: %w", id, err, errdefs.ErrDataLoss)
	}
	return &rec, nil
}

// Start starts a created container.
func (r *Runtime) Start(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	if _, err := r.run(ctx, nil, "start", id); err != nil {
		return r.failure(ctx, id, err, nil, func(st Status) bool { return st != StatusCreated })
	}
	r.started.Store(id, time.Now())
	return nil
}

// Kill signals the container's init (or all its processes).
func (r *Runtime) Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error {
	if err := validateID(id); err != nil {
		return err
	}
	args := []string{"kill"}
	if all {
		args = append(args, "--all")
	}
	if _, err := r.run(ctx, nil, append(args, id, strconv.Itoa(int(sig)))...); err != nil {
		// Killing a container that has stopped is done; any other failure
		// (EPERM, a frozen cgroup) is not, whatever runc printed.
		return r.failure(ctx, id, err, func(st Status) bool { return st == StatusStopped }, nil)
	}
	return nil
}

// Stop sends sig, waits up to timeout for the container to exit, then
// SIGKILLs it and waits for conmon to record the exit. A stopped container
// is fine.
//
// It asks the runtime nothing but the kills: conmon's exit file says the
// container has exited (conmon writes it after reaping the container's
// init and draining its log), so that is what Stop waits for, and a kill
// of a container that is already stopped is classed moot by failure.
func (r *Runtime) Stop(ctx context.Context, id string, sig syscall.Signal, timeout time.Duration) error {
	if err := validateID(id); err != nil {
		return err
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return err
	}
	exitFile := filepath.Join(rec.ExitDir, id)
	if _, _, ok := readExitFile(exitFile); ok {
		return nil
	}
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	if timeout > 0 && sig != syscall.SIGKILL {
		timeout -= r.awaitStopHandler(ctx, id, rec, sig, timeout/2)
		if !signalInit(rec, sig) {
			if err := r.Kill(ctx, id, sig, false); err != nil {
				return err
			}
		}
		if waitExitFile(ctx, exitFile, timeout, rec) {
			return nil
		}
		log.G(ctx).WithField("container", id).Debugf("container did not stop within %s after %s; killing", timeout, sig)
	}
	if !killInit(rec) {
		if err := r.Kill(ctx, id, syscall.SIGKILL, true); err != nil {
			return err
		}
	}
	if waitExitFile(ctx, exitFile, 0, rec) {
		return nil
	}
	// conmon is gone without an exit file: the runtime says when the
	// container has stopped (a kill takes effect a moment after it is
	// sent).
	for ctx.Err() == nil {
		if rs, known, err := r.runtimeState(ctx, id); err == nil && (!known || Status(rs.Status) == StatusStopped) {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(monitorPoll / 2):
		}
	}
	return fmt.Errorf("container %s did not exit after SIGKILL: %w", id, ctx.Err())
}

// killInit SIGKILLs the init of a container that has a PID namespace of
// its own, without a runtime call, and reports whether it did. The kernel
// kills every other process of a PID namespace when its init dies, so
// that is what `runc kill --all` would do for such a container, one
// process fewer per stop. Anything else (a shared or joined PID
// namespace, or what signalInit refuses) reports false and is left to
// the runtime.
func killInit(rec *record) bool {
	return ownPidNS(rec) && signalInit(rec, syscall.SIGKILL)
}

// ownPidNS reports whether the container's config.json gives it a PID
// namespace of its own, whose init is the container's process.
func ownPidNS(rec *record) bool {
	b, err := os.ReadFile(filepath.Join(rec.Bundle, "config.json"))
	if err != nil {
		return false
	}
	var spec struct {
		Linux *struct {
			Namespaces []specs.LinuxNamespace `json:"namespaces"`
		} `json:"linux"`
	}
	if json.Unmarshal(b, &spec) != nil || spec.Linux == nil {
		return false
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.PIDNamespace && ns.Path == "" {
			return true
		}
	}
	return false
}

// startupWindow is how long after StartContainer a container's init may
// keep a stop signal waiting for a handler (awaitStopHandler); a variable
// for the tests, whose loaded machines may take longer to start a shell.
var startupWindow = time.Second

// handlerPoll is how often awaitStopHandler looks at the init's signals.
const handlerPoll = 2 * time.Millisecond

// awaitStopHandler holds back a stop signal for the init of a container
// with a PID namespace of its own until that init catches or ignores sig,
// for at most the rest of the container's startupWindow and at most
// limit, and returns how long it waited.
//
// The kernel drops a signal to a PID namespace's init that has no
// handler for it. A StopContainer right after StartContainer (kubelet
// deleting a pod it has just started, a rollout's quick scale down) would
// otherwise send it while the runtime's init still execs the container's
// process, or while that process sets up its handler (a shell before its
// `trap`), and the container would run until the grace period's SIGKILL:
// 1-8 % of such stops on this host. A process that never handles sig
// loses nothing: the wait comes out of the grace period, whose end kills
// it as before. runc's init (a Go program: it catches everything) counts
// as not yet started. A container this process did not start (created
// only, or before a restart) is signalled at once.
func (r *Runtime) awaitStopHandler(ctx context.Context, id string, rec *record, sig syscall.Signal, limit time.Duration) time.Duration {
	v, ok := r.started.Load(id)
	if !ok {
		return 0
	}
	startedAt := v.(time.Time)
	if time.Since(startedAt) >= startupWindow {
		return 0
	}
	pid, ok := readPid(filepath.Join(rec.Bundle, "pidfile"))
	if !ok || !ownPidNS(rec) {
		return 0
	}
	start := time.Now()
	limit = min(limit, startupWindow-time.Since(startedAt))
	for {
		name, handled, ok := initSignals(pid, sig)
		if !ok || (handled && !strings.HasPrefix(name, "runc:[")) {
			return time.Since(start)
		}
		if time.Since(start)+handlerPoll > limit {
			return time.Since(start)
		}
		select {
		case <-ctx.Done():
			return time.Since(start)
		case <-time.After(handlerPoll):
		}
	}
}

// initSignals reads pid's command name and whether it catches or ignores
// sig, from /proc/<pid>/status; ok is false when pid is gone.
func initSignals(pid int, sig syscall.Signal) (name string, handled, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", false, false
	}
	bit := uint64(1) << (uint(sig) - 1)
	for line := range strings.Lines(string(b)) {
		key, val, _ := strings.Cut(strings.TrimSpace(line), ":")
		val = strings.TrimSpace(val)
		switch key {
		case "Name":
			name = val
		case "SigIgn", "SigCgt":
			if m, err := strconv.ParseUint(val, 16, 64); err == nil && m&bit != 0 {
				handled = true
			}
		}
	}
	return name, handled, true
}

// signalInit sends sig to the container's init without a runtime call
// and reports whether it did. For any signal but SIGKILL that is all
// `runc kill` (without --all) does, whatever the container's PID
// namespace, and kubelet's StopContainer sends one (SIGTERM or the
// image's stop signal) before its grace period: one runtime process
// fewer per stop. The pid is the one conmon recorded; a pidfd pins the
// process, which must then be conmon's child (conmon is the subreaper of
// the container's init), so a recycled pid is never signalled. No pid
// file, a process gone or not conmon's child reports false, and the
// caller asks the runtime, which knows whether the container stopped.
func signalInit(rec *record, sig syscall.Signal) bool {
	pid, ok := readPid(filepath.Join(rec.Bundle, "pidfile"))
	if !ok {
		return false
	}
	mon, ok := readPid(filepath.Join(rec.Bundle, "conmon.pid"))
	if !ok {
		return false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if parentPid(pid) != mon {
		return false
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0) == nil
}

func readPid(p string) (int, bool) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// parentPid is pid's parent from /proc/<pid>/stat, -1 if unknown. The
// command name in parentheses may hold spaces and parentheses itself: the
// fields follow its last ')'.
func parentPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return -1
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return ppid
}

// exitPoll is how often Stop looks for the exit file when it cannot wait
// on conmon: a stat, so it can be short.
const exitPoll = 5 * time.Millisecond

// monitorPoll is how long Stop waits on conmon before it looks at the
// exit file again, and how often it looks whether conmon still runs
// when it cannot wait on it.
const monitorPoll = 100 * time.Millisecond

// waitExitFile waits until conmon wrote the exit file p (so the container
// has exited and its log is drained), for at most d (0 = until ctx ends).
//
// With rec, it waits on rec's conmon, which writes the file and then
// exits: a pidfd of conmon turns readable the moment it is gone, with no
// polling, and a conmon gone without writing the file (killed, or its
// write failed) ends the wait, since nothing else ever will. Without a
// pidfd it polls the file, and looks at conmon now and then.
func waitExitFile(ctx context.Context, p string, d time.Duration, rec *record) bool {
	var end time.Time
	if d > 0 {
		end = time.Now().Add(d)
	}
	mon, alive := -1, true
	if rec != nil {
		mon, alive = openMonitor(rec)
		if mon >= 0 {
			defer unix.Close(mon)
		}
	}
	lastLook := time.Now()
	for {
		if _, _, ok := readExitFile(p); ok {
			return true
		}
		if !alive {
			_, _, ok := readExitFile(p) // written just before it went
			return ok
		}
		wait := exitPoll
		if mon >= 0 {
			wait = monitorPoll
		}
		if !end.IsZero() {
			wait = min(wait, time.Until(end))
		}
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl))
		}
		if ctx.Err() != nil || wait <= 0 {
			return false
		}
		switch {
		case mon >= 0:
			alive = !pidfdReadable(mon, wait)
		default:
			time.Sleep(wait)
			if rec != nil && time.Since(lastLook) >= monitorPoll {
				alive, lastLook = monitorAlive(rec.Bundle, rec.ID), time.Now()
			}
		}
	}
}

// openMonitor opens a pidfd of rec's conmon. alive is false when conmon
// is gone; fd is -1 then, and also where pidfds are missing (before
// Linux 5.3).
func openMonitor(rec *record) (fd int, alive bool) {
	pid, ok := readPid(filepath.Join(rec.Bundle, "conmon.pid"))
	if !ok || !monitorAlive(rec.Bundle, rec.ID) {
		return -1, false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, !errors.Is(err, unix.ESRCH)
	}
	// The pid may have been reused between the look and the open.
	if !monitorAlive(rec.Bundle, rec.ID) {
		_ = unix.Close(fd)
		return -1, false
	}
	return fd, true
}

// pidfdReadable waits up to d for pidfd fd's process to exit and says
// whether it did.
func pidfdReadable(fd int, d time.Duration) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}} //nolint:gosec // an fd fits
	n, err := unix.Poll(p, int(max(d.Milliseconds(), 1)))
	return err == nil && n > 0
}

// Delete removes the container from the runtime and forgets it. Deleting
// an unknown container is not an error.
//
// runc's `delete --force` signals the container and sleeps 100 ms before
// it looks again, even when the container exited long ago: that sleep
// was most of a RemoveContainer. Once conmon wrote the exit file, init is
// dead and reaped, so a plain delete does the same at once (runc still
// kills what is left in the cgroup of a container sharing a PID
// namespace). Should it refuse, the forced one follows.
func (r *Runtime) Delete(ctx context.Context, id string, force bool) error {
	if err := validateID(id); err != nil {
		return err
	}
	if _, ok := r.reaped.LoadAndDelete(id); ok {
		return r.forget(id)
	}
	// Prepared and never created: the runtime has nothing of it.
	if rec, err := r.loadRecord(id); err == nil && !prepared(rec.Bundle) {
		return r.forget(id)
	}
	r.unmountRestoreLeftovers(id)
	if force {
		if _, exited := r.ExitState(id); exited {
			if _, err := r.run(ctx, nil, "delete", id); err == nil {
				return r.forget(id)
			}
		}
	}
	args := []string{"delete"}
	if force {
		args = append(args, "--force")
	}
	if _, err := r.run(ctx, nil, append(args, id)...); err != nil {
		if err := r.failure(ctx, id, err, nil, nil); !errdefs.IsNotFound(err) {
			return err
		}
	}
	return r.forget(id)
}

// unmountRestoreLeftovers unmounts what an interrupted `runtime restore`
// of a restored container left mounted: runc's bind of the rootfs
// (criu-root, in its state directory) and CRIU's cgroup yard (in the
// bundle, its work directory). `runc delete` removes its state directory
// recursively: through a criu-root still mounted it would empty the
// container's rootfs (the kill test saw it).
//
// A `runtime restore` that outlived its conmon (or the daemon that
// started it) is waited for first, at most restoreRunWait: until it
// ends, it may still make or use those mounts, and a delete meanwhile
// went through them (a kill test in CI saw a rootfs without bin/busybox
// after a restart, 1 run in about 20).
func (r *Runtime) unmountRestoreLeftovers(id string) {
	rec, err := r.loadRecord(id)
	if err != nil || rec.Restore == "" {
		return
	}
	for deadline := time.Now().Add(restoreRunWait); restoreRunning(id) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	root := r.h.Root
	if root == "" {
		root = "/run/runc"
	}
	paths := []string{filepath.Join(root, id, "criu-root")}
	yards, _ := filepath.Glob(filepath.Join(rec.Bundle, ".criu.cgyard.*"))
	for _, p := range append(paths, yards...) {
		// MNT_DETACH takes the mounts beneath along.
		_ = unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	}
}

// restoreRunWait bounds the wait for a `runtime restore` still running.
const restoreRunWait = 30 * time.Second

// restoreRunning says whether `runtime restore` of container id runs:
// a process with "restore" and id among its arguments (conmon's own
// are --restore and -c id, so a live conmon is not one).
func restoreRunning(id string) bool {
	return AnyProcess(func(cmdline []byte) bool {
		args := bytes.Split(cmdline, []byte{0})
		return slices.ContainsFunc(args, func(a []byte) bool { return string(a) == "restore" }) &&
			slices.ContainsFunc(args, func(a []byte) bool { return string(a) == id })
	})
}

// AnyProcess says whether the command line (NUL-separated arguments) of
// any process on the host satisfies match.
func AnyProcess(match func(cmdline []byte) bool) bool {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && match(cmdline) {
			return true
		}
	}
	return false
}

// Reap deletes a container that has exited from the OCI runtime (its
// cgroup and the runtime's state go) and keeps pinrt's record and
// conmon's exit file, so State and ExitState still answer from them and
// a later Delete needs no runtime call. containerd deletes a task when it
// exits the same way. A container that has not exited is refused; one
// the runtime has no record of (a failed create deleted it) is NotFound.
func (r *Runtime) Reap(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	if _, ok := r.reaped.Load(id); ok {
		return nil
	}
	if _, exited := r.ExitState(id); !exited {
		if _, err := r.loadRecord(id); errdefs.IsNotFound(err) {
			return err
		}
		return fmt.Errorf("container %s has not exited: %w", id, errdefs.ErrFailedPrecondition)
	}
	r.unmountRestoreLeftovers(id)
	if _, err := r.run(ctx, nil, "delete", id); err != nil {
		if err := r.failure(ctx, id, err, nil, nil); !errdefs.IsNotFound(err) {
			return err
		}
	}
	r.reaped.Store(id, struct{}{})
	return nil
}

// forget drops what pinrt kept of a deleted container: its exit file
// first (the exit directory may be shared by every container, where
// nothing else would remove it), then the record that names it.
func (r *Runtime) forget(id string) error {
	r.started.Delete(id)
	if err := r.removeLegacyAttachLinks(id); err != nil {
		return err
	}
	if rec, err := r.loadRecord(id); err == nil && rec.ExitDir != "" {
		if err := os.Remove(filepath.Join(rec.ExitDir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Remove(r.recordPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

type runcState struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"`
	Bundle  string    `json:"bundle"`
	Created time.Time `json:"created"`
}

// State combines `runtime state` with conmon's exit and oom files. A
// container the runtime already forgot but whose exit file exists is
// reported stopped.
func (r *Runtime) State(ctx context.Context, id string) (*State, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	rec, recErr := r.loadRecord(id)
	st := &State{ID: id, ExitCode: -1}
	var rs *runcState
	var known bool
	var err error
	if _, reaped := r.reaped.Load(id); !reaped {
		rs, known, err = r.runtimeState(ctx, id)
	}
	switch {
	case err != nil:
		return nil, err
	case known:
		st.Status, st.Pid, st.Bundle, st.Created = Status(rs.Status), rs.Pid, rs.Bundle, rs.Created
	case recErr == nil && !prepared(rec.Bundle):
		// Prepared only: not in the runtime yet, nor stopped.
		return nil, fmt.Errorf("container %s is not created in the runtime yet: %w", id, errdefs.ErrNotFound)
	case recErr == nil:
		st.Status, st.Bundle = StatusStopped, rec.Bundle
	default:
		return nil, fmt.Errorf("container %s: %w", id, errdefs.ErrNotFound)
	}
	if st.Status != StatusStopped || recErr != nil {
		return st, nil
	}
	code, finished, ok := readExitFile(filepath.Join(rec.ExitDir, id))
	if !ok {
		// runc reports stopped the moment init dies; conmon writes the exit
		// file after draining the log. Give it a moment.
		for i := 0; i < 50 && !ok; i++ {
			time.Sleep(20 * time.Millisecond)
			code, finished, ok = readExitFile(filepath.Join(rec.ExitDir, id))
		}
	}
	if ok {
		st.ExitCode, st.FinishedAt = code, finished
	}
	if _, err := os.Stat(filepath.Join(rec.Bundle, "oom")); err == nil {
		st.OOMKilled = true
	}
	return st, nil
}

// ExitState is the state of a container conmon saw exit, from its exit
// and oom files alone, with no runtime call: conmon writes the exit file
// after the container's init died, when the runtime says stopped too.
// ok is false while there is no exit file (or no record of id).
func (r *Runtime) ExitState(id string) (st *State, ok bool) {
	if validateID(id) != nil {
		return nil, false
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return nil, false
	}
	code, finished, ok := readExitFile(filepath.Join(rec.ExitDir, id))
	if !ok {
		return nil, false
	}
	st = &State{ID: id, Status: StatusStopped, Bundle: rec.Bundle, ExitCode: code, FinishedAt: finished}
	if _, err := os.Stat(filepath.Join(rec.Bundle, "oom")); err == nil {
		st.OOMKilled = true
	}
	return st, true
}

// ExitFile is where conmon writes the container's exit file, from its
// record; "" without one.
func (r *Runtime) ExitFile(id string) string {
	if validateID(id) != nil {
		return ""
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return ""
	}
	return filepath.Join(rec.ExitDir, id)
}

func readExitFile(p string) (int32, time.Time, bool) {
	b, err := os.ReadFile(p)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return 0, time.Time{}, false
	}
	code, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 32)
	if err != nil {
		return 0, time.Time{}, false
	}
	fi, err := os.Stat(p)
	if err != nil {
		return 0, time.Time{}, false
	}
	return int32(code), fi.ModTime(), true
}

// Update changes the container's cgroup limits and records them in the
// bundle's config.json.
func (r *Runtime) Update(ctx context.Context, id string, res *specs.LinuxResources) error {
	if err := validateID(id); err != nil {
		return err
	}
	if res == nil {
		return fmt.Errorf("update %s: nil resources: %w", id, errdefs.ErrInvalidArgument)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	// Prepared and never created: the limits go into config.json, which
	// the runtime creates the cgroup from.
	rec, err := r.loadRecord(id)
	if err != nil {
		return err
	}
	if !prepared(rec.Bundle) {
		return UpdateBundleResources(rec.Bundle, res)
	}
	// The cgroup and config.json change one after the other. A crash
	// between them would leave ContainerStatus reporting limits the
	// cgroup does not have, so the update is marked as pending first and
	// FinishUpdate completes it at the next start.
	pending := filepath.Join(rec.Bundle, pendingUpdateFile)
	if err := atomicfile.WriteFiles(rec.Bundle, map[string][]byte{pendingUpdateFile: b}, 0o600, false); err != nil {
		return err
	}
	// Once begun, the update runs to its end even if the caller gives up
	// (kubelet's timeout, a closed connection): runc killed halfway
	// through the cgroup's files would leave some limits changed and
	// config.json not.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), updateTimeout)
	defer cancel()
	if _, err := r.run(ctx, b, "update", "--resources", "-", id); err != nil {
		_ = os.Remove(pending)
		return r.failure(ctx, id, err, nil, func(st Status) bool { return st == StatusStopped })
	}
	if err := UpdateBundleResources(rec.Bundle, res); err != nil {
		return err // pending stays: FinishUpdate records the limits
	}
	return os.Remove(pending)
}

// pendingUpdateFile, in a bundle, holds the resources of an Update that
// has not yet reached both the cgroup and config.json. It lives in the
// bundle, not with the runtime's records under /run: the bundle's
// config.json is what it must agree with, and a reboot, which empties
// /run, also takes the cgroup it was applied to.
const pendingUpdateFile = "update.pending"

// updateTimeout bounds a runtime update that its caller no longer waits
// for.
const updateTimeout = 2 * time.Minute

// FinishUpdate completes an Update that a crash cut short, before the
// container is reported again: the limits of the pending update are
// applied to the cgroup and recorded in config.json, so the two agree
// whichever step the crash came before. The update was never
// acknowledged, so applying it is as right as dropping it; applying it
// is what works from either side. A container with no pending update is
// left alone, and so is the cgroup of one that has stopped.
func (r *Runtime) FinishUpdate(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	rec, err := r.loadRecord(id)
	if errdefs.IsNotFound(err) {
		// No record under /run: the host rebooted since, and took the
		// cgroup with it; the container never runs again.
		return nil
	}
	if err != nil {
		return err
	}
	pending := filepath.Join(rec.Bundle, pendingUpdateFile)
	b, err := os.ReadFile(pending)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var res specs.LinuxResources
	if err := json.Unmarshal(b, &res); err != nil {
		// Written by rename, so never torn: a file that does not parse
		// was not written by pinrt.
		return fmt.Errorf("pending update of %s: %w: %w", id, err, errdefs.ErrDataLoss)
	}
	if _, err := r.run(ctx, b, "update", "--resources", "-", id); err != nil {
		if err := r.failure(ctx, id, err, func(st Status) bool { return st == StatusStopped }, nil); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	if err := UpdateBundleResources(rec.Bundle, &res); err != nil {
		return err
	}
	return os.Remove(pending)
}

var (
	featMu    sync.Mutex
	featCache = map[string]*Features{}
)

// Features probes `<binary> features` once per binary. A runtime without
// the command (old runc, or a failure) has no optional features.
func (r *Runtime) Features(ctx context.Context) (*Features, error) {
	featMu.Lock()
	defer featMu.Unlock()
	if f, ok := featCache[r.binary]; ok {
		return f, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.binary, "features")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	var f *Features
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		log.G(ctx).WithError(err).Debugf("runtime %s has no usable features command", r.binary)
		f = &Features{}
	} else if f, err = ParseFeatures(out); err != nil {
		log.G(ctx).WithError(err).Warnf("runtime %s: unparsable features output", r.binary)
		f = &Features{}
	}
	featCache[r.binary] = f
	return f, nil
}

// CheckIDMap fails with FailedPrecondition when the runtime cannot do
// idmapped mounts, which every userns pod volume needs.
func (r *Runtime) CheckIDMap(ctx context.Context) error {
	f, err := r.Features(ctx)
	if err != nil {
		return err
	}
	if !f.IDMapMounts {
		return fmt.Errorf("runtime %q (%s) lacks idmapped mounts (features: linux.mountExtensions.idmap.enabled is not true): %w", r.h.Name, r.binary, errdefs.ErrFailedPrecondition)
	}
	return nil
}
