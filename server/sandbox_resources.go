package server

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// UpdatePodSandboxResources applies the pod's new CPU and memory limits
// to the pod cgroup when pinrt owns it, and records the resources (shown
// in the verbose PodSandboxStatus) once applied. When kubelet named a
// cgroup parent, the pod cgroup is kubelet's, and kubelet has resized it
// before this call. NRI plugins are told before (a refusal fails the
// update, changing nothing) and after.
func (s *Server) UpdatePodSandboxResources(ctx context.Context, req *runtimeapi.UpdatePodSandboxResourcesRequest) (*runtimeapi.UpdatePodSandboxResourcesResponse, error) {
	if err := validResources(req.GetResources()); err != nil {
		return nil, err
	}
	if err := validOverhead(req.GetOverhead()); err != nil {
		return nil, err
	}
	// Under the pod's lock: a RemovePodSandbox forgets the record, and
	// one made after it would stay for good.
	sb, unlock, err := s.lockPod(req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	defer unlock()
	pod := nriPod(&sb.Metadata)
	if err := s.nri.UpdatePodSandbox(ctx, pod, nriResources(toResources(req.GetOverhead())), nriResources(toResources(req.GetResources()))); err != nil {
		return nil, fmt.Errorf("pod %s: %w", sb.ID, err)
	}
	if err := s.applyPodResources(ctx, sb, req.GetResources()); err != nil {
		return nil, err
	}
	s.podResources.Store(sb.ID, req)
	nriNotify(ctx, "PostUpdatePodSandbox", s.nri.PostUpdatePodSandbox(ctx, pod))
	log.G(ctx).WithFields(log.Fields{"pod": sb.Namespace + "/" + sb.Name, "id": shortID(sb.ID)}).Info("pod resources updated")
	return &runtimeapi.UpdatePodSandboxResourcesResponse{}, nil
}

func (s *Server) applyPodResources(ctx context.Context, sb *sandbox.Sandbox, r *runtimeapi.LinuxContainerResources) error {
	if sb.CgroupParent != "" || r == nil {
		return nil
	}
	// The same conversion as container limits, so controllers the host
	// lacks are dropped the same way.
	host := oci.ProbeHost()
	spec, err := oci.GenerateSpec(ctx, oci.WithResources(toResources(r), &host))
	if err != nil {
		return err
	}
	res := spec.Linux.Resources
	if res == nil || (res.CPU == nil && res.Memory == nil) {
		return nil
	}
	err = s.deps.Cgroups.Update(s.podCgroup(sb), res)
	if errdefs.IsNotFound(err) {
		// No container has run yet, so runc has not made the pod cgroup.
		return nil
	}
	if err != nil {
		return fmt.Errorf("applying resources to pod %s: %w", sb.ID, err)
	}
	return nil
}

// validOverhead checks a pod's overhead, which is told to NRI plugins and
// shown, never written to a cgroup by itself: a RuntimeClass's overhead
// may be under a container's minimums (a memory overhead of 1 MiB), but
// no amount is negative.
func validOverhead(r *runtimeapi.LinuxContainerResources) error {
	if r == nil {
		return nil
	}
	for _, v := range []struct {
		name string
		n    int64
	}{{"cpu_period", r.CpuPeriod}, {"cpu_shares", r.CpuShares}, {"memory_limit_in_bytes", r.MemoryLimitInBytes}} {
		if v.n < 0 {
			return invalid("pod overhead: %s %d is negative", v.name, v.n)
		}
	}
	if r.CpuQuota < -1 {
		return invalid("pod overhead: cpu_quota %d is below -1", r.CpuQuota)
	}
	return nil
}
