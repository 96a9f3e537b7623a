package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nilUnwrap is a foreign error whose Unwrap has nothing to give.
type nilUnwrap struct{}

func (nilUnwrap) Error() string { return "nil unwrap" }
func (nilUnwrap) Unwrap() error { return nil }

// nilUnwrapMulti is a joined error holding a nil member.
type nilUnwrapMulti struct{}

func (nilUnwrapMulti) Error() string   { return "nil members" }
func (nilUnwrapMulti) Unwrap() []error { return []error{nil} }

// panicMessage is an error whose Error method panics, like a typed-nil
// pointer error with a value receiver would.
type panicMessage struct{ p *string }

func (e panicMessage) Error() string { return *e.p }

// withClassShape is how image.Pull classifies an error: the class first,
// then the cause.
type withClassShape struct{ class, err error }

func (e *withClassShape) Error() string   { return e.err.Error() + ": " + e.class.Error() }
func (e *withClassShape) Unwrap() []error { return []error{e.class, e.err} }

// resolverError is what Go's resolver returns for "bad..host": a
// DNSError without an UnwrapErr, inside a *net.OpError and a *url.Error.
func resolverError() error {
	dns := &net.DNSError{Err: "no such host", Name: "bad..host", IsNotFound: true}
	op := &net.OpError{Op: "dial", Net: "tcp", Err: dns}
	return &url.Error{Op: "Get", URL: "https://bad..host/v2/", Err: op}
}

func TestMapErrorForeignShapes(t *testing.T) {
	var typedNilDNS *net.DNSError
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"dns not found bare", &net.DNSError{Err: "no such host", Name: "bad..host", IsNotFound: true}, codes.NotFound},
		{"dns timeout", &net.DNSError{Err: "i/o timeout", Name: "h", IsTimeout: true}, codes.Unavailable},
		{"dns temporary", &net.DNSError{Err: "server misbehaving", Name: "h", IsTemporary: true}, codes.Unavailable},
		{"op error refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, codes.Unavailable},
		{"op error nil err", &net.OpError{Op: "dial", Net: "tcp"}, codes.Unavailable},
		{"url error around resolver", resolverError(), codes.NotFound},
		{"url error nil err", &url.Error{Op: "Get", URL: "https://x/"}, codes.Unavailable},
		{"transport error empty", &transport.Error{}, codes.Unknown},
		{"transport error nil errors 404", &transport.Error{StatusCode: 404}, codes.NotFound},
		{"transport error 401", &transport.Error{StatusCode: 401}, codes.Unauthenticated},
		{"transport error 403", &transport.Error{StatusCode: 403}, codes.PermissionDenied},
		{"transport error 429", &transport.Error{StatusCode: 429}, codes.ResourceExhausted},
		{"transport error 503", &transport.Error{StatusCode: 503}, codes.Unavailable},
		{"transport error diagnostics", &transport.Error{StatusCode: 404, Errors: []transport.Diagnostic{{Code: transport.ManifestUnknownErrorCode}}}, codes.NotFound},
		{"classified resolver error", fmt.Errorf("pull bad..host/x:1: %w", &withClassShape{errdefs.ErrUnavailable, resolverError()}), codes.Unavailable},
		{"classified dns error", &withClassShape{errdefs.ErrNotFound, &net.DNSError{Err: "no such host", Name: "bad..host"}}, codes.NotFound},
		{"join with nil members", errors.Join(nil, errdefs.ErrNotFound, nil), codes.NotFound},
		{"join of nothing but a class", fmt.Errorf("x: %w", errors.Join(errdefs.ErrInvalidArgument)), codes.InvalidArgument},
		{"multi wrap with nil unwrap", fmt.Errorf("a: %w: %w", errdefs.ErrInvalidArgument, nilUnwrap{}), codes.InvalidArgument},
		{"multi wrap nil unwrap first", fmt.Errorf("a: %w: %w", nilUnwrap{}, errdefs.ErrNotFound), codes.NotFound},
		{"nil unwrap alone", nilUnwrap{}, codes.Unknown},
		{"nil members alone", nilUnwrapMulti{}, codes.Unknown},
		{"nil members after class", fmt.Errorf("%w: %w", errdefs.ErrUnavailable, nilUnwrapMulti{}), codes.Unavailable},
		{"typed nil dns error", fmt.Errorf("%w: %w", errdefs.ErrUnavailable, typedNilDNS), codes.Unavailable},
		{"panicking message", panicMessage{}, codes.Internal},
		{"panicking message with a class", fmt.Errorf("%w: %w", errdefs.ErrNotFound, panicMessage{}), codes.NotFound},
		{"deadline inside url error", &url.Error{Op: "Get", URL: "u", Err: context.DeadlineExceeded}, codes.DeadlineExceeded},
		{"status kept", fmt.Errorf("nested: %w", status.Error(codes.Aborted, "x")), codes.Aborted},
		{"disk full", fmt.Errorf("writing the layer: %w", &os.PathError{Op: "write", Path: "/var/lib/pinrt/x", Err: syscall.ENOSPC}), codes.ResourceExhausted},
		{"disk full in a classed error", fmt.Errorf("%w: %w", errdefs.ErrUnknown, os.NewSyscallError("fallocate", syscall.ENOSPC)), codes.ResourceExhausted},
		{"quota", &withClassShape{errdefs.ErrFailedPrecondition, &os.PathError{Op: "mkdir", Path: "/x", Err: syscall.EDQUOT}}, codes.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := finish(context.Background(), "/test/M", time.Now(), tc.err)
			st, ok := status.FromError(got)
			if !ok {
				t.Fatalf("finish(%T) = %v, not a status", tc.err, got)
			}
			if st.Code() != tc.want {
				t.Errorf("code = %v, want %v (message %q)", st.Code(), tc.want, st.Message())
			}
		})
	}
}

