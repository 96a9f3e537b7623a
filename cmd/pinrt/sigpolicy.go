package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/sigpolicy"
)

// helperName is the binary that evaluates signature policies
// (cmd/pinrt-sigpolicy), installed beside pinrt.
const helperName = "pinrt-sigpolicy"

// newVerifier builds the signature policy check of image pulls; nil
// when no policy is configured, so pulls go on as before and no helper
// is needed. A policy file that is missing or broken, or a helper that
// cannot be found, stops the daemon here.
func newVerifier(cfg *conf.Config) (image.Verifier, error) {
	if cfg.Image.SignaturePolicy == "" && cfg.Image.SignaturePolicyDir == "" {
		return nil, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("signature policy: locating pinrt's own binary to find %s beside it: %w", helperName, err)
	}
	helper, err := findHelper(exe)
	if err != nil {
		return nil, err
	}
	v, err := sigpolicy.New(sigpolicy.Config{
		Helper:     helper,
		Policy:     cfg.Image.SignaturePolicy,
		PolicyDir:  cfg.Image.SignaturePolicyDir,
		StateDir:   filepath.Join(cfg.RunRoot, "sigpolicy"),
		Registries: signatureRegistries(cfg),
		AuthFile:   cfg.Image.AuthFile,
	})
	if err != nil {
		return nil, err
	}
	return verifier{v}, nil
}

// imageRegistries is the configuration's per-host registry settings as
// the image store takes them.
func imageRegistries(cfg *conf.Config) map[string]image.RegistryConfig {
	regs := map[string]image.RegistryConfig{}
	for host, r := range cfg.Image.Registries {
		regs[host] = image.RegistryConfig{Mirrors: r.Mirrors, SkipOrigin: r.SkipOrigin, Insecure: r.Insecure, CAFile: r.CAFile}
	}
	return regs
}

// signatureRegistries gives the signature helper the endpoints pulls
// use: hosts keyed as the store keys them (image.CanonicalRegistries),
// and each mirror as host[/prefix], one given as an http:// URL
// plain HTTP, for the helper's registries.conf takes no scheme.
func signatureRegistries(cfg *conf.Config) map[string]sigpolicy.Registry {
	regs := map[string]sigpolicy.Registry{}
	var plain []string
	for host, r := range image.CanonicalRegistries(imageRegistries(cfg)) {
		sr := sigpolicy.Registry{SkipOrigin: r.SkipOrigin, Insecure: r.Insecure, CAFile: r.CAFile}
		for _, m := range r.Mirrors {
			mhost, prefix, plainHTTP := image.SplitMirror(m)
			mhost = strings.ToLower(mhost) // as the keys are
			sr.Mirrors = append(sr.Mirrors, path.Join(mhost, prefix))
			if plainHTTP {
				plain = append(plain, mhost)
			}
		}
		regs[host] = sr
	}
	for _, h := range plain {
		r := regs[h]
		r.Insecure = true
		regs[h] = r
	}
	return regs
}

// findHelper locates pinrt-sigpolicy beside exe first, so a daemon runs
// the helper of its own build, else on PATH. A file beside exe that
// cannot run is an error, not a reason to run another one from PATH.
func findHelper(exe string) (string, error) {
	beside, err := besideExe(exe, helperName)
	switch {
	case err == nil:
		return beside, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("signature policy helper: %w", err)
	}
	p, err := exec.LookPath(helperName)
	if err != nil {
		return "", fmt.Errorf("a signature policy is configured, but its helper %s is neither beside pinrt (%s) nor on PATH (%q); "+
			"install the one built with pinrt (make build writes bin/%s, make install installs it beside pinrt): %w",
			helperName, beside, os.Getenv("PATH"), helperName, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// verifier adapts sigpolicy to the image store's Verifier, marking the
// policy's refusals as image.ErrSignatureRejected.
type verifier struct{ v *sigpolicy.Verifier }

func (a verifier) Verify(ctx context.Context, ref string, auth *image.Auth, namespace string) (string, error) {
	req := sigpolicy.Request{Ref: ref, Namespace: namespace}
	if auth != nil {
		req.Auth = &sigpolicy.Auth{
			Username: auth.Username, Password: auth.Password, Auth: auth.Auth,
			IdentityToken: auth.IdentityToken, RegistryToken: auth.RegistryToken,
		}
	}
	d, err := a.v.Verify(ctx, req)
	var rej *sigpolicy.RejectedError
	if errors.As(err, &rej) {
		return "", rejected{err}
	}
	return d, err
}

// rejected is a refusal of the policy: errors.Is(image.ErrSignatureRejected)
// without adding to the message.
type rejected struct{ error }

func (r rejected) Is(target error) bool { return target == image.ErrSignatureRejected }
func (r rejected) Unwrap() error        { return r.error }
