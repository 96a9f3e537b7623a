package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// This file is the one place where domain errors become gRPC codes.
// Handlers and the packages below return errdefs classes wrapped with %w;
// the interceptors add a request ID to the context logger, turn panics into
// Internal, log failures and map the errors.

// UnaryInterceptor instruments every unary CRI call.
func UnaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	ctx, start := withRequestID(ctx, info.FullMethod)
	defer func() {
		if r := recover(); r != nil {
			err = panicError(ctx, info.FullMethod, r)
		}
		err = finish(ctx, info.FullMethod, start, err)
	}()
	return handler(ctx, req)
}

// StreamInterceptor instruments every streaming call.
func StreamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	ctx, start := withRequestID(ss.Context(), info.FullMethod)
	defer func() {
		if r := recover(); r != nil {
			err = panicError(ctx, info.FullMethod, r)
		}
		err = finish(ctx, info.FullMethod, start, err)
	}()
	return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

func withRequestID(ctx context.Context, method string) (context.Context, time.Time) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	entry := log.G(ctx).WithField("req", hex.EncodeToString(b[:]))
	entry.WithField("method", method).Trace("request")
	return log.WithLogger(ctx, entry), time.Now()
}

func panicError(ctx context.Context, method string, r any) error {
	log.G(ctx).WithField("method", method).Errorf("panic: %v\n%s", r, debug.Stack())
	return fmt.Errorf("panic in %s: %v: %w", method, r, errdefs.ErrInternal)
}

// finish logs the call and maps a failure to a gRPC status. Errors that
// already carry a status (from a nested gRPC call) keep their code.
//
// The level follows whose fault a failure is: kubelet polls for gone
// objects, probes optional RPCs and races its own requests all the time,
// so client-side refusals stay at debug; a failure of pinrt or the host
// is a warning, an internal error an error.
func finish(ctx context.Context, method string, start time.Time, err error) error {
	entry := log.G(ctx).WithFields(log.Fields{
		"method":   method,
		"duration": time.Since(start).Round(time.Microsecond).String(),
	})
	if err == nil {
		entry.Debug("request done")
		return nil
	}
	err = errgrpc.ToGRPC(err)
	entry = entry.WithError(err)
	switch status.Code(err) {
	case codes.NotFound, codes.Unimplemented, codes.InvalidArgument, codes.AlreadyExists, codes.Canceled:
		entry.Debug("request refused")
	case codes.Internal, codes.Unknown, codes.DataLoss:
		entry.Error("request failed")
	default:
		entry.Warn("request failed")
	}
	return err
}
