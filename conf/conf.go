// Package conf is pinrt's configuration: typed TOML structs, the built-in
// defaults, validation without I/O, and loading from a main file plus a
// drop-in directory.
package conf

import (
	"fmt"
	"math"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Default locations. Everything pinrt writes lives under Root (persistent)
// or RunRoot (tmpfs).
const (
	DefaultConfigFile = "/etc/pinrt/pinrt.toml"
	DefaultConfigDir  = "/etc/pinrt/pinrt.d"
	DefaultRoot       = "/var/lib/pinrt"
	DefaultRunRoot    = "/run/pinrt"
	SocketName        = "pinrt.sock"
)

// Config is the whole daemon configuration.
type Config struct {
	// Root is the persistent state directory: sandboxes, containers, images.
	Root string `toml:"root" comment:"Persistent state: sandboxes, containers, images."`
	// RunRoot is the volatile state directory (tmpfs): pinned namespaces,
	// the socket, locks, runtime state.
	RunRoot string `toml:"runroot" comment:"Volatile state (tmpfs): pinned namespaces, socket, lock, runtime state."`
	// Listen is the path of the CRI unix socket. Empty means
	// <runroot>/pinrt.sock.
	Listen string `toml:"listen" comment:"CRI unix socket path. Empty means <runroot>/pinrt.sock."`
	// SocketGroup is the group (name or numeric gid) that owns the socket.
	// Empty keeps root's group.
	SocketGroup string `toml:"socket_group" comment:"Group (name or gid) owning the socket, mode 0660. Empty: root's group."`
	// LogLevel is one of trace, debug, info, warn, error.
	LogLevel string `toml:"log_level" comment:"trace, debug, info, warn or error. SIGHUP re-reads it."`
	// LogFormat is text or json.
	LogFormat string `toml:"log_format" comment:"text or json."`
	// ShutdownTimeout bounds how long in-flight calls may run after SIGTERM.
	ShutdownTimeout Duration `toml:"shutdown_timeout" comment:"How long in-flight calls may finish after SIGTERM."`

	CNI     CNIConfig     `toml:"cni" comment:"Pod networking through CNI."`
	Runtime RuntimeConfig `toml:"runtime" comment:"OCI runtimes and the container monitor."`
	Userns  UsernsConfig  `toml:"userns" comment:"Host ID ranges for pods with a user namespace."`
	Image   ImageConfig   `toml:"image" comment:"Image pulls and registries."`

	Streaming StreamingConfig `toml:"streaming" comment:"The HTTP server kubelet connects to for exec, attach and port-forward."`
	Metrics   MetricsConfig   `toml:"metrics" comment:"The daemon's own Prometheus metrics and pprof, and stats sampling."`

	CDI CDIConfig `toml:"cdi" comment:"Container Device Interface: devices named by device plugins."`
	NRI NRIConfig `toml:"nri" comment:"Node Resource Interface: plugins that see pod and container events and adjust containers."`
}

// CDIConfig configures the Container Device Interface.
type CDIConfig struct {
	// SpecDirs are read, in increasing priority, for CDI spec files; they
	// are re-read for every container that asks for a CDI device.
	SpecDirs []string `toml:"spec_dirs" comment:"Directories of CDI spec files, in increasing priority; re-read for every container that asks for a CDI device."`
}

// NRIConfig configures the Node Resource Interface, with containerd's
// names and defaults.
type NRIConfig struct {
	// Enable listens on SocketPath and starts the pre-installed plugins.
	Enable bool `toml:"enable" comment:"Serve NRI plugins (default true, as containerd and CRI-O)."`
	// SocketPath is where external plugins connect.
	SocketPath string `toml:"socket_path" comment:"Unix socket external NRI plugins connect to."`
	// PluginPath holds pre-installed plugins pinrt starts itself
	// (named NN-name, NN the index).
	PluginPath string `toml:"plugin_path" comment:"Directory of pre-installed plugins pinrt starts (NN-name)."`
	// PluginConfigPath holds the configuration of pre-installed plugins.
	PluginConfigPath string `toml:"plugin_config_path" comment:"Directory of configuration for pre-installed plugins."`
	// PluginRegistrationTimeout bounds a plugin's registration.
	PluginRegistrationTimeout Duration `toml:"plugin_registration_timeout" comment:"How long a plugin may take to register."`
	// PluginRequestTimeout bounds every request to a plugin; a plugin
	// that does not answer in time is disconnected.
	PluginRequestTimeout Duration `toml:"plugin_request_timeout" comment:"How long a plugin may take to answer a request before it is disconnected."`
}

// StreamingConfig configures the exec/attach/port-forward server. Its URLs
// carry single-use tokens that expire after a minute.
type StreamingConfig struct {
	// Address is the IP the server listens on; kubelet must reach it.
	Address string `toml:"address" comment:"IP the streaming server listens on; kubelet connects to the URLs pinrt returns."`
	// Port is the TCP port; 0 picks a free one at every start.
	Port int `toml:"port" comment:"TCP port; 0 picks any free port."`
	// TLSCertFile and TLSKeyFile turn on TLS; both or neither.
	TLSCertFile string `toml:"tls_cert_file" comment:"PEM certificate for TLS (with tls_key_file). Empty: plain HTTP."`
	TLSKeyFile  string `toml:"tls_key_file" comment:"PEM private key for TLS (with tls_cert_file)."`
	// IdleTimeout closes a stream with no traffic for this long.
	IdleTimeout Duration `toml:"idle_timeout" comment:"A stream with no traffic for this long is closed."`
	// MaxStreams bounds the streams (exec, attach, port-forward
	// connections) served at once; more are refused with 429.
	MaxStreams int `toml:"max_streams" comment:"Streams served at once; more are refused with HTTP 429."`
}

// MetricsConfig configures the opt-in debug listener and how often the
// statistics that are too costly to read per call are sampled.
type MetricsConfig struct {
	// Address is the host:port of the HTTP listener serving /metrics.
	// Empty, the default, serves nothing: the listener is unauthenticated.
	Address string `toml:"address" comment:"host:port serving /metrics, e.g. 127.0.0.1:9090. Empty (default): off. Unauthenticated: keep it on loopback."`
	// EnablePprof adds net/http/pprof under /debug/pprof on that listener.
	EnablePprof bool `toml:"enable_pprof" comment:"Serve /debug/pprof on the metrics listener too."`
	// DiskUsageInterval is how often the writable layers of containers are
	// measured for ContainerStats and ImageFsInfo.
	DiskUsageInterval Duration `toml:"disk_usage_interval" comment:"How often container writable layers are measured (a directory walk each)."`
}

// CNIConfig configures pod networking.
type CNIConfig struct {
	// ConfDir holds the CNI network configurations.
	ConfDir string `toml:"conf_dir" comment:"Directory of CNI network configs; changes are picked up live."`
	// PluginDirs are searched for CNI plugin binaries.
	PluginDirs []string `toml:"plugin_dirs" comment:"Directories searched for CNI plugin binaries."`
	// DefaultNetwork writes a bridge conflist into ConfDir when it has none.
	DefaultNetwork bool `toml:"default_network" comment:"Write a default bridge network (pinrt0) when conf_dir has no config."`
}

// RuntimeConfig configures the OCI runtimes.
type RuntimeConfig struct {
	// DefaultRuntime names the handler used when a pod names none.
	DefaultRuntime string `toml:"default_runtime" comment:"Handler used when a pod names none."`
	// Conmon is the container monitor binary.
	Conmon string `toml:"conmon" comment:"Container monitor binary."`
	// CgroupDriver is cgroupfs (pinrt writes the cgroup tree through
	// runc) or systemd (pods get slices and containers scopes from
	// systemd, as kubelet's systemd driver expects).
	CgroupDriver string `toml:"cgroup_driver" comment:"cgroupfs, or systemd on a host whose init is systemd (must match kubelet's cgroupDriver)."`
	// CgroupParent is the cgroup under which pods go when kubelet names
	// none: a path for cgroupfs, a slice name for systemd (the default
	// "/pinrt" means pinrt.slice there).
	CgroupParent string `toml:"cgroup_parent" comment:"Cgroup parent for pods when kubelet names none: a path (cgroupfs) or a slice name (systemd; the default /pinrt means pinrt.slice)."`
	// Runtimes are the handlers, by the name a RuntimeClass uses.
	Runtimes map[string]Handler `toml:"runtimes" comment:"Runtime handlers by RuntimeClass handler name."`
	// SeccompDefaultWhenUnset gives containers whose security context names
	// no seccomp profile RuntimeDefault instead of the CRI's Unconfined, as
	// CRI-O's seccomp_use_default_when_empty does.
	SeccompDefaultWhenUnset bool `toml:"seccomp_default_when_unset" comment:"Containers without a seccomp profile get RuntimeDefault instead of Unconfined (the CRI's meaning of unset)."`
	// RestoreCheckpointImages lets a container whose image is a
	// checkpoint image be restored from it. Off, such an image is
	// refused: a checkpoint's processes come back with the credentials,
	// capabilities and seccomp filters CRIU recorded, whatever the pod
	// asks, and the image is the pod author's choice. A checkpoint
	// archive on the node (a CRI client's path) is always restorable.
	RestoreCheckpointImages bool `toml:"restore_checkpoint_images" comment:"Restore containers from checkpoint images (io.kubernetes.cri-o.annotations.checkpoint.name). A checkpoint brings back the credentials and capabilities it recorded, whatever the pod asks: enable only where pod authors may run privileged containers. Off: such an image is refused."`
}

// Handler is one OCI runtime.
type Handler struct {
	// Binary is the runtime executable, a path or a name looked up in PATH.
	Binary string `toml:"binary" comment:"Runtime executable (path or name in PATH)."`
	// Root is the runtime's --root. Empty means <runroot>/runtime/<name>.
	Root string `toml:"root" comment:"The runtime's --root. Empty: <runroot>/runtime/<handler>."`
	// Type is the runtime kind; only "oci" exists.
	Type string `toml:"type" comment:"Runtime type; only \"oci\"."`
}

// UsernsConfig bounds the user-namespace ID allocator.
type UsernsConfig struct {
	// MinHostID is the first host ID pinrt may hand out (block aligned).
	MinHostID uint32 `toml:"min_host_id" comment:"First host ID handed out to pods (multiple of 65536, at least 65536)."`
	// MaxHostID is the end (exclusive) of the host range pinrt may hand out.
	MaxHostID uint32 `toml:"max_host_id" comment:"End (exclusive) of the host ID range handed out (multiple of 65536)."`
	// MaxPods bounds how many pods may hold a user namespace at once.
	MaxPods int `toml:"max_pods" comment:"How many pods may hold a user namespace at once."`
}

// ImageConfig configures pulls.
type ImageConfig struct {
	// PullTimeout bounds one PullImage in total. Zero (the default) means
	// no total bound: a slow but moving pull of a big image must not fail,
	// a stalled one is caught by PullProgressTimeout.
	PullTimeout Duration `toml:"pull_timeout" comment:"Upper bound for one whole image pull. 0 (default): no total bound, only pull_progress_timeout."`
	// PullProgressTimeout fails a pull when no byte arrived from the
	// registry for this long (containerd's image_pull_progress_timeout).
	PullProgressTimeout Duration `toml:"pull_progress_timeout" comment:"Fail a pull when no byte arrived from the registry for this long."`
	// MaxConcurrentDownloads is how many layers of one pull download at
	// once.
	MaxConcurrentDownloads int `toml:"max_concurrent_downloads" comment:"Layers of one pull downloaded at once."`
	// AuthFile is a docker/podman config.json whose "auths" supply
	// credentials when kubelet sends none. Read on every pull.
	AuthFile string `toml:"auth_file" comment:"config.json in docker/podman format ({\"auths\": {\"host\": {\"auth\": \"base64(user:pass)\"}}}) used when kubelet sends no credentials, or sends credentials for another host (server_address) than a mirror's; read on every pull. Empty: none."`
	// Registries configures mirrors, TLS and plain HTTP per registry host.
	Registries map[string]Registry `toml:"registries" comment:"Per registry host: mirrors, skip_origin, insecure, ca_file. localhost and 127.0.0.0/8 use plain HTTP without config.\nExample, an air-gapped node pulling docker.io images from a local mirror only:\n[image.registries.\"docker.io\"]\n  mirrors = [\"mirror.example.internal:5000\", \"backup.example.internal/dockerhub\"]\n  skip_origin = true\n[image.registries.\"mirror.example.internal:5000\"]\n  ca_file = \"/etc/pinrt/certs/mirror-ca.pem\"\n[image.registries.\"backup.example.internal\"]\n  insecure = true"`
	// PinnedImages are reported pinned in ListImages and ImageStatus, so
	// kubelet's image GC never removes them. A pattern is an exact name
	// as ImageStatus reports it (fully qualified tag or digest, or the
	// image ID), or a prefix of one ending in a single "*". RemoveImage
	// still removes a pinned image when asked for it by name.
	PinnedImages []string `toml:"pinned_images" comment:"Images kubelet's GC must keep: exact names (docker.io/library/busybox:1.36, sha256:<id>) or prefixes ending in * (registry.k8s.io/pause*)."`
	// SignaturePolicy is the node's containers-policy.json(5). Every
	// pull is checked against it before anything is fetched: the
	// manifest's digest against cosign signatures stored beside the
	// image (sigstoreSigned), also through mirrors, whose signatures are
	// read where the manifest came from and checked against the name
	// asked for. A refusal reaches kubelet as SignatureValidationFailed.
	// Containers are created from images already in the store without a
	// new check: kubelet pulls only missing images, so images pulled
	// before a stricter policy keep being used until removed (crictl rmi). A file that does not parse
	// stops the start, and fails pulls after an edit; it never accepts
	// everything.
	SignaturePolicy string `toml:"signature_policy" comment:"containers-policy.json(5) every pull must satisfy before anything is fetched (sigstoreSigned, signedBy, reject, insecureAcceptAnything). Read again when it changes. Empty (default): every image is accepted."`
	// SignaturePolicyDir holds "<namespace>.json" policies for the pods
	// of one Kubernetes namespace, replacing SignaturePolicy for them.
	SignaturePolicyDir string `toml:"signature_policy_dir" comment:"Directory of per-namespace policies: <dir>/<namespace>.json governs the pulls for pods of that Kubernetes namespace (from PullImage's sandbox config); namespaces without a file fall back to signature_policy. Empty: none."`
}

// Registry configures pulls from one registry host.
type Registry struct {
	// Mirrors are tried in order before the registry itself.
	Mirrors []string `toml:"mirrors" comment:"Mirrors (host[:port][/prefix]) tried in order before the registry."`
	// SkipOrigin never falls back to the registry itself.
	SkipOrigin bool `toml:"skip_origin" comment:"Do not fall back to the registry itself."`
	// Insecure allows plain HTTP and unverified TLS.
	Insecure bool `toml:"insecure" comment:"Allow plain HTTP and unverified TLS."`
	// CAFile is a PEM bundle trusted for this host.
	CAFile string `toml:"ca_file" comment:"PEM CA bundle trusted for this host."`
}

// Duration is a time.Duration written as a Go duration string ("10s").
type Duration time.Duration

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(time.Duration(d).String()), nil
}

