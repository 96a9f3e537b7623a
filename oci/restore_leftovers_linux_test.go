package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// An interrupted restore leaves runc's bind of the rootfs (criu-root, in
// its state directory) and CRIU's cgroup yard (in the bundle) mounted.
// runc delete removes its state directory recursively; Delete unmounts
// both first, so the rootfs under the bind keeps its files.
func TestDeleteRestoredUnmountsLeftovers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	bin := filepath.Join(dir, "fakerunc")
	// Its delete removes its state directory as runc's does: recursively.
	script := `#!/bin/sh
[ "$1" = --root ] && root=$2 && shift 2
case "$1" in
delete) shift; [ "$1" = --force ] && shift; rm -rf "$root/$1" ;;
state) echo '{"id":"c1","status":"running"}' ;;
esac
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewRuntime(Handler{Name: "fake", Binary: bin, Root: root, MonitorPath: "/bin/true"}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	if err := rt.Prepare(CreateOptions{ID: "c1", Bundle: bundle, ExitDir: filepath.Join(dir, "exits"), Spec: &specs.Spec{Process: &specs.Process{Args: []string{"sh"}}}, Restore: filepath.Join(bundle, "checkpoint")}); err != nil {
		t.Fatal(err)
	}
	// conmon was started for it.
	if err := os.WriteFile(filepath.Join(bundle, "conmon.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), []byte("the image's"), 0o755); err != nil {
		t.Fatal(err)
	}
	criuRoot := filepath.Join(root, "c1", "criu-root")
	yard := filepath.Join(bundle, ".criu.cgyard.abc123")
	for _, d := range []string{criuRoot, yard} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount(rootfs, criuRoot, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("yard", yard, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(criuRoot, unix.MNT_DETACH)
		_ = unix.Unmount(yard, unix.MNT_DETACH)
	})
	if err := rt.Delete(context.Background(), "c1", true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "bin", "busybox")); err != nil || string(b) != "the image's" {
		t.Errorf("the rootfs lost its files through runc's criu-root: %q, %v", b, err)
	}
	for _, p := range []string{criuRoot, yard} {
		if mounted(t, p) {
			t.Errorf("%s is still mounted", p)
		}
	}
}

// mounted says whether p is a mount point, from the mount table.
func mounted(t *testing.T, p string) bool {
	t.Helper()
	ok, err := mountinfo.Mounted(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return ok
}
