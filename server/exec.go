package server

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/sandbox"
	"github.com/pinrt/pinrt/streaming"
)

// This file holds ExecSync and the streaming entry points: Exec, Attach
// and PortForward only check their target and return a URL of the
// streaming server; the work happens when the client connects to it.

// Streams serves exec, attach and port-forward sessions (package
// streaming).
type Streams interface {
	GetExec(*runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error)
	GetAttach(*runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error)
	GetPortForward(*runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error)
	// ClosePod ends the pod's port-forwards.
	ClosePod(id string)
}

var _ Streams = (*streaming.Server)(nil)

// SetStreams installs the streaming server. The daemon builds it after
// the Server, because it resolves its targets through StreamTargets; it is
// set before the CRI socket opens.
func (s *Server) SetStreams(st Streams) { s.streams = st }

// StreamTargets resolves the streaming server's requests on the stores.
func (s *Server) StreamTargets() streaming.Targets { return streamTargets{s} }

// Exec returns the URL of an exec session in a running container.
func (s *Server) Exec(ctx context.Context, req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	if err := validCommand(req.Cmd); err != nil {
		return nil, err
	}
	id, _, err := s.streamTarget(ctx, req.ContainerId)
	if err != nil {
		return nil, err
	}
	st, err := s.streamServer()
	if err != nil {
		return nil, err
	}
	req.ContainerId = id // see streamTarget
	return st.GetExec(req)
}

// validCommand refuses an exec that cannot start: no command, or a NUL
// in it, which the kernel refuses in an argument.
func validCommand(cmd []string) error {
	if len(cmd) == 0 {
		return invalid("exec: empty command")
	}
	return validate.NoNUL("exec command", cmd...)
}

// Attach returns the URL of an attach session to a running container.
func (s *Server) Attach(ctx context.Context, req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	id, _, err := s.streamTarget(ctx, req.ContainerId)
	if err != nil {
		return nil, err
	}
	st, err := s.streamServer()
	if err != nil {
		return nil, err
	}
	req.ContainerId = id // see streamTarget
	return st.GetAttach(req)
}

// PortForward returns the URL of a port-forward session into a Ready pod.
func (s *Server) PortForward(ctx context.Context, req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	for _, p := range req.Port {
		if p < 1 || p > 65535 {
			return nil, invalid("port-forward port %d is not a port", p)
		}
	}
	id, _, err := s.podNetNS(req.PodSandboxId)
	if err != nil {
		return nil, err
	}
	st, err := s.streamServer()
	if err != nil {
		return nil, err
	}
	req.PodSandboxId = id // see streamTarget
	return st.GetPortForward(req)
}

func (s *Server) streamServer() (Streams, error) {
	if s.streams == nil {
		return nil, fmt.Errorf("the streaming server is not running: %w", errdefs.ErrNotImplemented)
	}
	return s.streams, nil
}

// closePodStreams ends a stopping pod's port-forwards.
func (s *Server) closePodStreams(id string) {
	if s.streams != nil {
		s.streams.ClosePod(id)
	}
}