// Std returns the time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// DefaultCgroupParent is runtime.cgroup_parent's default.
const DefaultCgroupParent = "/pinrt"

// Default returns the built-in configuration.
func Default() *Config {
	return &Config{
		Root:            DefaultRoot,
		RunRoot:         DefaultRunRoot,
		LogLevel:        "info",
		LogFormat:       "text",
		ShutdownTimeout: Duration(10 * time.Second),
		CNI: CNIConfig{
			ConfDir:        "/etc/cni/net.d",
			PluginDirs:     []string{"/opt/cni/bin"},
			DefaultNetwork: true,
		},
		Runtime: RuntimeConfig{
			DefaultRuntime: "runc",
			Conmon:         "conmon",
			CgroupDriver:   "cgroupfs",
			CgroupParent:   DefaultCgroupParent,
			Runtimes: map[string]Handler{
				// Only runc: Debian's crun 1.8.1 refuses the spec version
				// pinrt writes. The README shows how to add crun.
				"runc": {Binary: "runc", Type: "oci"},
			},
		},
		Userns: UsernsConfig{
			// Kubelet's default range: 2^31 host IDs above the first 2^16
			// is far more than a node needs; stay well below 2^32-1.
			MinHostID: 1 << 16,
			MaxHostID: 1 << 31,
			MaxPods:   1024,
		},
		Image: ImageConfig{
			PullProgressTimeout:    Duration(time.Minute),
			MaxConcurrentDownloads: 3,
			// Empty, not nil, so `pinrt config --default` prints the table
			// and its commented example.
			Registries: map[string]Registry{},
		},
		Streaming: StreamingConfig{
			Address:     "127.0.0.1",
			IdleTimeout: Duration(4 * time.Hour),
			MaxStreams:  256,
		},
		Metrics: MetricsConfig{DiskUsageInterval: Duration(time.Minute)},
		CDI:     CDIConfig{SpecDirs: []string{"/etc/cdi", "/var/run/cdi"}},
		NRI: NRIConfig{
			Enable:                    true,
			SocketPath:                "/var/run/nri/nri.sock",
			PluginPath:                "/opt/nri/plugins",
			PluginConfigPath:          "/etc/nri/conf.d",
			PluginRegistrationTimeout: Duration(5 * time.Second),
			PluginRequestTimeout:      Duration(2 * time.Second),
		},
	}
}

