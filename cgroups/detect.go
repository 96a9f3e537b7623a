package cgroups

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Mode is how the host mounts its cgroup hierarchies.
type Mode int

const (
	// Legacy is cgroup v1 only: every controller in its own hierarchy.
	Legacy Mode = iota
	// Hybrid is v1 controllers with a v2 hierarchy (no controllers) on
	// /sys/fs/cgroup/unified, systemd's old default.
	Hybrid
	// Unified is cgroup v2 only, what current distributions and kubelet
	// expect.
	Unified
)

func (m Mode) String() string {
	switch m {
	case Unified:
		return "unified (v2)"
	case Hybrid:
		return "hybrid (v1 + v2)"
	default:
		return "legacy (v1)"
	}
}

// Root is where the cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Detect reports the host's cgroup mode from the filesystem types mounted
// at Root and Root/unified, the way runc and systemd tell them apart.
func Detect() Mode {
	return detect(Root, fsType)
}

func detect(root string, fstype func(string) (int64, error)) Mode {
	if t, err := fstype(root); err == nil && t == unix.CGROUP2_SUPER_MAGIC {
		return Unified
	}
	if t, err := fstype(root + "/unified"); err == nil && t == unix.CGROUP2_SUPER_MAGIC {
		return Hybrid
	}
	return Legacy
}

func fsType(p string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0, err
	}
	return int64(st.Type), nil //nolint:unconvert // Statfs_t.Type is int32 on some arches.
}

// V2Controllers are the controllers a child of dir may use on cgroup v2:
// those listed in dir's cgroup.subtree_control, or, when that is empty
// (the root before anything delegated), in cgroup.controllers. A
// controller missing here cannot be limited in containers placed below
// dir, and spec generation drops its settings rather than letting runc fail.
func V2Controllers(dir string) map[string]bool {
	for _, f := range []string{"cgroup.subtree_control", "cgroup.controllers"} {
		b, err := os.ReadFile(dir + "/" + f)
		if err != nil {
			continue
		}
		if out := parseControllers(string(b)); len(out) > 0 {
			return out
		}
	}
	return map[string]bool{}
}

func parseControllers(s string) map[string]bool {
	out := map[string]bool{}
	for _, c := range strings.Fields(s) {
		out[c] = true
	}
	return out
}
