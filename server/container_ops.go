package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	nriapi "github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"
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
	// reasonStartError and startErrorCode are a container the runtime
	// could not create at its start (containerd's StartError, 128).
	reasonStartError = "StartError"
	startErrorCode   = 128
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
	if c.Status().RuntimePending {
		if err := s.createInRuntime(ctx, rt, c); err != nil {
			return err
		}
	} else if _, alive, recorded := monitorPid(c.Dir, c.ID); recorded && !alive {
		// Without its monitor a container would run with no log, no
		// stdio and no exit file, and its stop would wait for an exit
		// code that is never written.
		return fmt.Errorf("container %s has no live monitor (conmon): %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	// Taken before the start: a short-lived container can exit, and conmon
	// date its exit file, before runc start even returns.
	pod, ctr := s.nriOf(c, nil)
	if err := s.nri.StartContainer(ctx, pod, ctr); err != nil {
		return fmt.Errorf("starting container %s: %w", c.ID, err)
	}
	started := time.Now()
	// A command that ends at once (`true`) can exit before runc start
	// returns. Until the start is recorded and published, its exit is
	// left to this start (refreshContainer), which looks for it last:
	// the exit watcher used to record it first, the start then
	// overwrote it with Running, and kubelet heard of the exit before
	// the start.
	s.starting.Store(c.ID, struct{}{})
	defer func() {
		s.starting.Delete(c.ID)
		s.observeContainer(ctx, c, true)
	}()
	// A restored container runs once the runtime has it: the restore
	// was its start.
	if !c.Restored {
		if err := rt.Start(ctx, c.ID); err != nil {
			return fmt.Errorf("starting container %s: %w", c.ID, err)
		}
	}
	if err := c.UpdateStatus(func(st *sandbox.ContainerStatus) {
		st.StartedAt = started
		if st.State == sandbox.ContainerCreated {
			st.State = sandbox.ContainerRunning
		}
	}); err != nil {
		return err
	}
	s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
	if c.Restored {
		s.checkpointRestored(ctx, c)
	}
	s.statsStarted(c)
	pod, ctr = s.nriOf(c, nil)
	nriNotify(ctx, "PostStartContainer", s.nri.PostStartContainer(ctx, pod, ctr))
	return nil
}

// createInRuntime creates a prepared container in the runtime, under
// conmon (see createRuntimeContainer). A failure is the container's end,
// as containerd ends a container whose task could not be created: it is
// exited with StartError, and kubelet makes a new one.
func (s *Server) createInRuntime(ctx context.Context, rt ContainerRuntime, c *sandbox.Container) error {
	pid, err := rt.CreatePrepared(ctx, c.ID)
	if err != nil {
		err = fmt.Errorf("creating container %s in the runtime: %w", c.ID, err)
		if uerr := c.UpdateStatus(func(st *sandbox.ContainerStatus) {
			st.State, st.RuntimePending, st.ExitCode, st.Reason, st.Message = sandbox.ContainerExited, false, startErrorCode, reasonStartError, err.Error()
			st.FinishedAt = time.Now()
		}); uerr != nil {
			log.G(ctx).WithError(uerr).WithField("container", c.ID).Warn("saving container state")
		}
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
		return err
	}
	return c.UpdateStatus(func(st *sandbox.ContainerStatus) { st.Pid, st.RuntimePending = pid, false })
}

// stopContainer sends the image's stop signal, waits up to timeout, then
// SIGKILLs. A timeout of 0 kills at once, as kubelet means it.
func (s *Server) stopContainer(ctx context.Context, c *sandbox.Container, timeout time.Duration) error {
	unlock := c.Lock()
	defer unlock()
	return s.stopLocked(ctx, c, timeout)
}

func (s *Server) stopLocked(ctx context.Context, c *sandbox.Container, timeout time.Duration) error {
	// An exit the watcher recorded may still be being told: the stop,
	// and a removal after it, are told after it (LockEvents).
	defer c.AwaitEvents()
	// The recorded state is current (see observeContainer); a container
	// that died unnoticed makes the kill moot, which the runtime tells.
	s.observeContainer(ctx, c, true)
	if c.Status().State == sandbox.ContainerExited {
		s.reapLocked(ctx, c)
		return nil
	}
	if c.Status().RuntimePending {
		// Nothing runs and nothing will: the container is exited, as a
		// created one killed before its start is, and told as any exit.
		if err := s.spare(ctx, func() error {
			return c.UpdateStatus(func(st *sandbox.ContainerStatus) {
				st.State, st.RuntimePending, st.ExitCode, st.Reason = sandbox.ContainerExited, false, sigkillExit, reasonError
				st.Message, st.FinishedAt = "stopped before it started", time.Now()
			})
		}); err != nil {
			return err
		}
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
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
	s.stopping(c)
	if err := rt.Stop(sctx, c.ID, sig, timeout); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stopping container %s: %w", c.ID, err)
	}
	s.refreshContainer(ctx, c, false)
	s.reapLocked(ctx, c)
	return nil
}

// reapLocked deletes an exited container from the OCI runtime at once,
// as containerd deletes a task when it exits: its cgroup and the
// runtime's state go then, and RemoveContainer (which kubelet makes
// right after StopContainer, or at garbage collection) is left with
// pinrt's own records. Nothing depends on it: a daemon killed before it
// leaves the runtime's container to RemoveContainer, as before. c is
// locked by the caller and still in the store.
func (s *Server) reapLocked(ctx context.Context, c *sandbox.Container) {
	if c.Status().State != sandbox.ContainerExited {
		return
	}
	if cur, err := s.containers.Get(c.ID); err != nil || cur != c {
		return // removed meanwhile
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return
	}
	// NotFound: the runtime holds nothing of it (a failed create
	// deleted what it made).
	if err := rt.Reap(ctx, c.ID); err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("deleting the exited container from the runtime")
	}
}

