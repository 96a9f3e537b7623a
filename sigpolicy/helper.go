package sigpolicy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
)

// What is read of the helper's output is capped: an answer is a digest
// or one error message, and of stderr only the end, which says why it
// failed, is kept.
const (
	maxResponse = 1 << 20
	stderrTail  = 4 << 10
	// waitDelay bounds the wait for the helper's pipes once it has exited
	// or been killed: a process it started that still holds them must
	// not hold the pull.
	waitDelay = 2 * time.Second
)

// kindClasses are the errdefs classes of a HelperError's kinds (except
// KindRejected, which becomes a *RejectedError).
var kindClasses = map[string]error{
	KindInvalid:            errdefs.ErrInvalidArgument,
	KindFailedPrecondition: errdefs.ErrFailedPrecondition,
	KindUnavailable:        errdefs.ErrUnavailable,
	KindNotFound:           errdefs.ErrNotFound,
	KindDataLoss:           errdefs.ErrDataLoss,
	KindUnauthenticated:    errdefs.ErrUnauthenticated,
	KindPermissionDenied:   errdefs.ErrPermissionDenied,
	KindResourceExhausted:  errdefs.ErrResourceExhausted,
}

// run executes the helper for req and returns its answer. A HelperError
// comes back wrapped with its kind's class (a rejection bare, for Verify
// to dress).
//
// A helper that exits non-zero, dies of a signal or answers anything but
// one HelperResponse is ErrInternal, with the end of its stderr: it is
// pinrt's own part that broke (a crash, a bug, a pinrt-sigpolicy of
// another release), not the registry nor the policy, and Unavailable
// would send the operator looking at the network. A helper that cannot
// be started at all is FailedPrecondition: the node's installation is
// broken. The context ending is the context's own error (Canceled or
// DeadlineExceeded), as for any other step of a pull.
func (v *Verifier) run(ctx context.Context, req *HelperRequest) (*HelperResponse, error) {
	req.Version = ProtocolVersion
	if dl, ok := ctx.Deadline(); ok {
		req.Deadline = dl
	}
	in, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	stdout, stderr := &cappedBuffer{max: maxResponse}, &tailBuffer{max: stderrTail}
	cmd := exec.CommandContext(ctx, v.cfg.Helper)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), stdout, stderr
	// A group of its own, killed whole: the helper may have started a
	// credential helper named by the auth file.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = waitDelay
	what := req.Op
	if req.Ref != "" {
		what += " " + req.Ref
	}

	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("signature helper %s (%s) stopped: %w", v.cfg.Helper, what, ctx.Err())
		case !errors.As(err, &exitErr) && !errors.Is(err, exec.ErrWaitDelay):
			return nil, fmt.Errorf("running signature helper %s: %w: %w", v.cfg.Helper, err, errdefs.ErrFailedPrecondition)
		}
		return nil, v.broken(what, err.Error(), stderr)
	}
	if stdout.overflow {
		return nil, v.broken(what, fmt.Sprintf("answered more than %d bytes", maxResponse), stderr)
	}
	var resp HelperResponse
	if err := json.Unmarshal(stdout.buf.Bytes(), &resp); err != nil {
		return nil, v.broken(what, fmt.Sprintf("answered %q, not a response: %v", clip(stdout.buf.String(), 200), err), stderr)
	}
	if e := resp.Error; e != nil {
		if e.Kind == KindRejected && req.Op == OpVerify {
			return nil, e
		}
		class, ok := kindClasses[e.Kind]
		if !ok {
			return nil, v.broken(what, fmt.Sprintf("answered an error of unknown kind %q: %s", e.Kind, e.Message), stderr)
		}
		return nil, fmt.Errorf("%w: %w", e, class)
	}
	if req.Op == OpVerify && resp.Digest == "" {
		return nil, v.broken(what, "accepted without a digest", stderr)
	}
	return &resp, nil
}

// broken is the error of a helper that failed to answer.
func (v *Verifier) broken(what, why string, stderr *tailBuffer) error {
	return fmt.Errorf("signature helper %s (%s) failed: %s; its stderr ends with %q: %w",
		v.cfg.Helper, what, why, stderr.String(), errdefs.ErrInternal)
}

// clip shortens s to n bytes for a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// cappedBuffer keeps the first max bytes written to it and notes that
// there were more. It never fails a write: the helper is drained, not
// blocked on a full pipe.
type cappedBuffer struct {
	buf      bytes.Buffer
	max      int
	overflow bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.overflow = true
		b.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return b.buf.Write(p)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	b         []byte
	max       int
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.truncated = t.truncated || len(t.b) > 0 || len(p) > t.max
		t.b = append(t.b[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.truncated = true
		t.b = t.b[:copy(t.b, t.b[over:])]
	}
	return n, nil
}

func (t *tailBuffer) String() string {
	s := strings.TrimSpace(string(t.b))
	if t.truncated {
		return "..." + s
	}
	return s
}
