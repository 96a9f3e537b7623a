package oci

import (
	"fmt"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/validate"
)

// validateID refuses an ID that is unsafe as a path component; the rule
// is internal/validate's, the one every package uses.
func validateID(id string) error { return validate.ID("container", id) }

// WithRootfs sets the root filesystem path.
func WithRootfs(rootfs string, readonly bool) SpecOpt {
	return func(g *Generator) error {
		if !filepath.IsAbs(rootfs) {
			return fmt.Errorf("rootfs %q is not absolute: %w", rootfs, errdefs.ErrInvalidArgument)
		}
		g.Config.Root = &specs.Root{Path: rootfs, Readonly: readonly}
		return nil
	}
}

// WithNamespaces joins the pod's pinned namespaces by path. A user
// namespace joined by path must not come with linux.uidMappings: runc
// derives them from the namespace and warns when both are given, and that
// warning would land in the container's log.
func WithNamespaces(ns Namespaces, cgroupNS bool) SpecOpt {
	return func(g *Generator) error {
		var list []specs.LinuxNamespace
		for _, j := range []struct {
			t    specs.LinuxNamespaceType
			path string
		}{
			{specs.UserNamespace, ns.User},
			{specs.NetworkNamespace, ns.Net},
			{specs.IPCNamespace, ns.IPC},
			{specs.UTSNamespace, ns.UTS},
		} {
			if j.path == "" {
				continue
			}
			if !filepath.IsAbs(j.path) {
				return fmt.Errorf("%s namespace path %q is not absolute: %w", j.t, j.path, errdefs.ErrInvalidArgument)
			}
			list = append(list, specs.LinuxNamespace{Type: j.t, Path: j.path})
		}
		switch ns.PIDMode {
		case PIDContainer, "":
			list = append(list, specs.LinuxNamespace{Type: specs.PIDNamespace})
		case PIDPod:
			if !filepath.IsAbs(ns.PID) {
				return fmt.Errorf("pod pid namespace path %q is not absolute: %w", ns.PID, errdefs.ErrInvalidArgument)
			}
			list = append(list, specs.LinuxNamespace{Type: specs.PIDNamespace, Path: ns.PID})
		case PIDNode:
		default:
			return fmt.Errorf("unknown pid mode %q: %w", ns.PIDMode, errdefs.ErrInvalidArgument)
		}
		list = append(list, specs.LinuxNamespace{Type: specs.MountNamespace})
		if cgroupNS {
			list = append(list, specs.LinuxNamespace{Type: specs.CgroupNamespace})
		}
		g.Config.Linux.Namespaces = list
		g.Config.Linux.UIDMappings = nil
		g.Config.Linux.GIDMappings = nil
		return nil
	}
}

// WithProcessArgs merges the request's command/args with the image's
// entrypoint/cmd as Kubernetes defines it: command replaces the entrypoint
// (and drops the image cmd), args replace the cmd.
func WithProcessArgs(command, args, entrypoint, cmd []string) SpecOpt {
	return func(g *Generator) error {
		var out []string
		switch {
		case len(command) > 0:
			out = append(append(out, command...), args...)
		case len(args) > 0:
			out = append(append(out, entrypoint...), args...)
		default:
			out = append(append(out, entrypoint...), cmd...)
		}
		if len(out) == 0 {
			return fmt.Errorf("no command specified: %w", errdefs.ErrInvalidArgument)
		}
		g.Config.Process.Args = out
		return nil
	}
}

// defaultPath is what containerd and Docker use when the image sets no PATH.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// WithEnv merges the image env with the request env; the request wins by
// key, and the first occurrence keeps its position.
func WithEnv(imageEnv, env []string) SpecOpt {
	return func(g *Generator) error {
		g.Config.Process.Env = mergeEnv(g.Config.Process.Env, imageEnv, env)
		if envIndex(g.Config.Process.Env, "PATH") < 0 {
			g.Config.Process.Env = append([]string{defaultPath}, g.Config.Process.Env...)
		}
		return nil
	}
}

func mergeEnv(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, kv := range l {
			k, _, _ := strings.Cut(kv, "=")
			if k == "" {
				continue
			}
			if i := envIndex(out, k); i >= 0 {
				out[i] = kv
				continue
			}
			out = append(out, kv)
		}
	}
	return out
}

func envIndex(env []string, key string) int {
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return i
		}
	}
	return -1
}

// WithHostname exports HOSTNAME. The UTS namespace is the pod's pin, whose
// hostname nsmgr already set, so spec.hostname stays empty: runc would
// otherwise sethostname the shared namespace on every container start.
func WithHostname(hostname string) SpecOpt {
	return func(g *Generator) error {
		if hostname != "" && envIndex(g.Config.Process.Env, "HOSTNAME") < 0 {
			g.Config.Process.Env = append(g.Config.Process.Env, "HOSTNAME="+hostname)
		}
		return nil
	}
}

