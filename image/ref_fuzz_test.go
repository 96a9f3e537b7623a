package image

import (
	"errors"
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
		"bad..host/x:1", "../../etc/passwd", "UPPER/case:1", "", ":", "@", "/",
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
	})
}
