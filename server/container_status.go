package server

import (
	"context"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// ContainerRuntime is one OCI runtime handler (package oci, *oci.Runtime).
type ContainerRuntime interface {
	Create(ctx context.Context, o oci.CreateOptions) (int, error)
	Start(ctx context.Context, id string) error
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Stop(ctx context.Context, id string, sig syscall.Signal, timeout time.Duration) error
	Delete(ctx context.Context, id string, force bool) error
	State(ctx context.Context, id string) (*oci.State, error)
	ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error)
	Update(ctx context.Context, id string, res *specs.LinuxResources) error
	ReopenLog(ctx context.Context, id string) error
	Features(ctx context.Context) (*oci.Features, error)
	CheckIDMap(ctx context.Context) error
	// Probe fails when the runtime cannot run the containers pinrt makes.
	Probe(ctx context.Context) error
}

var _ ContainerRuntime = (*oci.Runtime)(nil)

// CreateContainer creates a container in a Ready pod; it does not start it.
func (s *Server) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	// Labels and annotations come back in every ListContainers response.
	if err := validate.LabelsAndAnnotations("container", req.GetConfig().GetLabels(), req.GetConfig().GetAnnotations()); err != nil {
		return nil, err
	}
	c, err := s.createContainer(ctx, req.PodSandboxId, req.GetConfig())
	if err != nil {
		return nil, err
	}
	s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)
	return &runtimeapi.CreateContainerResponse{ContainerId: c.ID}, nil
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
	s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)
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
	if err := s.stopContainer(ctx, c, time.Duration(req.Timeout)*time.Second); err != nil {
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

// ContainerStatus reports a container's state, refreshed from the runtime.
func (s *Server) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	s.refreshContainer(ctx, c, false)
	resp := &runtimeapi.ContainerStatusResponse{Status: containerStatus(c)}
	resp.Status.Resources = containerResources(c.Dir)
	if req.Verbose {
		if resp.Info, err = containerInfo(c); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// ListContainers lists containers matching the filter. kubelet's PLEG
// learns about exits from this call, so states are refreshed first.
func (s *Server) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := req.GetFilter()
	var items []*runtimeapi.Container
	for _, c := range s.containers.List() {
		if f != nil {
			if f.Id != "" && !strings.HasPrefix(c.ID, f.Id) {
				continue
			}
			if f.PodSandboxId != "" && !strings.HasPrefix(c.SandboxID, f.PodSandboxId) {
				continue
			}
			if !labelsMatch(c.Labels, f.LabelSelector) {
				continue
			}
		}
		s.refreshContainer(ctx, c, true)
		st := containerState(c.Status().State)
		if f.GetState() != nil && f.State.State != st {
			continue
		}
		items = append(items, &runtimeapi.Container{
			Id: c.ID, PodSandboxId: c.SandboxID, Metadata: containerMetadata(c),
			Image: &runtimeapi.ImageSpec{Image: c.Image}, ImageRef: c.ImageRef, ImageId: c.ImageID,
			State: st, CreatedAt: c.CreatedAt.UnixNano(), Labels: c.Labels, Annotations: c.Annotations,
		})
	}
	return &runtimeapi.ListContainersResponse{Containers: items}, nil
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

// ExecSync runs a command in a running container and returns its output.
func (s *Server) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	stdout, stderr, code, err := s.execSync(ctx, c, req.Cmd, time.Duration(req.Timeout)*time.Second)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ExecSyncResponse{Stdout: stdout, Stderr: stderr, ExitCode: code}, nil
}

func containerState(st sandbox.ContainerState) runtimeapi.ContainerState {
	switch st {
	case sandbox.ContainerCreated:
		return runtimeapi.ContainerState_CONTAINER_CREATED
	case sandbox.ContainerRunning:
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	case sandbox.ContainerExited:
		return runtimeapi.ContainerState_CONTAINER_EXITED
	}
	return runtimeapi.ContainerState_CONTAINER_UNKNOWN
}

func containerMetadata(c *sandbox.Container) *runtimeapi.ContainerMetadata {
	return &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: c.Attempt}
}

func containerStatus(c *sandbox.Container) *runtimeapi.ContainerStatus {
	st := c.Status()
	out := &runtimeapi.ContainerStatus{
		Id: c.ID, Metadata: containerMetadata(c), State: containerState(st.State),
		CreatedAt: c.CreatedAt.UnixNano(), ExitCode: st.ExitCode, Reason: st.Reason, Message: st.Message,
		Image: &runtimeapi.ImageSpec{Image: c.Image}, ImageRef: c.ImageRef, ImageId: c.ImageID,
		Labels: c.Labels, Annotations: c.Annotations, LogPath: c.LogPath,
		User: &runtimeapi.ContainerUser{Linux: &runtimeapi.LinuxContainerUser{
			Uid: int64(c.User.UID), Gid: int64(c.User.GID),
		}},
	}
	for _, g := range c.User.SupplementalGroups {
		out.User.Linux.SupplementalGroups = append(out.User.Linux.SupplementalGroups, int64(g))
	}
	if !st.StartedAt.IsZero() {
		out.StartedAt = st.StartedAt.UnixNano()
	}
	if !st.FinishedAt.IsZero() {
		out.FinishedAt = st.FinishedAt.UnixNano()
	}
	for _, m := range c.Mounts {
		cm := &runtimeapi.Mount{
			ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.Readonly,
			RecursiveReadOnly: m.RecursiveReadOnly, Propagation: runtimeapi.MountPropagation(m.Propagation),
		}
		if m.Image != "" {
			cm.Image = &runtimeapi.ImageSpec{Image: m.Image, ImageRef: m.ImageRef}
			cm.ImageSubPath = m.ImageSubPath
		}
		for _, u := range m.UIDMappings {
			cm.UidMappings = append(cm.UidMappings, &runtimeapi.IDMapping{HostId: u.HostID, ContainerId: u.ContainerID, Length: u.Size})
		}
		for _, g := range m.GIDMappings {
			cm.GidMappings = append(cm.GidMappings, &runtimeapi.IDMapping{HostId: g.HostID, ContainerId: g.ContainerID, Length: g.Size})
		}
		out.Mounts = append(out.Mounts, cm)
	}
	return out
}
