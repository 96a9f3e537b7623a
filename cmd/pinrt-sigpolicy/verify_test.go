package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/distribution/registry/api/errcode"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"go.podman.io/image/v5/docker"

	"github.com/pinrt/pinrt/sigpolicy"
	"github.com/pinrt/pinrt/test/cosign"
	"github.com/pinrt/pinrt/test/testimage"
)

// tiny builds a one-file image; content makes it distinct.
func tiny(t *testing.T, content string) v1.Image {
	t.Helper()
	return testimage.Build(t, testimage.Spec{
		NoBusybox: true,
		Layers:    [][]testimage.File{{{Path: "id", Content: []byte(content)}}},
	})
}

// digestOf strips "repo@" from a digest reference.
func digestOf(ref string) string { return ref[strings.Index(ref, "@")+1:] }

// writePolicy writes a policy file and returns its path.
func writePolicy(t *testing.T, path, body string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// sigstore is a policy whose scope (a transports.docker key, "" for
// the whole transport) requires a cosign signature by keyPath.
func sigstore(scope, keyPath, identity string) string {
	return fmt.Sprintf(`{"default":[{"type":"reject"}],"transports":{"docker":{%q:[
		{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":%s}]}}}`, scope, keyPath, identity)
}

const matchRepository = `{"type":"matchRepository"}`

type fixture struct {
	reg              *testimage.Registry
	dir              string
	key, other       *cosign.Key
	keyPath          string
	signed, unsigned string // tag references
	signedDigest     string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{reg: testimage.StartRegistry(t), dir: t.TempDir(), key: cosign.NewKey(t), other: cosign.NewKey(t)}
	f.keyPath = filepath.Join(f.dir, "key.pub")
	f.key.WritePublic(t, f.keyPath)
	f.signedDigest = digestOf(f.reg.Push(t, "app/signed:1", tiny(t, "signed")))
	f.reg.Push(t, "app/unsigned:1", tiny(t, "unsigned"))
	f.signed, f.unsigned = f.reg.Ref("app/signed:1"), f.reg.Ref("app/unsigned:1")
	cosign.Sign(t, f.signed, f.key, cosign.Options{})
	return f
}

func (f *fixture) verifier(t *testing.T, cfg sigpolicy.Config) *sigpolicy.Verifier {
	t.Helper()
	cfg.StateDir = filepath.Join(f.dir, "state")
	v, err := newVerifier(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

func verifyRef(v *sigpolicy.Verifier, ref, ns string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return v.Verify(ctx, sigpolicy.Request{Ref: ref, Namespace: ns})
}

// wantRejected checks that err is the policy's refusal and that it
// names what an operator needs: the image, the file, the requirement.
func wantRejected(t *testing.T, err error, ref, policy, reason string) {
	t.Helper()
	var rej *sigpolicy.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("err = %v, want a RejectedError", err)
	}
	msg := err.Error()
	for _, s := range []string{ref, policy, reason} {
		if !strings.Contains(msg, s) {
			t.Errorf("error %q does not name %q", msg, s)
		}
	}
}

func TestVerifySigstore(t *testing.T) {
	f := setup(t)
	policy := writePolicy(t, filepath.Join(f.dir, "policy.json"), sigstore(f.reg.Addr+"/app", f.keyPath, matchRepository))
	v := f.verifier(t, sigpolicy.Config{Policy: policy})

	d, err := verifyRef(v, f.signed, "")
	if err != nil || d != f.signedDigest {
		t.Fatalf("signed: Verify = %q, %v; want %s", d, err, f.signedDigest)
	}
	// By digest too: the signature is on the same manifest.
	byDigest := f.reg.Addr + "/app/signed@" + f.signedDigest
	if d, err := verifyRef(v, byDigest, ""); err != nil || d != f.signedDigest {
		t.Fatalf("by digest: Verify = %q, %v", d, err)
	}

	_, err = verifyRef(v, f.unsigned, "")
	wantRejected(t, err, f.unsigned, policy, "no signature exists")
	if !strings.Contains(err.Error(), `transports.docker["`+f.reg.Addr+`/app"]: requirements sigstoreSigned`) {
		t.Errorf("error %q does not name the scope and requirement", err)
	}

	// Signed, but by a key the node does not trust.
	f.reg.Push(t, "app/other-key:1", tiny(t, "other-key"))
	cosign.Sign(t, f.reg.Ref("app/other-key:1"), f.other, cosign.Options{})
	_, err = verifyRef(v, f.reg.Ref("app/other-key:1"), "")
	wantRejected(t, err, "app/other-key:1", policy, "")

	// Signed by the right key for another image's name.
	f.reg.Push(t, "app/renamed:1", tiny(t, "renamed"))
	cosign.Sign(t, f.reg.Ref("app/renamed:1"), f.key, cosign.Options{Identity: f.reg.Addr + "/app/signed"})
	_, err = verifyRef(v, f.reg.Ref("app/renamed:1"), "")
	wantRejected(t, err, "app/renamed:1", policy, "not accepted")

	// A signature whose payload was changed after signing.
	f.reg.Push(t, "app/tampered:1", tiny(t, "tampered"))
	cosign.Sign(t, f.reg.Ref("app/tampered:1"), f.key, cosign.Options{Tamper: true})
	_, err = verifyRef(v, f.reg.Ref("app/tampered:1"), "")
	wantRejected(t, err, "app/tampered:1", policy, "")

	// A signature for another digest does not cover this one.
	f.reg.Push(t, "app/stale:1", tiny(t, "stale"))
	cosign.Sign(t, f.reg.Ref("app/stale:1"), f.key, cosign.Options{Digest: f.signedDigest})
	_, err = verifyRef(v, f.reg.Ref("app/stale:1"), "")
	wantRejected(t, err, "app/stale:1", policy, "no signature exists")

	// Outside the scope the default, reject, applies.
	f.reg.Push(t, "elsewhere/x:1", tiny(t, "x"))
	_, err = verifyRef(v, f.reg.Ref("elsewhere/x:1"), "")
	wantRejected(t, err, "elsewhere/x:1", policy, "default: requirements reject")
}

// The policy's scopes and identity rules are the library's; this checks
// they reach pinrt as containers-policy.json(5) says.
func TestVerifyScopesAndIdentities(t *testing.T) {
	f := setup(t)
	keyData := string(f.key.PublicPEM())
	cases := []struct {
		name, policy, ref string
		ok                bool
	}{
		{"repo scope beats host scope", fmt.Sprintf(`{"default":[{"type":"reject"}],"transports":{"docker":{
			%q:[{"type":"reject"}], %q:[{"type":"insecureAcceptAnything"}]}}}`, f.reg.Addr, f.reg.Addr+"/app/unsigned"), f.unsigned, true},
		{"tag scope beats repo scope", fmt.Sprintf(`{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{
			%q:[{"type":"insecureAcceptAnything"}], %q:[{"type":"reject"}]}}}`, f.reg.Addr+"/app/unsigned", f.unsigned), f.unsigned, false},
		{"keyData", fmt.Sprintf(`{"default":[{"type":"sigstoreSigned","keyData":%q,"signedIdentity":{"type":"matchRepository"}}]}`,
			b64(keyData)), f.signed, true},
		{"keyPaths, one of them trusted", fmt.Sprintf(`{"default":[{"type":"sigstoreSigned","keyPaths":[%q,%q],"signedIdentity":{"type":"matchRepository"}}]}`,
			writeKey(t, f.dir, "other.pub", f.other), f.keyPath), f.signed, true},
		{"matchExact wants the tag cosign does not sign", fmt.Sprintf(`{"default":[{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":{"type":"matchExact"}}]}`,
			f.keyPath), f.signed, false},
		{"exactReference: cosign's identity has no tag", fmt.Sprintf(`{"default":[{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":{"type":"exactReference","dockerReference":%q}}]}`,
			f.keyPath, f.signed), f.signed, false},
		{"remapIdentity from another prefix", fmt.Sprintf(`{"default":[{"type":"sigstoreSigned","keyPath":%q,"signedIdentity":{"type":"remapIdentity","prefix":%q,"signedPrefix":%q}}]}`,
			f.keyPath, f.reg.Addr+"/app", f.reg.Addr+"/app"), f.signed, false},
		{"insecureAcceptAnything takes an unsigned image", `{"default":[{"type":"insecureAcceptAnything"}]}`, f.unsigned, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			policy := writePolicy(t, filepath.Join(f.dir, fmt.Sprintf("p%d.json", i)), c.policy)
			cfg := sigpolicy.Config{Policy: policy, StateDir: filepath.Join(f.dir, "state")}
			v, err := newVerifier(cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			_, err = verifyRef(v, c.ref, "")
			if c.ok && err != nil {
				t.Fatalf("Verify = %v, want accepted", err)
			}
			if !c.ok {
				wantRejected(t, err, c.ref, policy, "")
			}
		})
	}
}

func TestVerifyPerNamespace(t *testing.T) {
	f := setup(t)
	dir := filepath.Join(f.dir, "namespaces")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writePolicy(t, filepath.Join(dir, "strict.json"), sigstore("", f.keyPath, matchRepository))
	writePolicy(t, filepath.Join(dir, "lax.json"), `{"default":[{"type":"insecureAcceptAnything"}]}`)
	node := writePolicy(t, filepath.Join(f.dir, "node.json"), `{"default":[{"type":"reject"}]}`)
	v := f.verifier(t, sigpolicy.Config{Policy: node, PolicyDir: dir})

	cases := []struct {
		ns, ref string
		policy  string // "" = accepted
	}{
		{"strict", f.signed, ""},
		{"strict", f.unsigned, filepath.Join(dir, "strict.json")},
		{"lax", f.unsigned, ""},
		{"default", f.signed, node}, // no file: the node's policy
		{"", f.signed, node},        // a pull for no pod
	}
	for _, c := range cases {
		_, err := verifyRef(v, c.ref, c.ns)
		if c.policy == "" && err != nil {
			t.Errorf("namespace %q, %s: %v", c.ns, c.ref, err)
		}
		if c.policy != "" {
			wantRejected(t, err, c.ref, c.policy, "")
		}
	}
	for _, ns := range []string{"../node", "a/b", "UPPER", strings.Repeat("a", 64), "-x"} {
		if _, err := verifyRef(v, f.signed, ns); !errdefs.IsInvalidArgument(err) {
			t.Errorf("namespace %q: err = %v, want InvalidArgument", ns, err)
		}
	}

	// Without a node policy, a namespace without a file is not checked.
	v = f.verifier(t, sigpolicy.Config{PolicyDir: dir})
	if d, err := verifyRef(v, f.unsigned, "default"); err != nil || d != "" {
		t.Fatalf("no node policy: Verify = %q, %v; want no check", d, err)
	}
	if _, err := verifyRef(v, f.unsigned, "strict"); err == nil {
		t.Fatal("strict namespace accepted an unsigned image")
	}
}

// The signature is read where the manifest came from (the mirror), and
// checked against the name asked for (the origin's).
func TestVerifyThroughMirror(t *testing.T) {
	f := setup(t)
	mirror := testimage.StartRegistry(t)
	img := tiny(t, "mirrored")
	d := digestOf(mirror.Push(t, "cache/app/m:1", img))
	origin := f.reg.Addr // has no app/m: only the mirror serves it
	cosign.Sign(t, mirror.Ref("cache/app/m:1"), f.key, cosign.Options{Identity: origin + "/app/m"})
	policy := writePolicy(t, filepath.Join(f.dir, "policy.json"), sigstore(origin+"/app", f.keyPath, matchRepository))

	for _, skip := range []bool{false, true} {
		v := f.verifier(t, sigpolicy.Config{Policy: policy, Registries: map[string]sigpolicy.Registry{
			origin: {Mirrors: []string{mirror.Addr + "/cache"}, SkipOrigin: skip},
		}})
		mirror.ResetRequests()
		got, err := verifyRef(v, origin+"/app/m:1", "")
		if err != nil || got != d {
			t.Fatalf("skip_origin=%v: Verify = %q, %v; want %s", skip, got, err, d)
		}
		if mirror.Requests("/v2/cache/app/m/manifests/sha256-") == 0 {
			t.Fatalf("signature not read from the mirror: %v", mirror.Log())
		}
	}

	// A signature naming the mirror's path is not one for the origin's name.
	img2 := tiny(t, "mirrored-2")
	mirror.Push(t, "cache/app/n:1", img2)
	cosign.Sign(t, mirror.Ref("cache/app/n:1"), f.key, cosign.Options{})
	v := f.verifier(t, sigpolicy.Config{Policy: policy, Registries: map[string]sigpolicy.Registry{origin: {Mirrors: []string{mirror.Addr + "/cache"}}}})
	_, err := verifyRef(v, origin+"/app/n:1", "")
	wantRejected(t, err, origin+"/app/n:1", policy, "not accepted")
}

// A policy that does not parse stops the start and fails the pulls it
// governs after an edit; it is never read as "accept everything".
func TestPolicyReloadAndMalformed(t *testing.T) {
	f := setup(t)
	path := filepath.Join(f.dir, "policy.json")
	for _, bad := range []string{`{`, `{}`, `{"default":[{"type":"sigstoreSigned"}]}`, `{"default":[{"type":"acceptAll"}]}`} {
		writePolicy(t, path, bad)
		if _, err := newVerifier(sigpolicy.Config{Policy: path, StateDir: filepath.Join(f.dir, "state")}); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), path) {
			t.Errorf("New with %s: err = %v, want FailedPrecondition naming the file", bad, err)
		}
	}
	if _, err := newVerifier(sigpolicy.Config{Policy: filepath.Join(f.dir, "missing.json"), StateDir: filepath.Join(f.dir, "state")}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("New with a missing policy: err = %v", err)
	}

	writePolicy(t, path, `{"default":[{"type":"insecureAcceptAnything"}]}`)
	v := f.verifier(t, sigpolicy.Config{Policy: path})
	if _, err := verifyRef(v, f.unsigned, ""); err != nil {
		t.Fatalf("accept-all policy: %v", err)
	}
	// An edit applies to the next pull.
	writePolicy(t, path, sigstore("", f.keyPath, matchRepository))
	_, err := verifyRef(v, f.unsigned, "")
	wantRejected(t, err, f.unsigned, path, "no signature exists")
	// A broken edit fails the pull instead of accepting it.
	writePolicy(t, path, `{"default":[`)
	if _, err := verifyRef(v, f.unsigned, ""); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), path) {
		t.Fatalf("broken policy: err = %v, want FailedPrecondition naming the file", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := verifyRef(v, f.unsigned, ""); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("removed policy: err = %v, want FailedPrecondition", err)
	}
	// A registry that is down is not a rejection.
	writePolicy(t, path, sigstore("", f.keyPath, matchRepository))
	f.reg.Close()
	if _, err := verifyRef(v, f.signed, ""); !errdefs.IsUnavailable(err) || errors.As(err, new(*sigpolicy.RejectedError)) {
		t.Fatalf("registry down: err = %v, want Unavailable", err)
	}
}

