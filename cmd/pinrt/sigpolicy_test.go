package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/sigpolicy"
)

// The helper is the one beside pinrt, else the one on PATH; one beside
// pinrt that cannot run is an error, not a reason to take another.
func TestFindHelper(t *testing.T) {
	write := func(t *testing.T, path string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name    string
		setup   func(t *testing.T, binDir, pathDir string)
		want    string // "bin" or "path": the helper found there
		wantErr []string
	}{
		{"beside pinrt", func(t *testing.T, bin, path string) {
			write(t, filepath.Join(bin, helperName), 0o755)
			write(t, filepath.Join(path, helperName), 0o755)
		}, "bin", nil},
		{"on PATH", func(t *testing.T, bin, path string) {
			write(t, filepath.Join(path, helperName), 0o755)
		}, "path", nil},
		{"beside pinrt, not executable", func(t *testing.T, bin, path string) {
			write(t, filepath.Join(bin, helperName), 0o644)
			write(t, filepath.Join(path, helperName), 0o755)
		}, "", []string{"not an executable file", "-rw-r--r--"}},
		{"beside pinrt, a directory", func(t *testing.T, bin, path string) {
			if err := os.Mkdir(filepath.Join(bin, helperName), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "", []string{"not an executable file"}},
		{"nowhere", func(t *testing.T, bin, path string) {
			write(t, filepath.Join(path, helperName), 0o644) // LookPath skips it
		}, "", []string{"neither beside pinrt", "nor on PATH", "make install"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bin, path := t.TempDir(), t.TempDir()
			t.Setenv("PATH", path)
			c.setup(t, bin, path)
			got, err := findHelper(filepath.Join(bin, "pinrt"))
			if c.wantErr != nil {
				if !errdefs.IsFailedPrecondition(err) {
					t.Fatalf("findHelper = %q, %v; want FailedPrecondition", got, err)
				}
				for _, w := range append(c.wantErr, filepath.Join(bin, helperName)) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				return
			}
			want := map[string]string{"bin": bin, "path": path}[c.want]
			if err != nil || got != filepath.Join(want, helperName) {
				t.Fatalf("findHelper = %q, %v; want the one in %s", got, err, want)
			}
		})
	}
}

// Without a policy the daemon needs no helper and looks for none.
func TestNewVerifierWithoutPolicy(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	cfg := conf.Default()
	cfg.Image.SignaturePolicy, cfg.Image.SignaturePolicyDir = "", ""
	if v, err := newVerifier(cfg); v != nil || err != nil {
		t.Fatalf("newVerifier = %v, %v; want none", v, err)
	}
	cfg.Image.SignaturePolicy = filepath.Join(t.TempDir(), "policy.json")
	if _, err := newVerifier(cfg); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), helperName) {
		t.Fatalf("newVerifier with a policy and no helper: err = %v", err)
	}
}

// The signature helper fetches signatures from the endpoints pulls use:
// a registry configured under another name of its host (Docker Hub's
// aliases, upper case) and mirrors written as URLs reach it as the image
// store reads them.
func TestSignatureRegistriesAsPulls(t *testing.T) {
	cfg := conf.Default()
	cfg.Image.Registries = map[string]conf.Registry{
		"index.docker.io": {Mirrors: []string{"http://Plain.example:5000/hub/", "https://mirror.example"}, SkipOrigin: true},
		"Quay.io":         {Insecure: true},
	}
	got := signatureRegistries(cfg)
	want := map[string]sigpolicy.Registry{
		"docker.io":          {Mirrors: []string{"plain.example:5000/hub", "mirror.example"}, SkipOrigin: true},
		"quay.io":            {Insecure: true},
		"plain.example:5000": {Insecure: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("signature helper's registries = %+v, want %+v", got, want)
	}
}
