package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/pinrt/pinrt/test/testimage"
	"golang.org/x/sys/unix"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown, mknod, trusted.* xattrs and mounts")
	}
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// gzLayer returns the gzip layer of files with its digest and diffID.
func gzLayer(t testing.TB, files []testimage.File) (blob []byte, digest, diffID string) {
	t.Helper()
	raw := testimage.TarBytes(t, files)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), sha(buf.Bytes()), sha(raw)
}

func unpackFiles(t testing.TB, dir string, files []testimage.File) error {
	t.Helper()
	blob, d, diff := gzLayer(t, files)
	_, err := UnpackLayer(bytes.NewReader(blob), dir, d, diff)
	return err
}

func TestCleanName(t *testing.T) {
	tests := []struct {
		in, want string
		bad      bool
	}{
		{in: "a/b", want: "a/b"},
		{in: "./a/b/", want: "a/b"},
		{in: "/abs/x", want: "abs/x"},
		{in: "./", want: "."},
		{in: "a//b", want: "a/b"},
		{in: "../x", bad: true},
		{in: "/abs/../../x", bad: true},
		{in: "a/../b", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := cleanName(tt.in)
			if tt.bad {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("cleanName(%q) = %q, %v; want ErrInvalidArgument", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("cleanName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestUnpackRefusesEscapes(t *testing.T) {
	me, mg := os.Getuid(), os.Getgid()
	f := func(p string) testimage.File {
		return testimage.File{Path: p, Content: []byte("pwned"), UID: me, GID: mg}
	}
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	sym := func(p, target string) testimage.File {
		return testimage.File{Path: p, Type: tar.TypeSymlink, Linkname: target, UID: me, GID: mg}
	}
	link := func(p, target string) testimage.File {
		return testimage.File{Path: p, Type: tar.TypeLink, Linkname: target, UID: me, GID: mg}
	}
	tests := []struct {
		name  string
		files []testimage.File
	}{
		{"dotdot file", []testimage.File{f("../outside/x")}},
		{"absolute with dotdot", []testimage.File{f("/abs/../../outside/x")}},
		{"write through relative symlink dir", []testimage.File{sym("d", "../outside"), f("d/x")}},
		{"write through absolute symlink", []testimage.File{sym("evil", outside), f("evil/x")}},
		{"write through root symlink", []testimage.File{sym("r", "/"), f("r" + outside + "/x")}},
		{"hardlink to outside", []testimage.File{link("l", "../outside/secret")}},
		{"hardlink through symlink", []testimage.File{sym("s", outside), link("l", "s/secret")}},
		{"dir through symlink", []testimage.File{sym("d", outside), {Path: "d/sub/", UID: me, GID: mg}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(base, "layer-"+filepath.Base(t.Name()))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			err := unpackFiles(t, dir, tt.files)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("unpack: got %v, want ErrInvalidArgument", err)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 || ents[0].Name() != "secret" {
				t.Fatalf("outside dir changed: %v", ents)
			}
			if fi, err := os.Lstat(filepath.Join(dir, "l")); err == nil {
				t.Fatalf("hard link created: %v", fi.Mode())
			}
		})
	}
}

func TestUnpackWhiteouts(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	err := unpackFiles(t, dir, []testimage.File{
		{Path: "a/", Mode: 0o755},
		{Path: "a/.wh..wh..opq"},
		{Path: "a/keep", Content: []byte("k")},
		{Path: ".wh.gone"},
		{Path: "b/.wh.deep"},
	})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	n, err := unix.Getxattr(filepath.Join(dir, "a"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque xattr = %q, %v; want y", buf[:n], err)
	}
	for _, p := range []string{"gone", "b/deep"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 || st.Gid != 0 {
			t.Fatalf("%s: mode %o rdev %d owner %d:%d, want 0/0 char device owned by 0:0", p, st.Mode, st.Rdev, st.Uid, st.Gid)
		}
	}
	for _, p := range []string{".wh.gone", "a/.wh..wh..opq", "b/.wh.deep"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s exists: %v", p, err)
		}
	}
}

func TestUnpackKeepsMetadata(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	err := unpackFiles(t, dir, []testimage.File{
		{Path: "bin/", Mode: 0o755},
		{Path: "bin/su", Content: []byte("suid"), Mode: 0o4755, UID: 0, GID: 0},
		{Path: "bin/sg", Content: []byte("sgid"), Mode: 0o2711, UID: 1002, GID: 33},
		{Path: "tmp/", Mode: 0o1777},
		{Path: "home/u/", Mode: 0o750, UID: 1002, GID: 1002},
		{Path: "home/u/f", Content: []byte("hello"), Mode: 0o640, UID: 1002, GID: 1002,
			Xattrs: map[string]string{"user.k": "v", "trusted.t": "tv"}},
		{Path: "home/u/hard", Type: tar.TypeLink, Linkname: "home/u/f"},
		{Path: "home/u/sym", Type: tar.TypeSymlink, Linkname: "/etc/passwd", UID: 33, GID: 33},
		{Path: "dev/null", Type: tar.TypeChar, Mode: 0o666},
		{Path: "fifo", Type: tar.TypeFifo, Mode: 0o620, UID: 5, GID: 6},
	})
	if err != nil {
		t.Fatal(err)
	}
	check := func(p string, typ, perm uint32, uid, gid uint32) unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != typ || st.Mode&0o7777 != perm || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: type %o perm %o owner %d:%d; want %o %o %d:%d", p, st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid, typ, perm, uid, gid)
		}
		return st
	}
	check("bin/su", unix.S_IFREG, 0o4755, 0, 0)
	check("bin/sg", unix.S_IFREG, 0o2711, 1002, 33)
	check("tmp", unix.S_IFDIR, 0o1777, 0, 0)
	check("home/u", unix.S_IFDIR, 0o750, 1002, 1002)
	f := check("home/u/f", unix.S_IFREG, 0o640, 1002, 1002)
	h := check("home/u/hard", unix.S_IFREG, 0o640, 1002, 1002)
	if f.Ino != h.Ino || f.Nlink != 2 {
		t.Errorf("hard link: inodes %d/%d nlink %d, want same inode, 2 links", f.Ino, h.Ino, f.Nlink)
	}
	check("home/u/sym", unix.S_IFLNK, 0o777, 33, 33)
	if target, _ := os.Readlink(filepath.Join(dir, "home/u/sym")); target != "/etc/passwd" {
		t.Errorf("symlink target %q", target)
	}
	if d := check("dev/null", unix.S_IFCHR, 0o666, 0, 0); d.Rdev != 0 {
		t.Errorf("dev/null rdev %d", d.Rdev)
	}
	check("fifo", unix.S_IFIFO, 0o620, 5, 6)
	for k, want := range map[string]string{"user.k": "v", "trusted.t": "tv"} {
		buf := make([]byte, 16)
		n, err := unix.Lgetxattr(filepath.Join(dir, "home/u/f"), k, buf)
		if err != nil || string(buf[:n]) != want {
			t.Errorf("xattr %s = %q, %v; want %q", k, buf[:n], err, want)
		}
	}
	// Directory mtimes are set after their children were written.
	want := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{"home/u", "home/u/f", "bin"} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil || !fi.ModTime().Equal(want) {
			t.Errorf("%s mtime %v, %v; want %v", p, fi.ModTime(), err, want)
		}
	}
}

func TestUnpackVerifiesDigests(t *testing.T) {
	me, mg := os.Getuid(), os.Getgid()
	files := []testimage.File{{Path: "f", Content: bytes.Repeat([]byte("data"), 4096), UID: me, GID: mg}}
	blob, digest, diffID := gzLayer(t, files)
	corrupt := bytes.Clone(blob)
	corrupt[len(corrupt)/2] ^= 0xff

	tests := []struct {
		name           string
		blob           []byte
		digest, diffID string
		want           error
	}{
		{"ok", blob, digest, diffID, nil},
		{"truncated", blob[:len(blob)/2], digest, diffID, errdefs.ErrDataLoss},
		{"corrupt byte", corrupt, digest, diffID, errdefs.ErrDataLoss},
		{"wrong digest", blob, sha([]byte("x")), diffID, errdefs.ErrDataLoss},
		{"wrong diffID", blob, digest, sha([]byte("x")), errdefs.ErrDataLoss},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := UnpackLayer(bytes.NewReader(tt.blob), t.TempDir(), tt.digest, tt.diffID)
			if tt.want == nil {
				if err != nil || n != int64(len(blob)) {
					t.Fatalf("UnpackLayer = %d, %v; want %d, nil", n, err, len(blob))
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("UnpackLayer: got %v, want %v", err, tt.want)
			}
		})
	}
}

// zstdFrame is a zstd frame written by hand, as the format (RFC 8878)
// lays it out: a frame header of descriptor fhd followed by header (the
// window descriptor or content size), then plain as one raw, last block.
func zstdFrame(fhd byte, header, plain []byte) []byte {
	frame := append([]byte{0x28, 0xb5, 0x2f, 0xfd, fhd}, header...)
	bh := 1 | uint32(len(plain))<<3 // last block, raw
	frame = append(frame, byte(bh), byte(bh>>8), byte(bh>>16))
	return append(frame, plain...)
}

// A zstd layer declares the window its decoder must keep; the decoder
// allocates it before the first byte comes out. Beyond 128 MiB, what the
// zstd CLI decompresses without --memory, the layer is refused: a 57 KB
// layer declaring 512 MiB made the daemon allocate that, per layer in
// parallel.
func TestUnpackZstdWindowLimit(t *testing.T) {
	plain := testimage.TarBytes(t, []testimage.File{{Path: "f", Content: []byte("x"), UID: os.Getuid(), GID: os.Getgid()}})
	le32 := func(n uint32) []byte { return []byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)} }
	tests := []struct {
		name    string
		fhd     byte
		header  []byte
		refused bool
	}{
		// Window descriptor: exponent<<3, a window of 1<<(10+exponent).
		{"128 MiB window", 0x00, []byte{17 << 3}, false},
		{"256 MiB window", 0x00, []byte{18 << 3}, true},
		{"512 MiB window", 0x00, []byte{19 << 3}, true},
		// A single segment's window is its content size (4 bytes here).
		{"single segment of 256 MiB", 0x20 | 0x80, le32(256 << 20), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := UnpackLayer(bytes.NewReader(zstdFrame(tc.fhd, tc.header, plain)), t.TempDir(), "", "")
			switch {
			case !tc.refused && err != nil:
				t.Fatalf("UnpackLayer: %v", err)
			case tc.refused && (!errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "128 MiB")):
				t.Fatalf("UnpackLayer = %v, want NotImplemented naming the 128 MiB limit", err)
			}
		})
	}
}
