package oci

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

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
	// Its delete removes its state directory as runc's does: recursively.
	rt, root, bundle := preparedRestore(t, dir, `#!/bin/sh
[ "$1" = --root ] && root=$2 && shift 2
case "$1" in
delete) shift; [ "$1" = --force ] && shift; rm -rf "$root/$1" ;;
state) echo '{"id":"c1","status":"running"}' ;;
esac
`, "c1")
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

// A `runtime restore` that outlived its conmon may still bind the rootfs
// into runc's state directory after Delete has looked; Delete waits for
// it to end first. Here the restore binds the rootfs 100 ms in and
// unmounts it when it ends, and runc's delete removes its state
// directory 300 ms in: without the wait, through the bind.
func TestDeleteWaitsForRestore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	dir := t.TempDir()
	rt, root, _ := preparedRestore(t, dir, `#!/bin/sh
[ "$1" = --root ] && root=$2 && shift 2
case "$1" in
delete) shift; [ "$1" = --force ] && shift; sleep 0.3; rm -rf "$root/$1" ;;
esac
`, "c2")
	rootfs, criuRoot := filepath.Join(dir, "rootfs"), filepath.Join(root, "c2", "criu-root")
	for _, d := range []string{filepath.Join(rootfs, "bin"), criuRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), []byte("the image's"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Its arguments are those of `runc restore ... c2`.
	restore := exec.Command("sh", "-c", `sleep 0.1; mount --bind "$2" "$3"; sleep 0.5; umount "$3"`, "restore", "restore", rootfs, criuRoot, "c2")
	if err := restore.Start(); err != nil {
		t.Fatal(err)
	}
	// Reaped as it ends: a zombie's command line is empty.
	ended := make(chan struct{})
	go func() { _ = restore.Wait(); close(ended) }()
	t.Cleanup(func() {
		_ = restore.Process.Kill()
		<-ended
		_ = unix.Unmount(criuRoot, unix.MNT_DETACH)
	})
	// Its command line reads empty until its exec has laid it out.
	waitFor(t, func() bool { return restoreRunning("c2") })
	if restoreRunning("c3") {
		t.Fatal("restoreRunning(c3) = true with only c2's restore running")
	}
	if err := rt.Delete(context.Background(), "c2", true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "bin", "busybox")); err != nil || string(b) != "the image's" {
		t.Errorf("the rootfs lost its files through a restore's criu-root: %q, %v", b, err)
	}
}

// preparedRestore is a runtime whose binary is the shell script given
// (its first argument may be --root <dir>) and a container id prepared
// for a restore, as if its conmon had been started; dir holds it all.
func preparedRestore(t *testing.T, dir, script, id string) (rt *Runtime, root, bundle string) {
	t.Helper()
	root = filepath.Join(dir, "root")
	bin := filepath.Join(dir, "fakerunc")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewRuntime(Handler{Name: "fake", Binary: bin, Root: root, MonitorPath: "/bin/true"}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	bundle = filepath.Join(dir, "bundle")
	if err := rt.Prepare(CreateOptions{ID: id, Bundle: bundle, ExitDir: filepath.Join(dir, "exits"), Spec: &specs.Spec{Process: &specs.Process{Args: []string{"sh"}}}, Restore: filepath.Join(bundle, "checkpoint")}); err != nil {
		t.Fatal(err)
	}
	// conmon was started for it.
	if err := os.WriteFile(filepath.Join(bundle, "conmon.pid"), []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	return rt, root, bundle
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

// WaitRestore adopts a restore a crash cut short once the runtime runs
// the container under that start's live conmon, waits while the restore
// is under way, and gives up at once when conmon is gone.
func TestWaitRestore(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(dir, "restored")
	bin := filepath.Join(dir, "fakerunc")
	// Running only once the restore "ends" (the flag file appears).
	script := fmt.Sprintf(`#!/bin/sh
[ "$1" = --root ] && shift 2
case "$1" in
state) if [ -e %q ]; then echo '{"id":"c1","pid":4242,"status":"running"}'; else echo "container does not exist" >&2; exit 1; fi ;;
esac
`, flag)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewRuntime(Handler{Name: "fake", Binary: bin, Root: filepath.Join(dir, "root"), MonitorPath: "/bin/true"}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	prepare := func(id string, restore bool) string {
		bundle := filepath.Join(dir, id)
		o := CreateOptions{ID: id, Bundle: bundle, ExitDir: filepath.Join(dir, "exits"), Spec: &specs.Spec{Process: &specs.Process{Args: []string{"sh"}}}}
		if restore {
			o.Restore = filepath.Join(bundle, "checkpoint")
		}
		if err := rt.Prepare(o); err != nil {
			t.Fatal(err)
		}
		return bundle
	}
	bundle := prepare("c1", true)
	conmon := standInConmon(t, &record{ID: "c1", Bundle: bundle})
	// runc says running before its restore is over; the pid file
	// comes last.
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(bundle, "pidfile"), []byte("4242"), 0o644)
	}()
	if pid, ok := rt.WaitRestore(context.Background(), "c1", 30*time.Second); !ok || pid != 4242 {
		t.Errorf("WaitRestore = %d, %v; want the restored container's 4242 once it runs", pid, ok)
	}
	if _, err := os.Stat(filepath.Join(bundle, "pidfile")); err != nil {
		t.Errorf("WaitRestore adopted the container before the restore wrote its pid file: %v", err)
	}
	prepare("plain", false)
	if _, ok := rt.WaitRestore(context.Background(), "plain", 30*time.Second); ok {
		t.Error("WaitRestore adopted a container that is no restore")
	}
	// conmon gone: nothing to wait for, whatever the wait allows.
	_ = conmon.Process.Kill()
	_ = conmon.Wait()
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { _, ok := rt.WaitRestore(context.Background(), "c1", time.Hour); done <- ok }()
	select {
	case ok := <-done:
		if ok {
			t.Error("WaitRestore adopted a restore whose conmon is gone")
		}
	case <-time.After(20 * time.Second):
		t.Error("WaitRestore waits on a restore whose conmon is gone")
	}
}