// WithWorkingDir sets the cwd: the request's, else the image's, else "/".
func WithWorkingDir(dir, imageDir string) SpecOpt {
	return func(g *Generator) error {
		cwd := dir
		if cwd == "" {
			cwd = imageDir
		}
		if cwd == "" {
			cwd = "/"
		}
		if !path.IsAbs(cwd) {
			return fmt.Errorf("working dir %q is not absolute: %w", cwd, errdefs.ErrInvalidArgument)
		}
		g.Config.Process.Cwd = cwd
		return nil
	}
}

// WithTTY sets up the process terminal. Stdin alone needs no spec change:
// conmon passes the pipe.
func WithTTY(tty, _ bool) SpecOpt {
	return func(g *Generator) error {
		g.Config.Process.Terminal = tty
		if tty && envIndex(g.Config.Process.Env, "TERM") < 0 {
			g.Config.Process.Env = append(g.Config.Process.Env, "TERM=xterm")
		}
		return nil
	}
}

// WithNoNewPrivileges sets no_new_privs.
func WithNoNewPrivileges(b bool) SpecOpt {
	return func(g *Generator) error {
		g.Config.Process.NoNewPrivileges = b
		return nil
	}
}

// WithPrivileged opens up devices for privileged containers: the device
// cgroup allows everything and /sys and the cgroup fs become writable.
// Host device nodes are added by WithDevices(…, true).
func WithPrivileged(privileged bool) SpecOpt {
	return func(g *Generator) error {
		if !privileged {
			return nil
		}
		g.resources().Devices = []specs.LinuxDeviceCgroup{{Allow: true, Access: "rwm"}}
		for i, m := range g.Config.Mounts {
			if m.Destination == "/sys" || m.Destination == "/sys/fs/cgroup" {
				g.Config.Mounts[i].Options = without(m.Options, "ro")
			}
		}
		return nil
	}
}

// WithMaskedPaths applies masked and read-only paths; nil lists mean the
// defaults, and privileged containers get none.
func WithMaskedPaths(privileged bool, masked, readonly []string) SpecOpt {
	return func(g *Generator) error {
		if privileged {
			g.Config.Linux.MaskedPaths, g.Config.Linux.ReadonlyPaths = nil, nil
			return nil
		}
		if masked == nil {
			masked = DefaultMaskedPaths
		}
		if readonly == nil {
			readonly = DefaultReadonlyPaths
		}
		g.Config.Linux.MaskedPaths = append([]string(nil), masked...)
		g.Config.Linux.ReadonlyPaths = append([]string(nil), readonly...)
		return nil
	}
}

// WithSysfs decides how /sys appears. A fresh sysfs needs the mounter to
// own the network namespace's user namespace: true without a userns (runc
// is host root), and true in a userns pod because nsmgr creates the pod
// netns inside it. A userns container on the host network cannot mount
// sysfs, so it gets a read-only bind of the host's /sys.
func WithSysfs(userNS, podNetNS, privileged bool) SpecOpt {
	return func(g *Generator) error {
		m := specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev"}}
		if userNS && !podNetNS {
			m = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev"}}
		}
		if !privileged {
			m.Options = append(m.Options, "ro")
		}
		g.setMount(m)
		return nil
	}
}

// WithPodFiles bind-mounts the pod's shared files. Empty paths are skipped.
func WithPodFiles(hosts, resolv, hostname, shm string, readonlyRootfs bool) SpecOpt {
	return func(g *Generator) error {
		for _, f := range []struct{ src, dst string }{
			{hosts, "/etc/hosts"},
			{resolv, "/etc/resolv.conf"},
			{hostname, "/etc/hostname"},
		} {
			if f.src == "" {
				continue
			}
			if !filepath.IsAbs(f.src) {
				return fmt.Errorf("pod file %q is not absolute: %w", f.src, errdefs.ErrInvalidArgument)
			}
			opts := []string{"rbind", "rprivate"}
			if readonlyRootfs {
				opts = append(opts, "ro")
			}
			g.setMount(specs.Mount{Destination: f.dst, Type: "bind", Source: f.src, Options: opts})
		}
		if shm != "" {
			if !filepath.IsAbs(shm) {
				return fmt.Errorf("shm path %q is not absolute: %w", shm, errdefs.ErrInvalidArgument)
			}
			g.setMount(specs.Mount{Destination: "/dev/shm", Type: "bind", Source: shm, Options: []string{"rbind", "rprivate", "nosuid", "nodev", "noexec"}})
		}
		return nil
	}
}

