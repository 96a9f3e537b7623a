package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pinrt/pinrt/sandbox"
)

// podStopTimeout is the grace a pod's containers get when the pod itself
// is stopped: none, as in containerd. kubelet has already stopped them
// with the pod's grace period, so only stragglers are left, and a stop
// signal that PID 1 ignores would only hold the pod up.
const podStopTimeout = 0 * time.Second

// stopPodContainers stops every container of a pod, then its infra
// process, before its network and namespaces go away.
func (s *Server) stopPodContainers(ctx context.Context, sb *sandbox.Sandbox) error {
	var errs []error
	for _, c := range s.podContainers(sb.ID) {
		if err := s.stopContainer(ctx, c, podStopTimeout); err != nil {
			errs = append(errs, err)
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