// SocketPath is the effective socket path.
func (c *Config) SocketPath() string {
	if c.Listen != "" {
		return c.Listen
	}
	return filepath.Join(c.RunRoot, SocketName)
}

// RuntimeRoot is the effective --root of a handler.
func (c *Config) RuntimeRoot(name string) string {
	if h, ok := c.Runtime.Runtimes[name]; ok && h.Root != "" {
		return h.Root
	}
	return filepath.Join(c.RunRoot, "runtime", name)
}

// FieldError is a validation failure of one key.
type FieldError struct {
	Key string // dotted TOML key, e.g. "runtime.default_runtime"
	Msg string
}

func (e *FieldError) Error() string { return e.Key + ": " + e.Msg }

var (
	logLevels   = map[string]bool{"trace": true, "debug": true, "info": true, "warn": true, "warning": true, "error": true}
	handlerName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
)

// Validate checks every value. It does no I/O: whether a binary or
// directory exists is the daemon's concern at start.
func (c *Config) Validate() error {
	abs := []struct{ key, val string }{
		{"root", c.Root}, {"runroot", c.RunRoot}, {"cni.conf_dir", c.CNI.ConfDir},
	}
	if c.Listen != "" {
		abs = append(abs, struct{ key, val string }{"listen", c.Listen})
	}
	for _, a := range abs {
		if !filepath.IsAbs(a.val) {
			return &FieldError{a.key, fmt.Sprintf("must be an absolute path, got %q", a.val)}
		}
	}
	// The kernel's sun_path holds 108 bytes including the terminating NUL.
	if n := len(c.SocketPath()); n > 107 {
		if c.Listen == "" {
			// Every other path under the runroot may be as long as
			// PATH_MAX; only the default socket's may not.
			return &FieldError{"runroot", fmt.Sprintf("the CRI socket <runroot>/pinrt.sock would be %d bytes, the limit of a unix socket path is 107: set listen to a shorter path", n)}
		}
		return &FieldError{"listen", fmt.Sprintf("socket path is %d bytes, the limit is 107", n)}
	}
	if !logLevels[c.LogLevel] {
		return &FieldError{"log_level", fmt.Sprintf("unknown level %q (trace, debug, info, warn, error)", c.LogLevel)}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return &FieldError{"log_format", fmt.Sprintf("unknown format %q (text, json)", c.LogFormat)}
	}
	// A name is looked up at start; a number is a gid as chown(2) takes
	// one, where -1 and other wrapped values mean "unchanged".
	if n, err := strconv.ParseInt(c.SocketGroup, 10, 64); err == nil && (n < 0 || n > math.MaxInt32) {
		return &FieldError{"socket_group", fmt.Sprintf("gid %d is out of range", n)}
	}
	if c.ShutdownTimeout < 0 {
		return &FieldError{"shutdown_timeout", "must not be negative"}
	}
	if len(c.CNI.PluginDirs) == 0 {
		return &FieldError{"cni.plugin_dirs", "needs at least one directory"}
	}
	for _, d := range c.CNI.PluginDirs {
		if !filepath.IsAbs(d) {
			return &FieldError{"cni.plugin_dirs", fmt.Sprintf("must be absolute paths, got %q", d)}
		}
	}
	if err := c.Runtime.validate(); err != nil {
		return err
	}
	if err := c.Userns.validate(); err != nil {
		return err
	}
	if err := c.Image.validate(); err != nil {
		return err
	}
	if err := c.Streaming.validate(); err != nil {
		return err
	}
	if err := c.CDI.validate(); err != nil {
		return err
	}
	if err := c.NRI.validate(); err != nil {
		return err
	}
	return c.Metrics.validate()
}

