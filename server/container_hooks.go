package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/containerd/log"

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
	if sb.CgroupParent == "" && s.cfg.Runtime.CgroupParent != "" {
		removeCgroupDirs(ctx, path.Join(s.cfg.Runtime.CgroupParent, sb.ID))
	}
	return nil
}

// cgroupRoot is where the cgroup hierarchies are mounted; a variable for
// tests.
var cgroupRoot = "/sys/fs/cgroup"

// removeCgroupDirs removes the pod's cgroup directory from every
// hierarchy. runc removes each container's own cgroup on delete but not
// the parent pinrt named for the pod. Failures only leave an empty
// directory behind, so they are logged.
func removeCgroupDirs(ctx context.Context, rel string) {
	dirs := []string{filepath.Join(cgroupRoot, rel)}
	entries, _ := os.ReadDir(cgroupRoot)
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name(), rel))
		}
	}
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).Debugf("removing pod cgroup %s", d)
		}
	}
}
