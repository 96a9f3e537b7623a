package image

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
)

// dockerHub is how Docker Hub appears in names; go-containerregistry
// calls it index.docker.io internally.
const dockerHub = "docker.io"

var (
	fullIDRe  = regexp.MustCompile(`^(?:sha256:)?([0-9a-f]{64})$`)
	shortIDRe = regexp.MustCompile(`^(?:sha256:)?([0-9a-f]{4,63})$`)

	// hostLabelRe is one RFC 1123 label; hostRe a DNS name or an IP
	// literal with an optional port, as the reference grammar has them.
	hostLabel = `[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?`
	hostRe    = regexp.MustCompile(`^(?:` + hostLabel + `(?:\.` + hostLabel + `)*|\[[0-9a-fA-F:.]+\])(?::([0-9]{1,5}))?$`)
	// componentRe is a repository path component: alphanumerics at both
	// ends, go-containerregistry's separators in between.
	componentRe = regexp.MustCompile(`^[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?$`)
)

// parseRef parses a user-given image reference ("busybox",
// "reg:5000/a/b:tag", "a/b@sha256:...").
//
// go-containerregistry accepts registry hosts and repository components
// that no registry can serve and that docker's reference grammar (which
// kubelet uses) rejects: "bad..host", "..", "host:99999", an empty or
// ".." component. Those would reach the resolver or a registry URL, so
// they are refused here (found by FuzzParseRef).
func parseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	if m := hostRe.FindStringSubmatch(r.Context().RegistryStr()); m == nil || !validPort(m[1]) {
		return nil, fmt.Errorf("image reference %q: registry %q is not a host name: %w", ref, r.Context().RegistryStr(), errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(r.Context().RepositoryStr(), "/") {
		if !componentRe.MatchString(c) {
			return nil, fmt.Errorf("image reference %q: repository component %q: %w", ref, c, errdefs.ErrInvalidArgument)
		}
	}
	return r, nil
}

// validPort: none, or 1 to 65535.
func validPort(p string) bool {
	if p == "" {
		return true
	}
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535
}

// registryHost is the host[:port] used for names and config lookups.
func registryHost(r name.Reference) string {
	h := r.Context().RegistryStr()
	if h == name.DefaultRegistry {
		return dockerHub
	}
	return h
}

// repoName is "registry/repo" normalised like docker
// ("docker.io/library/busybox").
func repoName(r name.Reference) string {
	return registryHost(r) + "/" + r.Context().RepositoryStr()
}

// normalize returns the fully qualified form of r: repo:tag or
// repo@digest.
func normalize(r name.Reference) string {
	if d, ok := r.(name.Digest); ok {
		return repoName(r) + "@" + d.DigestStr()
	}
	return repoName(r) + ":" + r.Identifier()
}

// NormalizeRef returns the fully qualified form of an image reference,
// "busybox" -> "docker.io/library/busybox:latest". Errors are
// errdefs.ErrInvalidArgument.
func NormalizeRef(ref string) (string, error) {
	r, err := parseRef(ref)
	if err != nil {
		return "", err
	}
	return normalize(r), nil
}

// SplitMirror splits a mirror "host[:port][/prefix]" into its host and
// path prefix. It may be written as a URL, as containerd's configuration
// has mirrors ("https://mirror.gcr.io"); "http://" asks for plain HTTP.
func SplitMirror(mirror string) (host, prefix string, plainHTTP bool) {
	m, plainHTTP := strings.CutPrefix(mirror, "http://")
	if !plainHTTP {
		m = strings.TrimPrefix(m, "https://")
	}
	host, prefix, _ = strings.Cut(strings.Trim(m, "/"), "/")
	return host, strings.Trim(prefix, "/"), plainHTTP
}

// mirrorRef rewrites r onto a mirror "host[:port][/prefix]" (SplitMirror).
func mirrorRef(r name.Reference, mirror string, opts ...name.Option) (name.Reference, error) {
	host, prefix, plainHTTP := SplitMirror(mirror)
	if plainHTTP {
		opts = append(opts, name.Insecure)
	}
	repo := r.Context().RepositoryStr()
	if prefix != "" {
		repo = prefix + "/" + repo
	}
	sep := ":"
	if _, ok := r.(name.Digest); ok {
		sep = "@"
	}
	return name.ParseReference(host+"/"+repo+sep+r.Identifier(), opts...)
}
