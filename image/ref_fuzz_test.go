package image

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// FuzzParseRef checks that any string kubelet or crictl may send as an
// image reference either parses to a normal form that is a fixed point,
// or fails as InvalidArgument; it never panics.
func FuzzParseRef(f *testing.F) {
	for _, s := range []string{
		"busybox", "busybox:1.36", "docker.io/library/busybox:latest",
		"reg:5000/a/b:tag", "localhost/a", "[::1]:5000/a:1",
		"a/b@sha256:" + strings.Repeat("ab", 32), "a:1@sha256:" + strings.Repeat("0", 64),
		"bad..host/x:1", "../../etc/passwd", "../x", "1.2.3.4.5/a", "[::1]:5000/a:1", "UPPER/case:1", "", ":", "@", "/",
		strings.Repeat("a", 300), "a/" + strings.Repeat("b/", 200) + "c",
		"sha256:" + strings.Repeat("f", 64), "x:\x00", "ü/ñ:1", "host:99999/a",
		"index.docker.io/busybox", "registry-1.docker.io/library/busybox",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		r, err := parseRef(ref)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("parseRef(%q) error %v is not InvalidArgument", ref, err)
			}
			if _, nerr := NormalizeRef(ref); nerr == nil {
				t.Fatalf("NormalizeRef(%q) succeeded where parseRef failed", ref)
			}
			return
		}
		n := normalize(r)
		if strings.HasPrefix(n, "index.docker.io/") {
			t.Fatalf("normalize(%q) = %q, want docker.io spelled as users do", ref, n)
		}
		r2, err := parseRef(n)
		if err != nil {
			t.Fatalf("normal form %q of %q does not parse: %v", n, ref, err)
		}
		if n2 := normalize(r2); n2 != n {
			t.Fatalf("normalize is not a fixed point: %q -> %q -> %q", ref, n, n2)
		}
		if registryHost(r2) != registryHost(r) || repoName(r2) != repoName(r) {
			t.Fatalf("%q and its normal form %q name different repositories", ref, n)
		}
		// What is accepted must be something a registry can serve: a
		// host a resolver may be asked about, and a repository whose
		// components are names, not "." or ".." (the reference grammar
		// kubelet and docker use).
		if !hostOK(registryHost(r)) {
			t.Fatalf("parseRef(%q) accepted registry host %q", ref, registryHost(r))
		}
		for _, c := range strings.Split(r.Context().RepositoryStr(), "/") {
			if !componentOK(c) {
				t.Fatalf("parseRef(%q) accepted repository component %q", ref, c)
			}
		}
	})
}

// hostOK is RFC 1123: an IP literal or dot-separated labels of letters,
// digits and inner hyphens, each 1 to 63 long, and an optional port.
func hostOK(h string) bool {
	if host, port, err := net.SplitHostPort(h); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return false
		}
		h = host
	}
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return true
	}
	for _, l := range strings.Split(h, ".") {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		if strings.IndexFunc(l, func(c rune) bool { return !isASCIIAlnum(c) && c != '-' }) >= 0 {
			return false
		}
	}
	return true
}

func isASCIIAlnum(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// componentOK: lower-case letters and digits at both ends.
func componentOK(c string) bool {
	alnum := func(b byte) bool { return b >= 'a' && b <= 'z' || b >= '0' && b <= '9' }
	return c != "" && alnum(c[0]) && alnum(c[len(c)-1])
}
