package sigpolicy

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"

	"github.com/pinrt/pinrt/internal/atomicfile"
)

// Config says which policies apply, how to reach the registries and
// which helper evaluates them.
type Config struct {
	// Helper is the pinrt-sigpolicy binary that parses policies and
	// verifies images.
	Helper string
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

// The bounds of one run of the helper, under the caller's context: a
// check only parses files; a verification fetches a manifest and its
// signatures, through every mirror in turn.
const (
	checkTimeout  = time.Minute
	verifyTimeout = 5 * time.Minute
)

// Verifier checks images against the policies of a Config.
type Verifier struct {
	cfg Config
	// paths locate the library's configuration; RegistriesConf is set
	// per pull.
	paths HelperPaths
}

// New has the helper parse every policy file of cfg (an error names the
// broken one) and writes the library's configuration under cfg.StateDir.
func New(cfg Config) (*Verifier, error) {
	if cfg.Helper == "" {
		return nil, fmt.Errorf("signature policy: no pinrt-sigpolicy helper given: %w", errdefs.ErrInvalidArgument)
	}
	v := &Verifier{cfg: cfg, paths: HelperPaths{
		RegistriesDir:     filepath.Join(cfg.StateDir, "registries.d"),
		RegistriesConfDir: filepath.Join(cfg.StateDir, "registries.conf.d"),
		CertDir:           filepath.Join(cfg.StateDir, "certs.d"),
		AuthFile:          filepath.Join(cfg.StateDir, "no-auth.json"),
		SignaturePolicy:   filepath.Join(cfg.StateDir, "no-policy.json"),
	}}
	if cfg.AuthFile != "" {
		v.paths.AuthFile = cfg.AuthFile
	}
	files, err := cfg.policyFiles()
	if err != nil {
		return nil, err
	}
	if len(files) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
		defer cancel()
		if _, err := v.run(ctx, &HelperRequest{Op: OpCheck, Policies: files}); err != nil {
			return nil, err
		}
	}
	if err := v.writeState(); err != nil {
		return nil, err
	}
	return v, nil
}

// writeState writes the configuration every verification shares: the
// registries.d and the CA files.
func (v *Verifier) writeState() error {
	// Signatures are cosign's attachments, looked up on the registry
	// that served the manifest; no lookaside web server.
	if err := os.MkdirAll(v.paths.RegistriesDir, 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(v.paths.RegistriesDir, "default.yaml"),
		[]byte("default-docker:\n  use-sigstore-attachments: true\n"), 0o600); err != nil {
		return err
	}
	for host, r := range v.cfg.Registries {
		if r.CAFile == "" {
			continue
		}
		pem, err := os.ReadFile(r.CAFile)
		if err != nil {
			return fmt.Errorf("registry %s CA file: %w", host, err)
		}
		dir := filepath.Join(v.paths.CertDir, host)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, "ca.crt"), pem, 0o600); err != nil {
			return err
		}
	}
	return nil
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
// req.Ref's tag. "" (and no error) means no policy applies, and then no
// helper runs. The policy file is read anew by every run of the helper,
// so an edit applies to the next pull.
func (v *Verifier) Verify(ctx context.Context, req Request) (string, error) {
	path, err := v.cfg.policyPath(req.Namespace)
	if err != nil || path == "" {
		return "", err
	}
	host, err := refHost(req.Ref)
	if err != nil {
		return "", err
	}
	creds, err := credentials(req.Auth)
	if err != nil {
		return "", err
	}
	paths := v.paths
	if paths.RegistriesConf, err = v.registriesConf(host); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	resp, err := v.run(ctx, &HelperRequest{Op: OpVerify, Policy: path, Ref: req.Ref, Paths: &paths, Credentials: creds})
	var he *HelperError
	if errors.As(err, &he) && he.Kind == KindRejected {
		return "", &RejectedError{Image: req.Ref, PolicyFile: path, Scope: he.Scope, Requirements: he.Requirements, Reason: he}
	}
	if err != nil {
		return "", err
	}
	return resp.Digest, nil
}

// refHost is the registry of a normalized reference: its first
// component, which must read as a host to the library's parser too
// (docker's rule: a dot, a colon, or "localhost"), or the registries.conf
// written for it would configure another name.
func refHost(ref string) (string, error) {
	host, _, ok := strings.Cut(ref, "/")
	if !ok || (!strings.ContainsAny(host, ".:") && host != "localhost" && strings.ToLower(host) == host) {
		return "", fmt.Errorf("image reference %q does not start with a registry host: %w", ref, errdefs.ErrInvalidArgument)
	}
	return host, nil
}

// credentials turns the CRI's credentials into the helper's: nil for
// none, the registry token alone, or a user and password, taken from
// the base64 "user:password" of Auth when Username is empty.
func credentials(auth *Auth) (*HelperCredentials, error) {
	if auth == nil || *auth == (Auth{}) {
		return nil, nil
	}
	if auth.RegistryToken != "" {
		return &HelperCredentials{RegistryToken: auth.RegistryToken}, nil
	}
	c := &HelperCredentials{Username: auth.Username, Password: auth.Password, IdentityToken: auth.IdentityToken}
	if c.Username == "" && auth.Auth != "" {
		dec, err := base64.StdEncoding.DecodeString(auth.Auth)
		if err != nil {
			return nil, fmt.Errorf("auth is not base64: %w", errdefs.ErrInvalidArgument)
		}
		c.Username, c.Password, _ = strings.Cut(string(dec), ":")
	}
	return c, nil
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
