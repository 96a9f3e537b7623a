package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni/cnitest"
	"github.com/pinrt/pinrt/conf"
)

func TestUnaryInterceptorMapsErrdefs(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"invalid argument", errdefs.ErrInvalidArgument, codes.InvalidArgument},
		{"not found", errdefs.ErrNotFound, codes.NotFound},
		{"already exists", errdefs.ErrAlreadyExists, codes.AlreadyExists},
		{"failed precondition", errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
		{"conflict", errdefs.ErrConflict, codes.FailedPrecondition},
		{"resource exhausted", errdefs.ErrResourceExhausted, codes.ResourceExhausted},
		{"unavailable", errdefs.ErrUnavailable, codes.Unavailable},
		{"not implemented", errdefs.ErrNotImplemented, codes.Unimplemented},
		{"permission denied", errdefs.ErrPermissionDenied, codes.PermissionDenied},
		{"internal", errdefs.ErrInternal, codes.Internal},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"plain error", errors.New("boom"), codes.Unknown},
		{"existing status kept", status.Error(codes.Aborted, "x"), codes.Aborted},
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/test/Method"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wrapped := fmt.Errorf("doing a thing for pod %q: %w", "p1", tc.err)
			_, err := UnaryInterceptor(context.Background(), nil, info, func(context.Context, any) (any, error) {
				return nil, wrapped
			})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code = %v, want %v (err %v)", got, tc.want, err)
			}
			if tc.want != codes.Aborted && status.Convert(err).Message() != wrapped.Error() {
				t.Errorf("message = %q, want the wrapped error's context %q", status.Convert(err).Message(), wrapped.Error())
			}
		})
	}
}

func TestUnaryInterceptorNilError(t *testing.T) {
	resp, err := UnaryInterceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x"},
		func(context.Context, any) (any, error) { return "ok", nil })
	if err != nil || resp != "ok" {
		t.Fatalf("got (%v, %v), want (ok, nil)", resp, err)
	}
}

type panickingNetwork struct{ *cnitest.Fake }

func (panickingNetwork) Status() error { panic("network plugin exploded") }

// A panic in one handler becomes Internal, and the same server keeps
// answering the next call.
func TestPanicBecomesInternalAndServerKeepsServing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(UnaryInterceptor), grpc.ChainStreamInterceptor(StreamInterceptor))
	New(conf.Default(), Deps{Network: panickingNetwork{&cnitest.Fake{}}}).Register(g)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := runtimeapi.NewRuntimeServiceClient(conn)
	_, err = c.Status(context.Background(), &runtimeapi.StatusRequest{})
	if status.Code(err) != codes.Internal {
		t.Fatalf("Status with a panicking plugin = %v, want Internal", err)
	}
	v, err := c.Version(context.Background(), &runtimeapi.VersionRequest{})
	if err != nil || v.RuntimeName != "pinrt" {
		t.Fatalf("Version after the panic = (%v, %v), want the server still answering", v, err)
	}
}

func TestStreamInterceptorMapsErrors(t *testing.T) {
	err := StreamInterceptor(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/s"},
		func(any, grpc.ServerStream) error { return fmt.Errorf("x: %w", errdefs.ErrNotFound) })
	if status.Code(err) != codes.NotFound {
		t.Errorf("stream error code = %v, want NotFound", status.Code(err))
	}
	err = StreamInterceptor(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/s"},
		func(any, grpc.ServerStream) error { panic("stream exploded") })
	if status.Code(err) != codes.Internal {
		t.Errorf("stream panic code = %v, want Internal", status.Code(err))
	}
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }

func TestFinishLogLevel(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want logrus.Level
		msg  string
	}{
		{"success", nil, logrus.DebugLevel, "request done"},
		{"not found", errdefs.ErrNotFound, logrus.DebugLevel, "request refused"},
		{"unimplemented", errdefs.ErrNotImplemented, logrus.DebugLevel, "request refused"},
		{"invalid argument", errdefs.ErrInvalidArgument, logrus.DebugLevel, "request refused"},
		{"already exists", errdefs.ErrAlreadyExists, logrus.DebugLevel, "request refused"},
		{"unavailable", errdefs.ErrUnavailable, logrus.WarnLevel, "request failed"},
		{"deadline", context.DeadlineExceeded, logrus.WarnLevel, "request failed"},
		{"internal", errdefs.ErrInternal, logrus.ErrorLevel, "request failed"},
		{"plain error", errors.New("boom"), logrus.ErrorLevel, "request failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, hook := logtest.NewNullLogger()
			logger.SetLevel(logrus.TraceLevel)
			ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
			_ = finish(ctx, "/runtime.v1.RuntimeService/X", time.Now(), tc.err)
			e := hook.LastEntry()
			if e == nil {
				t.Fatal("nothing logged")
			}
			if e.Level != tc.want || e.Message != tc.msg {
				t.Errorf("logged %q at %v, want %q at %v", e.Message, e.Level, tc.msg, tc.want)
			}
			if e.Data["method"] != "/runtime.v1.RuntimeService/X" || e.Data["duration"] == nil {
				t.Errorf("fields = %v, want method and duration", e.Data)
			}
		})
	}
}

// Above debug, a success writes nothing, and failures are still logged.
func TestFinishAtInfoLevel(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.InfoLevel)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
	if err := finish(ctx, "/m", time.Now(), nil); err != nil || len(hook.AllEntries()) != 0 {
		t.Fatalf("success: %v, logged %d entries", err, len(hook.AllEntries()))
	}
	if err := finish(ctx, "/m", time.Now(), errdefs.ErrUnavailable); status.Code(err) != codes.Unavailable {
		t.Fatalf("failure mapped to %v", err)
	}
	if e := hook.LastEntry(); e == nil || e.Level != logrus.WarnLevel || e.Data["method"] != "/m" {
		t.Fatalf("failure logged as %+v", e)
	}
}
