package oci

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// DefaultCDISpecDirs are where device plugins write CDI specs, as the CDI
// library and both anchors have them: static specs first, generated ones
// (higher priority) second.
var DefaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// CDIRegistry resolves fully qualified CDI device names
// ("vendor.com/class=name") against the spec files in its directories.
//
// It re-reads the directories in Resolve, once per container that asks
// for a device, instead of watching them: a spec a device plugin wrote
// just before kubelet's CreateContainer is then always seen, which an
// inotify watch only promises eventually. Containers without CDI devices
// cost nothing.
type CDIRegistry struct {
	dirs []string
	// mu orders a refresh against the injections that rely on it.
	mu    sync.Mutex
	cache *cdi.Cache
}

// NewCDIRegistry returns a registry over dirs, in increasing priority.
// Directories that do not exist yet are fine: they are read when they do.
func NewCDIRegistry(dirs []string) (*CDIRegistry, error) {
	if len(dirs) == 0 {
		dirs = DefaultCDISpecDirs
	}
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("CDI spec dir %q is not absolute: %w", d, errdefs.ErrInvalidArgument)
		}
	}
	c, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI registry over %v: %w", dirs, err)
	}
	return &CDIRegistry{dirs: slices.Clone(dirs), cache: c}, nil
}

// CDIDeviceNames validates and merges the devices a container asks for:
// the CRI field's names first, then those of the cdi.k8s.io/ annotations
// (the older way device plugins hand them over), without duplicates.
func CDIDeviceNames(field []string, annotations map[string]string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	add := func(n string) error {
		if _, _, _, err := parser.ParseQualifiedName(n); err != nil {
			return fmt.Errorf("CDI device %q: %w: %w", n, err, errdefs.ErrInvalidArgument)
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
		return nil
	}
	for _, n := range field {
		if err := add(n); err != nil {
			return nil, err
		}
	}
	_, annotated, err := cdi.ParseAnnotations(annotations)
	if err != nil {
		return nil, fmt.Errorf("CDI annotations: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	// ParseAnnotations walks a map: sort so the spec edits come out in
	// the same order for the same request.
	sort.Strings(annotated)
	for _, n := range annotated {
		if err := add(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Resolve re-reads the spec directories and checks that every device is
// defined. An unknown device is FailedPrecondition (its device plugin has
// not written its spec, or wrote a broken one); the error names the
// device, and every spec file that failed to load with its reason.
func (r *CDIRegistry) Resolve(names []string) error {
	if len(names) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Refresh reports the errors of every spec file, also of files
	// naming other devices; only an unresolved device makes them matter.
	_ = r.cache.Refresh()
	var missing []string
	for _, n := range names {
		if r.cache.GetDevice(n) == nil {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("CDI device %s not found in %s%s: %w",
		quoteAll(missing), strings.Join(r.dirs, ", "), r.specErrors(), errdefs.ErrFailedPrecondition)
}

// specErrors describes the spec files that failed to load, "" if none.
func (r *CDIRegistry) specErrors() string {
	errs := r.cache.GetErrors()
	if len(errs) == 0 {
		return ""
	}
	files := make([]string, 0, len(errs))
	for f := range errs {
		files = append(files, f)
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		fmt.Fprintf(&b, "; spec file %s: %v", f, errors.Join(errs[f]...))
	}
	return b.String()
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// inject applies the edits of names to s and returns the raw device
// nodes and mounts they asked for, for the user-namespace rewrite.
func (r *CDIRegistry) inject(s *specs.Spec, names []string) ([]cdispec.DeviceNode, []cdispec.Mount, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var nodes []cdispec.DeviceNode
	var mounts []cdispec.Mount
	seenSpec := map[*cdi.Spec]bool{}
	collect := func(e cdispec.ContainerEdits) {
		for _, n := range e.DeviceNodes {
			if n != nil {
				nodes = append(nodes, *n)
			}
		}
		for _, m := range e.Mounts {
			if m != nil {
				mounts = append(mounts, *m)
			}
		}
	}
	for _, n := range names {
		d := r.cache.GetDevice(n)
		if d == nil {
			return nil, nil, fmt.Errorf("CDI device %q not found in %s: %w", n, strings.Join(r.dirs, ", "), errdefs.ErrFailedPrecondition)
		}
		if sp := d.GetSpec(); !seenSpec[sp] {
			seenSpec[sp] = true
			collect(sp.ContainerEdits)
		}
		collect(d.ContainerEdits)
	}
	if _, err := r.cache.InjectDevices(s, names...); err != nil {
		files := map[string]bool{}
		for _, n := range names {
			files[r.cache.GetDevice(n).GetSpec().GetPath()] = true
		}
		return nil, nil, fmt.Errorf("CDI devices %s (spec %s): %w: %w", quoteAll(names), strings.Join(sortedKeys(files), ", "), err, errdefs.ErrFailedPrecondition)
	}
	return nodes, mounts, nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// WithCDIDevices applies the CDI edits (device nodes, mounts, env, hooks)
// of the named devices. It runs after the container's own mounts and
// devices, so a CDI spec can replace them as it does in the anchors. In
// a pod with a user namespace (u set) the nodes and bind mounts are
// rewritten to work there (rewriteForUserNS).
func WithCDIDevices(r *CDIRegistry, names []string, u *PodUserNS) SpecOpt {
	return func(g *Generator) error {
		if len(names) == 0 {
			return nil
		}
		if r == nil {
			return fmt.Errorf("CDI devices %s requested, but CDI is not configured: %w", quoteAll(names), errdefs.ErrFailedPrecondition)
		}
		return r.injectForUserNS(g.Config, names, u)
	}
}

// injectForUserNS applies the edits of names to s and, for a pod with a
// user namespace, rewrites the nodes and mounts they added.
func (r *CDIRegistry) injectForUserNS(s *specs.Spec, names []string, u *PodUserNS) error {
	nodes, mounts, err := r.inject(s, names)
	if err != nil || u == nil {
		return err
	}
	hn := make([]hostNode, 0, len(nodes))
	for _, n := range nodes {
		hn = append(hn, hostNode{Path: n.Path, HostPath: n.HostPath})
	}
	dsts := make([]string, 0, len(mounts))
	for _, m := range mounts {
		dsts = append(dsts, m.ContainerPath)
	}
	if err := rewriteForUserNS(s, hn, dsts, u); err != nil {
		return fmt.Errorf("CDI devices %s: %w", quoteAll(names), err)
	}
	return nil
}

func isBind(m specs.Mount) bool {
	if m.Type == "bind" {
		return true
	}
	return slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
