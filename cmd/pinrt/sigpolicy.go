package main

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/sigpolicy"
)

// newVerifier builds the signature policy check of image pulls; nil
// when no policy is configured, so pulls go on as before. A policy file
// that is missing or broken stops the daemon here.
func newVerifier(cfg *conf.Config) (image.Verifier, error) {
	if cfg.Image.SignaturePolicy == "" && cfg.Image.SignaturePolicyDir == "" {
		return nil, nil
	}
	regs := map[string]sigpolicy.Registry{}
	for host, r := range cfg.Image.Registries {
		regs[host] = sigpolicy.Registry{Mirrors: r.Mirrors, SkipOrigin: r.SkipOrigin, Insecure: r.Insecure, CAFile: r.CAFile}
	}
	v, err := sigpolicy.New(sigpolicy.Config{
		Policy:     cfg.Image.SignaturePolicy,
		PolicyDir:  cfg.Image.SignaturePolicyDir,
		StateDir:   filepath.Join(cfg.RunRoot, "sigpolicy"),
		Registries: regs,
		AuthFile:   cfg.Image.AuthFile,
	})
	if err != nil {
		return nil, err
	}
	return verifier{v}, nil
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
