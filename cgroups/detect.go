package cgroups

import (
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