// reapLater reaps an exit noticed outside a stop, once c's lock is free.
// A few at a time: a restart after many exits must not start a runtime
// process for each of them at once.
func (s *Server) reapLater(ctx context.Context, c *sandbox.Container) {
	ctx = context.WithoutCancel(ctx)
	go func() {
		s.reaping <- struct{}{}
		defer func() { <-s.reaping }()
		rctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		defer cancel()
		unlock := c.Lock()
		defer unlock()
		s.reapLocked(rctx, c)
	}()
}

// reapParallel bounds the exited containers deleted from the runtime at
// once in the background.
const reapParallel = 4

// nriStopped tells plugins a container exited and applies the updates
// to other containers they answer with. c may be locked (a stop): an
// update of c itself would wait for that lock, and an exited container
// has no limits to change. The others wait in the background until c's
// lock is free, as in updateContainer: an update of one of them may hold
// its lock while its plugins' answer waits for c.
func (s *Server) nriStopped(ctx context.Context, c *sandbox.Container) {
	pod, ctr := s.nriOf(c, nil)
	updates, err := s.nri.StopContainer(ctx, pod, ctr)
	nriNotify(ctx, "StopContainer", err)
	updates = slices.DeleteFunc(updates, func(u *nriapi.ContainerUpdate) bool { return u.GetContainerId() == c.ID })
	if len(updates) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		unlock := c.Lock() // free: the stop or the read that saw the exit is done
		unlock()
		uctx, cancel := context.WithTimeout(ctx, refreshTimeout)
		defer cancel()
		if _, err := s.UpdateContainers(uctx, updates); err != nil {
			log.G(ctx).WithError(err).Warn("NRI: updates after a stop failed")
		}
	}()
}

// removeContainer kills a live container, deletes it from the runtime,
// unmounts its rootfs and forgets it. Every step is idempotent.
func (s *Server) removeContainer(ctx context.Context, c *sandbox.Container) error {
	unlock := c.Lock()
	defer unlock()
	if cur, err := s.containers.Get(c.ID); err != nil || cur != c {
		return nil // removed by a removal this one waited for
	}
	// Recorded first, so a start after a crash finishes the removal.
	if err := s.spare(ctx, func() error {
		return sandbox.MarkIntent(c.Dir, sandbox.IntentRemoving, c.ContainerMetadata)
	}); err != nil && !errors.Is(err, os.ErrNotExist) {
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
	// An exit the stop above caused may still be being recorded: no more
	// writes into the directory once its removal starts.
	c.Detach()
	if err := sandbox.RemoveDir(c.Dir); err != nil {
		return fmt.Errorf("removing container %s: %w", c.ID, err)
	}
	s.containers.Delete(c.ID)
	s.statsRemoved(c.ID, "")
	s.resources.forget(c.Dir)
	s.forgetOOM("", c.ID)
	s.ctrNames.Release(sandbox.ContainerNameKey(c.SandboxID, c.Name, c.Attempt), c.ID)
	s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT)
	pod, ctr := s.nriOf(c, nil)
	nriNotify(ctx, "RemoveContainer", s.nri.RemoveContainer(ctx, pod, ctr))
	s.reserve.fill(ctx)
	return nil
}