// streamTarget returns the full ID and the runtime of a running
// container. Exec and Attach hand the streaming server the full ID, not
// the prefix the request may give: it looks the container up again when
// the client connects, and a prefix could name another container by then.
func (s *Server) streamTarget(ctx context.Context, id string) (string, streaming.ContainerRuntime, error) {
	c, err := s.containers.Get(id)
	if err != nil {
		return "", nil, err
	}
	s.observeContainer(ctx, c, true)
	if st := c.Status().State; st != sandbox.ContainerRunning {
		return "", nil, fmt.Errorf("container %s is %s, not running: %w", c.ID, st, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return "", nil, err
	}
	sr, ok := rt.(streaming.ContainerRuntime)
	if !ok {
		return "", nil, fmt.Errorf("runtime handler %q cannot stream: %w", c.Handler, errdefs.ErrNotImplemented)
	}
	return c.ID, sr, nil
}

// podNetNS returns the full ID and the pinned netns of a Ready pod, ""
// on the host network. PortForward hands on the full ID (see
// streamTarget), which closePodStreams finds its forwards by.
func (s *Server) podNetNS(id string) (string, string, error) {
	sb, err := s.sandboxes.Get(id)
	if err != nil {
		return "", "", err
	}
	if st := sb.Status().State; st != sandbox.StateReady {
		return "", "", fmt.Errorf("pod %s is not ready: %w", id, errdefs.ErrFailedPrecondition)
	}
	if sb.Modes.Network == sandbox.ModeNode {
		return sb.ID, "", nil
	}
	p := sb.Pins["net"]
	if p == "" {
		return "", "", fmt.Errorf("pod %s has no pinned network namespace: %w", id, errdefs.ErrFailedPrecondition)
	}
	return sb.ID, p, nil
}

type streamTargets struct{ s *Server }

func (t streamTargets) Container(ctx context.Context, id string) (streaming.ContainerRuntime, error) {
	_, rt, err := t.s.streamTarget(ctx, id)
	return rt, err
}

func (t streamTargets) PodNetNS(_ context.Context, id string) (string, error) {
	_, p, err := t.s.podNetNS(id)
	return p, err
}

// ExecSync runs a command in a running container and returns its output.
func (s *Server) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	stdout, stderr, code, err := s.execSync(ctx, c, req.Cmd, timeoutSeconds(req.Timeout))
	if err != nil {
		return nil, withPartialOutput(err, stdout, stderr)
	}
	stdout, stderr = fitExecReply(stdout, stderr)
	return &runtimeapi.ExecSyncResponse{Stdout: stdout, Stderr: stderr, ExitCode: code}, nil
}

// maxExecReply bounds the output of one ExecSync reply: kubelet and
// crictl take messages of up to 16 MiB, and the runtime keeps up to
// 16 MiB of each stream. A larger reply failed whole (ResourceExhausted),
// exit code and all.
const maxExecReply = 16<<20 - 64<<10

// fitExecReply cuts stdout and stderr to maxExecReply together, each
// keeping its beginning; a stream under half of it stays whole.
func fitExecReply(stdout, stderr []byte) ([]byte, []byte) {
	if len(stdout)+len(stderr) <= maxExecReply {
		return stdout, stderr
	}
	half := maxExecReply / 2
	switch {
	case len(stderr) <= half:
		return stdout[:maxExecReply-len(stderr)], stderr
	case len(stdout) <= half:
		return stdout, stderr[:maxExecReply-len(stdout)]
	}
	return stdout[:half], stderr[:half]
}

// partialOutputMax bounds each stream's share of a failed exec's error.
// The message travels in the gRPC trailer, which clients cap (kubelet
// at its 16 MiB message limit, others far lower).
const partialOutputMax = 2048

// withPartialOutput puts what a timed-out command wrote into its error.
// kubelet tells a probe that timed out from one that failed only by the
// DeadlineExceeded code, so the answer must stay an error; the output is
// all the operator has to see where the command hung.
func withPartialOutput(err error, stdout, stderr []byte) error {
	if len(stdout) == 0 && len(stderr) == 0 {
		return err
	}
	tail := func(b []byte) []byte {
		if len(b) > partialOutputMax {
			return b[len(b)-partialOutputMax:]
		}
		return b
	}
	return fmt.Errorf("%w; output before the timeout: stdout %q, stderr %q", err, tail(stdout), tail(stderr))
}

func (s *Server) execSync(ctx context.Context, c *sandbox.Container, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error) {
	if err := validCommand(cmd); err != nil {
		return nil, nil, -1, err
	}
	s.observeContainer(ctx, c, true)
	if st := c.Status().State; st != sandbox.ContainerRunning {
		return nil, nil, -1, fmt.Errorf("container %s is %s, not running: %w", c.ID, st, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return nil, nil, -1, err
	}
	return rt.ExecSync(ctx, c.ID, cmd, timeout)
}
