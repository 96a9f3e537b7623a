package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// testUser creates a system user of its own for the test (nobody, where
// useradd is missing) and returns its uid and gid.
func testUser(t *testing.T) (uid, gid string) {
	t.Helper()
	if _, err := exec.LookPath("useradd"); err != nil {
		return "65534", "65534"
	}
	name := "pe2e" + randHex(4)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/bin/false", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	for _, f := range []struct {
		flag string
		dst  *string
	}{{"-u", &uid}, {"-g", &gid}} {
		out, err := exec.Command("id", f.flag, name).Output()
		if err != nil {
			t.Fatalf("id %s %s: %v", f.flag, name, err)
		}
		*f.dst = strings.TrimSpace(string(out))
	}
	return uid, gid
}

// asUser runs cmd as uid and gid with no supplementary groups.
func asUser(uid, gid string, cmd ...string) (string, error) {
	args := append([]string{"--reuid", uid, "--regid", gid, "--clear-groups"}, cmd...)
	out, err := exec.Command("setpriv", args...).CombinedOutput()
	return string(out), err
}

// mountOptions is the per-mount option field of target's mountinfo line.
func mountOptions(t *testing.T, target string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 5 && unescapeMount(f[4]) == target {
			return f[5]
		}
	}
	t.Fatalf("%s is not a mount point", target)
	return ""
}

// A container's rootfs is not reachable by other host users, who could
// otherwise run its setuid binaries or read its files by knowing its ID,
// nor can a device node in it be opened from the host;
// a userns container, whose runc init reaches the rootfs as the pod's
// mapped root, still starts.
func TestContainerRootfsNotReachableByOtherUsers(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux) to act as another user")
	}
	e := newCtrEnv(t)
	uid, gid := testUser(t)
	for _, tc := range []struct {
		name string
		cfg  *runtimeapi.PodSandboxConfig
	}{
		{"host userns", PodConfig("rootfs-private")},
		{"pod userns", UsernsPod(PodConfig("rootfs-private-userns"), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, podCfg := e.pod(t, tc.cfg)
			id := e.run(t, pod, podCfg, e.ctr("c", "sleep", "60"))
			if out := e.mustExec(t, id, "cat", "/etc/hostname"); strings.TrimSpace(out) == "" {
				t.Errorf("exec in the container read an empty hostname")
			}
			rootfs := filepath.Join(e.d.Root, "containers", id, "rootfs")
			if _, err := os.Stat(filepath.Join(rootfs, "bin")); err != nil {
				t.Fatalf("root cannot see the rootfs either: %v", err)
			}
			for _, cmd := range [][]string{
				{"ls", rootfs},
				{"stat", filepath.Join(rootfs, "bin")},
				{"cat", filepath.Join(rootfs, "etc", "passwd")},
			} {
				if out, err := asUser(uid, gid, cmd...); err == nil {
					t.Errorf("another user (uid %s) ran %v on the rootfs:\n%s", uid, cmd, out)
				}
			}
			// No device node is usable through the host path.
			if opts := mountOptions(t, rootfs); !strings.Contains(","+opts+",", ",nodev,") {
				t.Errorf("rootfs %s is mounted %q, want nodev", rootfs, opts)
			}
		})
	}
	removeAllAndCheck(t, e.d)
}

// A container runs in a pod with the mappings the CRI conformance suite
// sends (host ID 1000, length 100000), not a 65536-aligned block.
func TestUsernsContainerWithCallerMappings(t *testing.T) {
	e := newCtrEnv(t)
	pod, podCfg := e.pod(t, usernsMapped(PodConfig("userns-critest-ctr"), 1000, 100000))
	id := e.run(t, pod, podCfg, e.ctr("c", "sleep", "60"))
	if got := strings.Fields(e.mustExec(t, id, "cat", "/proc/self/uid_map")); strings.Join(got, " ") != "0 1000 100000" {
		t.Errorf("uid_map in the container = %v, want 0 1000 100000", got)
	}
	if got := strings.TrimSpace(e.mustExec(t, id, "id", "-u")); got != "0" {
		t.Errorf("id -u = %q, want 0", got)
	}
	removeAllAndCheck(t, e.d)
}
