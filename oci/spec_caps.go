package oci

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

type capsT = specs.LinuxCapabilities

// allCaps is every capability the kernel knows, indexed by number.
var allCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// DefaultCapabilities is the set containerd and CRI-O give unprivileged
// containers.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// ParseCapBnd turns the CapBnd line's hex mask of /proc/<pid>/status into
// capability names, in number order. Bits pinrt has no name for are left
// out: runc could not name them either.
func ParseCapBnd(status []byte) ([]string, error) {
	for _, line := range strings.Split(string(status), "\n") {
		v, ok := strings.CutPrefix(line, "CapBnd:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("parse CapBnd %q: %w", strings.TrimSpace(v), err)
		}
		out := []string{}
		for i, name := range allCaps {
			if mask&(1<<uint(i)) != 0 {
				out = append(out, name)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("no CapBnd line in the process status: %w", errdefs.ErrNotFound)
}

// boundingOrAll is the set privileged and "ALL" mean: the daemon's bounding
// set, which is also every capability runc can hand out (asking for more
// fails with "unable to apply caps: operation not permitted"). nil means
// unknown, and then every capability pinrt knows.
func boundingOrAll(bounding []string) []string {
	if bounding == nil {
		return allCaps
	}
	return bounding
}

func normalizeCap(c string) string {
	c = strings.ToUpper(strings.TrimSpace(c))
	if c == "ALL" || strings.HasPrefix(c, "CAP_") {
		return c
	}
	return "CAP_" + c
}

// WithCapabilities computes bounding/effective/permitted: privileged gets
// the daemon's bounding set (bounding; nil = unknown, all known caps);
// otherwise start from the defaults, "ALL" in drop empties the set, "ALL"
// in add fills it with the bounding set, then named adds and drops apply
// (drop last, so a cap both added and dropped is dropped). A named add the
// daemon does not hold is refused: runc would fail with a bare EPERM.
func WithCapabilities(privileged bool, add, drop []string, bounding []string) SpecOpt {
	return func(g *Generator) error {
		avail := boundingOrAll(bounding)
		var set []string
		if privileged {
			set = append(set, avail...)
		} else {
			set = append(set, DefaultCapabilities...)
			norm := func(list []string) ([]string, bool, error) {
				var out []string
				all := false
				for _, c := range list {
					n := normalizeCap(c)
					if n == "ALL" {
						all = true
						continue
					}
					if !slices.Contains(allCaps, n) {
						return nil, false, fmt.Errorf("unknown capability %q: %w", c, errdefs.ErrInvalidArgument)
					}
					out = append(out, n)
				}
				return out, all, nil
			}
			adds, addAll, err := norm(add)
			if err != nil {
				return err
			}
			drops, dropAll, err := norm(drop)
			if err != nil {
				return err
			}
			if dropAll {
				set = nil
			}
			if addAll {
				set = append([]string(nil), avail...)
			}
			for _, c := range adds {
				if !slices.Contains(avail, c) && !slices.Contains(drops, c) {
					return fmt.Errorf("capability %s is not in the bounding set of the runtime daemon, so no container can get it: %w", c, errdefs.ErrFailedPrecondition)
				}
				if !slices.Contains(set, c) {
					set = append(set, c)
				}
			}
			set = slices.DeleteFunc(set, func(c string) bool { return slices.Contains(drops, c) })
		}
		// Defaults the daemon lacks are left out rather than failing every
		// container.
		set = slices.DeleteFunc(set, func(c string) bool { return !slices.Contains(avail, c) })
		g.Config.Process.Capabilities = &capsT{
			Bounding:  slices.Clone(set),
			Effective: slices.Clone(set),
			Permitted: slices.Clone(set),
		}
		return nil
	}
}
