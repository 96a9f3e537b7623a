package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// The writable layer as overlayfs leaves it: new and changed files, a
// symlink (not followed), owners kept, and whiteouts for the image's
// files the container deleted, which are listed, not archived.
func TestWriteRootfsDiff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("overlayfs whiteouts are 0/0 character devices: mknod needs root")
	}
	dir := t.TempDir()
	upper := filepath.Join(dir, "upper")
	for _, d := range []string{"etc", "var/log"} {
		if err := os.MkdirAll(filepath.Join(upper, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(upper, "var/log/app.log"), []byte("line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(upper, "var/log/app.log"), 3000100, 3000200); err != nil {
		t.Fatal(err)
	}
	// A symlink to a host file: archived as a link, never read through.
	if err := os.Symlink("/etc/shadow", filepath.Join(upper, "etc/secret")); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"etc/os-release", "bin"} {
		if err := unix.Mknod(filepath.Join(upper, w), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	deleted, err := WriteRootfsDiff(dir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/bin", "/etc/os-release"}; !reflect.DeepEqual(deleted, want) {
		t.Errorf("deleted = %v, want %v", deleted, want)
	}
	got := map[string]*tar.Header{}
	content := map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[hdr.Name], content[hdr.Name] = hdr, string(b)
	}
	for _, name := range []string{"etc/", "var/", "var/log/", "var/log/app.log", "etc/secret"} {
		if got[name] == nil {
			t.Errorf("no %s in the diff (entries %v)", name, got)
		}
	}
	if h := got["var/log/app.log"]; h != nil && (content[h.Name] != "line\n" || h.Uid != 3000100 || h.Gid != 3000200 || h.Mode&0o777 != 0o644) {
		t.Errorf("var/log/app.log: %q uid %d gid %d mode %o", content[h.Name], h.Uid, h.Gid, h.Mode)
	}
	if h := got["etc/secret"]; h != nil && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/shadow" || content[h.Name] != "") {
		t.Errorf("etc/secret: type %c link %q content %q, want the symlink alone", h.Typeflag, h.Linkname, content[h.Name])
	}
	for _, w := range []string{"etc/os-release", "bin"} {
		if got[w] != nil {
			t.Errorf("whiteout %s archived", w)
		}
	}
}

// A container with no writable layer (none made yet) has an empty diff.
func TestWriteRootfsDiffNoLayer(t *testing.T) {
	var buf bytes.Buffer
	deleted, err := WriteRootfsDiff(t.TempDir(), &buf)
	if err != nil || len(deleted) != 0 {
		t.Fatalf("deleted %v, err %v", deleted, err)
	}
	if _, err := tar.NewReader(&buf).Next(); !errors.Is(err, io.EOF) {
		t.Errorf("the diff has entries: %v", err)
	}
}

// A directory the container swapped for a symlink to a host directory
// after the walk listed what was in it: the entries under it are not
// read through it. (writeDiffEntry is what the walk calls per entry.)
func TestWriteRootfsDiffSwappedDirectory(t *testing.T) {
	dir := t.TempDir()
	upper := filepath.Join(dir, "upper")
	host := filepath.Join(dir, "host")
	for _, d := range []string{upper, host} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(host, "secret"), []byte("the host's"), 0o600); err != nil {
		t.Fatal(err)
	}
	// data was a directory holding "secret" when walked; now it leads out.
	if err := os.Symlink(host, filepath.Join(upper, "data")); err != nil {
		t.Fatal(err)
	}
	root, err := unix.Open(upper, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, rel := range []string{"data/secret", "../host/secret"} {
		if whiteout, err := writeDiffEntry(tw, root, rel); err != nil || whiteout {
			t.Errorf("%s: whiteout %v, err %v", rel, whiteout, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(buf.Bytes(), []byte("the host's")) {
		t.Error("a host file was read through a symlinked directory of the layer")
	}
	if _, err := tar.NewReader(&buf).Next(); !errors.Is(err, io.EOF) {
		t.Errorf("entries written for paths leading out of the layer: %v", err)
	}
}

// What WriteRootfsDiff took of one writable layer, ApplyRootfsDiff puts
// into another: files, owners, the symlink as a link, and a whiteout for
// every deleted file.
func TestApplyRootfsDiffRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("owners and whiteouts need root")
	}
	src := t.TempDir()
	upper := filepath.Join(src, "upper")
	if err := os.MkdirAll(filepath.Join(upper, "var/log"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "var/log/app.log"), []byte("line\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(upper, "var/log/app.log"), 1000, 2000); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(upper, "secret")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := WriteRootfsDiff(src, &buf); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := ApplyRootfsDiff(dst, &RootfsChanges{Diff: &buf, Deleted: []string{"/etc/group", "bin"}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dst, "var/log/app.log"))
	var st unix.Stat_t
	_ = unix.Lstat(filepath.Join(dst, "var/log/app.log"), &st)
	if err != nil || string(b) != "line\n" || st.Uid != 1000 || st.Gid != 2000 || st.Mode&0o777 != 0o640 {
		t.Errorf("var/log/app.log: %q %v, uid %d gid %d mode %o", b, err, st.Uid, st.Gid, st.Mode&0o777)
	}
	if l, err := os.Readlink(filepath.Join(dst, "secret")); err != nil || l != "/etc/shadow" {
		t.Errorf("secret: %q %v, want the symlink", l, err)
	}
	for _, w := range []string{"etc/group", "bin"} {
		if err := unix.Lstat(filepath.Join(dst, w), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("%s: %v, mode %o rdev %d; want an overlay whiteout", w, err, st.Mode, st.Rdev)
		}
	}
}

// A hostile archive's diff writes nothing outside the layer: not through
// "..", not through a symlink an earlier entry planted, and a deleted
// file that names no path in the rootfs is refused.
func TestApplyRootfsDiffHostile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts need root")
	}
	outside := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		deleted []string
	}{
		{"dot-dot", []*tar.Header{{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}}, nil},
		{"through a symlink", []*tar.Header{
			{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "out/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		}, nil},
		{"deleted through a symlink", []*tar.Header{{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside}}, []string{"/out/escaped"}},
		{"deleted dot-dot", nil, []string{"/../escaped"}},
		{"deleted root", nil, []string{"/"}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range tc.entries {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		layer := filepath.Join(t.TempDir(), "upper")
		if err := os.Mkdir(layer, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := ApplyRootfsDiff(layer, &RootfsChanges{Diff: &buf, Deleted: tc.deleted}); err == nil {
			t.Errorf("%s: applied", tc.name)
		}
		for _, p := range []string{filepath.Join(outside, "escaped"), filepath.Join(filepath.Dir(layer), "escaped")} {
			if _, err := os.Lstat(p); err == nil {
				t.Errorf("%s: %s was written", tc.name, p)
			}
		}
	}
}

// posixACL is a system.posix_acl_access value as the kernel stores it
// (version 2, then tag, permissions and ID per entry): rw for the owner,
// r for user uid, the group, the mask and others.
func posixACL(uid uint32) []byte {
	var b []byte
	le16 := func(v uint16) { b = append(b, byte(v), byte(v>>8)) }
	le32 := func(v uint32) { b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
	le32(2)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{{0x01, 6, ^uint32(0)}, {0x02, 4, uid}, {0x04, 4, ^uint32(0)}, {0x10, 4, ^uint32(0)}, {0x20, 4, ^uint32(0)}} {
		le16(e.tag)
		le16(e.perm)
		le32(e.id)
	}
	return b
}

// A container restored from its rootfs diff sees its rootfs as it left
// it, as overlayfs (not this package) wrote the writable layer: a
// directory of the image it replaced (rm -rf, mkdir) hides the image's
// files, which overlayfs records as an opaque directory with no
// whiteouts; and its files keep their capabilities, ACLs and user
// xattrs, also those of files copied up from the image.
func TestRootfsDiffRestoresTheView(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullTestImage(t, s)
	ctx := context.Background()
	d1, d2 := t.TempDir(), t.TempDir()
	t.Cleanup(func() {
		s.UnmountRootfs(ctx, "c1", "", d1)
		s.UnmountRootfs(ctx, "c2", "", d2)
	})
	r1, err := s.MountRootfs(ctx, MountRequest{ContainerID: "c1", ImageID: img.ID, Dir: d1})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(r1, "srv")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(r1, "srv"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r1, "srv/new"), []byte("n"), 0o755); err != nil {
		t.Fatal(err)
	}
	// CAP_NET_BIND_SERVICE, permitted and effective (VFS_CAP_REVISION_2).
	capNetBind := []byte{1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	xattrs := []struct{ path, name string }{
		{"srv/new", "security.capability"},
		{"srv/new", "user.note"},
		{"srv", "user.dir"},
		{"etc/passwd", "user.note"}, // copied up from the image
		{"etc/group", "system.posix_acl_access"},
	}
	values := map[string][]byte{"security.capability": capNetBind, "user.note": []byte("kept"), "user.dir": []byte("d"), "system.posix_acl_access": posixACL(1000)}
	for _, x := range xattrs {
		if err := unix.Setxattr(filepath.Join(r1, x.path), x.name, values[x.name], 0); err != nil {
			t.Fatalf("set %s on %s: %v", x.name, x.path, err)
		}
	}
	var buf bytes.Buffer
	deleted, err := WriteRootfsDiff(d1, &buf)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.MountRootfs(ctx, MountRequest{ContainerID: "c2", ImageID: img.ID, Dir: d2, Changes: &RootfsChanges{Diff: &buf, Deleted: deleted}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(r2, "srv/data")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("srv/data, which the container deleted with its directory, after the restore: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(r2, "srv/new")); err != nil || string(got) != "n" {
		t.Errorf("srv/new after the restore = %q, %v", got, err)
	}
	for _, x := range xattrs {
		want := make([]byte, 256)
		n, err := unix.Getxattr(filepath.Join(r1, x.path), x.name, want)
		if err != nil {
			t.Fatalf("%s of %s in the checkpointed rootfs: %v", x.name, x.path, err)
		}
		got := make([]byte, 256)
		m, err := unix.Getxattr(filepath.Join(r2, x.path), x.name, got)
		if err != nil || !bytes.Equal(got[:m], want[:n]) {
			t.Errorf("%s of %s after the restore = %x, %v; want %x", x.name, x.path, got[:max(m, 0)], err, want[:n])
		}
	}
}
