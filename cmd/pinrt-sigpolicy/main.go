// Command pinrt-sigpolicy evaluates pinrt's image signature policies
// (containers-policy.json(5)) with the containers/image library, on
// behalf of the daemon, which runs it once at its start to parse the
// policy files and once per pull a policy governs. It is not meant to be
// run by hand.
//
// It reads one sigpolicy.HelperRequest (JSON) on stdin, writes one
// sigpolicy.HelperResponse on stdout and exits 0, whatever the answer: a
// refusal, a broken policy and a registry that is down are answers. It
// exits 2, saying why on stderr, for a request it cannot take (another
// protocol version, a path missing), and 1 for a failure of its own.
//
// It is a Go module of its own so that the daemon's build does not
// carry the library: that module alone needs the build tag
// containers_image_openpgp, which selects the library's OpenPGP written
// in Go instead of gpgme through cgo, and it is built static:
//
//	CGO_ENABLED=0 go build -tags containers_image_openpgp
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pinrt/pinrt/sigpolicy"
)

// maxRequest bounds what is read of stdin: a request is a few paths,
// a reference and credentials.
const maxRequest = 1 << 20

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the helper's whole life, returning its exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: pinrt-sigpolicy < request.json (run by pinrt, see its sigpolicy package)")
		return 2
	}
	req, err := readRequest(stdin)
	if err != nil {
		fmt.Fprintf(stderr, "pinrt-sigpolicy: %v\n", err)
		return 2
	}
	// The daemon kills the helper's process group when it stops waiting;
	// the deadline covers a daemon that died first, and a TERM from an
	// operator ends the registry requests cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	resp, err := answer(ctx, req)
	if err != nil {
		fmt.Fprintf(stderr, "pinrt-sigpolicy: %s: %v\n", req.Op, err)
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(resp); err != nil {
		fmt.Fprintf(stderr, "pinrt-sigpolicy: writing the response: %v\n", err)
		return 1
	}
	return 0
}

// readRequest decodes and checks the request.
func readRequest(r io.Reader) (*sigpolicy.HelperRequest, error) {
	var req sigpolicy.HelperRequest
	if err := json.NewDecoder(io.LimitReader(r, maxRequest)).Decode(&req); err != nil {
		return nil, fmt.Errorf("reading the request: %w", err)
	}
	if req.Version != sigpolicy.ProtocolVersion {
		return nil, fmt.Errorf("the request is of protocol version %d, this pinrt-sigpolicy speaks %d: install the one of the daemon's release",
			req.Version, sigpolicy.ProtocolVersion)
	}
	switch req.Op {
	case sigpolicy.OpCheck:
		if len(req.Policies) == 0 {
			return nil, errors.New("check: no policy files")
		}
	case sigpolicy.OpVerify:
		if req.Policy == "" || req.Ref == "" {
			return nil, errors.New("verify: the policy or the reference is missing")
		}
		return &req, checkPaths(req.Paths)
	default:
		return nil, fmt.Errorf("unknown operation %q", req.Op)
	}
	return &req, nil
}

// checkPaths refuses a verification without every path of its
// configuration: the library reads the host's /etc/containers and
// $HOME for any it is not given.
func checkPaths(p *sigpolicy.HelperPaths) error {
	if p == nil {
		return errors.New("verify: no paths")
	}
	for name, v := range map[string]string{
		"registries_dir": p.RegistriesDir, "registries_conf": p.RegistriesConf, "registries_conf_dir": p.RegistriesConfDir,
		"cert_dir": p.CertDir, "auth_file": p.AuthFile, "signature_policy": p.SignaturePolicy,
	} {
		if !filepath.IsAbs(v) {
			return fmt.Errorf("verify: paths.%s %q is not an absolute path", name, v)
		}
	}
	return nil
}

// answer runs the request's operation. A *sigpolicy.HelperError is an
// answer; any other error is a failure of the helper.
func answer(ctx context.Context, req *sigpolicy.HelperRequest) (*sigpolicy.HelperResponse, error) {
	var resp sigpolicy.HelperResponse
	var err error
	switch req.Op {
	case sigpolicy.OpCheck:
		err = check(req.Policies)
	case sigpolicy.OpVerify:
		resp.Digest, err = verify(ctx, req)
	}
	if err != nil && !errors.As(err, &resp.Error) {
		return nil, err
	}
	return &resp, nil
}

// fail is an answer other than acceptance.
func fail(kind, format string, args ...any) *sigpolicy.HelperError {
	return &sigpolicy.HelperError{Kind: kind, Message: strings.TrimSpace(fmt.Sprintf(format, args...))}
}
