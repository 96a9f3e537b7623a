package cosign_test

import (
	"bytes"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/pinrt/pinrt/test/cosign"
	"github.com/pinrt/pinrt/test/testimage"
)

// sig is one layer of a .sig image.
type sig struct {
	payload   []byte
	signature []byte
}

// image builds a tiny image without busybox; name makes it distinct.
func image(t *testing.T, name string) v1.Image {
	t.Helper()
	return testimage.Build(t, testimage.Spec{
		NoBusybox: true,
		Layers:    [][]testimage.File{{{Path: "name", Content: []byte(name)}}},
	})
}

// digestOf strips "repo@" from a digest reference.
func digestOf(ref string) string { return ref[strings.Index(ref, "@")+1:] }

// sigs fetches the signature image cosign stores for digest in repo and
// checks its media types.
func sigs(t *testing.T, reg *testimage.Registry, repo, digest string) []sig {
	t.Helper()
	ref, err := name.ParseReference(reg.Ref(repo + ":" + strings.Replace(digest, ":", "-", 1) + ".sig"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("fetch %s: %v", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Fatalf("manifest %s, config %s", m.MediaType, m.Config.MediaType)
	}
	if _, err := img.ConfigFile(); err != nil {
		t.Fatalf("config: %v", err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []sig
	for i, l := range layers {
		d := m.Layers[i]
		if d.MediaType != "application/vnd.dev.cosign.simplesigning.v1+json" {
			t.Fatalf("layer %d media type %s", i, d.MediaType)
		}
		s, err := base64.StdEncoding.DecodeString(d.Annotations["dev.cosignproject.cosign/signature"])
		if err != nil || len(s) == 0 {
			t.Fatalf("layer %d signature annotation %q: %v", i, d.Annotations, err)
		}
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		p, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sig{payload: p, signature: s})
	}
	return out
}

// verify checks s against the PEM public key.
func verify(t *testing.T, pemKey []byte, s sig) error {
	t.Helper()
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(pemKey)
	if err != nil {
		t.Fatalf("public key: %v", err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return v.VerifySignature(bytes.NewReader(s.signature), bytes.NewReader(s.payload))
}

// claims decodes a payload's identity and digest.
func claims(t *testing.T, payload []byte) (identity, digest string) {
	t.Helper()
	var p struct {
		Critical struct {
			Identity struct {
				DockerReference string `json:"docker-reference"`
			} `json:"identity"`
			Image struct {
				DockerManifestDigest string `json:"docker-manifest-digest"`
			} `json:"image"`
		} `json:"critical"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		t.Fatalf("payload %s: %v", payload, err)
	}
	return p.Critical.Identity.DockerReference, p.Critical.Image.DockerManifestDigest
}

func TestSign(t *testing.T) {
	reg := testimage.StartRegistry(t)
	pushed := digestOf(reg.Push(t, "signed/busybox:1", image(t, "a")))
	k := cosign.NewKey(t)

	d := cosign.Sign(t, reg.Ref("signed/busybox:1"), k, cosign.Options{})
	if d != pushed {
		t.Fatalf("Sign returned %s, pushed %s", d, pushed)
	}
	got := sigs(t, reg, "signed/busybox", d)
	if len(got) != 1 {
		t.Fatalf("%d signatures, want 1", len(got))
	}
	want := `{"critical":{"identity":{"docker-reference":"` + reg.Addr + `/signed/busybox"},` +
		`"image":{"docker-manifest-digest":"` + d + `"},"type":"cosign container image signature"},"optional":null}`
	if string(got[0].payload) != want {
		t.Fatalf("payload\n%s\nwant\n%s", got[0].payload, want)
	}
	if err := verify(t, k.PublicPEM(), got[0]); err != nil {
		t.Fatalf("signature does not verify: %v", err)
	}
	if err := verify(t, cosign.NewKey(t).PublicPEM(), got[0]); err == nil {
		t.Fatal("signature verifies with another key")
	}
}

func TestSignByDigest(t *testing.T) {
	reg := testimage.StartRegistry(t)
	ref := reg.Push(t, "signed/busybox:1", image(t, "a"))
	k := cosign.NewKey(t)
	d := cosign.Sign(t, ref, k, cosign.Options{})
	if d != digestOf(ref) {
		t.Fatalf("Sign returned %s for %s", d, ref)
	}
	id, pd := claims(t, sigs(t, reg, "signed/busybox", d)[0].payload)
	if id != reg.Addr+"/signed/busybox" || pd != d {
		t.Fatalf("identity %q digest %q", id, pd)
	}
}

func TestTamper(t *testing.T) {
	reg := testimage.StartRegistry(t)
	reg.Push(t, "signed/busybox:1", image(t, "a"))
	k := cosign.NewKey(t)
	d := cosign.Sign(t, reg.Ref("signed/busybox:1"), k, cosign.Options{Tamper: true})
	got := sigs(t, reg, "signed/busybox", d)
	if err := verify(t, k.PublicPEM(), got[0]); err == nil {
		t.Fatal("tampered signature verifies")
	}
	id, pd := claims(t, got[0].payload)
	if id != reg.Addr+"/signed/busybox" || pd == d || len(pd) != len(d) {
		t.Fatalf("tampered payload: identity %q digest %q (image %s)", id, pd, d)
	}
}

func TestTwoKeys(t *testing.T) {
	reg := testimage.StartRegistry(t)
	reg.Push(t, "signed/busybox:1", image(t, "a"))
	k1, k2 := cosign.NewKey(t), cosign.NewKey(t)
	d := cosign.Sign(t, reg.Ref("signed/busybox:1"), k1, cosign.Options{})
	if d2 := cosign.Sign(t, reg.Ref("signed/busybox:1"), k2, cosign.Options{}); d2 != d {
		t.Fatalf("digests %s %s", d, d2)
	}
	got := sigs(t, reg, "signed/busybox", d)
	if len(got) != 2 {
		t.Fatalf("%d signatures, want 2", len(got))
	}
	for i, k := range []*cosign.Key{k1, k2} {
		if err := verify(t, k.PublicPEM(), got[i]); err != nil {
			t.Fatalf("signature %d: %v", i, err)
		}
		if err := verify(t, k.PublicPEM(), got[1-i]); err == nil {
			t.Fatalf("signature %d verifies with the other key", 1-i)
		}
	}
}

func TestOptions(t *testing.T) {
	reg := testimage.StartRegistry(t)
	reg.Push(t, "signed/busybox:1", image(t, "a"))
	other := digestOf(reg.Push(t, "signed/busybox:2", image(t, "b")))
	k := cosign.NewKey(t)
	d := cosign.Sign(t, reg.Ref("signed/busybox:1"), k, cosign.Options{Identity: "example.com/elsewhere:v1", Digest: other})
	if d != other {
		t.Fatalf("Sign returned %s, want %s", d, other)
	}
	got := sigs(t, reg, "signed/busybox", other)
	if err := verify(t, k.PublicPEM(), got[0]); err != nil {
		t.Fatal(err)
	}
	if id, pd := claims(t, got[0].payload); id != "example.com/elsewhere:v1" || pd != other {
		t.Fatalf("identity %q digest %q", id, pd)
	}
}

func TestWritePublic(t *testing.T) {
	k := cosign.NewKey(t)
	path := filepath.Join(t.TempDir(), "key.pub")
	k.WritePublic(t, path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, k.PublicPEM()) || !bytes.HasPrefix(b, []byte("-----BEGIN PUBLIC KEY-----\n")) {
		t.Fatalf("key file %q", b)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("key file mode %v, %v", fi.Mode(), err)
	}
}
