package testimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// A Shape says which programs write an image's layers and which media
// types describe them, so tests can pull what registries really serve
// rather than what this package's own writer produces. The zero Shape is
// what Build always made: Go's archive/tar, Go's gzip, an OCI manifest.
//
// The GNU tar shapes stage the files in a directory (owners, modes, hard
// links, whiteout files and all) and exec tar on it, so they need root
// and GNU tar; the compressors are the gzip and zstd binaries. A missing
// tool fails the test, naming `make deps`: a skipped shape would pass CI
// while testing nothing.
type Shape struct {
	Tar         TarWriter
	Compression Compression
	// Docker makes a Docker v2 schema 2 image: docker manifest, config
	// and layer media types. Docker has no zstd layer type.
	Docker bool
}

// TarWriter is the program that writes a layer's tar stream.
type TarWriter int

const (
	// GoTar is Go's archive/tar (PAX headers where a field needs one).
	GoTar TarWriter = iota
	// GNUTar is `tar --format=gnu`: ././@LongLink entries for long names,
	// base-256 numbers, zero padding to 10240-byte records after the
	// end-of-archive marker.
	GNUTar
	// PosixTar is `tar --format=posix`: a pax extended header (atime,
	// ctime, long paths) before every entry, 10240-byte records.
	PosixTar
)

func (w TarWriter) String() string {
	return [...]string{"go-tar", "gnu-tar", "posix-tar"}[w]
}

// Compression is how a layer's tar stream is compressed.
type Compression int

const (
	// GoGzip is Go's compress/gzip at its default level.
	GoGzip Compression = iota
	// Gzip1 and Gzip9 are the gzip binary at -1 and -9.
	Gzip1
	Gzip9
	// Zstd is the zstd binary at its default level.
	Zstd
	// Uncompressed is the plain tar stream.
	Uncompressed
)

func (c Compression) String() string {
	return [...]string{"go-gzip", "gzip-1", "gzip-9", "zstd", "uncompressed"}[c]
}

func (s Shape) String() string {
	m := "oci"
	if s.Docker {
		m = "docker"
	}
	return m + "-" + s.Tar.String() + "-" + s.Compression.String()
}

// MediaType is the layer media type s gives a layer.
func (s Shape) MediaType() (types.MediaType, error) {
	switch {
	case s.Docker && s.Compression == Zstd:
		return "", fmt.Errorf("docker v2 schema 2 has no zstd layer media type")
	case s.Docker && s.Compression == Uncompressed:
		return types.DockerUncompressedLayer, nil
	case s.Docker:
		return types.DockerLayer, nil
	case s.Compression == Zstd:
		return types.OCILayerZStd, nil
	case s.Compression == Uncompressed:
		return types.OCIUncompressedLayer, nil
	}
	return types.OCILayer, nil
}

// ShapedLayer writes files as one layer of shape s: the tar stream by
// s.Tar, compressed by s.Compression, labelled with s.MediaType. The
// layer's digest and diffID are those of the exact bytes produced.
func ShapedLayer(t testing.TB, files []File, s Shape) v1.Layer {
	t.Helper()
	mt, err := s.MediaType()
	if err != nil {
		t.Fatalf("testimage: %s: %v", s, err)
	}
	var raw []byte
	switch s.Tar {
	case GoTar:
		raw = TarBytes(t, files)
	case GNUTar:
		raw = ExternalTar(t, files, "gnu")
	case PosixTar:
		raw = ExternalTar(t, files, "posix")
	default:
		t.Fatalf("testimage: unknown tar writer %d", s.Tar)
	}
	blob := compress(t, raw, s.Compression)
	return newBlobLayer(t, blob, raw, mt)
}

// RecordSize is GNU tar's default record (blocking factor 20): it pads
// every archive to a multiple of it after the end-of-archive marker.
const RecordSize = 10240

// ExternalTar stages files in a directory and archives it with the tar
// binary in format "gnu" or "posix". The archive starts at "./", as
// `tar -C dir .` writes it, and every name is "./"-prefixed. Files a
// layer lists with a hard link type become real hard links, so tar
// itself decides which entry is the link. Names, owners and mtimes are
// fixed (sorted, numeric, the package epoch), so the bytes are
// reproducible.
func ExternalTar(t testing.TB, files []File, format string) []byte {
	t.Helper()
	requireGNUTar(t)
	if os.Geteuid() != 0 {
		t.Skip("testimage: staging a layer for GNU tar sets file owners: it needs root")
	}
	dir := t.TempDir()
	// The "./" entry becomes the layer root's metadata.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stage(t, dir, files)
	args := []string{"--format=" + format, "--sort=name", "--numeric-owner",
		fmt.Sprintf("--mtime=@%d", epoch.Unix()), "-C", dir, "-cf", "-", "."}
	if format == "posix" {
		// GNU tar's pax headers carry atime and ctime by default; pin
		// them (and the header name, which otherwise may hold the pid)
		// so the layer is reproducible but keeps its real shape.
		opt := fmt.Sprintf("--pax-option=exthdr.name=%%d/PaxHeaders/%%f,atime:=%d,ctime:=%d", epoch.Unix(), epoch.Unix())
		args = append([]string{opt}, args...)
	}
	cmd := exec.Command("tar", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("testimage: tar %v: %v\n%s", args, err, stderr.String())
	}
	if len(out)%RecordSize != 0 {
		t.Fatalf("testimage: GNU tar wrote %d bytes, not whole %d-byte records", len(out), RecordSize)
	}
	return out
}

