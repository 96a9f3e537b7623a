package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/pinrt/pinrt/test/testimage"
)

// TestMountManyLayers mounts an image of 127 layers, Docker's most, as a
// rootfs and as an image volume: with the new mount API, and as a kernel
// before 6.8 does it, without "lowerdir+", where mount(2)'s one page of
// options holds about 40 of this store's layer paths, and 23 of a pod's
// idmapped ones. The short names the older path gives the layers must
// still tell, after a restart, which layers and which idmapped tree are
// in use.
func TestMountManyLayers(t *testing.T) {
	requireRoot(t)
	const extra = 126 // on top of the busybox base layer
	spec := testimage.Spec{}
	for i := range extra {
		spec.Layers = append(spec.Layers, []testimage.File{
			{Path: fmt.Sprintf("layer/%d", i), Content: []byte(fmt.Sprint(i))},
			{Path: "top", Content: []byte(fmt.Sprint(i))},
		})
	}
	built := testimage.Build(t, spec)
	reg := testimage.StartRegistry(t)
	reg.Push(t, "many:1", built)
	for _, plus := range []bool{true, false} {
		for _, userns := range []bool{false, true} {
			t.Run(fmt.Sprintf("lowerdirPlus=%v/userns=%v", plus, userns), func(t *testing.T) {
				defer func(old bool) { lowerdirPlus = old }(lowerdirPlus)
				lowerdirPlus = plus
				testMountManyLayers(t, reg.Ref("many:1"), extra, userns)
			})
		}
	}
}

func testMountManyLayers(t *testing.T, ref string, extra int, userns bool) {
	s := newTestStore(t, Options{})
	ctx := context.Background()
	img, err := s.Pull(ctx, ref, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.ChainIDs) != extra+1 {
		t.Fatalf("%d layers, want %d", len(img.ChainIDs), extra+1)
	}
	d1, d2 := t.TempDir(), t.TempDir()
	req := MountRequest{ContainerID: "c1", PodID: "p", ImageID: img.ID, Dir: d1}
	if userns {
		req.UsernsPath, req.RootUID, req.RootGID = pinUserns(t, 320000), 320000, 320000
	}
	t.Cleanup(func() {
		s.UnmountRootfs(ctx, "c1", "p", d1)
		s.UnmountRootfs(ctx, "c2", "p", d2)
		s.ReleasePod(ctx, "p")
	})
	rootfs, err := s.MountRootfs(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	vol, err := s.MountImageVolume(ctx, VolumeRequest{ContainerID: "c1", PodID: "p", ImageID: img.ID, Dir: d1, UsernsPath: req.UsernsPath})
	if err != nil {
		t.Fatal(err)
	}
	req2 := req
	req2.ContainerID, req2.Dir = "c2", d2
	if _, err := s.MountRootfs(ctx, req2); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{rootfs, vol} {
		if b, err := os.ReadFile(filepath.Join(root, "top")); err != nil || string(b) != fmt.Sprint(extra-1) {
			t.Errorf("%s/top: %q, %v; want the top layer's %d", root, b, err, extra-1)
		}
		for _, i := range []int{0, extra / 2, extra - 1} {
			if b, err := os.ReadFile(filepath.Join(root, "layer", fmt.Sprint(i))); err != nil || string(b) != fmt.Sprint(i) {
				t.Errorf("%s/layer/%d: %q, %v", root, i, b, err)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "bin/busybox")); err != nil {
			t.Errorf("the bottom layer through %s: %v", root, err)
		}
		if got := mountedChainIDs(root); !slices.Equal(got, img.ChainIDs) {
			t.Errorf("the layers the mount table gives %s: %d, want the image's %d", root, len(got), len(img.ChainIDs))
		}
	}
	// Without lowerdir+, the layers are mounted by their short names.
	if ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(rootfs)); err != nil || len(ms) != 1 {
		t.Errorf("the rootfs mount: %v, %v", ms, err)
	} else if short := strings.Contains(ms[0].VFSOptions, "lowerdir=0:1:"); short == lowerdirPlus {
		t.Errorf("the rootfs is mounted with %.80s..., with lowerdir+ %v", ms[0].VFSOptions, lowerdirPlus)
	}
	if userns {
		if got := owner(t, filepath.Join(rootfs, "top")); got != "320000:320000" {
			t.Errorf("top owned by %s through the rootfs, want the pod's root 320000:320000", got)
		}
	}

	// A restart: only the mount table knows what is mounted.
	s2 := newTestStore(t, Options{Root: s.Root()})
	if err := s2.UnmountRootfs(ctx, "c2", "p", d2); err != nil {
		t.Fatal(err)
	}
	if ms := idmappedMounts(t, s.Root()); userns && len(ms) != 1 {
		t.Fatalf("idmapped tree dropped while c1 uses it: %v", ms)
	}
	if err := s2.Remove(ctx, img.ID); err != nil {
		t.Fatal(err)
	}
	if err := s2.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	if names, err := dirNames(s2.path("layers")); err != nil || len(names) != extra+1 {
		t.Fatalf("layers under a mounted rootfs after the image's removal and a collection: %d, %v; want %d", len(names), err, extra+1)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "layer/0")); err != nil || string(b) != "0" {
		t.Errorf("the rootfs after a collection: %q, %v", b, err)
	}
	if err := s2.UnmountRootfs(ctx, "c1", "p", d1); err != nil {
		t.Fatal(err)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 0 {
		t.Fatalf("idmapped mounts %v after the last unmount", ms)
	}
	if err := s2.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	if names, err := dirNames(s2.path("layers")); err != nil || len(names) != 0 {
		t.Errorf("layers after the last unmount and a collection: %d, %v", len(names), err)
	}
}
