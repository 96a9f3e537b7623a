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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// createTimeout bounds how long conmon may take to report the container
// pid (runc create includes mounting and the userns join).
const createTimeout = 2 * time.Minute

// syncMsg is what conmon (api version 1) writes on the sync pipe.
type syncMsg struct {
	Data    int    `json:"data"`
	Message string `json:"message,omitempty"`
}

// Create writes the bundle's config.json and starts conmon, which runs
// `runtime create`, keeps the container's stdio and writes its CRI log and
// exit file. It returns the container's init pid.
//
// conmon daemonizes (it forks; the parent writes --conmon-pidfile and
// exits), calls setsid and becomes a subreaper, so it is not our child and
// outlives a pinrt restart. Runtime errors reach us through the sync pipe,
// and the runtime's own logging goes to <bundle>/runtime.log, never into
// the container log.
func (r *Runtime) Create(ctx context.Context, o CreateOptions) (pid int, retErr error) {
	if err := r.Prepare(o); err != nil {
		return 0, err
	}
	return r.createPrepared(ctx, o)
}

// Prepare writes the bundle's config.json and the container's record,
// and starts nothing: CreatePrepared starts conmon on it later, as
// containerd creates a task only when the container starts. A prepared
// container is unknown to the runtime; Delete and Update act on its
// files alone.
func (r *Runtime) Prepare(o CreateOptions) error {
	if err := r.checkCreate(o); err != nil {
		return err
	}
	return r.writeBundle(o)
}

// CreatePrepared runs Create's second half on a bundle Prepare wrote:
// conmon and `runtime create`. What an earlier attempt that a crash cut
// short left is adopted (the runtime holds the created container under a
// live conmon) or deleted first. A failure deletes the container, record
// included.
func (r *Runtime) CreatePrepared(ctx context.Context, id string) (int, error) {
	if err := validateID(id); err != nil {
		return 0, err
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return 0, err
	}
	ps, err := readProcessSpec(rec.Bundle)
	if err != nil {
		return 0, err
	}
	o := CreateOptions{
		ID: id, Bundle: rec.Bundle, ExitDir: rec.ExitDir, LogPath: rec.LogPath,
		Stdin: rec.Stdin, StdinOnce: rec.StdinOnce, Tty: rec.Tty, Spec: ps.spec(), Restore: rec.Restore,
	}
	if pid, ok, err := r.leftover(ctx, o); err != nil || ok {
		return pid, err
	}
	return r.createPrepared(ctx, o)
}

// leftover deals with a conmon an earlier CreatePrepared of o started
// before a crash: a container it left under a live conmon is adopted
// (its pid, ok), anything else of it is deleted so that the create can
// run again.
func (r *Runtime) leftover(ctx context.Context, o CreateOptions) (int, bool, error) {
	if !prepared(o.Bundle) {
		return 0, false, nil
	}
	if pid, ok := r.settled(ctx, o, createTimeout); ok {
		if err := ownCreatedStdio(o.Spec, pid); err != nil {
			return 0, false, fmt.Errorf("create container %s: stdio: %w", o.ID, err)
		}
		return pid, true, nil
	}
	return 0, false, r.discard(ctx, o)
}