// Before the fix, the interceptor's deferred mapping ran after recover
// and errgrpc.ToGRPC dereferenced the nil a DNSError unwraps to: the
// daemon died with SIGSEGV on PullImage of "bad..host/x:1".
func TestInterceptorsSurviveHostileErrors(t *testing.T) {
	errs := []error{
		&withClassShape{errdefs.ErrUnavailable, resolverError()},
		fmt.Errorf("a: %w: %w", errdefs.ErrInvalidArgument, nilUnwrap{}),
		panicMessage{},
	}
	for i, e := range errs {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			_, err := UnaryInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/u"},
				func(context.Context, any) (any, error) { return nil, e })
			if _, ok := status.FromError(err); !ok || status.Code(err) == codes.OK {
				t.Errorf("unary: %v, want a status error", err)
			}
			err = StreamInterceptor(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/s"},
				func(any, grpc.ServerStream) error { return e })
			if _, ok := status.FromError(err); !ok || status.Code(err) == codes.OK {
				t.Errorf("stream: %v, want a status error", err)
			}
		})
	}
}

func FuzzMapError(f *testing.F) {
	f.Add("no such host", "bad..host", uint8(0), 404, true)
	f.Add("", "", uint8(1), 0, false)
	f.Add("x", "../../etc/passwd", uint8(2), 500, true)
	f.Add("y", "UPPER/case:1", uint8(3), 401, false)
	f.Add("z", "", uint8(4), 429, true)
	classes := []error{nil, errdefs.ErrNotFound, errdefs.ErrInvalidArgument, errdefs.ErrUnavailable, context.Canceled}
	// Every failure is logged; at fuzzing rates that would be the bottleneck.
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(quiet))
	f.Fuzz(func(t *testing.T, msg, host string, shape uint8, code int, nilInner bool) {
		var inner error = &net.DNSError{Err: msg, Name: host, IsNotFound: nilInner}
		if nilInner {
			inner = nilUnwrap{}
		}
		var err error
		switch shape % 6 {
		case 0:
			err = &url.Error{Op: "Get", URL: host, Err: &net.OpError{Op: "dial", Err: inner}}
		case 1:
			err = &transport.Error{StatusCode: code, Errors: []transport.Diagnostic{{Message: msg}}}
		case 2:
			err = errors.Join(nil, inner, nil)
		case 3:
			err = nilUnwrapMulti{}
		case 4:
			err = &transport.Error{StatusCode: code}
		default:
			err = inner
		}
		if c := classes[int(shape/6)%len(classes)]; c != nil {
			err = &withClassShape{c, err}
		}
		got := finish(ctx, "/fuzz", time.Now(), fmt.Errorf("%s: %w", msg, err))
		if _, ok := status.FromError(got); !ok {
			t.Fatalf("finish gave %v, not a status", got)
		}
	})
}

// panicHook makes every log call panic, standing in for any failure
// while the interceptor reports an error.
type panicHook struct{}

func (panicHook) Levels() []logrus.Level   { return logrus.AllLevels }
func (panicHook) Fire(*logrus.Entry) error { panic("log hook exploded") }

// Logging the failure runs under the same protection as mapping it: a
// panic there becomes Internal, not a dead daemon.
func TestFinishSurvivesPanickingLogger(t *testing.T) {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.TraceLevel)
	l.AddHook(panicHook{})
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(l))
	err := finish(ctx, "/m", time.Now(), fmt.Errorf("x: %w", errdefs.ErrUnavailable))
	if status.Code(err) != codes.Internal {
		t.Fatalf("finish with a panicking logger = %v, want Internal", err)
	}
}

// A handler that panics while the logger panics too still answers.
func TestInterceptorSurvivesPanicWithPanickingLogger(t *testing.T) {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.TraceLevel)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(l))
	// Added after the request log line, which is not an error path.
	_, err := UnaryInterceptor(ctx, nil, &grpc.UnaryServerInfo{FullMethod: "/u"}, func(context.Context, any) (any, error) {
		l.AddHook(panicHook{})
		panic("handler exploded")
	})
	if status.Code(err) != codes.Internal {
		t.Fatalf("unary = %v, want Internal", err)
	}
}
