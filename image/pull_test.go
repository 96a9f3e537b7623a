package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sys/unix"
)

// TestClassifyResolves checks the class errdefs.Resolve picks, because
// that, not errors.Is, is what the gRPC interceptor turns into a code. A
// pull_timeout used to come out as DeadlineExceeded and a mirror's 404
// joined with a dead origin as NotFound.
func TestClassifyResolves(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", unix.ECONNREFUSED)}
	timeout := fmt.Errorf("Get \"http://r/v2/\": %w", context.DeadlineExceeded)
	notFound := fmt.Errorf("mirror: %w", classify(&transport.Error{StatusCode: http.StatusNotFound}))
	unreachable := fmt.Errorf("origin: %w", classify(refused))
	tests := []struct {
		name    string
		err     error
		want    error
		wantMsg string
	}{
		{"timeout", classify(timeout), errdefs.ErrUnavailable,
			"timed out: Get \"http://r/v2/\": context deadline exceeded: unavailable"},
		{"connection refused", classify(refused), errdefs.ErrUnavailable,
			"registry unreachable: dial tcp: connect: connection refused: unavailable"},
		{"404", classify(&transport.Error{StatusCode: http.StatusNotFound}), errdefs.ErrNotFound, ""},
		{"401", classify(&transport.Error{StatusCode: http.StatusUnauthorized}), errdefs.ErrUnauthenticated, ""},
		{"403", classify(&transport.Error{StatusCode: http.StatusForbidden}), errdefs.ErrPermissionDenied, ""},
		{"429", classify(&transport.Error{StatusCode: http.StatusTooManyRequests, Errors: []transport.Diagnostic{{Code: transport.TooManyRequestsErrorCode}}}), errdefs.ErrResourceExhausted, ""},
		{"manifest unknown", classify(&transport.Error{StatusCode: http.StatusBadRequest, Errors: []transport.Diagnostic{{Code: transport.ManifestUnknownErrorCode}}}), errdefs.ErrNotFound, ""},
		{"500", classify(&transport.Error{StatusCode: http.StatusInternalServerError}), errdefs.ErrUnavailable, ""},
		{"mirror 404 then origin down", withClass(errors.Join(notFound, unreachable), errdefs.ErrUnavailable), errdefs.ErrUnavailable, ""},
		{"all endpoints 404", withClass(errors.Join(notFound, notFound), errdefs.ErrNotFound), errdefs.ErrNotFound, ""},
		{"other errors keep no class", classify(errors.New("boom")), errdefs.ErrUnknown, "boom"},
		// net/http wraps a transport's error in *url.Error, a net.Error.
		{"damaged blob", classify(&url.Error{Op: "Get", URL: "http://r/v2/x/blobs/sha256:ab", Err: &blobMismatchError{digest: "sha256:ab", msg: "registry sends 1 bytes, the manifest says 2"}}),
			errdefs.ErrDataLoss, `Get "http://r/v2/x/blobs/sha256:ab": blob sha256:ab: registry sends 1 bytes, the manifest says 2: data loss`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := errdefs.Resolve(tc.err); !errors.Is(got, tc.want) {
				t.Errorf("Resolve(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if !errors.Is(tc.want, errdefs.ErrUnknown) && !errors.Is(tc.err, tc.want) {
				t.Errorf("errors.Is(%v, %v) = false", tc.err, tc.want)
			}
			if tc.wantMsg != "" && tc.err.Error() != tc.wantMsg {
				t.Errorf("message = %q, want %q", tc.err.Error(), tc.wantMsg)
			}
		})
	}
	// A timeout stays recognisable as one.
	if !errors.Is(classify(timeout), context.DeadlineExceeded) {
		t.Error("classified timeout no longer wraps context.DeadlineExceeded")
	}
}

func TestWithClassKeepsResolvedError(t *testing.T) {
	err := fmt.Errorf("x: %w", errdefs.ErrNotFound)
	if got := withClass(err, errdefs.ErrNotFound); got != err { //nolint:errorlint // identity: the same error, not re-wrapped
		t.Errorf("withClass re-wrapped an error already of its class: %v", got)
	}
}

// A pull's class is the endpoints' when they all agree; any
// disagreement means the image may exist where we couldn't look.
func TestEndpointsFailed(t *testing.T) {
	notFound := classify(&transport.Error{StatusCode: http.StatusNotFound})
	denied := classify(&transport.Error{StatusCode: http.StatusUnauthorized})
	down := classify(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", unix.ECONNREFUSED)})
	tests := []struct {
		name string
		errs []error
		want error
	}{
		{"one 404", []error{notFound}, errdefs.ErrNotFound},
		{"all 404", []error{notFound, notFound}, errdefs.ErrNotFound},
		{"one 401", []error{denied}, errdefs.ErrUnauthenticated},
		{"404 then down", []error{notFound, down}, errdefs.ErrUnavailable},
		{"401 then 404", []error{denied, notFound}, errdefs.ErrUnavailable},
		{"unclassified", []error{errors.New("boom")}, errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errdefs.Resolve(endpointsFailed(tt.errs)); !errors.Is(got, tt.want) {
				t.Errorf("class %v, want %v", got, tt.want)
			}
		})
	}
}
