package image

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/test/testimage"
)

func pullVolumeImage(t testing.TB, s *Store) *Image {
	t.Helper()
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{NoBusybox: true, Layers: [][]testimage.File{
		{{Path: "data/", Mode: 0o755}, {Path: "data/a", Content: []byte("a1"), UID: 33, GID: 33}},
		{
			{Path: "data/b", Content: []byte("b2")}, {Path: "etc/", Mode: 0o755}, {Path: "etc/conf", Content: []byte("c")},
			{Path: "data/abs", Type: tar.TypeSymlink, Linkname: "/etc"},
			{Path: "data/up", Type: tar.TypeSymlink, Linkname: "../../../../../etc"},
		},
	}})
	reg.Push(t, "vol:1", img)
	got, err := s.Pull(context.Background(), reg.Ref("vol:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestMountImageVolume(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullVolumeImage(t, s)
	ctx := context.Background()
	const base = 400000
	userns := pinUserns(t, base)
	dir := t.TempDir()
	t.Cleanup(func() {
		s.UnmountRootfs(ctx, "c1", "pod1", dir)
		s.ReleasePod(ctx, "pod1")
	})
	vol := func(i int, sub string) (string, error) {
		return s.MountImageVolume(ctx, VolumeRequest{ContainerID: "c1", PodID: "pod1", Index: i, ImageID: img.ID, Dir: dir, SubPath: sub, UsernsPath: userns})
	}
	mnt := filepath.Join(dir, "volumes", "0", "mnt")
	tests := []struct {
		name    string
		index   int
		sub     string
		want    string
		wantErr error
	}{
		{"whole image", 0, "", mnt, nil},
		{"again is a no-op", 0, "", mnt, nil},
		{"dot is the root", 0, ".", mnt, nil},
		{"sub directory", 1, "data", filepath.Join(dir, "volumes/1/mnt/data"), nil},
		{"sub file from the lower layer", 2, "data/a", filepath.Join(dir, "volumes/2/mnt/data/a"), nil},
		{"absolute symlink stays inside", 3, "data/abs", filepath.Join(dir, "volumes/3/mnt/etc"), nil},
		{"climbing symlink stays inside", 4, "data/up/conf", filepath.Join(dir, "volumes/4/mnt/etc/conf"), nil},
		{"absent", 5, "data/nope", "", errdefs.ErrNotFound},
		{"through a file", 6, "data/a/x", "", errdefs.ErrNotFound},
		{"absolute", 7, "/data", "", errdefs.ErrInvalidArgument},
		{"escapes", 8, "data/../../x", "", errdefs.ErrInvalidArgument},
		{"negative index", -1, "", "", errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := vol(tc.index, tc.sub)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("MountImageVolume(%q) = %q, %v; want %v", tc.sub, got, err, tc.wantErr)
				}
				if ok, _ := mountinfo.Mounted(filepath.Join(dir, "volumes", "5", "mnt")); tc.index == 5 && ok {
					t.Error("failed volume left mounted")
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("MountImageVolume(%q) = %q, %v; want %q", tc.sub, got, err, tc.want)
			}
		})
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(mnt)); len(ms) != 1 {
		t.Fatalf("volume 0 mounted %d times, want once", len(ms))
	} else if m := ms[0]; m.FSType != "overlay" || !hasOpt(m.Options, "ro") || !hasOpt(m.Options, "nosuid") || !hasOpt(m.Options, "nodev") {
		t.Errorf("volume mount %s options %q, want a ro,nosuid,nodev overlay", m.FSType, m.Options)
	}
	// Owners are mapped into the pod's user namespace, as in the rootfs.
	if got := owner(t, filepath.Join(mnt, "data/a")); got != "400033:400033" {
		t.Errorf("data/a owned by %s, want 400033:400033", got)
	}
	if got := owner(t, filepath.Join(mnt, "data/b")); got != "400000:400000" {
		t.Errorf("data/b owned by %s, want 400000:400000", got)
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "data/b")); string(b) != "b2" {
		t.Errorf("data/b = %q, want the upper layer's content", b)
	}
	if err := os.WriteFile(filepath.Join(mnt, "data/new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the volume: %v, want EROFS", err)
	}
	// In use: removing the image keeps the layers the volume shows.
	if err := s.Remove(context.Background(), img.ID); err != nil {
		t.Fatal(err)
	}
	for _, c := range img.ChainIDs {
		if _, err := os.Stat(s.layerPath(c)); err != nil {
			t.Errorf("layer %s of a mounted volume removed with its image: %v", c, err)
		}
	}
	if err := s.UnmountRootfs(ctx, "c1", "pod1", dir); err != nil {
		t.Fatal(err)
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(dir)); len(ms) != 0 {
		t.Errorf("mounts left under the container dir: %v", ms)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 0 {
		t.Errorf("idmapped mounts left: %v", ms)
	}
	if len(s.mounted) != 0 {
		t.Errorf("bookkeeping left: %v", s.mounted)
	}
	// Unused now, a second Remove's GC drops the layers.
	if _, err := s.collect(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range img.ChainIDs {
		if _, err := os.Stat(s.layerPath(c)); !os.IsNotExist(err) {
			t.Errorf("layer %s kept after its volume went: %v", c, err)
		}
	}
	if _, err := vol(0, ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("volume of a removed image: %v, want NotFound", err)
	}
}

func TestMountImageVolumeNoUserns(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullVolumeImage(t, s)
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() { s.UnmountRootfs(ctx, "c", "", dir) })
	src, err := s.MountImageVolume(ctx, VolumeRequest{ContainerID: "c", ImageID: img.ID, Dir: dir, SubPath: "data"})
	if err != nil {
		t.Fatal(err)
	}
	if got := owner(t, filepath.Join(src, "a")); got != "33:33" {
		t.Errorf("owner %s, want the image's 33:33", got)
	}
	if err := os.Remove(filepath.Join(src, "a")); !errors.Is(err, unix.EROFS) {
		t.Errorf("remove in the volume: %v, want EROFS", err)
	}
	if idm := idmappedMounts(t, s.Root()); len(idm) != 0 {
		t.Errorf("idmapped mounts %v without userns", idm)
	}
}

