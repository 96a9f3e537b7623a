package server

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Checkpoint and restore need CRIU driven through the OCI runtime
// (runc checkpoint/restore), an archive format for the container's
// rootfs diff and state, and, for pods, re-creating pinned namespaces
// from an archive. pinrt has none of these yet; the messages say so, so
// an operator sees what is missing rather than a bare Unimplemented.

// CheckpointContainer is not supported.
func (s *Server) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	return nil, fmt.Errorf("checkpointing container %s: pinrt has no CRIU integration (runc checkpoint) nor a checkpoint archive format: %w", req.ContainerId, errdefs.ErrNotImplemented)
}

// CheckpointPod is not supported.
func (s *Server) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	return nil, fmt.Errorf("checkpointing pod %s: pinrt has no CRIU integration and cannot archive pinned namespaces: %w", req.GetPodSandboxId(), errdefs.ErrNotImplemented)
}

// RestorePod is not supported.
func (s *Server) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	return nil, fmt.Errorf("restoring a pod from %q: pinrt has no CRIU integration and no checkpoint archive reader: %w", req.CheckpointPath, errdefs.ErrNotImplemented)
}
