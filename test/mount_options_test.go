package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestMountOptions sends volumes the way kubelet 1.37 does with a pod's
// volumeMounts[].bindMountOptions (CRI Mount.mount_options) and checks
// that runc really applies them: the same host directory is mounted twice,
// once plain and once with the options, and only the plain one runs a
// script or opens a device node from it.
func TestMountOptions(t *testing.T) {
	e := newCtrEnv(t)
	resp, err := e.d.Runtime.Status(Ctx(t), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetFeatures().GetMountOptions() {
		t.Errorf("Status features %v: want mount_options, every advertised handler applies them", resp.GetFeatures())
	}
	t.Run("Pod", func(t *testing.T) { e.testMountOptions(t, false) })
	t.Run("UsernsPod", func(t *testing.T) { e.testMountOptions(t, true) })
	t.Run("BadOption", e.testBadMountOption)
}

// fillVolume puts in dir an executable script, run.sh, and (when dev) a
// character device with /dev/null's numbers, which the container's device
// rules allow: only a nodev mount keeps it shut.
func fillVolume(t *testing.T, dir string, dev bool) {
	t.Helper()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if dev {
		if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
}

// ctrMountOptions is the per-mount option field of target's line in the
// container's own mountinfo.
func (e *ctrEnv) ctrMountOptions(t *testing.T, id, target string) []string {
	t.Helper()
	for _, l := range strings.Split(e.mustExec(t, id, "cat", "/proc/self/mountinfo"), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == target {
			return strings.Split(f[5], ",")
		}
	}
	t.Fatalf("%s is not a mount point in container %s", target, id)
	return nil
}

func hasAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

func (e *ctrEnv) testMountOptions(t *testing.T, userns bool) {
	podCfg := PodConfig("mountopts")
	if userns {
		podCfg = UsernsPod(PodConfig("mountopts-userns"), 0)
	}
	// The volume's source must not have the flags already; a bind keeps
	// them. A tmpfs /tmp is often nodev and nosuid: then the device node
	// is not tried, nor is it in a userns pod, where the exec test does.
	dir := t.TempDir()
	var src unix.Statfs_t
	if err := unix.Statfs(dir, &src); err != nil {
		t.Fatal(err)
	}
	if src.Flags&unix.ST_NOEXEC != 0 {
		t.Skipf("%s is on a noexec mount: nothing to compare a noexec volume with", dir)
	}
	srcHas := map[string]bool{"nodev": src.Flags&unix.ST_NODEV != 0, "nosuid": src.Flags&unix.ST_NOSUID != 0}
	dev := !userns && !srcHas["nodev"]
	fillVolume(t, dir, dev)
	pod, podCfg := e.pod(t, podCfg)
	all := []string{"noexec", "nodev", "nosuid"}
	cfg := e.ctr("c", "sleep", "1000")
	cfg.Mounts = []*runtimeapi.Mount{
		{HostPath: dir, ContainerPath: "/plain"},
		{HostPath: dir, ContainerPath: "/opts", MountOptions: all},
		{HostPath: dir, ContainerPath: "/ro-opts", Readonly: true, MountOptions: []string{"noexec"}},
	}
	id := e.run(t, pod, podCfg, cfg)

	if out, code := e.exec(t, id, "sh", "-c", "/plain/run.sh"); code != 0 || strings.TrimSpace(out) != "ran" {
		t.Errorf("the script on the plain volume: exit %d %q, want it to run", code, out)
	}
	for _, v := range []string{"/opts", "/ro-opts"} {
		if out, code := e.exec(t, id, "sh", "-c", v+"/run.sh"); code != 126 || !strings.Contains(out, "Permission denied") {
			t.Errorf("the script on %s (noexec): exit %d %q, want 126 Permission denied", v, code, out)
		}
	}
	if dev {
		if out, code := e.exec(t, id, "sh", "-c", "echo x > /plain/null"); code != 0 {
			t.Errorf("the device node on the plain volume: exit %d %q, want it to open", code, out)
		}
		if out, code := e.exec(t, id, "sh", "-c", "echo x > /opts/null"); code == 0 || !strings.Contains(out, "Permission denied") {
			t.Errorf("the device node on the nodev volume: exit %d %q, want Permission denied", code, out)
		}
	}
	got := e.ctrMountOptions(t, id, "/plain")
	for _, o := range all {
		if hasAll(got, o) && !srcHas[o] {
			t.Errorf("/plain has %v: %s was not asked for, nor has the source it", got, o)
		}
	}
	if got := e.ctrMountOptions(t, id, "/opts"); !hasAll(got, append([]string{"rw"}, all...)...) {
		t.Errorf("/opts has %v, want rw and %v", got, all)
	}
	if got := e.ctrMountOptions(t, id, "/ro-opts"); !hasAll(got, "ro", "noexec") || hasAll(got, "nodev") != srcHas["nodev"] {
		t.Errorf("/ro-opts has %v, want ro and noexec, and nodev only from the source", got)
	}
	st := e.status(t, id)
	if len(st.Mounts) != 3 || len(st.Mounts[0].MountOptions) != 0 || strings.Join(st.Mounts[1].MountOptions, ",") != "noexec,nodev,nosuid" {
		t.Errorf("status mounts %v, want the options as asked", st.Mounts)
	}
}

func (e *ctrEnv) testBadMountOption(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("mountopts-bad"))
	for _, tc := range []struct {
		name string
		m    *runtimeapi.Mount
		msg  string
	}{
		{"rw over read-only", &runtimeapi.Mount{HostPath: t.TempDir(), ContainerPath: "/vol", Readonly: true, MountOptions: []string{"noexec", "rw"}}, `mount /vol: mount option "rw" is not allowed`},
		{"propagation", &runtimeapi.Mount{HostPath: t.TempDir(), ContainerPath: "/shared", MountOptions: []string{"rshared"}}, `mount /shared: mount option "rshared" is not allowed`},
		{"suid", &runtimeapi.Mount{HostPath: t.TempDir(), ContainerPath: "/s", MountOptions: []string{"suid"}}, `mount /s: mount option "suid" is not allowed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.ctr("bad", "true")
			cfg.Mounts = []*runtimeapi.Mount{tc.m}
			_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			wantCode(t, err, codes.InvalidArgument, tc.msg)
			list, err := e.d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
			if err != nil || len(list.Containers) != 0 {
				t.Errorf("containers in the pod after the refusal: %v, %v; want none", list.GetContainers(), err)
			}
			if left := e.containerLeftovers(); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}