// settled is the pid of o's container if the runtime holds it as an
// earlier CreatePrepared leaves it, under that call's live conmon:
// created, or running once a restore is done. A restore still under way
// is waited for (at most wait), never cut short: CRIU killed in the
// middle leaves its mounts and half a process tree.
func (r *Runtime) settled(ctx context.Context, o CreateOptions, wait time.Duration) (int, bool) {
	done := StatusCreated
	if o.Restore != "" {
		done = StatusRunning
	}
	deadline := time.Now().Add(wait)
	for {
		alive := monitorAlive(o.Bundle, o.ID)
		if rs, known, err := r.runtimeState(ctx, o.ID); err == nil && known && Status(rs.Status) == done && rs.Pid > 0 && alive && restoreEnded(o) {
			return rs.Pid, true
		}
		if o.Restore == "" || !alive || time.Now().After(deadline) || ctx.Err() != nil {
			return 0, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restoreEnded says whether `runtime restore` of o is over: runc says
// running as soon as CRIU has made the process tree, while CRIU still
// has it stopped and its mounts up; the pid file is written last.
func restoreEnded(o CreateOptions) bool {
	if o.Restore == "" {
		return true
	}
	_, err := os.Stat(filepath.Join(o.Bundle, "pidfile"))
	return err == nil
}

// WaitRestore waits, at most wait, for the restore a crash cut short of
// prepared container id while the conmon of that CreatePrepared lives.
// It returns the container's pid and true once it runs under that
// conmon; false for a container that is no restore, whose restore failed
// or outlasted the wait (Reset then undoes it).
func (r *Runtime) WaitRestore(ctx context.Context, id string, wait time.Duration) (int, bool) {
	if validateID(id) != nil {
		return 0, false
	}
	rec, err := r.loadRecord(id)
	if err != nil || rec.Restore == "" || !prepared(rec.Bundle) {
		return 0, false
	}
	return r.settled(ctx, CreateOptions{ID: id, Bundle: rec.Bundle, Restore: rec.Restore}, wait)
}

// discard deletes the runtime's container of an interrupted create and
// conmon's files, leaving the prepared bundle.
func (r *Runtime) discard(ctx context.Context, o CreateOptions) error {
	r.unmountRestoreLeftovers(o.ID)
	if _, err := r.run(ctx, nil, "delete", "--force", o.ID); err != nil {
		if err := r.failure(ctx, o.ID, err, nil, nil); !errdefs.IsNotFound(err) {
			return err
		}
	}
	for _, f := range []string{filepath.Join(o.Bundle, "conmon.pid"), filepath.Join(o.Bundle, "pidfile"), filepath.Join(o.ExitDir, o.ID)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Reset takes a prepared container back to its bundle alone: a conmon
// an interrupted CreatePrepared started is killed with its process
// group (`runtime create` and init), the runtime's container deleted and
// conmon's files removed. The container never ran (its start never
// reached `runtime start`), and CreatePrepared can run again.
func (r *Runtime) Reset(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return err
	}
	if !prepared(rec.Bundle) {
		return nil
	}
	if b, err := os.ReadFile(filepath.Join(rec.Bundle, "conmon.pid")); err == nil && monitorAlive(rec.Bundle, id) {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
			// conmon called setsid: its pid is its process group.
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return r.discard(ctx, CreateOptions{ID: id, Bundle: rec.Bundle, ExitDir: rec.ExitDir})
}

// prepared says whether conmon was ever started for the container of
// bundle: its pidfile is the first thing it writes.
func prepared(bundle string) bool {
	_, err := os.Stat(filepath.Join(bundle, "conmon.pid"))
	return err == nil
}

// monitorAlive says whether the conmon recorded in bundle still runs for
// the container id.
func monitorAlive(bundle, id string) bool {
	b, err := os.ReadFile(filepath.Join(bundle, "conmon.pid"))
	if err != nil {
		return false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(b)), "cmdline"))
	return err == nil && bytes.Contains(cmdline, []byte("\x00"+id+"\x00"))
}

// createPrepared starts conmon on o's prepared bundle and waits for the
// container's pid; a failure deletes the container.
func (r *Runtime) createPrepared(ctx context.Context, o CreateOptions) (pid int, retErr error) {
	// From here on the record exists, and Delete removes what it names.
	defer func() {
		if retErr == nil {
			return
		}
		// Fresh context: the caller's may be what failed us.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := r.Delete(cctx, o.ID, true); err != nil {
			log.G(ctx).WithError(err).WithField("container", o.ID).Warn("cleanup after failed create")
		}
	}()

	syncR, err := r.startConmon(o)
	if err != nil {
		return 0, err
	}
	defer syncR.Close()
	return waitConmonPid(ctx, o, syncR)
}

// checkCreate rejects options Create cannot act on and an ID already in
// use, before anything is written.
func (r *Runtime) checkCreate(o CreateOptions) error {
	if err := validateID(o.ID); err != nil {
		return err
	}
	if o.Spec == nil {
		return fmt.Errorf("create %s: nil spec: %w", o.ID, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(o.Bundle) || !filepath.IsAbs(o.ExitDir) {
		return fmt.Errorf("create %s: bundle %q and exit dir %q must be absolute: %w", o.ID, o.Bundle, o.ExitDir, errdefs.ErrInvalidArgument)
	}
	if err := CheckLogPath(o.LogPath); err != nil {
		return fmt.Errorf("create %s: %w", o.ID, err)
	}
	if _, err := os.Stat(r.recordPath(o.ID)); err == nil {
		return fmt.Errorf("container %s: %w", o.ID, errdefs.ErrAlreadyExists)
	}
	return nil
}

// CheckLogPath refuses a container log path conmon cannot take: one
// that is relative, or that holds a ':', since conmon's -l option is
// driver:path and it cuts the path at the next ':'. An empty path is no
// log, and fine.
func CheckLogPath(p string) error {
	if p == "" {
		return nil
	}
	if !filepath.IsAbs(p) {
		return fmt.Errorf("log path %q is not absolute: %w", p, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, ':') {
		return fmt.Errorf("log path %q: the container monitor takes no ':' in a log path: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

// writeBundle writes the bundle's config.json and, last, the container's
// record, which is what Delete and a restart go by.
func (r *Runtime) writeBundle(o CreateOptions) error {
	for _, d := range []string{o.Bundle, o.ExitDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", o.ID, err)
		}
	}
	// A stale exit file from an earlier container with this ID would make
	// the new one look stopped.
	if err := os.Remove(filepath.Join(o.ExitDir, o.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	specJSON, err := json.Marshal(o.Spec)
	if err != nil {
		return fmt.Errorf("marshal spec: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(o.Bundle, "config.json"), specJSON, 0o600); err != nil {
		return fmt.Errorf("write config.json: %w", err)
	}
	rec, _ := json.Marshal(record{Version: recordVersion, ID: o.ID, Bundle: o.Bundle, ExitDir: o.ExitDir, LogPath: o.LogPath, Stdin: o.Stdin, StdinOnce: o.Stdin && o.StdinOnce, Tty: o.Tty, Restore: o.Restore})
	if err := atomicfile.WriteFile(r.recordPath(o.ID), rec, 0o600); err != nil {
		return fmt.Errorf("write container record: %w", err)
	}
	return nil
}

// startConmon starts conmon for o and waits for its first process, which
// exits once it forked the daemon half. It returns the read end of the
// sync pipe, on which conmon reports the container's pid or the
// runtime's error; the caller closes it. On error nothing it opened is
// left open.
func (r *Runtime) startConmon(o CreateOptions) (syncR *os.File, retErr error) {
	syncR, syncW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			syncR.Close()
		}
	}()
	startR, startW, err := os.Pipe()
	if err != nil {
		syncW.Close()
		return nil, err
	}

	cmd := exec.Command(r.monitor, r.conmonArgs(o)...)
	cmd.Dir = o.Bundle
	// ExtraFiles start at fd 3.
	cmd.ExtraFiles = []*os.File{syncW, startR}
	if o.Restore != "" {
		// conmon reports the pid on the sync pipe once the restore is
		// done, which takes long enough for pinrt to die meanwhile: with
		// no reader left that write would kill conmon (SIGPIPE), leaving
		// the restored container without its monitor. conmon holds a
		// read end of its own (fd 5, unused) so the write always lands.
		cmd.ExtraFiles = append(cmd.ExtraFiles, syncR)
	}
	// CHARSET tells glib, which parses conmon's options, that its
	// arguments are UTF-8: in the C locale it converts them from ASCII
	// and exits on the first other byte, so a log path with an "ü" failed
	// the start (option parsing failed: Invalid byte sequence).
	cmd.Env = []string{"_OCI_SYNCPIPE=3", "_OCI_STARTPIPE=4", "PATH=" + os.Getenv("PATH"), "CHARSET=UTF-8"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	syncW.Close()
	startR.Close()
	if err != nil {
		startW.Close()
		return nil, fmt.Errorf("start conmon for %s: %w", o.ID, err)
	}
	// conmon blocks on the start pipe until we are done with it (CRI-O
	// moves it into a cgroup here); closing it lets conmon proceed.
	startW.Close()
	// The first conmon process exits right after forking its daemon half.
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("conmon for %s: %w: %s: %w", o.ID, err, bytes.TrimSpace(stderr.Bytes()), errdefs.ErrUnknown)
	}
	return syncR, nil
}

// waitConmonPid reads conmon's report from the sync pipe for at most
// createTimeout and returns the container's init pid.
func waitConmonPid(ctx context.Context, o CreateOptions, syncR *os.File) (int, error) {
	msgCh := make(chan syncMsg, 1)
	errCh := make(chan error, 1)
	go func() {
		var m syncMsg
		if err := json.NewDecoder(syncR).Decode(&m); err != nil {
			errCh <- err
			return
		}
		msgCh <- m
	}()
	timer := time.NewTimer(createTimeout)
	defer timer.Stop()
	select {
	case m := <-msgCh:
		if m.Data <= 0 {
			// conmon passes runc's last line with its newline.
			return 0, fmt.Errorf("create container %s: %s: %w", o.ID, strings.TrimSpace(m.Message), errdefs.ErrUnknown)
		}
		// conmon made the stdio pipes as host root; the process has not
		// run yet (it waits for `runc start`).
		if err := ownCreatedStdio(o.Spec, m.Data); err != nil {
			return 0, fmt.Errorf("create container %s: stdio: %w", o.ID, err)
		}
		return m.Data, nil
	case err := <-errCh:
		return 0, fmt.Errorf("create container %s: reading conmon sync pipe: %w (see %s): %w", o.ID, err, filepath.Join(o.Bundle, "runtime.log"), errdefs.ErrUnknown)
	case <-timer.C:
		return 0, fmt.Errorf("create container %s: conmon did not report a pid within %s: %w", o.ID, createTimeout, context.DeadlineExceeded)
	case <-ctx.Done():
		return 0, fmt.Errorf("create container %s: %w", o.ID, ctx.Err())
	}
}

func (r *Runtime) conmonArgs(o CreateOptions) []string {
	args := []string{
		"--api-version", "1",
		"-c", o.ID,
		"-u", o.ID,
		"-n", o.ID,
		"-r", r.binary,
		"-b", o.Bundle,
		"-p", filepath.Join(o.Bundle, "pidfile"),
		"-P", filepath.Join(o.Bundle, "conmon.pid"),
		// No --persist-dir: conmon writes its "exit" file there before the
		// exit dir's, and gives up without the second when the first fails,
		// as it does on the full disk kubelet evicts containers from. The
		// oom file goes to the bundle all the same (conmon's cwd).
		"--exit-dir", o.ExitDir,
		// The attach socket goes straight into the bundle, bound through
		// /proc/self/fd, with no symlink under a socket dir: conmon cuts a
		// <socket dir>/<id> of exactly 107 bytes by one byte, so attach
		// found nothing, and conmon before 2.1.7 never removes its links.
		"--full-attach",
		"--log-level", "error",
		// runc's logrus output goes to a file: on stderr it would end up in
		// the container log.
		"--runtime-arg", "--log=" + filepath.Join(o.Bundle, "runtime.log"),
		"--runtime-arg", "--log-format=json",
	}
	if r.h.Root != "" {
		args = append(args, "--runtime-arg", "--root="+r.h.Root)
	}
	for _, a := range r.h.ExtraArgs {
		args = append(args, "--runtime-arg", a)
	}
	if o.LogPath != "" {
		args = append(args, "-l", "k8s-file:"+o.LogPath)
	} else {
		args = append(args, "-l", "none:")
	}
	if o.Tty {
		args = append(args, "-t")
	}
	if o.Restore != "" {
		// conmon runs `runtime restore --detach --image-path <dir>
		// --work-path <bundle>` (CRIU's restore.log goes to the bundle).
		// A pod's namespaces are external to CRIU: runc joins the new
		// pod's by their paths. Sockets to other processes and file locks
		// were dumped (Checkpoint's options), so they are restored too.
		args = append(args, "--restore", o.Restore,
			"--runtime-opt", "--ext-unix-sk", "--runtime-opt", "--file-locks")
	}
	if o.Stdin {
		args = append(args, "-i")
		if !o.StdinOnce {
			args = append(args, "--leave-stdin-open")
		}
	}
	return args
}

// ctlReopenLogs is conmon's control message type for reopening log files.
const ctlReopenLogs = 2

// ReopenLog asks conmon to reopen the container's log file (after kubelet
// rotated it) and waits until the file exists again.
func (r *Runtime) ReopenLog(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return err
	}
	st, err := r.State(ctx, id)
	if err != nil {
		return err
	}
	if st.Status != StatusRunning && st.Status != StatusCreated {
		return fmt.Errorf("reopen log of %s: container is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	// Nonblocking: if conmon is gone there is no reader and open fails with
	// ENXIO instead of hanging.
	fd, err := unix.Open(filepath.Join(rec.Bundle, "ctl"), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open conmon control fifo of %s: %w: %w", id, err, errdefs.ErrUnavailable)
	}
	f := os.NewFile(uintptr(fd), "ctl")
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%d 0 0\n", ctlReopenLogs); err != nil {
		return fmt.Errorf("write conmon control fifo of %s: %w", id, err)
	}
	if rec.LogPath == "" {
		return nil
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for {
		if _, err := os.Stat(rec.LogPath); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("conmon did not reopen log %s of %s: %w", rec.LogPath, id, context.DeadlineExceeded)
		case <-tick.C:
		}
	}
}
