package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// asNobody runs cmd as uid and gid 65534 with no supplementary groups.
func asNobody(t *testing.T, cmd ...string) (string, error) {
	t.Helper()
	args := append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups"}, cmd...)
	out, err := exec.Command("setpriv", args...).CombinedOutput()
	return string(out), err
}

// A container's rootfs is not reachable by other host users, who could
// otherwise run its setuid binaries or read its files by knowing its ID;
// a userns container, whose runc init reaches the rootfs as the pod's
// mapped root, still starts.
func TestContainerRootfsNotReachableByOtherUsers(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux) to act as another user")
	}
	e := newCtrEnv(t)
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
				if out, err := asNobody(t, cmd...); err == nil {
					t.Errorf("another user ran %v on the rootfs:\n%s", cmd, out)
				}
			}
		})
	}
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
}
