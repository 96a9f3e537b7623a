package sigpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/image"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/signature"
	"go.podman.io/image/v5/types"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// Config says which policies apply and how to reach the registries.
type Config struct {
	// Policy is the node's containers-policy.json; "" accepts every
	// image unless PolicyDir has a file for the pod's namespace.
	Policy string
	// PolicyDir holds "<namespace>.json" policies that replace Policy for
	// the pods of that Kubernetes namespace.
	PolicyDir string
	// StateDir receives the registries.conf, registries.d and certs.d
	// that configure the library; it is created by New.
	StateDir string
	// Registries are pinrt's per-host settings, keyed by host[:port].
	Registries map[string]Registry
	// AuthFile is a docker/podman config.json used when a pull carries
	// no credentials ("" means none: no file of the host is read).
	AuthFile string
}

// Registry mirrors image.RegistryConfig.
type Registry struct {
	Mirrors    []string
	SkipOrigin bool
	Insecure   bool
	CAFile     string
}

// Auth carries a pull's credentials (the CRI AuthConfig).
type Auth struct {
	Username, Password, Auth, IdentityToken, RegistryToken string
}

// Request is one image to verify.
type Request struct {
	// Ref is a normalized reference: "host/repo:tag" or
	// "host/repo@sha256:...".
	Ref string
	// Namespace is the Kubernetes namespace of the pod the pull is for
	// ("" when the pull names no pod).
	Namespace string
	Auth      *Auth
}

// Verifier checks images against the policies of a Config.
type Verifier struct {
	cfg   Config
	files policyFiles
	// certDir is certs.d: <host>/ca.crt for each registry with a CA file.
	certDir, regDir, noAuth string
}

// New checks every policy file of cfg (an error names the broken one)
// and writes the library's configuration under cfg.StateDir.
func New(cfg Config) (*Verifier, error) {
	v := &Verifier{
		cfg:     cfg,
		certDir: filepath.Join(cfg.StateDir, "certs.d"),
		regDir:  filepath.Join(cfg.StateDir, "registries.d"),
		noAuth:  filepath.Join(cfg.StateDir, "no-auth.json"),
	}
	if err := v.files.checkAll(&cfg); err != nil {
		return nil, err
	}
	// Signatures are cosign's attachments, looked up on the registry
	// that served the manifest; no lookaside web server.
	if err := os.MkdirAll(v.regDir, 0o700); err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(v.regDir, "default.yaml"),
		[]byte("default-docker:\n  use-sigstore-attachments: true\n"), 0o600); err != nil {
		return nil, err
	}
	for host, r := range cfg.Registries {
		if r.CAFile == "" {
			continue
		}
		pem, err := os.ReadFile(r.CAFile)
		if err != nil {
			return nil, fmt.Errorf("registry %s CA file: %w", host, err)
		}
		dir := filepath.Join(v.certDir, host)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, "ca.crt"), pem, 0o600); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// RejectedError is a pull the policy refused: kubelet reports it as
// SignatureValidationFailed.
type RejectedError struct {
	Image, PolicyFile, Scope, Requirements string
	Reason                                 error
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("image %s is rejected by signature policy %s (%s: %s): %v",
		e.Image, e.PolicyFile, e.Scope, e.Requirements, e.Reason)
}

func (e *RejectedError) Unwrap() error { return e.Reason }

