package testimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestBuildPushPull(t *testing.T) {
	reg := StartRegistry(t)
	img := Build(t, Spec{
		Cmd:      []string{"/hello"},
		User:     "1002",
		Programs: map[string]string{"hello": "package main\nfunc main() { println(\"hi\") }\n"},
	})
	again := Build(t, Spec{
		Cmd:      []string{"/hello"},
		User:     "1002",
		Programs: map[string]string{"hello": "package main\nfunc main() { println(\"hi\") }\n"},
	})
	if ID(t, img) != ID(t, again) {
		t.Fatalf("builds differ: %s %s", ID(t, img), ID(t, again))
	}
	ref := reg.Push(t, "hello:1", img)
	if !strings.HasPrefix(ref, reg.Addr+"/hello@sha256:") {
		t.Fatalf("digest ref %q", ref)
	}
	r, _ := name.ParseReference(reg.Ref("hello:1"))
	got, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "1002" || !slices.Equal(cf.Config.Cmd, []string{"/hello"}) || cf.Architecture != "amd64" {
		t.Fatalf("config %+v", cf.Config)
	}
	layers, _ := got.Layers()
	if len(layers) != 2 {
		t.Fatalf("%d layers, want busybox + programs", len(layers))
	}
	if n := reg.Requests("GET /v2/hello/manifests/1"); n != 1 {
		t.Fatalf("manifest requests %d, want 1: %v", n, reg.Log())
	}
}

// Every shape gives the bytes its writer and compressor make, under the
// media type that names them, and the digests match those bytes.
func TestShapedLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("GNU tar shapes stage files with owners: they need root")
	}
	long := "long/" + strings.Repeat("n", 120)
	files := []File{
		{Path: "d/", Mode: 0o750, UID: 33, GID: 33},
		{Path: "d/a", Content: []byte("a\n"), Mode: 0o4755},
		{Path: "d/b", Type: tar.TypeLink, Linkname: "d/a"},
		{Path: "d/.wh.gone"},
		{Path: "s", Type: tar.TypeSymlink, Linkname: "d/a"},
		{Path: long, Content: []byte("long\n")},
	}
	magic := map[Compression][]byte{GoGzip: {0x1f, 0x8b}, Gzip1: {0x1f, 0x8b}, Gzip9: {0x1f, 0x8b}, Zstd: {0x28, 0xb5, 0x2f, 0xfd}}
	for _, tw := range []TarWriter{GoTar, GNUTar, PosixTar} {
		for _, c := range []Compression{GoGzip, Gzip1, Gzip9, Zstd, Uncompressed} {
			for _, docker := range []bool{false, true} {
				s := Shape{Tar: tw, Compression: c, Docker: docker}
				if docker && c == Zstd {
					if _, err := s.MediaType(); err == nil {
						t.Errorf("%s: MediaType() succeeded, want an error", s)
					}
					continue
				}
				t.Run(s.String(), func(t *testing.T) { checkShapedLayer(t, s, files, magic[c], long) })
			}
		}
	}
}

func checkShapedLayer(t *testing.T, s Shape, files []File, magic []byte, long string) {
	l := ShapedLayer(t, files, s)
	blob := readAll(t, l.Compressed)
	raw := readAll(t, l.Uncompressed)
	if magic != nil && !bytes.HasPrefix(blob, magic) {
		t.Errorf("blob starts %x, want %x", blob[:4], magic)
	}
	if magic == nil && !bytes.Equal(blob, raw) {
		t.Errorf("uncompressed blob differs from its tar stream")
	}
	mt, _ := l.MediaType()
	want, _ := s.MediaType()
	if mt != want || (s.Docker != strings.Contains(string(mt), "docker")) {
		t.Errorf("media type %s, want %s", mt, want)
	}
	if d, _ := l.Digest(); d.String() != sha(blob) {
		t.Errorf("digest %s, want %s", d, sha(blob))
	}
	if d, _ := l.DiffID(); d.String() != sha(raw) {
		t.Errorf("diffID %s, want %s", d, sha(raw))
	}
	if s.Tar != GoTar && len(raw)%RecordSize != 0 {
		t.Errorf("%s wrote %d bytes, want whole records", s.Tar, len(raw))
	}
	if s.Tar == GNUTar && !bytes.Contains(raw, []byte("././@LongLink")) {
		t.Errorf("GNU tar stream has no ././@LongLink entry for the long name")
	}
	if s.Tar == PosixTar && !bytes.Contains(raw, []byte("PaxHeaders/")) {
		t.Errorf("posix tar stream has no pax extended headers")
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading the tar back: %v", err)
		}
		got[strings.TrimPrefix(h.Name, "./")] = h
	}
	if h := got["d/b"]; h == nil || h.Typeflag != tar.TypeLink || strings.TrimPrefix(h.Linkname, "./") != "d/a" {
		t.Errorf("d/b = %+v, want a hard link to d/a", h)
	}
	if h := got["d/a"]; h == nil || h.Mode&0o7777 != 0o4755 || h.Typeflag != tar.TypeReg {
		t.Errorf("d/a = %+v, want a setuid 0755 file", h)
	}
	if h := got["d/"]; h == nil || h.Uid != 33 || h.Gid != 33 || h.Mode&0o777 != 0o750 {
		t.Errorf("d/ = %+v, want 0750 owned by 33:33", h)
	}
	if got["d/.wh.gone"] == nil || got[long] == nil || got["s"].Linkname != "d/a" {
		t.Errorf("entries %v lack the whiteout, the long name or the symlink", slices.Collect(maps.Keys(got)))
	}
}

func readAll(t *testing.T, open func() (io.ReadCloser, error)) []byte {
	t.Helper()
	rc, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

func TestPushIndexAsManifestList(t *testing.T) {
	reg := StartRegistry(t)
	amd := Build(t, Spec{NoBusybox: true, Shape: Shape{Docker: true}, Layers: [][]File{{{Path: "arch", Content: []byte("amd64")}}}})
	arm := Build(t, Spec{NoBusybox: true, Shape: Shape{Docker: true}, Architecture: "arm64", Layers: [][]File{{{Path: "arch", Content: []byte("arm64")}}}})
	ref := reg.PushIndexAs(t, "list:1", types.DockerManifestList,
		PlatformImage{v1.Platform{OS: "linux", Architecture: "arm64"}, arm},
		PlatformImage{v1.Platform{OS: "linux", Architecture: "amd64"}, amd})
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(r)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.DockerManifestList || len(m.Manifests) != 2 ||
		m.Manifests[0].Platform.Architecture != "arm64" || m.Manifests[1].MediaType != types.DockerManifestSchema2 {
		t.Fatalf("index %+v, want a docker manifest list of arm64 then amd64 docker manifests", m)
	}
}
