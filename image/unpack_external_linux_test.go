package image

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

// externalLayer builds a layer the way the outside world does: GNU tar
// writes the archive (padded to 10240-byte records after the
// end-of-archive marker), then an external compressor runs over it.
// compress is a command line reading stdin, or nil for an uncompressed
// layer.
func externalLayer(t *testing.T, compress ...string) (blob []byte, digest, diffID string) {
	t.Helper()
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("GNU tar is not installed (make deps installs it)")
	}
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "etc", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "etc", "hello"), []byte("hello from GNU tar\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("hello", filepath.Join(src, "etc", "sub", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "etc", "hello"), filepath.Join(src, "etc", "hard")); err != nil {
		t.Fatal(err)
	}
	raw, err := exec.Command("tar", "--format=gnu", "-C", src, "-cf", "-", ".").Output()
	if err != nil {
		t.Fatalf("tar: %v", err)
	}
	if len(raw)%10240 != 0 {
		t.Fatalf("GNU tar wrote %d bytes, not whole 10240-byte records: the test would not cover padding", len(raw))
	}
	blob = raw
	if len(compress) > 0 {
		if _, err := exec.LookPath(compress[0]); err != nil {
			t.Skipf("%s is not installed (make deps installs it)", compress[0])
		}
		cmd := exec.Command(compress[0], compress[1:]...)
		cmd.Stdin = bytes.NewReader(raw)
		if blob, err = cmd.Output(); err != nil {
			t.Fatalf("%v: %v", compress, err)
		}
	}
	return blob, sha(blob), sha(raw)
}

func TestUnpackExternalLayers(t *testing.T) {
	requireRoot(t)
	tests := []struct {
		name     string
		compress []string
	}{
		{name: "gnu tar, uncompressed"},
		{name: "gnu tar, gzip -1", compress: []string{"gzip", "-1", "-c"}},
		{name: "gnu tar, gzip -9", compress: []string{"gzip", "-9", "-c"}},
		{name: "gnu tar, zstd", compress: []string{"zstd", "-q", "-c"}},
		{name: "gnu tar, zstd -19", compress: []string{"zstd", "-19", "-q", "-c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			blob, digest, diffID := externalLayer(t, tt.compress...)
			dir := t.TempDir()
			n, err := UnpackLayer(bytes.NewReader(blob), dir, digest, diffID)
			if err != nil {
				t.Fatalf("UnpackLayer: %v", err)
			}
			if n != int64(len(blob)) {
				t.Errorf("size = %d, want %d", n, len(blob))
			}
			got, err := os.ReadFile(filepath.Join(dir, "etc", "hard"))
			if err != nil || string(got) != "hello from GNU tar\n" {
				t.Errorf("etc/hard = %q, %v", got, err)
			}
			if target, err := os.Readlink(filepath.Join(dir, "etc", "sub", "link")); err != nil || target != "hello" {
				t.Errorf("etc/sub/link -> %q, %v", target, err)
			}
		})
	}
}

// Every byte counts: an extra byte after the stream, a truncated stream
// and a wrong digest are all data loss, whatever the compression.
func TestUnpackExternalLayerDamage(t *testing.T) {
	requireRoot(t)
	for _, compress := range [][]string{nil, {"gzip", "-c"}, {"zstd", "-q", "-c"}} {
		blob, digest, diffID := externalLayer(t, compress...)
		damaged := map[string]struct {
			blob           []byte
			digest, diffID string
		}{
			"extra byte":   {blob: append(bytes.Clone(blob), 0), digest: digest, diffID: diffID},
			"flipped byte": {blob: flipped(blob), digest: digest, diffID: diffID},
			"truncated":    {blob: blob[:len(blob)/2], digest: digest, diffID: diffID},
			"wrong digest": {blob: blob, digest: sha([]byte("x")), diffID: diffID},
			"wrong diffID": {blob: blob, digest: digest, diffID: sha([]byte("x"))},
		}
		kind := "plain"
		if compress != nil {
			kind = compress[0]
		}
		for name, d := range damaged {
			t.Run(kind+" "+name, func(t *testing.T) {
				_, err := UnpackLayer(bytes.NewReader(d.blob), t.TempDir(), d.digest, d.diffID)
				if !errors.Is(err, errdefs.ErrDataLoss) {
					t.Fatalf("UnpackLayer = %v, want ErrDataLoss", err)
				}
			})
		}
	}
}

// flipped damages the middle byte of a copy of b, as a bad disk or a
// broken proxy would.
func flipped(b []byte) []byte {
	c := bytes.Clone(b)
	c[len(c)/2] ^= 0x55
	return c
}
