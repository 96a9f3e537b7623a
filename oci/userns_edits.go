package oci

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// PodUserNS is what the devices and mounts added to a container of a pod
// with its own user namespace are rewritten with: the pod's mappings and
// the runtime's features. nil is a pod in the host's user namespace.
type PodUserNS struct {
	UIDMappings, GIDMappings []specs.LinuxIDMapping
	Features                 *Features
}

// hostNode is a device node added to a spec and the host file it is to
// be bound from ("" is its container path).
type hostNode struct {
	Path, HostPath string
}

// rewriteForUserNS makes device nodes and bind mounts that CDI or an NRI
// plugin added to s work in a user namespace.
//
// There runc cannot mknod, so it bind-mounts each device node from the
// host path equal to its container path. A node whose host file has
// another name would then bind the wrong file, or none: it becomes an
// explicit bind mount of its host file instead. The added bind mounts
// (at dsts) are idmapped with the pod's mappings, like volumes, so their
// owners show as in the host.
func rewriteForUserNS(s *specs.Spec, nodes []hostNode, dsts []string, u *PodUserNS) error {
	if u == nil {
		return nil
	}
	for _, n := range nodes {
		if n.HostPath == "" || path.Clean(n.HostPath) == path.Clean(n.Path) {
			continue
		}
		dst := path.Clean(n.Path)
		s.Linux.Devices = slices.DeleteFunc(s.Linux.Devices, func(d specs.LinuxDevice) bool { return path.Clean(d.Path) == dst })
		setSpecMount(s, specs.Mount{Destination: dst, Type: "bind", Source: filepath.Clean(n.HostPath), Options: []string{"bind", "nosuid", "noexec"}})
	}
	for _, dst := range dsts {
		i := specMount(s, dst)
		if i < 0 || !isBind(s.Mounts[i]) {
			continue
		}
		if u.Features == nil || !u.Features.IDMapMounts {
			return fmt.Errorf("mount %s: idmapped mounts are not supported by the runtime: %w", dst, errdefs.ErrFailedPrecondition)
		}
		sm := &s.Mounts[i]
		sm.UIDMappings = slices.Clone(u.UIDMappings)
		sm.GIDMappings = slices.Clone(u.GIDMappings)
	}
	return nil
}

// specMount is the index of the mount at dst, or -1.
func specMount(s *specs.Spec, dst string) int {
	dst = path.Clean(dst)
	for i, m := range s.Mounts {
		if path.Clean(m.Destination) == dst {
			return i
		}
	}
	return -1
}

// setSpecMount replaces the mount at m.Destination or appends m.
func setSpecMount(s *specs.Spec, m specs.Mount) {
	if i := specMount(s, m.Destination); i >= 0 {
		s.Mounts[i] = m
		return
	}
	s.Mounts = append(s.Mounts, m)
}

// devRoot is where host device nodes are looked for (a variable for
// tests).
var devRoot = "/dev"

// hostDeviceNode finds the host file of a device an NRI plugin added,
// which names only its container path, type and numbers: the host file
// at the same path when it is that device, else /dev/char/M:m or
// /dev/block/M:m, else a node of that device in /dev or its
// subdirectories. A device with no node on the host cannot be bound into
// a user namespace: FailedPrecondition.
func hostDeviceNode(d specs.LinuxDevice) (string, error) {
	if d.Type == "p" {
		return "", nil // a FIFO runc makes itself
	}
	want := unix.Mkdev(uint32(d.Major), uint32(d.Minor))
	block := d.Type == "b"
	is := func(p string) bool {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil {
			return false
		}
		mode := st.Mode & unix.S_IFMT
		return st.Rdev == want && ((block && mode == unix.S_IFBLK) || (!block && mode == unix.S_IFCHR))
	}
	if is(d.Path) {
		return d.Path, nil
	}
	kind := "char"
	if block {
		kind = "block"
	}
	candidates := []string{filepath.Join(devRoot, kind, fmt.Sprintf("%d:%d", d.Major, d.Minor))}
	for _, pattern := range []string{"*", "*/*"} {
		m, _ := filepath.Glob(filepath.Join(devRoot, pattern))
		candidates = append(candidates, m...)
	}
	for _, p := range candidates {
		if is(p) {
			if r, err := filepath.EvalSymlinks(p); err == nil {
				return r, nil
			}
		}
	}
	return "", fmt.Errorf("device %s (%s %d:%d): no node of it on the host to bind into the pod's user namespace: %w",
		d.Path, d.Type, d.Major, d.Minor, errdefs.ErrFailedPrecondition)
}