func (c *CDIConfig) validate() error {
	for _, d := range c.SpecDirs {
		if !filepath.IsAbs(d) {
			return &FieldError{"cdi.spec_dirs", fmt.Sprintf("must be absolute paths, got %q", d)}
		}
	}
	return nil
}

func (n *NRIConfig) validate() error {
	if !n.Enable {
		return nil
	}
	for _, p := range []struct{ key, val string }{
		{"nri.socket_path", n.SocketPath}, {"nri.plugin_path", n.PluginPath}, {"nri.plugin_config_path", n.PluginConfigPath},
	} {
		if p.val != "" && !filepath.IsAbs(p.val) {
			return &FieldError{p.key, fmt.Sprintf("must be an absolute path, got %q", p.val)}
		}
	}
	if n.SocketPath == "" {
		return &FieldError{"nri.socket_path", "must not be empty while nri.enable is set"}
	}
	if len(n.SocketPath) > 107 {
		return &FieldError{"nri.socket_path", fmt.Sprintf("socket path is %d bytes, the limit is 107", len(n.SocketPath))}
	}
	if n.PluginRegistrationTimeout <= 0 {
		return &FieldError{"nri.plugin_registration_timeout", "must be positive"}
	}
	if n.PluginRequestTimeout <= 0 {
		return &FieldError{"nri.plugin_request_timeout", "must be positive"}
	}
	return nil
}

