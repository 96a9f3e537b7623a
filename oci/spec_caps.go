package oci

import (
	"fmt"
	"slices"
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

// knownCaps returns the capabilities up to lastCap (the kernel's
// cap_last_cap); runc refuses caps the kernel does not know.
func knownCaps(lastCap int) []string {
	if lastCap <= 0 || lastCap >= len(allCaps) {
		return allCaps
	}
	return allCaps[:lastCap+1]
}

func normalizeCap(c string) string {
	c = strings.ToUpper(strings.TrimSpace(c))
	if c == "ALL" || strings.HasPrefix(c, "CAP_") {
		return c
	}
	return "CAP_" + c
}

// WithCapabilities computes bounding/effective/permitted: privileged gets
// every known cap; otherwise start from the defaults, "ALL" in drop empties
// the set, "ALL" in add fills it, then named adds and drops apply (drop
// last, so a cap both added and dropped is dropped).
func WithCapabilities(privileged bool, add, drop []string, lastCap int) SpecOpt {
	return func(g *Generator) error {
		known := knownCaps(lastCap)
		var set []string
		if privileged {
			set = append(set, known...)
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
				set = append([]string(nil), known...)
			}
			for _, c := range adds {
				if !slices.Contains(set, c) {
					set = append(set, c)
				}
			}
			set = slices.DeleteFunc(set, func(c string) bool { return slices.Contains(drops, c) })
		}
		set = slices.DeleteFunc(set, func(c string) bool { return !slices.Contains(known, c) })
		g.Config.Process.Capabilities = &capsT{
			Bounding:  slices.Clone(set),
			Effective: slices.Clone(set),
			Permitted: slices.Clone(set),
		}
		return nil
	}
}
