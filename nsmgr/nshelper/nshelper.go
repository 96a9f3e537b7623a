// Package nshelper is the body of pinrt's namespace helper, which clones
// itself into a pod's new user namespace and the namespaces it owns, where
// it sets the hostname, brings up lo, writes the pod's sysctls and reports
// on a pipe; and of Setup, which does the same on a thread of the daemon
// for a pod without a user namespace.
//
// It imports nothing beyond the standard library's smallest packages, so
// that cmd/pinrt-nshelper, a separate static binary built from it, starts
// in about a millisecond: re-executing the pinrt binary instead pays the
// package initialisation of everything pinrt links (gRPC, protobuf, the
// image code) for every pod.
package nshelper

import (
	"errors"
	"strconv"
	"strings"
)

// Command is argv[1] of the helper, in the pinrt binary re-executed and in
// pinrt-nshelper alike.
const Command = "__pinrt-nshelper"

// HostnameArg prefixes the helper argument that names the pod's host.
// Sysctl arguments are "path=value" with a path of [a-zA-Z0-9_/.-], so
// the two never collide.
const HostnameArg = "--hostname="

// LoArg asks the helper to bring up lo: it is in a new network namespace.
const LoArg = "--lo-up"

// UserNSArg, first among the arguments, asks the helper to create the
// pod's user namespace itself, with the other namespaces listed after it
// ("--userns=net,ipc,uts") inside it, and the ID maps given by the next two
// arguments (UIDMapArg, GIDMapArg: "container:host:size,...").
const (
	UserNSArg = "--userns="
	UIDMapArg = "--uid-map="
	GIDMapArg = "--gid-map="
)

// CheckSysctlPath rejects a sysctl path (relative to /proc/sys) that could
// escape /proc/sys: an empty, "." or ".." component, or a character other
// than [a-zA-Z0-9_.-] in a component.
func CheckSysctlPath(path string) error {
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

// SwapSeparators swaps '/' and '.' in a sysctl name or its path under
// /proc/sys: "net.ipv4.conf.eth0/100.rp_filter" and
// "net/ipv4/conf/eth0.100/rp_filter" are the same sysctl.
func SwapSeparators(s string) string {
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
