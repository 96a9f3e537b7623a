package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/errdefs"
)

// Checkpoint dumps a running container's processes with CRIU through the
// runtime (`runc checkpoint`) into imageDir, CRIU's log into workDir, and
// leaves the container running: kubelet's checkpoint is forensic, the
// workload must not notice it. The dump accepts what a serving workload
// has open, which CRIU refuses by default: established TCP connections
// (frozen in repair mode for the dump, then resumed), unix sockets whose
// peer is outside the container, and file locks.
//
// CRIU freezes the container's cgroup for the dump and thaws it at the
// end, on success or failure; a CRIU killed in between would leave the
// container frozen. So the runtime is never killed: when ctx ends first,
// Checkpoint returns its error and the dump runs on to its end, its
// result discarded. The runtime writes to a file in workDir, not to a
// pipe to pinrt, and runs in a process group of its own, so a pinrt that
// dies mid-dump takes neither it (SIGPIPE on its next log line) nor
// CRIU along.
//
// A container the runtime has not running is FailedPrecondition; one it
// does not know is NotFound.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	if err := validateID(id); err != nil {
		return err
	}
	if imageDir == "" || workDir == "" {
		return fmt.Errorf("checkpoint %s: image and work directories are required: %w", id, errdefs.ErrInvalidArgument)
	}
	args := []string{"checkpoint", "--leave-running", "--tcp-established", "--ext-unix-sk", "--file-locks",
		"--image-path", imageDir, "--work-path", workDir, id}
	out, err := os.OpenFile(filepath.Join(workDir, "runtime.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.binary, append(r.globalArgs(), args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("%s checkpoint: %w", filepath.Base(r.binary), err)
	}
	done := make(chan error, 1)
	go func() {
		done <- cmd.Wait()
		out.Close()
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		return fmt.Errorf("checkpoint %s: %w (the dump runs on to its end and is discarded)", id, ctx.Err())
	}
	if err == nil {
		return nil
	}
	b, _ := os.ReadFile(out.Name())
	runErr := fmt.Errorf("%s checkpoint: %w: %s: %w", filepath.Base(r.binary), err, lastLines(string(b), 5), errdefs.ErrUnknown)
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return runErr
	}
	return r.failure(context.WithoutCancel(ctx), id, runErr, nil, func(st Status) bool { return st != StatusRunning })
}

// lastLines is the last n lines of s, trimmed.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
