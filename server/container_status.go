package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/sandbox"
)

// ContainerStatus reports a container's state from memory (see
// observeContainer): kubelet calls it for every container on every pod
// sync, and a runtime call per read cost 30 ms.
func (s *Server) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	s.observeContainer(ctx, c, true)
	resp := &runtimeapi.ContainerStatusResponse{Status: containerStatus(c)}
	resp.Status.Resources = s.resources.get(c.Dir)
	if req.Verbose {
		if resp.Info, err = containerInfo(c); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

// ListContainers lists containers matching the filter, from memory.
// kubelet's PLEG learns about exits from this call. The exit watcher
// records an exit within milliseconds of conmon writing it, so a relist
// takes the recorded states as they are (a stat of every exit file was
// most of a ListContainers of 220 containers); a container the watcher
// could not watch is looked at through its exit file.
func (s *Server) ListContainers(ctx context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f := req.GetFilter()
	list := s.containers.List()
	// The messages of a list are allocated together: at kubelet's 220
	// containers, one allocation each was a third of the call.
	items := make([]*runtimeapi.Container, 0, len(list))
	msgs := make([]runtimeapi.Container, len(list))
	metas := make([]runtimeapi.ContainerMetadata, len(list))
	specs := make([]runtimeapi.ImageSpec, len(list))
	for i, c := range list {
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
		if !s.watched(c) {
			s.observeContainer(ctx, c, false)
		}
		st := containerState(c.Status().State)
		if f.GetState() != nil && f.State.State != st {
			continue
		}
		m := &msgs[i]
		metas[i].Name, metas[i].Attempt = c.Name, c.Attempt
		specs[i].Image = c.Image
		m.Id, m.PodSandboxId, m.Metadata, m.Image = c.ID, c.SandboxID, &metas[i], &specs[i]
		m.ImageRef, m.ImageId, m.State, m.CreatedAt = c.ImageRef, c.ImageID, st, c.CreatedAt.UnixNano()
		m.Labels, m.Annotations = c.Labels, c.Annotations
		items = append(items, m)
	}
	return &runtimeapi.ListContainersResponse{Containers: items}, nil
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
		StopSignal: criSignal(c.StopSignal),
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
			MountOptions: m.MountOptions,
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

// containerInfo is the verbose ContainerStatus info: the pid, whether the
// container is privileged (CRI-O's key, which Falco reads) and the OCI
// spec the runtime was given. The spec goes out as config.json has it,
// compacted, rather than decoded and encoded again: that round trip (most
// of it the seccomp profile) was half of the garbage of a node's status
// reads, and its collections the tail of every other call. The file is
// read into a pooled buffer and the info encoded straight into its
// string, so that the spec's bytes are allocated once per call.
func containerInfo(c *sandbox.Container) (map[string]string, error) {
	bp := specBufs.Get().(*bytes.Buffer)
	defer specBufs.Put(bp)
	bp.Reset()
	spec := json.RawMessage("null")
	if f, err := os.Open(filepath.Join(c.Dir, "config.json")); err == nil {
		_, err := bp.ReadFrom(f)
		_ = f.Close()
		if err == nil && json.Valid(bp.Bytes()) {
			spec = bp.Bytes()
		}
	}
	st := c.Status()
	var sb strings.Builder
	sb.Grow(len(spec) + 512)
	// The keys in the order json.Marshal sorts a map's; Encode escapes as
	// Marshal does, and ends with a newline.
	if err := json.NewEncoder(&sb).Encode(struct {
		Pid            int                     `json:"pid"`
		Privileged     bool                    `json:"privileged"`
		Restored       bool                    `json:"restored,omitempty"`
		RuntimeHandler string                  `json:"runtimeHandler"`
		RuntimeSpec    json.RawMessage         `json:"runtimeSpec"`
		SandboxID      string                  `json:"sandboxID"`
		Status         sandbox.ContainerStatus `json:"status"`
	}{st.Pid, c.Privileged, c.Restored, c.Handler, spec, c.SandboxID, st}); err != nil {
		return nil, fmt.Errorf("encoding container info: %w", errdefs.ErrInternal)
	}
	return map[string]string{"info": strings.TrimSuffix(sb.String(), "\n")}, nil
}

// specBufs are the buffers containerInfo reads config.json into.
var specBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}
