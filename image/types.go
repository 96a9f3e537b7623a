package image

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// RegistryConfig configures how one registry host is reached. The conf
// package embeds a map of these keyed by "host[:port]" (docker.io for
// Docker Hub).
type RegistryConfig struct {
	// Mirrors are "host[:port][/path-prefix]" endpoints tried in order
	// before the registry itself. A leading "https://" changes nothing;
	// "http://" means plain HTTP.
	Mirrors []string `toml:"mirrors"`
	// SkipOrigin disables the fallback to the registry itself after the
	// mirrors failed.
	SkipOrigin bool `toml:"skip_origin"`
	// Insecure allows plain HTTP and skips TLS verification. Loopback
	// registries (localhost, 127.0.0.0/8, ::1) use plain HTTP without it.
	Insecure bool `toml:"insecure"`
	// CAFile is a PEM bundle trusted in addition to the system roots.
	CAFile string `toml:"ca_file"`
}

// Auth carries the credentials of a pull request (the CRI AuthConfig).
type Auth struct {
	Username      string
	Password      string
	Auth          string // base64("user:pass")
	IdentityToken string
	RegistryToken string
	// ServerAddress, when set, is the one registry the credentials are
	// for (CRI's AuthConfig.server_address): a mirror of it, another
	// host, gets none of them.
	ServerAddress string
}

// Image is the record of one pulled image.
type Image struct {
	// ID is the config digest ("sha256:..."), the same on every node.
	ID string
	// RepoTags are fully qualified: "docker.io/library/busybox:latest".
	RepoTags []string
	// RepoDigests are "registry/repo@sha256:..." of what was pulled
	// (the index digest for a multi-arch image).
	RepoDigests []string
	// Size is the sum of the compressed layers and the config, as crictl
	// shows it.
	Size uint64
	// Config is the runtime part of the image config.
	Config v1.Config
	// ChainIDs of the layers, bottom to top.
	ChainIDs []string
	// Annotations are the manifest's (a checkpoint image names the
	// checkpointed container in one).
	Annotations map[string]string
}

// UIDOrUser splits Config.User ("1002", "1002:1002", "www-data",
// "www-data:grp") into the numeric UID or the user name, as CRI's
// ImageStatus reports them. Both are zero values when User is empty.
func (i *Image) UIDOrUser() (uid *int64, username string) {
	user, _, _ := strings.Cut(i.Config.User, ":")
	if user == "" {
		return nil, ""
	}
	if n, err := strconv.ParseInt(user, 10, 64); err == nil && n >= 0 {
		return &n, ""
	}
	return nil, user
}

// Options configure a Store.
type Options struct {
	// Root is the store directory, e.g. /var/lib/pinrt/images.
	Root string
	// Registries is keyed by "host[:port]", in any case; Docker Hub's
	// names (docker.io, index.docker.io, registry-1.docker.io) are one.
	Registries map[string]RegistryConfig
	// PullTimeout bounds a whole Pull, including every mirror tried.
	// Zero means no total bound: only the callers' contexts and
	// PullProgressTimeout end it.
	PullTimeout time.Duration
	// PullProgressTimeout fails a pull when no byte arrived from the
	// registry for this long while a request was outstanding. Zero means
	// DefaultPullProgressTimeout.
	PullProgressTimeout time.Duration
	// MaxConcurrentDownloads is how many layers of one pull download at
	// once. Zero means DefaultMaxConcurrentDownloads.
	MaxConcurrentDownloads int
	// AuthFile is a docker/podman config.json supplying credentials for
	// pulls that bring none. Empty means none.
	AuthFile string
	// Platform to resolve multi-arch indexes to; nil means the host
	// (linux/runtime.GOARCH).
	Platform *v1.Platform
	// Verifier, if set, checks every pull against the node's signature
	// policy before anything is fetched.
	Verifier Verifier
}

// ErrSignatureRejected marks (through errors.Is) a pull the Verifier
// refused: the policy's requirements are not met, as opposed to the
// policy or the registry being unreachable or broken.
var ErrSignatureRejected = errors.New("rejected by the signature policy")

// Verifier checks a normalized reference ("host/repo:tag" or
// "host/repo@sha256:...") against a signature policy and returns the
// manifest digest it accepted, which the pull then fetches: a tag moved
// after the check cannot slip another image in. "" (no error) means no
// policy applies. namespace is the Kubernetes namespace of the pod the
// pull is for, "" if none.
type Verifier interface {
	Verify(ctx context.Context, ref string, auth *Auth, namespace string) (string, error)
}

// PullOption qualifies a Pull.
type PullOption func(*PullRequest)

// PullRequest is what the options of a Pull set.
type PullRequest struct {
	// Namespace is the Kubernetes namespace of the pod the pull is for.
	Namespace string
}

// ForNamespace says which Kubernetes namespace the pull is for: the
// Verifier may hold it to that namespace's signature policy.
func ForNamespace(ns string) PullOption {
	return func(p *PullRequest) { p.Namespace = ns }
}

// PullOptions applies opts (for stand-ins of Store.Pull).
func PullOptions(opts ...PullOption) PullRequest {
	var req PullRequest
	for _, o := range opts {
		o(&req)
	}
	return req
}

// Defaults for the zero values of Options.
const (
	DefaultPullProgressTimeout    = time.Minute
	DefaultMaxConcurrentDownloads = 3
)

// clone returns a deep copy so callers can't mutate the store's records.
func (i *Image) clone() *Image {
	c := *i
	c.RepoTags = append([]string(nil), i.RepoTags...)
	c.RepoDigests = append([]string(nil), i.RepoDigests...)
	c.ChainIDs = append([]string(nil), i.ChainIDs...)
	c.Annotations = maps.Clone(i.Annotations)
	return &c
}
