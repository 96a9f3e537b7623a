package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/docker/distribution/registry/api/errcode"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/image"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/signature"
	"go.podman.io/image/v5/types"

	"github.com/pinrt/pinrt/sigpolicy"
)

// loadPolicy parses the policy in path. A file that is missing or does
// not parse is FailedPrecondition (the node's configuration is broken),
// never an empty policy.
func loadPolicy(path string) (*signature.Policy, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fail(sigpolicy.KindFailedPrecondition, "signature policy %s: %v", path, err)
	}
	pol, err := signature.NewPolicyFromFile(path)
	if err != nil {
		return nil, fail(sigpolicy.KindFailedPrecondition, "signature policy %s is not a valid containers-policy.json: %v", path, err)
	}
	return pol, nil
}

// check parses every file, stopping at the first broken one.
func check(paths []string) error {
	for _, p := range paths {
		if _, err := loadPolicy(p); err != nil {
			return err
		}
	}
	return nil
}

// verify checks req.Ref against req.Policy and returns the digest of the
// manifest it accepted.
func verify(ctx context.Context, req *sigpolicy.HelperRequest) (string, error) {
	pol, err := loadPolicy(req.Policy)
	if err != nil {
		return "", err
	}
	named, err := reference.ParseNormalizedNamed(req.Ref)
	if err != nil {
		return "", fail(sigpolicy.KindInvalid, "image reference %q: %v", req.Ref, err)
	}
	// The daemon wrote the registries.conf for the first component of
	// the reference: the library must see the same registry.
	if host, _, _ := strings.Cut(req.Ref, "/"); reference.Domain(named) != host {
		return "", fail(sigpolicy.KindInvalid, "image reference %q is not normalized: its registry is %s", req.Ref, reference.Domain(named))
	}
	ref, err := docker.NewReference(named)
	if err != nil {
		return "", fail(sigpolicy.KindInvalid, "image reference %q: %v", req.Ref, err)
	}
	pc, err := signature.NewPolicyContext(pol)
	if err != nil {
		return "", fail(sigpolicy.KindFailedPrecondition, "signature policy %s: %v", req.Policy, err)
	}
	defer func() { _ = pc.Destroy() }()

	src, err := ref.NewImageSource(ctx, systemContext(req.Paths, req.Credentials))
	if err != nil {
		return "", fetchError(req.Ref, err)
	}
	defer func() { _ = src.Close() }()
	unparsed := image.UnparsedInstance(src, nil)
	allowed, err := pc.IsRunningImageAllowed(ctx, unparsed)
	if !allowed {
		return "", refusal(ctx, req, pol, ref, unparsed, err)
	}
	raw, _, err := unparsed.Manifest(ctx)
	if err != nil {
		return "", fetchError(req.Ref, err)
	}
	d, err := manifest.Digest(raw)
	if err != nil {
		return "", fail(sigpolicy.KindDataLoss, "manifest of %s: %v", req.Ref, err)
	}
	return d.String(), nil
}

// refusal classifies why the policy did not allow the image. The
// library reports many refusals without a type of its own (a keyless
// policy meeting a signature without a certificate is "missing ...
// annotation"): once the registry has answered for the manifest and its
// signatures, which the image caches, the refusal is the policy's, not
// the registry's. A key or CA file of the policy that cannot be read is
// the node's configuration.
func refusal(ctx context.Context, req *sigpolicy.HelperRequest, pol *signature.Policy, ref types.ImageReference, img types.UnparsedImage, err error) error {
	var pathErr *fs.PathError
	switch {
	case rejection(err):
	case registryError(err) || ctx.Err() != nil:
		return fetchError(req.Ref, err)
	case errors.As(err, &pathErr):
		return fail(sigpolicy.KindFailedPrecondition, "signature policy %s: %v", req.Policy, err)
	default:
		if _, _, ferr := img.Manifest(ctx); ferr != nil {
			return fetchError(req.Ref, err)
		}
		if _, ferr := img.Signatures(ctx); ferr != nil {
			return fetchError(req.Ref, err)
		}
	}
	e := fail(sigpolicy.KindRejected, "%v", err)
	e.Scope, e.Requirements = describe(pol, ref)
	return e
}

