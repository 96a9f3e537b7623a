package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/sandbox"
)

// StopPodSandbox stops the pod's containers and releases its network and
// namespaces. It is idempotent, and an unknown ID is not an error, as
// kubelet expects.
func (s *Server) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	sb, gone, err := lookupForRemoval(s.sandboxes, req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	if gone {
		return &runtimeapi.StopPodSandboxResponse{}, nil
	}
	wasReady := sb.Status().State == sandbox.StateReady // kubelet repeats stops
	if err := s.stopPod(ctx, sb); err != nil {
		return nil, err
	}
	if wasReady {
		podEvent(ctx, sb, "stopped")
	}
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

// RemovePodSandbox stops the pod if needed and deletes it. Removing a pod
// that is already gone succeeds, as api.proto requires.
func (s *Server) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	sb, gone, err := lookupForRemoval(s.sandboxes, req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	if gone {
		return &runtimeapi.RemovePodSandboxResponse{}, nil
	}
	if err := s.removePod(ctx, sb); err != nil {
		return nil, err
	}
	podEvent(ctx, sb, "removed")
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// stopPod tears a pod down to NotReady: containers, network, pins, shm.
// Every step is idempotent, so Stop works on a half-made, NotReady or
// already stopped sandbox. NotReady is on disk before anything is torn
// down, and the network's end as soon as DEL succeeded: a daemon killed
// in between never restores the pod Ready without its IP.
func (s *Server) stopPod(ctx context.Context, sb *sandbox.Sandbox) error {
	unlock := sb.Lock()
	defer unlock()
	return s.stopPodLocked(ctx, sb)
}

func (s *Server) stopPodLocked(ctx context.Context, sb *sandbox.Sandbox) error {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", sb.ID))
	wasReady := sb.Status().State == sandbox.StateReady
	if err := s.spare(ctx, func() error {
		return sb.UpdateStatus(func(st *sandbox.Status) { st.State = sandbox.StateNotReady })
	}); err != nil {
		return err
	}
	s.closePodStreams(sb.ID) // port-forwards into the pod end with it
	if err := s.stopPodContainers(ctx, sb); err != nil {
		return err
	}
	if err := s.teardownPodNetwork(ctx, sb); err != nil {
		return err
	}
	if err := s.deps.Namespaces.Remove(ctx, sb.ID); err != nil {
		return fmt.Errorf("removing pod namespaces: %w", err)
	}
	if err := s.deps.Shm.Unmount(sb.ShmPath); err != nil {
		return err
	}
	if wasReady {
		nriNotify(ctx, "StopPodSandbox", s.nri.StopPodSandbox(ctx, nriPod(&sb.Metadata)))
	}
	if !sb.Status().StoppedAt.IsZero() {
		return nil
	}
	return s.spare(ctx, func() error {
		return sb.UpdateStatus(func(st *sandbox.Status) { st.StoppedAt = time.Now() })
	})
}

// teardownPodNetwork runs CNI DEL once and records that it succeeded.
func (s *Server) teardownPodNetwork(ctx context.Context, sb *sandbox.Sandbox) error {
	if sb.Modes.Network != sandbox.ModePod || sb.Status().NetworkTornDown {
		return nil
	}
	pod := cniPod(&sb.Metadata)
	// After a reboot the pin is gone: DEL runs from the cached result
	// with no netns, as the CNI spec allows.
	if _, err := s.deps.Namespaces.Open(ctx, sb.ID, pinnedKinds(sb)); err != nil {
		pod.NetNS = ""
	}
	if err := s.deps.Network.Teardown(ctx, pod); err != nil {
		return fmt.Errorf("tearing down the pod network: %w", err)
	}
	return s.spare(ctx, func() error {
		return sb.UpdateStatus(func(st *sandbox.Status) { st.NetworkTornDown = true })
	})
}

// removePod stops a pod if needed and deletes everything it had. The
// removal is recorded first, so a start after a crash finishes it.
func (s *Server) removePod(ctx context.Context, sb *sandbox.Sandbox) error {
	// One lock for the stop and the removal: a CreateContainer waiting
	// for the pod then finds it gone, never half-removed.
	unlock := sb.Lock()
	defer unlock()
	if err := s.spare(ctx, func() error {
		return sandbox.MarkIntent(sb.Dir, sandbox.IntentRemoving, sb.Metadata)
	}); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := s.stopPodLocked(ctx, sb); err != nil {
		return err
	}
	if err := s.removePodContainers(ctx, sb); err != nil {
		return err
	}
	if err := errors.Join(os.RemoveAll(s.sandboxRunDir(sb.ID)), sandbox.RemoveDir(sb.Dir)); err != nil {
		return fmt.Errorf("removing sandbox directories: %w", err)
	}
	s.deps.IDs.Release(sb.ID)
	s.sandboxes.Delete(sb.ID)
	s.statsRemoved(sb.ID, s.podCgroup(sb))
	s.podResources.Delete(sb.ID)
	s.forgetOOM(sb.ID, "")
	s.podNames.Release(sandbox.NameKey(sb.Name, sb.Namespace, sb.UID, sb.Attempt), sb.ID)
	nriNotify(ctx, "RemovePodSandbox", s.nri.RemovePodSandbox(ctx, nriPod(&sb.Metadata)))
	s.reserve.fill(ctx)
	return nil
}

// podStopTimeout is the grace a pod's containers get when the pod itself
// is stopped: none, as in containerd. kubelet has already stopped them
// with the pod's grace period, so only stragglers are left, and a stop
// signal that PID 1 ignores would only hold the pod up.
const podStopTimeout = 0 * time.Second

// stopPodContainers stops every container of a pod, then its infra
// process, before its network and namespaces go away. A container that
// restore could not load or tear down is not listed, but may still run in
// the pod: its teardown is tried again, and while it fails the stop does
// too, so the pod keeps its network, pins and ID range.
func (s *Server) stopPodContainers(ctx context.Context, sb *sandbox.Sandbox) error {
	var errs []error
	for _, c := range s.podContainers(sb.ID) {
		if err := s.stopContainer(ctx, c, podStopTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	for _, md := range s.strayContainers()[sb.ID] {
		if err := s.teardownContainer(ctx, md); err != nil {
			errs = append(errs, fmt.Errorf("container %s, left over by a restart: %w", md.ID, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return s.stopInfra(ctx, &sb.Metadata)
}

// removePodContainers removes every container of a pod, its infra process,
// the pod's idmapped image tree and the cgroup parent pinrt made for it.
func (s *Server) removePodContainers(ctx context.Context, sb *sandbox.Sandbox) error {
	var errs []error
	for _, c := range s.podContainers(sb.ID) {
		if err := s.removeContainer(ctx, c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if sb.InfraID != "" {
		if err := s.removeInfra(ctx, &sb.Metadata); err != nil {
			return err
		}
	}
	if err := s.deps.Images.ReleasePod(ctx, sb.ID); err != nil {
		return fmt.Errorf("releasing the pod's image mounts: %w", err)
	}
	if err := s.deps.CgroupDriver.RemovePod(ctx, sb.CgroupParent, sb.ID); err != nil {
		return fmt.Errorf("removing the pod's cgroup: %w", err)
	}
	return nil
}
