package cgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// Driver places pods and containers in cgroups. The daemon picks one at
// start from runtime.cgroup_driver (New); nothing else asks which it is.
type Driver interface {
	// Name is the config name, "cgroupfs" or "systemd".
	Name() string
	// PodParent is the cgroup parent of a pod's containers: kubelet's
	// cgroup_parent when it sent one, else one this driver owns under the
	// configured default.
	PodParent(kubeletParent, sandboxID string) (string, error)
	// EnsurePod makes the pod parent exist before a container goes in.
	EnsurePod(ctx context.Context, parent string) error
	// ContainerPath is the OCI linux.cgroupsPath of container id.
	ContainerPath(parent, id string) string
	// RuntimeArgs are the global flags the OCI runtime needs for this
	// driver.
	RuntimeArgs() []string
	// RemovePod removes the pod's cgroup if the driver made it; a parent
	// kubelet sent is kubelet's to remove. Removing what is gone succeeds.
	RemovePod(ctx context.Context, kubeletParent, sandboxID string) error
	// FSPath is the cgroupfs path, under the mount root, of a pod parent
	// (PodParent) or an OCI cgroupsPath (ContainerPath), which is where
	// the statistics are read; "" if p is not in this driver's form.
	FSPath(p string) string
}

// Driver names, as runtime.cgroup_driver spells them.
const (
	DriverCgroupfs = "cgroupfs"
	DriverSystemd  = "systemd"
)

// New returns the driver called name. defaultParent is where pods go when
// kubelet names no parent: a cgroup path for cgroupfs ("/pinrt"), a slice
// for systemd ("pinrt.slice"; the cgroupfs default "/pinrt" maps to it).
func New(name, defaultParent string) (Driver, error) {
	switch name {
	case DriverCgroupfs, "":
		return &cgroupfs{root: DefaultRoot, parent: defaultParent}, nil
	case DriverSystemd:
		slice, err := defaultSlice(defaultParent)
		if err != nil {
			return nil, err
		}
		return newSystemd(slice), nil
	}
	return nil, fmt.Errorf("unknown cgroup driver %q: %w", name, errdefs.ErrInvalidArgument)
}

// cgroupfs leaves the hierarchy to runc, which creates each container's
// directory (and its parents) itself.
type cgroupfs struct {
	root   string // the cgroup mount root; a field for tests
	parent string
}

var _ Driver = (*cgroupfs)(nil)

func (*cgroupfs) Name() string { return DriverCgroupfs }

func (d *cgroupfs) PodParent(kubeletParent, sandboxID string) (string, error) {
	if kubeletParent != "" {
		if !path.IsAbs(kubeletParent) || strings.Contains(kubeletParent, "..") {
			return "", fmt.Errorf("cgroup parent %q is not an absolute cgroup path: %w", kubeletParent, errdefs.ErrInvalidArgument)
		}
		return path.Clean(kubeletParent), nil
	}
	base := d.parent
	if base == "" {
		base = "/pinrt"
	}
	return path.Join(base, sandboxID), nil
}

func (*cgroupfs) EnsurePod(context.Context, string) error { return nil }

func (*cgroupfs) ContainerPath(parent, id string) string { return path.Join(parent, "pinrt-"+id) }

func (*cgroupfs) RuntimeArgs() []string { return nil }

func (*cgroupfs) FSPath(p string) string {
	if !path.IsAbs(p) || strings.Contains(p, "..") {
		return ""
	}
	return path.Clean(p)
}

// RemovePod removes the pod's directory from every hierarchy: the unified
// one on v2, each controller's on v1. runc removes each container's own
// cgroup on delete but not the parent pinrt named for the pod. Failures
// only leave an empty directory behind, so they are logged.
func (d *cgroupfs) RemovePod(ctx context.Context, kubeletParent, sandboxID string) error {
	if kubeletParent != "" {
		return nil
	}
	rel, err := d.PodParent("", sandboxID)
	if err != nil {
		return err
	}
	dirs := []string{filepath.Join(d.root, rel)}
	entries, _ := os.ReadDir(d.root)
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(d.root, e.Name(), rel))
		}
	}
	for _, dir := range dirs {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, os.ErrInvalid) {
			log.G(ctx).WithError(err).Debugf("removing pod cgroup %s", dir)
		}
	}
	return nil
}

// defaultSlice turns the configured default parent into a slice name.
func defaultSlice(parent string) (string, error) {
	switch {
	case parent == "" || parent == "/pinrt":
		return "pinrt.slice", nil
	case IsSlice(parent):
		return parent, nil
	}
	return "", fmt.Errorf("cgroup parent %q is not a systemd slice name (like pinrt.slice): %w", parent, errdefs.ErrInvalidArgument)
}

// IsSlice reports whether s is a plain slice unit name, the form kubelet's
// systemd driver sends ("kubepods-burstable-pod<uid>.slice"). Its
// characters are those of systemd's unit names but ':', which runc's
// "slice:prefix:name" cannot carry (systemd would make the slice, and
// runc refuse every container in it), and the backslash of systemd's
// escapes, which kubelet never writes.
func IsSlice(s string) bool {
	name, ok := strings.CutSuffix(s, ".slice")
	if !ok || name == "" || strings.Contains(name, "..") {
		return false
	}
	if strings.IndexFunc(name, notUnitChar) >= 0 {
		return false
	}
	return !strings.HasPrefix(name, "-") && !strings.HasSuffix(name, "-") && !strings.Contains(name, "--")
}

// notUnitChar says c is none of the characters IsSlice allows.
func notUnitChar(c rune) bool {
	return (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.'
}