// stage creates files below dir with their owners and modes.
func stage(t testing.TB, dir string, files []File) {
	t.Helper()
	type meta struct {
		path     string
		mode     uint32
		uid, gid int
	}
	var metas []meta
	for _, f := range files {
		rel := filepath.Clean("/" + f.Path)
		if len(f.Xattrs) > 0 {
			t.Fatalf("testimage: %s: xattrs are only written by GoTar layers", f.Path)
		}
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		typ, mode := fileType(f)
		var err error
		switch typ {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			err = os.WriteFile(p, f.Content, 0o600)
		case tar.TypeSymlink:
			err = os.Symlink(f.Linkname, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(dir, filepath.Clean("/"+f.Linkname)), p)
		case tar.TypeFifo:
			err = unix.Mkfifo(p, 0o600)
		default:
			t.Fatalf("testimage: %s: type %q can't be staged for GNU tar", f.Path, typ)
		}
		if err != nil {
			t.Fatalf("testimage: staging %s: %v", f.Path, err)
		}
		if typ != tar.TypeLink {
			metas = append(metas, meta{p, uint32(mode), f.UID, f.GID})
		}
	}
	// Owners before modes (chown clears setuid bits), and after every
	// entry exists, so a read-only directory still took its children.
	for _, m := range metas {
		if err := os.Lchown(m.path, m.uid, m.gid); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(m.path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			continue
		}
		if err := unix.Chmod(m.path, m.mode); err != nil {
			t.Fatal(err)
		}
	}
}

// fileType is f's tar type and permission bits with the defaults
// TarBytes applies.
func fileType(f File) (byte, int64) {
	typ := f.Type
	if typ == 0 {
		typ = tar.TypeReg
		if strings.HasSuffix(f.Path, "/") {
			typ = tar.TypeDir
		}
	}
	mode := f.Mode
	if mode == 0 {
		mode = 0o644
		switch typ {
		case tar.TypeDir:
			mode = 0o755
		case tar.TypeSymlink:
			mode = 0o777
		}
	}
	return typ, mode
}

var (
	gnuTarMu      sync.Mutex
	gnuTarChecked bool
)

func requireGNUTar(t testing.TB) {
	t.Helper()
	gnuTarMu.Lock()
	defer gnuTarMu.Unlock()
	if gnuTarChecked {
		return
	}
	out, err := exec.Command("tar", "--version").Output()
	if err != nil || !bytes.Contains(out, []byte("GNU tar")) {
		t.Fatalf("testimage: GNU tar is needed to build real-world layers (make deps installs it): %v %q", err, firstLine(out))
	}
	gnuTarChecked = true
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// compress runs raw through the compressor c names.
func compress(t testing.TB, raw []byte, c Compression) []byte {
	t.Helper()
	var argv []string
	switch c {
	case Uncompressed:
		return raw
	case GoGzip:
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	case Gzip1:
		argv = []string{"gzip", "-1", "-n", "-c"}
	case Gzip9:
		argv = []string{"gzip", "-9", "-n", "-c"}
	case Zstd:
		argv = []string{"zstd", "-q", "-c"}
	default:
		t.Fatalf("testimage: unknown compression %d", c)
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		t.Fatalf("testimage: %s is needed to build %s layers (make deps installs it): %v", argv[0], c, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = bytes.NewReader(raw)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("testimage: %v: %v\n%s", argv, err, stderr.String())
	}
	return out
}

// blobLayer is a layer whose compressed and uncompressed bytes are both
// given: go-containerregistry's tarball layers would gzip an
// uncompressed stream on upload, which is the one thing an uncompressed
// layer must not be.
type blobLayer struct {
	blob, raw      []byte
	digest, diffID v1.Hash
	mediaType      types.MediaType
}

var _ v1.Layer = (*blobLayer)(nil)

func newBlobLayer(t testing.TB, blob, raw []byte, mt types.MediaType) *blobLayer {
	t.Helper()
	d, _, err := v1.SHA256(bytes.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	diffID, _, err := v1.SHA256(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	return &blobLayer{blob: blob, raw: raw, digest: d, diffID: diffID, mediaType: mt}
}

func (l *blobLayer) Digest() (v1.Hash, error) { return l.digest, nil }
func (l *blobLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }
func (l *blobLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}
func (l *blobLayer) Uncompressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.raw)), nil
}
func (l *blobLayer) Size() (int64, error)                { return int64(len(l.blob)), nil }
func (l *blobLayer) MediaType() (types.MediaType, error) { return l.mediaType, nil }