// Verify checks req against the policy that governs it and returns the
// digest of the manifest it accepted, which the caller pulls instead of
// req.Ref's tag. "" (and no error) means no policy applies.
func (v *Verifier) Verify(ctx context.Context, req Request) (string, error) {
	path, err := v.cfg.policyPath(req.Namespace)
	if err != nil || path == "" {
		return "", err
	}
	pol, err := v.files.load(path)
	if err != nil {
		return "", err
	}
	named, err := reference.ParseNormalizedNamed(req.Ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w: %w", req.Ref, err, errdefs.ErrInvalidArgument)
	}
	ref, err := docker.NewReference(named)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w: %w", req.Ref, err, errdefs.ErrInvalidArgument)
	}
	sys, err := v.systemContext(named, req.Auth)
	if err != nil {
		return "", err
	}
	pc, err := signature.NewPolicyContext(pol)
	if err != nil {
		return "", fmt.Errorf("signature policy %s: %w: %w", path, err, errdefs.ErrFailedPrecondition)
	}
	defer func() { _ = pc.Destroy() }()

	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		return "", fetchError(req.Ref, err)
	}
	defer func() { _ = src.Close() }()
	unparsed := image.UnparsedInstance(src, nil)
	allowed, err := pc.IsRunningImageAllowed(ctx, unparsed)
	if !allowed {
		if rejection(err) {
			scope, reqs := describe(pol, ref)
			return "", &RejectedError{Image: req.Ref, PolicyFile: path, Scope: scope, Requirements: reqs, Reason: err}
		}
		return "", fetchError(req.Ref, err)
	}
	raw, _, err := unparsed.Manifest(ctx)
	if err != nil {
		return "", fetchError(req.Ref, err)
	}
	d, err := manifest.Digest(raw)
	if err != nil {
		return "", fmt.Errorf("manifest of %s: %w: %w", req.Ref, err, errdefs.ErrDataLoss)
	}
	return d.String(), nil
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
// registry's fault.
func fetchError(ref string, err error) error {
	var class error = errdefs.ErrUnavailable
	if strings.Contains(err.Error(), "manifest unknown") || strings.Contains(err.Error(), "name unknown") {
		class = errdefs.ErrNotFound
	}
	return fmt.Errorf("verifying the signatures of %s: %w: %w", ref, err, class)
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
// pulls: the same mirrors, plain HTTP where pinrt uses it, CA files and
// credentials, and nothing read from the host's /etc/containers or
// home directory.
func (v *Verifier) systemContext(named reference.Named, auth *Auth) (*types.SystemContext, error) {
	conf, err := v.registriesConf(reference.Domain(named))
	if err != nil {
		return nil, err
	}
	sys := &types.SystemContext{
		RegistriesDirPath:           v.regDir,
		SystemRegistriesConfPath:    conf,
		SystemRegistriesConfDirPath: filepath.Join(v.cfg.StateDir, "registries.conf.d"),
		DockerPerHostCertDirPath:    v.certDir,
		AuthFilePath:                v.noAuth,
		SignaturePolicyPath:         filepath.Join(v.cfg.StateDir, "no-policy.json"),
	}
	if v.cfg.AuthFile != "" {
		sys.AuthFilePath = v.cfg.AuthFile
	}
	if auth != nil && *auth != (Auth{}) {
		switch {
		case auth.RegistryToken != "":
			sys.DockerBearerRegistryToken = auth.RegistryToken
		default:
			a := &types.DockerAuthConfig{Username: auth.Username, Password: auth.Password, IdentityToken: auth.IdentityToken}
			if a.Username == "" && auth.Auth != "" {
				dec, err := base64.StdEncoding.DecodeString(auth.Auth)
				if err != nil {
					return nil, fmt.Errorf("auth is not base64: %w", errdefs.ErrInvalidArgument)
				}
				a.Username, a.Password, _ = strings.Cut(string(dec), ":")
			}
			sys.DockerAuthConfig = a
		}
	}
	return sys, nil
}

// registriesConf writes (once per content) the registries.conf for a
// pull from host: host's mirrors in order, then host itself unless
// skip_origin. The library caches a parsed registries.conf by path, so
// each content gets a path of its own.
func (v *Verifier) registriesConf(host string) (string, error) {
	type mirror struct {
		Location string `toml:"location"`
		Insecure bool   `toml:"insecure"`
	}
	type registry struct {
		Prefix   string   `toml:"prefix"`
		Location string   `toml:"location"`
		Insecure bool     `toml:"insecure"`
		Mirror   []mirror `toml:"mirror"`
	}
	r := v.cfg.Registries[host]
	origin := registry{Prefix: host, Location: host, Insecure: v.insecure(host)}
	for _, m := range r.Mirrors {
		loc := strings.Trim(m, "/")
		mhost, _, _ := strings.Cut(loc, "/")
		origin.Mirror = append(origin.Mirror, mirror{Location: loc, Insecure: v.insecure(mhost)})
	}
	if r.SkipOrigin {
		if len(origin.Mirror) == 0 {
			return "", fmt.Errorf("registry %s: skip_origin set and no mirrors: %w", host, errdefs.ErrFailedPrecondition)
		}
		// The library tries the mirrors, then location: the last mirror
		// takes the origin's place.
		last := origin.Mirror[len(origin.Mirror)-1]
		origin.Location, origin.Insecure = last.Location, last.Insecure
		origin.Mirror = slices.Clip(origin.Mirror[:len(origin.Mirror)-1])
	}
	b, err := toml.Marshal(struct {
		Registry []registry `toml:"registry"`
	}{[]registry{origin}})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	path := filepath.Join(v.cfg.StateDir, "registries-"+hex.EncodeToString(sum[:8])+".conf")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	return path, atomicfile.WriteFile(path, b, 0o600)
}

// insecure says whether pinrt talks plain HTTP (or unverified TLS) to
// host: loopback registries without configuration, others when insecure
// is set. The library then tries HTTPS first and falls back to HTTP.
func (v *Verifier) insecure(host string) bool {
	if v.cfg.Registries[host].Insecure {
		return true
	}
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