func (m *MetricsConfig) validate() error {
	if m.Address != "" {
		if _, port, err := net.SplitHostPort(m.Address); err != nil || port == "" {
			return &FieldError{"metrics.address", fmt.Sprintf("must be host:port, got %q", m.Address)}
		}
	} else if m.EnablePprof {
		return &FieldError{"metrics.enable_pprof", "needs metrics.address"}
	}
	if m.DiskUsageInterval < Duration(100*time.Millisecond) {
		return &FieldError{"metrics.disk_usage_interval", fmt.Sprintf("must be at least 100ms, got %v", m.DiskUsageInterval.Std())}
	}
	return nil
}

func (c *ImageConfig) validate() error {
	if c.PullTimeout < 0 {
		return &FieldError{"image.pull_timeout", "must not be negative (0 means no total bound)"}
	}
	if c.PullProgressTimeout <= 0 {
		return &FieldError{"image.pull_progress_timeout", "must be positive"}
	}
	if c.MaxConcurrentDownloads < 1 || c.MaxConcurrentDownloads > 64 {
		return &FieldError{"image.max_concurrent_downloads", fmt.Sprintf("must be between 1 and 64, got %d", c.MaxConcurrentDownloads)}
	}
	if c.AuthFile != "" && !filepath.IsAbs(c.AuthFile) {
		return &FieldError{"image.auth_file", "must be an absolute path"}
	}
	if c.SignaturePolicy != "" && !filepath.IsAbs(c.SignaturePolicy) {
		return &FieldError{"image.signature_policy", "must be an absolute path"}
	}
	if c.SignaturePolicyDir != "" && !filepath.IsAbs(c.SignaturePolicyDir) {
		return &FieldError{"image.signature_policy_dir", "must be an absolute path"}
	}
	for host, r := range c.Registries {
		if host == "" || strings.ContainsAny(host, " /") {
			return &FieldError{"image.registries", fmt.Sprintf("bad registry host %q", host)}
		}
		if r.CAFile != "" && !filepath.IsAbs(r.CAFile) {
			return &FieldError{"image.registries." + host + ".ca_file", "must be an absolute path"}
		}
		if r.SkipOrigin && len(r.Mirrors) == 0 {
			return &FieldError{"image.registries." + host + ".skip_origin", "needs at least one mirror"}
		}
	}
	for _, p := range c.PinnedImages {
		if err := validPinPattern(p); err != nil {
			return &FieldError{"image.pinned_images", err.Error()}
		}
	}
	return nil
}

