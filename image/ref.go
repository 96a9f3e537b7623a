package image

import (
	"fmt"
	"regexp"
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
)

// parseRef parses a user-given image reference ("busybox",
// "reg:5000/a/b:tag", "a/b@sha256:...").
func parseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	return r, nil
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

// mirrorRef rewrites r onto a mirror "host[:port][/prefix]".
func mirrorRef(r name.Reference, mirror string, opts ...name.Option) (name.Reference, error) {
	host, prefix, _ := strings.Cut(strings.Trim(mirror, "/"), "/")
	repo := r.Context().RepositoryStr()
	if prefix != "" {
		repo = strings.Trim(prefix, "/") + "/" + repo
	}
	sep := ":"
	if _, ok := r.(name.Digest); ok {
		sep = "@"
	}
	return name.ParseReference(host+"/"+repo+sep+r.Identifier(), opts...)
}