// updateContainer applies new cgroup limits to a live container. The
// limits go through the same option as at create, so controllers the host
// lacks are dropped the same way. NRI plugins see them first and may
// replace them.
func (s *Server) updateContainer(ctx context.Context, c *sandbox.Container, res *oci.Resources) error {
	if res == nil {
		return invalid("update of %s without linux resources", c.ID)
	}
	host := oci.ProbeHost()
	spec, err := oci.GenerateSpec(ctx, oci.WithResources(res, &host))
	if err != nil {
		return err
	}
	others, err := s.updateLocked(ctx, c, res, spec.Linux.Resources)
	// The plugins' updates of other containers take those containers'
	// locks, so they wait until c is unlocked (as containerd calls NRI
	// outside a container's lock): an update of one of them may hold it
	// while its plugins' answer waits for c.
	if _, uerr := s.UpdateContainers(ctx, others); uerr != nil {
		log.G(ctx).WithError(uerr).Warn("NRI: updates to other containers failed")
	}
	return err
}

// updateLocked sets c's new limits, lr or those plugins replace them
// with, and returns the plugins' updates of other containers.
func (s *Server) updateLocked(ctx context.Context, c *sandbox.Container, res *oci.Resources, lr *specs.LinuxResources) ([]*nriapi.ContainerUpdate, error) {
	// Two updates must reach runc and config.json in the same order, or
	// the record ends up with limits the cgroup does not have.
	unlock := c.Lock()
	defer unlock()
	rt, err := s.updatable(ctx, c)
	if err != nil {
		return nil, err
	}
	lr, others, err := s.nriUpdate(ctx, c, res, lr)
	if err != nil {
		return nil, err
	}
	lr.Devices = nil // runc update does not take device rules
	if err := rt.Update(ctx, c.ID, lr); err != nil {
		return others, fmt.Errorf("updating container %s: %w", c.ID, err)
	}
	pod, ctr := s.nriOf(c, nil)
	nriNotify(ctx, "PostUpdateContainer", s.nri.PostUpdateContainer(ctx, pod, ctr))
	return others, nil
}

// applyResources sets a live container's cgroup limits (NRI updates).
func (s *Server) applyResources(ctx context.Context, c *sandbox.Container, lr *specs.LinuxResources) error {
	unlock := c.Lock()
	defer unlock()
	rt, err := s.updatable(ctx, c)
	if err != nil {
		return err
	}
	lr.Devices = nil // runc update does not take device rules
	if err := rt.Update(ctx, c.ID, lr); err != nil {
		return fmt.Errorf("updating container %s: %w", c.ID, err)
	}
	return nil
}

// updatable is the runtime of a container whose limits can change: one
// that has not exited. The caller holds the container's lock.
func (s *Server) updatable(ctx context.Context, c *sandbox.Container) (ContainerRuntime, error) {
	s.observeContainer(ctx, c, true)
	if st := c.Status().State; st == sandbox.ContainerExited {
		return nil, fmt.Errorf("container %s has exited: %w", c.ID, errdefs.ErrFailedPrecondition)
	}
	return s.runtimeFor(c.Handler)
}

func (s *Server) reopenLog(ctx context.Context, c *sandbox.Container) error {
	s.observeContainer(ctx, c, true)
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

// StartContainer starts a created container.
func (s *Server) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if err := s.startContainer(ctx, c); err != nil {
		return nil, err
	}
	return &runtimeapi.StartContainerResponse{}, nil
}

// StopContainer stops a container with its stop signal, then SIGKILL after
// the timeout. Stopping a stopped container is not an error.
func (s *Server) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	c, gone, err := lookupForRemoval(s.containers, req.ContainerId)
	if err != nil {
		return nil, err
	}
	if gone {
		return &runtimeapi.StopContainerResponse{}, nil
	}
	wasLive := c.Status().State != sandbox.ContainerExited // kubelet repeats stops
	if err := s.stopContainer(ctx, c, timeoutSeconds(req.Timeout)); err != nil {
		return nil, err
	}
	if wasLive {
		log.G(ctx).WithFields(s.containerFields(c)).Info("container stopped")
	}
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer kills a live container and deletes everything it had.
// Removing a container that is already gone succeeds (api.proto).
func (s *Server) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	c, gone, err := lookupForRemoval(s.containers, req.ContainerId)
	if err != nil {
		return nil, err
	}
	if gone {
		return &runtimeapi.RemoveContainerResponse{}, nil
	}
	if err := s.removeContainer(ctx, c); err != nil {
		return nil, err
	}
	return &runtimeapi.RemoveContainerResponse{}, nil
}

// UpdateContainerResources changes a live container's cgroup limits.
func (s *Server) UpdateContainerResources(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if err := validResources(req.Linux); err != nil {
		return nil, err
	}
	if err := s.updateContainer(ctx, c, toResources(req.Linux)); err != nil {
		return nil, err
	}
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

// ReopenContainerLog makes conmon reopen the log after kubelet rotated it.
func (s *Server) ReopenContainerLog(ctx context.Context, req *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	if err := s.reopenLog(ctx, c); err != nil {
		return nil, err
	}
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}