// WithMounts adds the volumes. In a userns pod each gets idmap mappings
// (its own, else the pod's), which needs runtime support; recursive
// read-only needs "rro" in the runtime's mount options. A volume's extra
// options (noexec, nodev, nosuid) go with its others: runc remounts the
// bind with them, idmapped or not. Volumes replace default mounts at the
// same destination and are ordered parents first, among themselves and
// with the mounts already in the spec.
func WithMounts(mounts []Mount, userNS bool, podUID, podGID []specs.LinuxIDMapping, feat *Features) SpecOpt {
	return func(g *Generator) error {
		sorted := append([]Mount(nil), mounts...)
		// Parents before children, or a later parent mount would hide a child.
		sort.SliceStable(sorted, func(i, j int) bool {
			return depth(sorted[i].ContainerPath) < depth(sorted[j].ContainerPath)
		})
		rootProp := ""
		dsts := make([]string, 0, len(sorted))
		for _, m := range sorted {
			if !filepath.IsAbs(m.HostPath) {
				return fmt.Errorf("mount host path %q is not absolute: %w", m.HostPath, errdefs.ErrInvalidArgument)
			}
			if !path.IsAbs(m.ContainerPath) {
				return fmt.Errorf("mount container path %q is not absolute: %w", m.ContainerPath, errdefs.ErrInvalidArgument)
			}
			opts := []string{"rbind"}
			switch m.Propagation {
			case PropagationPrivate:
				opts = append(opts, "rprivate")
			case PropagationHostToContainer:
				opts = append(opts, "rslave")
				if rootProp == "" {
					rootProp = "rslave"
				}
			case PropagationBidirectional:
				opts = append(opts, "rshared")
				rootProp = "rshared"
			default:
				return fmt.Errorf("mount %s: unknown propagation %d: %w", m.ContainerPath, m.Propagation, errdefs.ErrInvalidArgument)
			}
			switch {
			case m.RecursiveReadOnly:
				if !m.Readonly || m.Propagation != PropagationPrivate {
					return fmt.Errorf("mount %s: recursive read-only needs readonly and private propagation: %w", m.ContainerPath, errdefs.ErrInvalidArgument)
				}
				if feat == nil || !feat.RecursiveReadOnly {
					return fmt.Errorf("mount %s: recursive read-only is not supported by the runtime (no \"rro\" mount option): %w", m.ContainerPath, errdefs.ErrFailedPrecondition)
				}
				opts = append(opts, "rro")
			case m.Readonly:
				opts = append(opts, "ro")
			}
			opts, err := withVolumeOptions(opts, m.ContainerPath, m.Options, feat)
			if err != nil {
				return err
			}
			sm := specs.Mount{Destination: path.Clean(m.ContainerPath), Type: "bind", Source: filepath.Clean(m.HostPath), Options: opts}
			uids, gids := m.UIDMappings, m.GIDMappings
			if userNS && len(uids) == 0 && len(gids) == 0 {
				uids, gids = podUID, podGID
			}
			if len(uids) > 0 || len(gids) > 0 {
				if feat == nil || !feat.IDMapMounts {
					return fmt.Errorf("mount %s: idmapped mounts are not supported by the runtime: %w", m.ContainerPath, errdefs.ErrFailedPrecondition)
				}
				sm.UIDMappings = append([]specs.LinuxIDMapping(nil), uids...)
				sm.GIDMappings = append([]specs.LinuxIDMapping(nil), gids...)
			}
			g.setMount(sm)
			dsts = append(dsts, sm.Destination)
		}
		// The pod's files and the default mounts come first: a volume at
		// /etc must not hide /etc/resolv.conf.
		g.parentsFirst(dsts)
		if rootProp != "" {
			g.Config.Linux.RootfsPropagation = rootProp
		}
		return nil
	}
}

func depth(p string) int {
	p = path.Clean(p)
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}

// defaultDevices are the device nodes every container may use, with
// their cgroup rules (runc creates the nodes itself).
var defaultDeviceRules = []specs.LinuxDeviceCgroup{
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"},     // /dev/null
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(5), Access: "rwm"},     // /dev/zero
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(7), Access: "rwm"},     // /dev/full
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(8), Access: "rwm"},     // /dev/random
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(9), Access: "rwm"},     // /dev/urandom
	{Allow: true, Type: "c", Major: i64(5), Minor: i64(0), Access: "rwm"},     // /dev/tty
	{Allow: true, Type: "c", Major: i64(5), Minor: i64(2), Access: "rwm"},     // /dev/ptmx
	{Allow: true, Type: "c", Major: i64(136), Minor: nil, Access: "rwm"},      // /dev/pts/*
	{Allow: false, Type: "c", Major: i64(10), Minor: i64(200), Access: "rwm"}, // /dev/net/tun stays denied
}

func i64(v int64) *int64 { return &v }

