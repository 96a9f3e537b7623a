package streaming

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containernetworking/plugins/pkg/ns"
	cristreaming "k8s.io/cri-streaming/pkg/streaming"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/pinrt/pinrt/oci"
)

// runtime is the library's view of pinrt: it is called once the client's
// streams are set up.
type runtime struct{ s *Server }

var _ cristreaming.Runtime = (*runtime)(nil)

// withServer ends ctx when the server closes as well.
func (r *runtime) withServer(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.s.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Exec runs cmd in the container. A non-zero exit reaches the client as
// its exit code (the library writes a NonZeroExitCode status), not as a
// stream error.
func (r *runtime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	ctx, done := r.withServer(ctx)
	defer done()
	rt, err := r.s.targets.Container(ctx, containerID)
	if err != nil {
		return err
	}
	o := oci.ExecOptions{Cmd: cmd, Stdin: in, Tty: tty, Resize: convertResize(ctx, resize)}
	// The library hands over nil interfaces for streams the client did
	// not ask for.
	if out != nil {
		o.Stdout = out
	}
	if errw != nil {
		o.Stderr = errw
	}
	code, err := rt.ExecStream(ctx, containerID, o)
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

// Attach connects to the container's stdio through conmon.
func (r *runtime) Attach(ctx context.Context, containerID string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize) error {
	ctx, done := r.withServer(ctx)
	defer done()
	rt, err := r.s.targets.Container(ctx, containerID)
	if err != nil {
		return err
	}
	o := oci.AttachOptions{Stdin: in, Resize: convertResize(ctx, resize)}
	if out != nil {
		o.Stdout = out
	}
	if errw != nil {
		o.Stderr = errw
	}
	return rt.Attach(ctx, containerID, o)
}

// convertResize relays the library's resize events in oci's type until
// in closes or ctx ends.
func convertResize(ctx context.Context, in <-chan remotecommand.TerminalSize) <-chan oci.TerminalSize {
	if in == nil {
		return nil
	}
	out := make(chan oci.TerminalSize)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case sz, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- oci.TerminalSize{Width: sz.Width, Height: sz.Height}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// dialTimeout bounds connecting to the pod's port.
const dialTimeout = 10 * time.Second

// graces bounds how long a forward outlives one side's end.
type graces struct {
	// afterClient is how long the pod may keep sending after the client
	// ended its side. The client's end is passed on as a half-close, so a
	// request is still answered, but an application that ignores
	// half-closes would hold the forward, and the client waiting for it,
	// forever. CRI-O waits 1 s here and socat 0.5 s; containerd closes
	// both sides at once.
	afterClient time.Duration
	// afterPod is how long the client may keep sending after the pod
	// ended its side. kubectl ends a forward at the first end it reads
	// and closes its local connection, resetting it under a client still
	// sending: an HTTP client uploading a body the pod answered without
	// reading then loses the answer. So the pod's end is passed on only
	// when the client has ended too, or after this grace, as containerd
	// does.
	afterPod time.Duration
}

// forwardGraces are the graces of every forward.
var forwardGraces = graces{afterClient: 10 * time.Second, afterPod: time.Second}

// PortForward connects to port on the pod's loopback and copies both ways
// until both sides ended (one side's end bounds the other's by a grace,
// see graces), the pod stops or the server closes. An error (a
// closed port) goes to the client's error stream.
func (r *runtime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d: %w", port, errdefs.ErrInvalidArgument)
	}
	// Registered before the pod is looked up: see trackForward.
	ctx, done := r.s.trackForward(ctx, podSandboxID)
	defer done()
	netns, err := r.s.targets.PodNetNS(ctx, podSandboxID)
	if err != nil {
		return err
	}
	conn, err := dialPod(ctx, netns, int(port))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return pipe(ctx, conn, stream, forwardGraces)
}

// dialPod dials 127.0.0.1:port, then [::1]:port if that is refused, in
// netns ("" is the host's). The socket is created in the namespace the
// dialing thread is in; ns.WithNetNSPath locks the OS thread for that and
// never returns a thread it could not switch back to the pool.
func dialPod(ctx context.Context, netns string, port int) (net.Conn, error) {
	dial := func() (net.Conn, error) {
		d := net.Dialer{Timeout: dialTimeout}
		p := strconv.Itoa(port)
		conn, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", p))
		if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
			if c6, err6 := d.DialContext(ctx, "tcp6", net.JoinHostPort("::1", p)); err6 == nil {
				return c6, nil
			}
		}
		return conn, err
	}
	if netns == "" {
		return dial()
	}
	var conn net.Conn
	err := ns.WithNetNSPath(netns, func(ns.NetNS) error {
		var err error
		conn, err = dial()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to port %d in the pod: %w", port, err)
	}
	return conn, nil
}

// halfCloser is a stream whose write side can be closed on its own.
type halfCloser interface{ CloseWrite() error }

// resetter is an SPDY stream, which can be aborted in both directions.
type resetter interface{ Reset() error }

// pipe copies between the pod's connection and the client's stream. The
// client's end half-closes the connection, so a request is still
// answered; the forward ends when both sides ended, or when one side's
// grace after the other's end passed.
//
// A client stream is read to its end or reset, never left half-read: the
// server only half-closes it when the forward returns, and SPDY hands a
// stream's data to its reader one frame at a time, so a client still
// sending into a stream no one reads stalls every stream of its
// connection (each later forward of a kubectl port-forward).
func pipe(ctx context.Context, conn net.Conn, stream io.ReadWriteCloser, g graces) error {
	reset := func() {
		if r, ok := stream.(resetter); ok {
			_ = r.Reset()
		}
	}
	stop := context.AfterFunc(ctx, func() {
		_ = conn.Close()
		reset()
	})
	defer stop()
	// clientEnd gets true when the client's stream was read to its end,
	// false when the copy stopped first, at a pod that no longer reads.
	clientEnd := make(chan bool, 1)
	go func() {
		_, err := io.Copy(conn, stream)
		if err == nil {
			if hc, ok := conn.(halfCloser); ok {
				_ = hc.CloseWrite()
			}
		}
		clientEnd <- err == nil
	}()
	podDone := make(chan error, 1)
	go func() {
		_, err := io.Copy(stream, conn)
		podDone <- err
	}()

	var err error
	streamRead := false
	select {
	case err = <-podDone:
		t := time.NewTimer(g.afterPod)
		defer t.Stop()
		select {
		case streamRead = <-clientEnd:
		case <-t.C:
		case <-ctx.Done():
		}
	case streamRead = <-clientEnd:
		t := time.NewTimer(g.afterClient)
		defer t.Stop()
		select {
		case err = <-podDone:
		case <-ctx.Done():
		case <-t.C:
			// Not waiting for the copy: closing the connection ends a
			// read from the pod, but not a write to a stuck client.
			_ = conn.Close()
		}
	}
	if !streamRead {
		_ = conn.Close()
		reset()
	}
	if ctx.Err() != nil {
		return fmt.Errorf("port-forward closed: %w", context.Cause(ctx))
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