// A refusal that the library reports with an error of no particular
// type is still the policy's refusal once the registry has answered: a
// keyless (Fulcio) policy meeting an image signed with a key is refused,
// not blamed on the registry. A key file the policy names that is
// missing is the node's configuration, not the registry, either.
func TestVerifyRefusalKinds(t *testing.T) {
	f := setup(t)
	ca := filepath.Join(f.dir, "fulcio.pem")
	if err := os.WriteFile(ca, selfSignedCA(t), 0o644); err != nil {
		t.Fatal(err)
	}
	fulcio := writePolicy(t, filepath.Join(f.dir, "fulcio.json"), fmt.Sprintf(`{"default":[{"type":"sigstoreSigned",
		"fulcio":{"caPath":%q,"oidcIssuer":"https://issuer.example","subjectEmail":"a@example.com"},
		"rekorPublicKeyPath":%q,"signedIdentity":{"type":"matchRepository"}}]}`, ca, f.keyPath))
	_, err := verifyRef(f.verifier(t, sigpolicy.Config{Policy: fulcio}), f.signed, "")
	wantRejected(t, err, f.signed, fulcio, "annotation")

	missing := filepath.Join(f.dir, "gone.pub")
	noKey := writePolicy(t, filepath.Join(f.dir, "nokey.json"), sigstore("", missing, matchRepository))
	_, err = verifyRef(f.verifier(t, sigpolicy.Config{Policy: noKey}), f.signed, "")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), noKey) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing key: err = %v, want FailedPrecondition naming %s and %s", err, noKey, missing)
	}
}