// statDevice is swapped in tests that cannot mknod.
var statDevice = func(p string) (typ string, major, minor int64, mode uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", 0, 0, 0, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		typ = "c"
	case unix.S_IFBLK:
		typ = "b"
	default:
		return "", 0, 0, 0, fmt.Errorf("%s is not a device node", p)
	}
	return typ, int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev)), st.Mode &^ unix.S_IFMT, nil
}

// WithDevices adds the default device cgroup rules and the requested host
// devices (stat'ed for type and numbers); a privileged container also
// gets every device node of the host (withHostDevices), as in containerd
// and CRI-O. In a pod with a user namespace (u set) runc cannot make
// device nodes, and binds each from the host path equal to its container
// path: a device kubelet puts at another path becomes a bind mount of its
// host node instead (rewriteForUserNS), as a CDI device does.
func WithDevices(devs []Device, privileged bool, u *PodUserNS) SpecOpt {
	return func(g *Generator) error {
		r := g.resources()
		if !privileged {
			r.Devices = append(r.Devices, defaultDeviceRules...)
		}
		nodes := make([]hostNode, 0, len(devs))
		for _, d := range devs {
			if !filepath.IsAbs(d.HostPath) || !path.IsAbs(d.ContainerPath) {
				return fmt.Errorf("device %q -> %q: paths must be absolute: %w", d.HostPath, d.ContainerPath, errdefs.ErrInvalidArgument)
			}
			perms := d.Permissions
			if perms == "" {
				perms = "rwm"
			}
			if strings.Trim(perms, "rwm") != "" {
				return fmt.Errorf("device %s: invalid permissions %q: %w", d.HostPath, perms, errdefs.ErrInvalidArgument)
			}
			typ, major, minor, mode, err := statDevice(d.HostPath)
			if err != nil {
				return fmt.Errorf("device %s: %w: %w", d.HostPath, err, errdefs.ErrInvalidArgument)
			}
			fm := fileMode(mode)
			g.Config.Linux.Devices = append(g.Config.Linux.Devices, specs.LinuxDevice{
				Path: path.Clean(d.ContainerPath), Type: typ, Major: major, Minor: minor, FileMode: &fm,
			})
			if !privileged {
				r.Devices = append(r.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: typ, Major: i64(major), Minor: i64(minor), Access: perms})
			}
			nodes = append(nodes, hostNode{Path: d.ContainerPath, HostPath: d.HostPath})
		}
		if privileged {
			if err := withHostDevices(g.Config); err != nil {
				return err
			}
		}
		return rewriteForUserNS(g.Config, nodes, nil, u)
	}
}

// WithFixedCgroupsPath sets linux.cgroupsPath as the cgroup driver named
// it; "" leaves what an earlier option set.
func WithFixedCgroupsPath(p string) SpecOpt {
	return func(g *Generator) error {
		if p != "" {
			g.Config.Linux.CgroupsPath = p
		}
		return nil
	}
}

// WithCgroupsPath places the container's cgroup (cgroupfs driver):
// <parent>/pinrt-<id> when a parent is given, else /pinrt/<sandbox>/<id>.
func WithCgroupsPath(parent, sandboxID, id string) SpecOpt {
	return func(g *Generator) error {
		if parent != "" {
			if !path.IsAbs(parent) {
				return fmt.Errorf("cgroup parent %q is not absolute: %w", parent, errdefs.ErrInvalidArgument)
			}
			g.Config.Linux.CgroupsPath = path.Join(path.Clean(parent), "pinrt-"+id)
			return nil
		}
		if sandboxID == "" {
			g.Config.Linux.CgroupsPath = path.Join("/pinrt", id)
			return nil
		}
		if err := validateID(sandboxID); err != nil {
			return err
		}
		g.Config.Linux.CgroupsPath = path.Join("/pinrt", sandboxID, id)
		return nil
	}
}

// WithSysctls sets container-level sysctls.
func WithSysctls(sysctls map[string]string) SpecOpt {
	return func(g *Generator) error {
		if len(sysctls) == 0 {
			return nil
		}
		if g.Config.Linux.Sysctl == nil {
			g.Config.Linux.Sysctl = map[string]string{}
		}
		for k, v := range sysctls {
			g.Config.Linux.Sysctl[k] = v
		}
		return nil
	}
}

// WithAnnotations copies annotations into the spec.
func WithAnnotations(a map[string]string) SpecOpt {
	return func(g *Generator) error {
		if len(a) == 0 {
			return nil
		}
		if g.Config.Annotations == nil {
			g.Config.Annotations = map[string]string{}
		}
		for k, v := range a {
			g.Config.Annotations[k] = v
		}
		return nil
	}
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// logDrop records a setting the host cannot apply.
func (g *Generator) logDrop(format string, args ...any) {
	log.G(g.ctx()).Debugf(format, args...)
}
