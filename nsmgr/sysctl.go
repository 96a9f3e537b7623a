package nsmgr

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/internal/validate"
)

// NormalizeSysctl returns the canonical dotted form of a sysctl name.
// Kubernetes accepts both "net.ipv4.ip_forward" and "net/ipv4/ip_forward";
// when the first separator is '/', a '.' is part of a component (as in the
// interface name of "net/ipv4/conf/eth0.100/rp_filter"), so the two
// characters swap roles.
func NormalizeSysctl(name string) string {
	i := strings.IndexAny(name, "./")
	if i < 0 || name[i] == '.' {
		return name
	}
	return swapSeparators(name)
}

// sysctlPath turns a canonical dotted name into the path under /proc/sys.
func sysctlPath(name string) string { return swapSeparators(name) }

// sysctlNamespace reports which pod namespace makes a sysctl safe to set,
// following the namespaced set that Kubernetes allows. It returns "" for
// a sysctl that would change the host.
func sysctlNamespace(name string) Kind {
	switch {
	case strings.HasPrefix(name, "net."):
		return Net
	case strings.HasPrefix(name, "kernel.shm"),
		strings.HasPrefix(name, "kernel.msg"),
		name == "kernel.sem",
		strings.HasPrefix(name, "fs.mqueue."):
		return IPC
	}
	return ""
}

// checkSysctlName rejects names that could escape /proc/sys once turned
// into a path: empty components and "." or "..".
func checkSysctlName(orig, name string) error {
	if err := checkSysctlPath(sysctlPath(name)); err != nil {
		return fmt.Errorf("sysctl %q: %s: %w", orig, err.Error(), errdefs.ErrInvalidArgument)
	}
	return nil
}

// ValidateSysctls checks that every sysctl is namespaced and that the pod
// owns the namespace it lives in: a net.* sysctl needs a pod network
// namespace (podNet) and an IPC one a pod IPC namespace (podIPC). Anything
// else would change the host and is an errdefs.ErrInvalidArgument error
// that names the sysctl. Names are checked in sorted order so the error is
// deterministic.
func ValidateSysctls(sysctls map[string]string, podNet, podIPC bool) error {
	names := make([]string, 0, len(sysctls))
	for n := range sysctls {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, orig := range names {
		name := NormalizeSysctl(orig)
		if err := checkSysctlName(orig, name); err != nil {
			return err
		}
		if err := validate.SysctlValue(orig, sysctls[orig]); err != nil {
			return err
		}
		switch sysctlNamespace(name) {
		case Net:
			if !podNet {
				return fmt.Errorf("sysctl %q needs a pod network namespace, the pod uses the host's: %w",
					orig, errdefs.ErrInvalidArgument)
			}
		case IPC:
			if !podIPC {
				return fmt.Errorf("sysctl %q needs a pod IPC namespace, the pod uses the host's: %w",
					orig, errdefs.ErrInvalidArgument)
			}
		default:
			return fmt.Errorf("sysctl %q is not namespaced and would change the host: %w",
				orig, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// checkSysctlPath rejects a sysctl path (relative to /proc/sys) that could
// escape /proc/sys: an empty, "." or ".." component, or a character other
// than [a-zA-Z0-9_.-] in a component.
func checkSysctlPath(path string) error {
	for c := range strings.SplitSeq(path, "/") {
		if c == "" || c == "." || c == ".." {
			return errors.New("malformed name")
		}
		for _, r := range c {
			ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
				r == '_' || r == '-' || r == '.'
			if !ok {
				return errors.New("invalid character " + strconv.QuoteRune(r))
			}
		}
	}
	return nil
}

// swapSeparators swaps '/' and '.' in a sysctl name or its path under
// /proc/sys: "net.ipv4.conf.eth0/100.rp_filter" and
// "net/ipv4/conf/eth0.100/rp_filter" are the same sysctl.
func swapSeparators(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.':
			return '/'
		case '/':
			return '.'
		}
		return r
	}, s)
}
