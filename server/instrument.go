package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
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
	if entry.Logger.IsLevelEnabled(log.TraceLevel) {
		entry.WithField("method", method).Trace("request")
	}
	return log.WithLogger(ctx, entry), time.Now()
}

// panicError logs a handler's panic and turns it into Internal. It runs
// in a deferred function after recover, so nothing in it may panic: the
// logging is protected, and fmt already survives a panicking String.
func panicError(ctx context.Context, method string, r any) error {
	_, _ = protect(func() (struct{}, bool) {
		log.G(ctx).WithField("method", method).Errorf("panic: %v\n%s", r, debug.Stack())
		return struct{}{}, true
	})
	return fmt.Errorf("panic in %s: %v: %w", method, r, errdefs.ErrInternal)
}

// finish logs the call and maps a failure to a gRPC status. Errors that
// already carry a status (from a nested gRPC call) keep their code.
//
// The level follows whose fault a failure is: kubelet polls for gone
// objects, probes optional RPCs and races its own requests all the time,
// so client-side refusals stay at debug; a failure of pinrt or the host
// is a warning, an internal error an error.
//
// It runs after the handler's recover, so it protects itself: an error
// value that panics while being inspected (a nil pointer error, an Unwrap
// that returns nil where a library expects an error) becomes Internal,
// never a dead daemon.
func finish(ctx context.Context, method string, start time.Time, err error) (mapped error) {
	defer func() {
		if r := recover(); r != nil {
			mapped = status.Error(codes.Internal, "panic while reporting the error of "+method)
			// The logger may be what panicked; it must not get a second go.
			_, _ = protect(func() (struct{}, bool) {
				log.G(ctx).WithField("method", method).Errorf("panic while mapping an error: %v\n%s", r, debug.Stack())
				return struct{}{}, true
			})
		}
	}()
	logger := log.G(ctx)
	if err == nil && !logger.Logger.IsLevelEnabled(log.DebugLevel) {
		// kubelet's status calls come by the thousand: no entry is
		// built for a line that would not be written.
		return nil
	}
	entry := logger.WithFields(log.Fields{
		"method":   method,
		"duration": time.Since(start).Round(time.Microsecond).String(),
	})
	if err == nil {
		entry.Debug("request done")
		return nil
	}
	mapped = mapError(err)
	entry = entry.WithError(mapped)
	switch status.Code(mapped) {
	case codes.NotFound, codes.Unimplemented, codes.InvalidArgument, codes.AlreadyExists, codes.Canceled:
		entry.Debug("request refused")
	case codes.Internal, codes.Unknown, codes.DataLoss:
		entry.Error("request failed")
	default:
		entry.Warn("request failed")
	}
	return mapped
}

// mapError turns err into a status with err's message. The code is the
// errdefs class (errdefs.Resolve, the resolution errgrpc.ToGRPC uses),
// else the class of a well-known foreign error inside err. It does not
// attach errgrpc's error details: kubelet never reads them, and building
// them dereferences every unwrapped member, which is nil for a *net.DNSError
// from Go's resolver (the SIGSEGV of PullImage "bad..host/x:1").
func mapError(err error) error {
	// Each step runs on its own, so one broken method (a nil *net.OpError's
	// Error, a typed-nil *net.DNSError's Unwrap) costs only what it gives.
	st, isStatus := protect(func() (*status.Status, bool) { return status.FromError(err) })
	if isStatus && st != nil {
		return st.Err()
	}
	code, codeOK := protect(func() (codes.Code, bool) { return errCode(err), true })
	msg, msgOK := protect(func() (string, bool) { return err.Error(), true })
	switch {
	case !msgOK:
		msg = fmt.Sprintf("%T (its message could not be formatted)", err)
	case msg == "":
		msg = "unknown error"
	}
	if !codeOK || (!msgOK && code == codes.Unknown) {
		// A broken error value is a bug here, not the client's fault.
		code = codes.Internal
	}
	return status.Error(code, msg)
}

// protect runs fn and reports false instead of panicking.
func protect[T any](fn func() (T, bool)) (v T, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			var zero T
			v, ok = zero, false
		}
	}()
	return fn()
}

// classCodes are the gRPC codes of the errdefs classes, as
// errgrpc.ToGRPC maps them.
var classCodes = map[error]codes.Code{
	errdefs.ErrInvalidArgument:    codes.InvalidArgument,
	errdefs.ErrNotFound:           codes.NotFound,
	errdefs.ErrAlreadyExists:      codes.AlreadyExists,
	errdefs.ErrPermissionDenied:   codes.PermissionDenied,
	errdefs.ErrResourceExhausted:  codes.ResourceExhausted,
	errdefs.ErrFailedPrecondition: codes.FailedPrecondition,
	errdefs.ErrConflict:           codes.FailedPrecondition,
	errdefs.ErrNotModified:        codes.FailedPrecondition,
	errdefs.ErrAborted:            codes.Aborted,
	errdefs.ErrOutOfRange:         codes.OutOfRange,
	errdefs.ErrNotImplemented:     codes.Unimplemented,
	errdefs.ErrInternal:           codes.Internal,
	errdefs.ErrUnavailable:        codes.Unavailable,
	errdefs.ErrDataLoss:           codes.DataLoss,
	errdefs.ErrUnauthenticated:    codes.Unauthenticated,
	context.DeadlineExceeded:      codes.DeadlineExceeded,
	context.Canceled:              codes.Canceled,
}

// errCode is the code of err's errdefs class (errdefs.Resolve returns
// the class sentinel itself), else of a foreign error inside it.
func errCode(err error) codes.Code {
	// A full disk (or quota) is the node's, whatever class the step that
	// met it gave: kubelet and an operator need to see it as such.
	// errors.Is walks foreign errors, whose Unwrap may panic (a typed nil
	// *net.DNSError): such an error is simply not a full disk.
	if full, _ := protect(func() (bool, bool) {
		return isFull(err), true
	}); full {
		return codes.ResourceExhausted
	}
	if c, ok := classCodes[errdefs.Resolve(err)]; ok {
		return c
	}
	return foreignCode(err)
}

// foreignCode classifies the network and registry errors that reach a
// handler without an errdefs class. Anything else is Unknown.
func foreignCode(err error) codes.Code {
	var terr *transport.Error
	if errors.As(err, &terr) && terr != nil {
		switch c := terr.StatusCode; {
		case c == http.StatusNotFound:
			return codes.NotFound
		case c == http.StatusUnauthorized:
			return codes.Unauthenticated
		case c == http.StatusForbidden:
			return codes.PermissionDenied
		case c == http.StatusTooManyRequests:
			return codes.ResourceExhausted
		case c >= 500 && c < 600:
			return codes.Unavailable
		}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns != nil {
		if dns.IsNotFound {
			return codes.NotFound
		}
		return codes.Unavailable
	}
	var op *net.OpError
	if errors.As(err, &op) && op != nil {
		return codes.Unavailable
	}
	var uerr *url.Error
	if errors.As(err, &uerr) && uerr != nil {
		return codes.Unavailable
	}
	return codes.Unknown
}