// selfSignedCA is a PEM CA certificate, for a Fulcio policy.
func selfSignedCA(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test fulcio"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func writeKey(t *testing.T, dir, name string, k *cosign.Key) string {
	t.Helper()
	path := filepath.Join(dir, name)
	k.WritePublic(t, path)
	return path
}

// A registry that wants credentials: the signatures are read with the
// pull's own, and a refusal of them is Unauthenticated, as the pull's
// own 401 is, not a registry that is down.
func TestVerifyCredentials(t *testing.T) {
	f := setup(t)
	f.reg.Intercept(testimage.BasicAuth("alice", "secret", nil))
	policy := writePolicy(t, filepath.Join(f.dir, "policy.json"), sigstore(f.reg.Addr+"/app", f.keyPath, matchRepository))
	v := f.verifier(t, sigpolicy.Config{Policy: policy})
	verify := func(auth *sigpolicy.Auth) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return v.Verify(ctx, sigpolicy.Request{Ref: f.signed, Auth: auth})
	}
	for name, auth := range map[string]*sigpolicy.Auth{
		"without credentials": nil,
		"with wrong ones":     {Username: "alice", Password: "wrong"},
	} {
		if _, err := verify(auth); !errdefs.IsUnauthorized(err) || !strings.Contains(err.Error(), f.signed) {
			t.Errorf("%s: err = %v, want Unauthenticated naming %s", name, err, f.signed)
		}
	}
	if d, err := verify(&sigpolicy.Auth{Username: "alice", Password: "secret"}); err != nil || d != f.signedDigest {
		t.Fatalf("with the right credentials: Verify = %q, %v; want %s", d, err, f.signedDigest)
	}
}

