// Package cosign signs test images the way `cosign sign --key` does, so
// end-to-end tests can check a runtime's sigstoreSigned policy
// (containers-policy.json) against an in-process registry.
//
// A typical test does:
//
//	reg := testimage.StartRegistry(t)
//	reg.Push(t, "signed/busybox:1", testimage.Busybox(t))
//	k := cosign.NewKey(t)
//	k.WritePublic(t, keyPath) // the policy's keyPath
//	cosign.Sign(t, reg.Ref("signed/busybox:1"), k, cosign.Options{})
//
// Sign pushes, next to the image, the OCI image cosign stores: tag
// "sha256-<hex>.sig" with one layer per signature, each layer a
// simple-signing payload whose signature is in the layer's
// "dev.cosignproject.cosign/signature" annotation.
package cosign

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// What cosign writes into its signature images.
const (
	payloadMediaType    = types.MediaType("application/vnd.dev.cosign.simplesigning.v1+json")
	signatureAnnotation = "dev.cosignproject.cosign/signature"
	payloadType         = "cosign container image signature"
)

// Key is an ECDSA P-256 key pair, the kind `cosign generate-key-pair`
// makes.
type Key struct {
	signer signature.Signer
	pub    []byte // PEM
}

// NewKey generates a key pair.
func NewKey(t testing.TB) *Key {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("cosign: generate key: %v", err)
	}
	s, err := signature.LoadECDSASigner(priv, crypto.SHA256)
	if err != nil {
		t.Fatalf("cosign: load signer: %v", err)
	}
	pub, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		t.Fatalf("cosign: marshal public key: %v", err)
	}
	return &Key{signer: s, pub: pub}
}

// PublicPEM is the public key as a PEM "PUBLIC KEY" block, what a
// sigstoreSigned policy's keyPath file or keyData holds.
func (k *Key) PublicPEM() []byte { return bytes.Clone(k.pub) }

// WritePublic writes PublicPEM to path with mode 0644, whatever the umask.
func (k *Key) WritePublic(t testing.TB, path string) {
	t.Helper()
	if err := os.WriteFile(path, k.PublicPEM(), 0o644); err != nil {
		t.Fatalf("cosign: %v", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatalf("cosign: %v", err)
	}
}

// Options vary what Sign writes; the zero value signs like cosign.
type Options struct {
	// Identity is critical.identity.docker-reference of the payload;
	// empty means the repository of the signed reference, without tag or
	// digest, as cosign writes it.
	Identity string
	// Tamper changes one character of the manifest digest in the payload
	// after signing, so the signature no longer matches its payload.
	Tamper bool
	// Digest is the manifest digest ("sha256:...") to sign instead of the
	// one the registry serves for the reference.
	Digest string
}

// payload is cosign's simple-signing payload. Its JSON encoding is byte
// for byte what cosign signs.
type payload struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional map[string]any `json:"optional"`
}

// Sign signs the manifest digest D that the loopback registry serves for
// ref ("host/repo:tag" or "host/repo@sha256:...") with k and pushes the
// signature to the same repository as tag "sha256-<hex of D>.sig",
// appending it to the signatures already there. It returns D.
func Sign(t testing.TB, ref string, k *Key, o Options) string {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatalf("cosign: %v", err)
	}
	digest := o.Digest
	if digest == "" {
		desc, err := remote.Get(r)
		if err != nil {
			t.Fatalf("cosign: resolve %s: %v", ref, err)
		}
		digest = desc.Digest.String()
	}
	h, err := v1.NewHash(digest)
	if err != nil {
		t.Fatalf("cosign: digest %q: %v", digest, err)
	}

	var p payload
	p.Critical.Identity.DockerReference = o.Identity
	if p.Critical.Identity.DockerReference == "" {
		p.Critical.Identity.DockerReference = r.Context().Name()
	}
	p.Critical.Image.DockerManifestDigest = digest
	p.Critical.Type = payloadType
	body, err := json.Marshal(p)
	if err != nil {
		t.Fatalf("cosign: %v", err)
	}
	sig, err := k.signer.SignMessage(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("cosign: sign: %v", err)
	}
	if o.Tamper {
		body = tamper(body, digest)
	}

	sigRef := r.Context().Tag(h.Algorithm + "-" + h.Hex + ".sig")
	base, err := remote.Image(sigRef)
	var terr *transport.Error
	switch {
	case errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound:
		base = mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	case err != nil:
		t.Fatalf("cosign: get %s: %v", sigRef, err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(body, payloadMediaType),
		Annotations: map[string]string{signatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatalf("cosign: %v", err)
	}
	if err := remote.Write(sigRef, img); err != nil {
		t.Fatalf("cosign: push %s: %v", sigRef, err)
	}
	return digest
}

// tamper flips the last hex digit of digest inside payload; the JSON
// stays valid but no longer matches the signature.
func tamper(payload []byte, digest string) []byte {
	i := bytes.Index(payload, []byte(digest)) + len(digest) - 1
	out := bytes.Clone(payload)
	out[i] = '0'
	if payload[i] == '0' {
		out[i] = '1'
	}
	return out
}
