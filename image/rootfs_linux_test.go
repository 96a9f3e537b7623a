package image

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/pinrt/pinrt/test/testimage"
	"golang.org/x/sys/unix"
)

// pinUserns creates a user namespace mapping 0..65535 to hostBase.. and
// pins it to a file, as nsmgr does for a pod.
func pinUserns(t testing.TB, hostBase int) string {
	t.Helper()
	cmd := exec.Command(testimage.BusyboxPath, "sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostBase, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostBase, Size: 65536}},
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start userns helper: %v", err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	pin := filepath.Join(t.TempDir(), "userns")
	if err := os.WriteFile(pin, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), pin, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("pin userns: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(pin, unix.MNT_DETACH) })
	return pin
}

// idmappedMounts lists the idmapped mounts below dir.
func idmappedMounts(t testing.TB, dir string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if strings.Contains(","+m.Options+",", ",idmapped,") {
			out = append(out, m.Mountpoint)
		}
	}
	return out
}

func owner(t testing.TB, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", st.Uid, st.Gid)
}

func pullTestImage(t testing.TB, s *Store) *Image {
	t.Helper()
	reg := testimage.StartRegistry(t)
	img := testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{
		{{Path: "srv/", Mode: 0o755, UID: 33, GID: 33}, {Path: "srv/data", Content: []byte("d"), UID: 33, GID: 1002}},
	}})
	reg.Push(t, "rootfs:1", img)
	got, err := s.Pull(context.Background(), reg.Ref("rootfs:1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestMountRootfsUserns(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullTestImage(t, s)
	ctx := context.Background()
	const base = 200000
	userns := pinUserns(t, base)
	dirs := map[string]string{"c1": t.TempDir(), "c2": t.TempDir()}
	t.Cleanup(func() {
		for c, d := range dirs {
			s.UnmountRootfs(ctx, c, "pod1", d)
		}
		s.ReleasePod(ctx, "pod1")
	})

	for _, c := range []string{"c1", "c2", "c1"} { // c1 twice: idempotent
		req := MountRequest{ContainerID: c, PodID: "pod1", ImageID: img.ID, Dir: dirs[c],
			UsernsPath: userns, RootUID: base, RootGID: base}
		rootfs, err := s.MountRootfs(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if rootfs != filepath.Join(dirs[c], "rootfs") {
			t.Fatalf("rootfs %s", rootfs)
		}
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 1 || ms[0] != s.path("idmapped", "pod1") {
		t.Fatalf("idmapped mounts %v, want exactly %s", ms, s.path("idmapped", "pod1"))
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(filepath.Join(dirs["c1"], "rootfs"))); len(ms) != 1 {
		t.Fatalf("c1 rootfs mounted %d times, want 1", len(ms))
	}
	rootfs := filepath.Join(dirs["c1"], "rootfs")
	top := s.layerPath(img.ChainIDs[len(img.ChainIDs)-1])
	bottom := s.layerPath(img.ChainIDs[0])
	for _, tt := range []struct{ host, mapped, hostOwner, mappedOwner string }{
		{filepath.Join(bottom, "bin/busybox"), filepath.Join(rootfs, "bin/busybox"), "0:0", "200000:200000"},
		{filepath.Join(bottom, "home/user1002"), filepath.Join(rootfs, "home/user1002"), "1002:1002", "201002:201002"},
		{filepath.Join(top, "srv/data"), filepath.Join(rootfs, "srv/data"), "33:1002", "200033:201002"},
		{filepath.Join(dirs["c1"], "upper"), filepath.Join(dirs["c1"], "work"), "200000:200000", "200000:200000"},
	} {
		if got := owner(t, tt.host); got != tt.hostOwner {
			t.Errorf("%s owned by %s on the host layer, want %s", tt.host, got, tt.hostOwner)
		}
		if got := owner(t, tt.mapped); got != tt.mappedOwner {
			t.Errorf("%s owned by %s through the rootfs, want %s", tt.mapped, got, tt.mappedOwner)
		}
	}
	// Writes land in the container's upper dir, and Usage sees them.
	if err := os.WriteFile(filepath.Join(rootfs, "srv/new"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, n, err := s.Usage(dirs["c1"]); err != nil || b < 1<<20 || n < 3 {
		t.Fatalf("Usage = %d bytes %d inodes, %v; want >= 1 MiB, >= 3 inodes", b, n, err)
	}
	if _, err := os.Stat(filepath.Join(top, "srv/new")); !os.IsNotExist(err) {
		t.Fatalf("write reached the shared layer: %v", err)
	}

	if err := s.UnmountRootfs(ctx, "c1", "pod1", dirs["c1"]); err != nil {
		t.Fatal(err)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 1 {
		t.Fatalf("idmapped mounts after first unmount: %v, want 1", ms)
	}
	if err := s.UnmountRootfs(ctx, "c2", "pod1", dirs["c2"]); err != nil {
		t.Fatal(err)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 0 {
		t.Fatalf("idmapped mounts after last unmount: %v, want none", ms)
	}
	if _, err := os.Stat(s.path("idmapped", "pod1")); !os.IsNotExist(err) {
		t.Fatalf("idmapped dir left: %v", err)
	}
	// Idempotent.
	if err := s.UnmountRootfs(ctx, "c2", "pod1", dirs["c2"]); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePod(ctx, "pod1"); err != nil {
		t.Fatal(err)
	}
}

// After a restart the in-memory bookkeeping is empty; the idmapped tree
// must still stay while a container's overlay uses it.
func TestUnmountAfterRestartKeepsTreeInUse(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullTestImage(t, s)
	ctx := context.Background()
	userns := pinUserns(t, 300000)
	d1, d2 := t.TempDir(), t.TempDir()
	t.Cleanup(func() {
		s.UnmountRootfs(ctx, "c1", "p", d1)
		s.UnmountRootfs(ctx, "c2", "p", d2)
		s.ReleasePod(ctx, "p")
	})
	for c, d := range map[string]string{"c1": d1, "c2": d2} {
		if _, err := s.MountRootfs(ctx, MountRequest{ContainerID: c, PodID: "p", ImageID: img.ID, Dir: d, UsernsPath: userns, RootUID: 300000, RootGID: 300000}); err != nil {
			t.Fatal(err)
		}
	}
	s2 := newTestStore(t, Options{Root: s.Root()})
	if err := s2.UnmountRootfs(ctx, "c1", "p", d1); err != nil {
		t.Fatal(err)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 1 {
		t.Fatalf("idmapped tree dropped while c2 uses it: %v", ms)
	}
	if err := s2.UnmountRootfs(ctx, "c2", "p", d2); err != nil {
		t.Fatal(err)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 0 {
		t.Fatalf("idmapped mounts %v after last unmount", ms)
	}
}

func TestMountRootfsNoUserns(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullTestImage(t, s)
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() { s.UnmountRootfs(ctx, "c", "", dir) })
	rootfs, err := s.MountRootfs(ctx, MountRequest{ContainerID: "c", ImageID: img.ID, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := owner(t, filepath.Join(rootfs, "home/user1002")); got != "1002:1002" {
		t.Fatalf("owner %s", got)
	}
	// Volatile: unmounting it commits no journal (see mountOverlay). The
	// kernel shows "volatile", or "fsync=volatile" since 6.x.
	if ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(rootfs)); err != nil || len(ms) != 1 {
		t.Errorf("the rootfs mount: %v, %v", ms, err)
	} else if o := "," + ms[0].VFSOptions + ","; !strings.Contains(o, ",volatile,") && !strings.Contains(o, ",fsync=volatile,") {
		t.Errorf("the rootfs is mounted %s, want a volatile upper", ms[0].VFSOptions)
	}
	if ms := idmappedMounts(t, s.Root()); len(ms) != 0 {
		t.Fatalf("idmapped mounts %v without userns", ms)
	}
	// A mounted layer survives removal of its image.
	if err := s.Remove(context.Background(), img.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "srv/data")); err != nil {
		t.Fatalf("rootfs broken after image removal: %v", err)
	}
	if err := s.UnmountRootfs(ctx, "c", "", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MountRootfs(ctx, MountRequest{ContainerID: "../x", ImageID: img.ID, Dir: dir}); err == nil {
		t.Fatal("bad container ID accepted")
	}
}

// After a restart nothing has told the store which containers of a
// stopped pod still have their rootfs mounted: the kernel's mount table
// does. A collection (at start, or a Remove of the image) keeps their
// layers, read through layers/ or a pod's idmapped view, and collects
// them once the last overlay is gone.
func TestCollectKeepsMountedLayersAfterRestart(t *testing.T) {
	requireRoot(t)
	for _, userns := range []bool{false, true} {
		t.Run(fmt.Sprintf("userns=%v", userns), func(t *testing.T) {
			s := newTestStore(t, Options{})
			img := pullTestImage(t, s)
			ctx := context.Background()
			dir := t.TempDir()
			req := MountRequest{ContainerID: "c", PodID: "p", ImageID: img.ID, Dir: dir}
			if userns {
				req.UsernsPath, req.RootUID, req.RootGID = pinUserns(t, 310000), 310000, 310000
			}
			t.Cleanup(func() {
				s.UnmountRootfs(ctx, "c", "p", dir)
				s.ReleasePod(ctx, "p")
			})
			rootfs, err := s.MountRootfs(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			s2 := newTestStore(t, Options{Root: s.Root()})
			if err := s2.Remove(ctx, img.ID); err != nil {
				t.Fatal(err)
			}
			if err := s2.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			for _, c := range img.ChainIDs {
				if _, err := os.Stat(s2.layerPath(c)); err != nil {
					t.Errorf("layer %s under a mounted rootfs, after the image's removal and a collection: %v", c, err)
				}
			}
			if b, err := os.ReadFile(filepath.Join(rootfs, "srv/data")); err != nil || string(b) != "d" {
				t.Errorf("the rootfs after a collection: %q, %v", b, err)
			}
			if err := s2.UnmountRootfs(ctx, "c", "p", dir); err != nil {
				t.Fatal(err)
			}
			if err := s2.ReleasePod(ctx, "p"); err != nil {
				t.Fatal(err)
			}
			if err := s2.Collect(ctx); err != nil {
				t.Fatal(err)
			}
			for _, sub := range []string{"layers", "blobs/sha256", "tmp"} {
				if names, err := dirNames(s2.path(sub)); err != nil || len(names) != 0 {
					t.Errorf("%s after the last unmount and a collection: %v, %v", sub, names, err)
				}
			}
		})
	}
}

// TestMountRootfsAgainAfterUnmount: a rootfs unmounted behind the store's
// back (by hand, or a mount namespace that lost it) while its pod is
// Ready is mounted again by the restore with its writable layer whole,
// although the kernel refuses a volatile layer's second mount until its
// incompat/volatile marker goes.
func TestMountRootfsAgainAfterUnmount(t *testing.T) {
	requireRoot(t)
	s := newTestStore(t, Options{})
	img := pullTestImage(t, s)
	ctx := context.Background()
	dir := t.TempDir()
	t.Cleanup(func() { s.UnmountRootfs(ctx, "c", "", dir) })
	req := MountRequest{ContainerID: "c", ImageID: img.ID, Dir: dir}
	rootfs, err := s.MountRootfs(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "written"), []byte("by the container"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(rootfs, 0); err != nil {
		t.Fatal(err)
	}
	s2 := newTestStore(t, Options{Root: s.Root()})
	if _, err := s2.MountRootfs(ctx, req); err != nil {
		t.Fatalf("mounting a volatile rootfs again: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "written")); err != nil || string(b) != "by the container" {
		t.Errorf("the writable layer after the second mount: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "srv/data")); err != nil {
		t.Errorf("the image's files after the second mount: %v", err)
	}
	if err := s2.UnmountRootfs(ctx, "c", "", dir); err != nil {
		t.Fatal(err)
	}
}
