package server

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/sandbox"
)

// The VOLUMEs an image declares get a mount only where its rootfs has
// nothing, resolved inside the rootfs: a symlink cannot make one look
// missing or present from the host's side.
func TestDeclaredVolumes(t *testing.T) {
	rootfs, dir := t.TempDir(), t.TempDir()
	for _, d := range []string{"etc", "var"} {
		if err := os.Mkdir(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "afile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Absolute symlinks resolve inside the rootfs: /var/run to a /run the
	// rootfs lacks, /conf to its /etc, /escape to the host's /tmp.
	for link, target := range map[string]string{"var/run": "/run", "conf": "/etc", "escape": "../../../../../tmp"} {
		if err := os.Symlink(target, filepath.Join(rootfs, link)); err != nil {
			t.Fatal(err)
		}
	}
	declared := map[string]struct{}{}
	for _, v := range []string{"/data", "data/", "/etc", "/conf", "/var/run/app", "/afile/sub", "/escape/x", "/proc/x", "/sys", "/dev/shm/x", "/", "/kube/sub", "/kube"} {
		declared[v] = struct{}{}
	}
	requested := []sandbox.ContainerMount{{ContainerPath: "/kube", HostPath: "/srv"}}
	mounts, err := declaredVolumes(rootfs, dir, declared, requested)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, m := range mounts {
		got = append(got, m.ContainerPath)
		if want := filepath.Join(dir, declaredVolumesDir, fmt.Sprint(i)); m.HostPath != want {
			t.Errorf("mount %s from %s, want %s", m.ContainerPath, m.HostPath, want)
		}
		if fi, err := os.Stat(m.HostPath); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
			t.Errorf("volume directory %s: %v %v", m.HostPath, fi, err)
		}
	}
	if want := []string{"/data", "/escape/x", "/var/run/app"}; !slices.Equal(got, want) {
		t.Errorf("declared volumes mounted at %q, want %q", got, want)
	}

	many := map[string]struct{}{}
	for i := range maxDeclaredVolumes + 1 {
		many[fmt.Sprintf("/v%d", i)] = struct{}{}
	}
	if _, err := declaredVolumes(rootfs, t.TempDir(), many, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("an image with %d volumes: %v, want InvalidArgument", len(many), err)
	}
}
