package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// CRI's exit reasons; MonitorGone is pinrt's for a container whose
// conmon died, so its exit code is unknown.
const (
	reasonCompleted   = "Completed"
	reasonError       = "Error"
	reasonOOMKilled   = "OOMKilled"
	reasonMonitorGone = "MonitorGone"
)

// stopKillTimeout bounds the wait for a container to die after SIGKILL.
const stopKillTimeout = 30 * time.Second

func (s *Server) startContainer(ctx context.Context, c *sandbox.Container) error {
	unlock := c.Lock()
	defer unlock()
	if st := c.Status().State; st != sandbox.ContainerCreated {
		return fmt.Errorf("container %s is %s, not created: %w", c.ID, st, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return err
	}
	// Without its monitor a container would run with no log, no stdio
	// and no exit file, and its stop would wait for an exit code that is
	// never written.
	if _, alive, recorded := monitorPid(c.Dir, c.ID); recorded && !alive {
		return fmt.Errorf("container %s has no live monitor (conmon): %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	// Taken before the start: a short-lived container can exit, and conmon
	// date its exit file, before runc start even returns.
	started := time.Now()
	if err := rt.Start(ctx, c.ID); err != nil {
		return fmt.Errorf("starting container %s: %w", c.ID, err)
	}
	return c.UpdateStatus(func(st *sandbox.ContainerStatus) {
		st.State, st.StartedAt = sandbox.ContainerRunning, started
	})
}

// stopSignal parses an image STOPSIGNAL ("SIGUSR1", "USR1" or "10").
func stopSignal(v string) (syscall.Signal, error) {
	if v == "" {
		return syscall.SIGTERM, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 && n < 65 {
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, invalid("unknown stop signal %q", v)
}

// stopContainer sends the image's stop signal, waits up to timeout, then
// SIGKILLs. A timeout of 0 kills at once, as kubelet means it.
func (s *Server) stopContainer(ctx context.Context, c *sandbox.Container, timeout time.Duration) error {
	unlock := c.Lock()
	defer unlock()
	return s.stopLocked(ctx, c, timeout)
}

func (s *Server) stopLocked(ctx context.Context, c *sandbox.Container, timeout time.Duration) error {
	s.refreshContainer(ctx, c, false)
	if c.Status().State == sandbox.ContainerExited {
		return nil
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return err
	}
	sig, err := stopSignal(c.StopSignal)
	if err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("using SIGTERM")
		sig = syscall.SIGTERM
	}
	// The runtime waits for conmon's exit file after SIGKILL; that wait
	// has its own bound, whatever the caller's deadline.
	sctx, cancel := context.WithTimeout(ctx, timeout+stopKillTimeout)
	defer cancel()
	if err := rt.Stop(sctx, c.ID, sig, timeout); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stopping container %s: %w", c.ID, err)
	}
	s.refreshContainer(ctx, c, false)
	return nil
}

// removeContainer kills a live container, deletes it from the runtime,
// unmounts its rootfs and forgets it. Every step is idempotent.
func (s *Server) removeContainer(ctx context.Context, c *sandbox.Container) error {
	unlock := c.Lock()
	defer unlock()
	// Recorded first, so a start after a crash finishes the removal.
	if err := sandbox.MarkIntent(c.Dir, sandbox.IntentRemoving, c.ContainerMetadata); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := s.stopLocked(ctx, c, 0); err != nil {
		return err
	}
	if rt, err := s.runtimeFor(c.Handler); err == nil {
		if err := rt.Delete(ctx, c.ID, true); err != nil {
			return fmt.Errorf("deleting container %s: %w", c.ID, err)
		}
	}
	if err := s.deps.Images.UnmountRootfs(ctx, c.ID, c.SandboxID, c.Dir); err != nil {
		return fmt.Errorf("unmounting the rootfs of %s: %w", c.ID, err)
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		return fmt.Errorf("removing container %s: %w", c.ID, err)
	}
	s.containers.Delete(c.ID)
	s.ctrNames.Release(sandbox.ContainerNameKey(c.SandboxID, c.Name, c.Attempt), c.ID)
	s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	return nil
}

// refreshContainer brings the recorded status in line with the runtime
// and conmon's exit file. cheap skips the runtime call for a running
// container whose exit file is not there yet: conmon writes it when the
// container dies, so ListContainers need not exec runc for every
// container on every kubelet relist.
func (s *Server) refreshContainer(ctx context.Context, c *sandbox.Container, cheap bool) {
	st := c.Status()
	if st.State == sandbox.ContainerExited {
		return
	}
	if cheap && st.State == sandbox.ContainerRunning {
		if _, err := os.Stat(filepath.Join(c.Dir, c.ID)); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return
	}
	rs, err := rt.State(ctx, c.ID)
	if err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("refreshing container state")
		return
	}
	if err == nil && rs.Status != oci.StatusStopped && s.monitorGone(ctx, rt, c) {
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
		return
	}
	exited := false
	if err := c.UpdateStatus(func(st *sandbox.ContainerStatus) {
		was := st.State
		applyState(st, rs, err)
		exited = was != sandbox.ContainerExited && st.State == sandbox.ContainerExited
	}); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("saving container state")
	} else if exited {
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	}
}

// applyState folds the runtime's view into st. A container the runtime no
// longer knows (after a reboot) is exited with an unknown code.
func applyState(st *sandbox.ContainerStatus, rs *oci.State, err error) {
	if err != nil {
		st.State, st.ExitCode, st.Reason, st.Message = sandbox.ContainerExited, -1, reasonError, errGone.Error()
		if st.FinishedAt.IsZero() {
			st.FinishedAt = time.Now()
		}
		return
	}
	switch rs.Status {
	case oci.StatusCreated, oci.StatusCreating:
		// runc start's success already made the container running; runc
		// state can still say created for a few tens of milliseconds
		// after it, and the state never goes back.
		if st.State != sandbox.ContainerRunning {
			st.State = sandbox.ContainerCreated
		}
		st.Pid = rs.Pid
	case oci.StatusRunning, oci.StatusPaused:
		st.State, st.Pid = sandbox.ContainerRunning, rs.Pid
	case oci.StatusStopped:
		st.State, st.ExitCode, st.FinishedAt = sandbox.ContainerExited, rs.ExitCode, rs.FinishedAt
		if st.FinishedAt.IsZero() {
			st.FinishedAt = time.Now()
		}
		switch {
		case rs.OOMKilled:
			st.Reason = reasonOOMKilled
		case rs.ExitCode == 0:
			st.Reason = reasonCompleted
		default:
			st.Reason = reasonError
		}
		if rs.ExitCode == -1 {
			st.Message = "conmon recorded no exit code"
		}
	}
}

func (s *Server) execSync(ctx context.Context, c *sandbox.Container, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error) {
	if len(cmd) == 0 {
		return nil, nil, -1, invalid("exec: empty command")
	}
	s.refreshContainer(ctx, c, false)
	if st := c.Status().State; st != sandbox.ContainerRunning {
		return nil, nil, -1, fmt.Errorf("container %s is %s, not running: %w", c.ID, st, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return nil, nil, -1, err
	}
	return rt.ExecSync(ctx, c.ID, cmd, timeout)
}

// updateContainer applies new cgroup limits to a live container. The
// limits go through the same option as at create, so controllers the host
// lacks are dropped the same way.
func (s *Server) updateContainer(ctx context.Context, c *sandbox.Container, res *oci.Resources) error {
	if res == nil {
		return invalid("update of %s without linux resources", c.ID)
	}
	s.refreshContainer(ctx, c, false)
	if st := c.Status().State; st == sandbox.ContainerExited {
		return fmt.Errorf("container %s has exited: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return err
	}
	host := oci.ProbeHost()
	spec, err := oci.GenerateSpec(ctx, oci.WithResources(res, &host))
	if err != nil {
		return err
	}
	lr := spec.Linux.Resources
	lr.Devices = nil // runc update does not take device rules
	if err := rt.Update(ctx, c.ID, lr); err != nil {
		return fmt.Errorf("updating container %s: %w", c.ID, err)
	}
	return nil
}

func (s *Server) reopenLog(ctx context.Context, c *sandbox.Container) error {
	s.refreshContainer(ctx, c, false)
	if st := c.Status().State; st != sandbox.ContainerRunning {
		return fmt.Errorf("container %s is %s, not running: %w", c.ID, st, errdefs.ErrFailedPrecondition)
	}
	if c.LogPath == "" {
		return fmt.Errorf("container %s has no log: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return err
	}
	return rt.ReopenLog(ctx, c.ID)
}

// containerInfo is the verbose ContainerStatus info: the pid and the OCI
// spec the runtime was given.
func containerInfo(c *sandbox.Container) (map[string]string, error) {
	var spec *specs.Spec
	if b, err := os.ReadFile(filepath.Join(c.Dir, "config.json")); err == nil {
		spec = &specs.Spec{}
		if err := json.Unmarshal(b, spec); err != nil {
			spec = nil
		}
	}
	st := c.Status()
	b, err := json.Marshal(map[string]any{
		"pid": st.Pid, "sandboxID": c.SandboxID, "runtimeHandler": c.Handler,
		"runtimeSpec": spec, "status": st,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding container info: %w", errdefs.ErrInternal)
	}
	return map[string]string{"info": string(b)}, nil
}

// podContainers lists a pod's containers.
func (s *Server) podContainers(id string) []*sandbox.Container {
	var out []*sandbox.Container
	for _, c := range s.containers.List() {
		if c.SandboxID == id {
			out = append(out, c)
		}
	}
	return out
}