// registryError says err is a failure to talk to the registry: the
// transport's, or the registry's answer.
func registryError(err error) bool {
	var (
		urlErr  *url.Error
		opErr   *net.OpError
		status  docker.UnexpectedHTTPStatusError
		unauth  docker.ErrUnauthorizedForCredentials
		coded   errcode.Error
		code    errcode.ErrorCode
		errList errcode.Errors
	)
	return errors.As(err, &urlErr) || errors.As(err, &opErr) || errors.As(err, &status) || errors.As(err, &unauth) ||
		errors.As(err, &coded) || errors.As(err, &code) || errors.As(err, &errList) || errors.Is(err, docker.ErrTooManyRequests)
}

// rejection tells the policy's refusal (a requirement not met, a
// signature that does not verify) from a failure to ask (the registry
// unreachable while fetching signatures).
func rejection(err error) bool {
	var pre signature.PolicyRequirementError
	var ise signature.InvalidSignatureError
	return errors.As(err, &pre) || errors.As(err, &ise)
}

// fetchError classifies a failure to read the manifest or signatures:
// the policy could not be checked, which fails the pull as the
// registry's fault, or as the credentials' when the registry refused
// them (a 401 or a denial, as the pull itself reports them).
func fetchError(ref string, err error) error {
	kind := sigpolicy.KindUnavailable
	var u docker.ErrUnauthorizedForCredentials
	switch {
	case strings.Contains(err.Error(), "manifest unknown") || strings.Contains(err.Error(), "name unknown"):
		kind = sigpolicy.KindNotFound
	case errors.As(err, &u) || hasCode(err, errcode.ErrorCodeUnauthorized):
		kind = sigpolicy.KindUnauthenticated
	case hasCode(err, errcode.ErrorCodeDenied):
		kind = sigpolicy.KindPermissionDenied
	case errors.Is(err, docker.ErrTooManyRequests) || hasCode(err, errcode.ErrorCodeTooManyRequests):
		kind = sigpolicy.KindResourceExhausted
	}
	return fail(kind, "verifying the signatures of %s: %v", ref, err)
}

// hasCode is the registry's error code want in err: a bare code when the
// registry's answer had no message of its own, else a coded error.
func hasCode(err error, want errcode.ErrorCode) bool {
	var code errcode.ErrorCode
	var coded errcode.Error
	return errors.As(err, &code) && code == want || errors.As(err, &coded) && coded.Code == want
}

// describe names the policy section that governs ref and the types of
// its requirements, for the error an operator reads. It follows the
// order of containers-policy.json(5): the exact identity, then each
// enclosing namespace, then the transport's "" scope, then default.
func describe(pol *signature.Policy, ref types.ImageReference) (string, string) {
	reqs, scope := pol.Default, "default"
	if scopes, ok := pol.Transports[docker.Transport.Name()]; ok {
		names := append([]string{ref.PolicyConfigurationIdentity()}, ref.PolicyConfigurationNamespaces()...)
		names = append(names, "")
		for _, n := range names {
			if r, ok := scopes[n]; ok {
				reqs, scope = r, fmt.Sprintf("transports.docker[%q]", n)
				break
			}
		}
	}
	types := make([]string, 0, len(reqs))
	for _, r := range reqs {
		var t struct {
			Type string `json:"type"`
		}
		if b, err := json.Marshal(r); err == nil && json.Unmarshal(b, &t) == nil {
			types = append(types, t.Type)
		}
	}
	return scope, "requirements " + strings.Join(types, ", ")
}

// systemContext configures the library for one pull like pinrt's own
// pulls: the daemon's registries.conf (mirrors, plain HTTP where pinrt
// uses it), CA files and credentials, and nothing read from the host's
// /etc/containers or home directory (readRequest refused a request
// without every path).
func systemContext(p *sigpolicy.HelperPaths, c *sigpolicy.HelperCredentials) *types.SystemContext {
	sys := &types.SystemContext{
		RegistriesDirPath:           p.RegistriesDir,
		SystemRegistriesConfPath:    p.RegistriesConf,
		SystemRegistriesConfDirPath: p.RegistriesConfDir,
		DockerPerHostCertDirPath:    p.CertDir,
		AuthFilePath:                p.AuthFile,
		SignaturePolicyPath:         p.SignaturePolicy,
	}
	switch {
	case c == nil:
	case c.RegistryToken != "":
		sys.DockerBearerRegistryToken = c.RegistryToken
	default:
		sys.DockerAuthConfig = &types.DockerAuthConfig{Username: c.Username, Password: c.Password, IdentityToken: c.IdentityToken}
	}
	return sys
}