// validPinPattern accepts a name, or a prefix with one "*" at its end.
// Anything else would be a glob pinrt does not expand, silently pinning
// nothing.
func validPinPattern(p string) error {
	switch {
	case p == "" || p == "*":
		return fmt.Errorf("pattern %q pins nothing or everything; name images or prefixes", p)
	case strings.IndexFunc(p, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("pattern %q has a space or control character", p)
	case strings.ContainsAny(strings.TrimSuffix(p, "*"), "*?["):
		return fmt.Errorf("pattern %q: only a single \"*\" at the end is supported", p)
	}
	return nil
}

func (r *RuntimeConfig) validate() error {
	switch r.CgroupDriver {
	case "cgroupfs":
		if !strings.HasPrefix(r.CgroupParent, "/") || strings.Contains(r.CgroupParent, "..") {
			return &FieldError{"runtime.cgroup_parent", fmt.Sprintf("must be an absolute cgroup path without '..', got %q", r.CgroupParent)}
		}
	case "systemd":
		// The default "/pinrt" stands for pinrt.slice; anything else must
		// be a slice name (cgroups.New checks it in full at start).
		if r.CgroupParent != DefaultCgroupParent && (!strings.HasSuffix(r.CgroupParent, ".slice") || strings.ContainsAny(r.CgroupParent, "/ ")) {
			return &FieldError{"runtime.cgroup_parent", fmt.Sprintf("the systemd driver needs a slice name like pinrt.slice, got %q", r.CgroupParent)}
		}
	default:
		return &FieldError{"runtime.cgroup_driver", fmt.Sprintf("unknown driver %q (cgroupfs or systemd)", r.CgroupDriver)}
	}
	if r.Conmon == "" {
		return &FieldError{"runtime.conmon", "must not be empty"}
	}
	names := make([]string, 0, len(r.Runtimes))
	for n := range r.Runtimes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		h := r.Runtimes[n]
		key := "runtime.runtimes." + n
		if !handlerName.MatchString(n) {
			return &FieldError{key, "handler names are [a-zA-Z0-9_.-], at most 63 characters"}
		}
		if h.Binary == "" {
			return &FieldError{key + ".binary", "must not be empty"}
		}
		if h.Type != "" && h.Type != "oci" {
			return &FieldError{key + ".type", fmt.Sprintf("unknown type %q (oci)", h.Type)}
		}
		if h.Root != "" && !filepath.IsAbs(h.Root) {
			return &FieldError{key + ".root", "must be an absolute path"}
		}
	}
	if _, ok := r.Runtimes[r.DefaultRuntime]; !ok {
		return &FieldError{"runtime.default_runtime", fmt.Sprintf("%q is not in runtime.runtimes", r.DefaultRuntime)}
	}
	return nil
}