func hasOpt(opts, o string) bool { return slices.Contains(strings.Split(opts, ","), o) }

// After a restart the index may no longer hold the image of a live
// rootfs or volume; mounting again must still record their layers from
// the mount table, or the next Remove deletes them under the container.
func TestRemountAfterRestartWithoutImage(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullVolumeImage(t, s)
	other := pullTestImage(t, s)
	ctx := context.Background()
	userns := pinUserns(t, 500000)
	dir := t.TempDir()
	t.Cleanup(func() {
		s.UnmountRootfs(ctx, "c", "p", dir)
		s.ReleasePod(ctx, "p")
	})
	if _, err := s.MountRootfs(ctx, MountRequest{ContainerID: "c", PodID: "p", ImageID: other.ID, Dir: dir, UsernsPath: userns, RootUID: 500000, RootGID: 500000}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MountImageVolume(ctx, VolumeRequest{ContainerID: "c", PodID: "p", ImageID: img.ID, Dir: dir, SubPath: "data", UsernsPath: userns}); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(context.Background(), img.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(context.Background(), other.ID); err != nil {
		t.Fatal(err)
	}

	s2 := newTestStore(t, Options{Root: s.Root()})
	if _, err := s2.MountRootfs(ctx, MountRequest{ContainerID: "c", PodID: "p", ImageID: other.ID, Dir: dir, UsernsPath: userns, RootUID: 500000, RootGID: 500000}); err != nil {
		t.Fatalf("remount rootfs of a removed image: %v", err)
	}
	src, err := s2.MountImageVolume(ctx, VolumeRequest{ContainerID: "c", PodID: "p", ImageID: img.ID, Dir: dir, SubPath: "data", UsernsPath: userns})
	if err != nil || src != filepath.Join(dir, "volumes/0/mnt/data") {
		t.Fatalf("remount volume of a removed image = %q, %v", src, err)
	}
	if _, err := s2.collect(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(append([]string(nil), img.ChainIDs...), other.ChainIDs...) {
		if _, err := os.Stat(s2.layerPath(c)); err != nil {
			t.Errorf("layer %s in use deleted by GC after the restart: %v", c, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(src, "b")); err != nil || string(b) != "b2" {
		t.Errorf("volume after GC: %q, %v", b, err)
	}
	if err := s2.UnmountRootfs(ctx, "c", "p", dir); err != nil {
		t.Fatal(err)
	}
	n, err := s2.collect(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s2.path("layers")); len(ents) != 0 {
		t.Errorf("%d layers left once nothing uses them", len(ents))
	}
	// What Collect logs: the layers of both removed images, which the
	// mounts kept; their blobs went with the removals.
	if want := (gcCount{layers: len(img.ChainIDs) + len(other.ChainIDs)}); n != want {
		t.Errorf("collected %+v, want %+v", n, want)
	}
}