func TestFetchErrorKinds(t *testing.T) {
	for _, c := range []struct {
		err  error
		kind string
	}{
		{docker.ErrUnauthorizedForCredentials{Err: errors.New("401")}, sigpolicy.KindUnauthenticated},
		{fmt.Errorf("reading manifest 1 in r/x: %w", errcode.ErrorCodeUnauthorized), sigpolicy.KindUnauthenticated},
		{fmt.Errorf("reading manifest 1 in r/x: %w", errcode.ErrorCodeUnauthorized.WithMessage("token expired")), sigpolicy.KindUnauthenticated},
		{fmt.Errorf("reading manifest 1 in r/x: %w", errcode.ErrorCodeDenied), sigpolicy.KindPermissionDenied},
		{fmt.Errorf("reading manifest 1 in r/x: %w", errcode.ErrorCodeDenied.WithMessage("requested access to the resource is denied")), sigpolicy.KindPermissionDenied},
		{fmt.Errorf("reading manifest 1 in r/x: %w", errcode.ErrorCodeUnknown), sigpolicy.KindUnavailable},
		{errors.New("reading manifest 1 in r/x: manifest unknown"), sigpolicy.KindNotFound},
		{fmt.Errorf("reading manifest 1 in r/x: %w", docker.ErrTooManyRequests), sigpolicy.KindResourceExhausted},
		{fmt.Errorf("reading manifest 1 in r/x: %w", errcode.ErrorCodeTooManyRequests.WithMessage("pull rate limit")), sigpolicy.KindResourceExhausted},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), sigpolicy.KindUnavailable},
	} {
		var he *sigpolicy.HelperError
		if err := fetchError("r/x:1", c.err); !errors.As(err, &he) || he.Kind != c.kind {
			t.Errorf("fetchError(%v) = %v, want kind %s", c.err, err, c.kind)
		}
	}
}

// registryError tells a registry's failure, which a refusal must not
// hide, from the library's untyped refusals and local file errors.
func TestRegistryError(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", fmt.Errorf("reading signatures: %w", &url.Error{Op: "Get", URL: "https://r/v2/", Err: errors.New("connection refused")}), true},
		{"registry error code", fmt.Errorf("reading signatures: %w", errcode.ErrorCodeUnknown.WithMessage("boom")), true},
		{"unexpected status", fmt.Errorf("reading signatures: %w", docker.UnexpectedHTTPStatusError{StatusCode: 502}), true},
		{"rate limited", fmt.Errorf("reading signatures: %w", docker.ErrTooManyRequests), true},
		{"missing annotation", errors.New("missing dev.sigstore.cosign/bundle annotation"), false},
		{"missing key file", &fs.PathError{Op: "open", Path: "/etc/pinrt/key.pub", Err: syscall.ENOENT}, false},
	} {
		if got := registryError(c.err); got != c.want {
			t.Errorf("%s: registryError(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