const idBlock = 1 << 16

func (u *UsernsConfig) validate() error {
	switch {
	case u.MinHostID < idBlock || u.MinHostID%idBlock != 0:
		return &FieldError{"userns.min_host_id", fmt.Sprintf("must be a multiple of 65536 and at least 65536, got %d", u.MinHostID)}
	case u.MaxHostID%idBlock != 0:
		return &FieldError{"userns.max_host_id", fmt.Sprintf("must be a multiple of 65536, got %d", u.MaxHostID)}
	case u.MaxHostID <= u.MinHostID:
		return &FieldError{"userns.max_host_id", "must be above min_host_id"}
	case u.MaxPods <= 0:
		return &FieldError{"userns.max_pods", "must be positive"}
	}
	return nil
}

func (s *StreamingConfig) validate() error {
	switch {
	case net.ParseIP(s.Address) == nil:
		return &FieldError{"streaming.address", fmt.Sprintf("must be an IP address, got %q", s.Address)}
	case s.Port < 0 || s.Port > 65535:
		return &FieldError{"streaming.port", fmt.Sprintf("must be 0-65535, got %d", s.Port)}
	case (s.TLSCertFile == "") != (s.TLSKeyFile == ""):
		return &FieldError{"streaming.tls_cert_file", "tls_cert_file and tls_key_file go together"}
	case s.TLSCertFile != "" && (!filepath.IsAbs(s.TLSCertFile) || !filepath.IsAbs(s.TLSKeyFile)):
		return &FieldError{"streaming.tls_cert_file", "TLS files must be absolute paths"}
	case s.IdleTimeout <= 0:
		return &FieldError{"streaming.idle_timeout", "must be positive"}
	case s.MaxStreams <= 0:
		return &FieldError{"streaming.max_streams", "must be positive"}
	}
	return nil
}
