package oci

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-tools/generate"
)

// Generator holds the spec being built: runtime-tools' generator, whose
// Config the options read and edit, plus the context for their logs.
type Generator struct {
	*generate.Generator
	// Ctx carries the logger for options that drop settings with a debug
	// log instead of failing.
	Ctx context.Context
}

// SpecOpt is one step of spec generation.
type SpecOpt func(g *Generator) error

// PIDMode says which PID namespace a container gets.
type PIDMode string

const (
	// PIDContainer gives the container its own, new PID namespace.
	PIDContainer PIDMode = "container"
	// PIDPod joins the pod's PID namespace (Namespaces.PID, the infra process's).
	PIDPod PIDMode = "pod"
	// PIDNode uses the host's PID namespace.
	PIDNode PIDMode = "node"
)

// Namespaces are the pinned pod namespaces a container joins. An empty path
// means the host's namespace for net/ipc/uts and "no user namespace" for user.
type Namespaces struct {
	User, Net, IPC, UTS string
	PIDMode             PIDMode
	// PID is the infra process's PID namespace path, used with PIDPod.
	PID string
}

// Propagation is a volume's mount propagation.
type Propagation int

const (
	PropagationPrivate         Propagation = iota // rprivate
	PropagationHostToContainer                    // rslave
	PropagationBidirectional                      // rshared
)

// Mount is a volume bind-mounted into the container.
type Mount struct {
	HostPath, ContainerPath string
	Readonly                bool
	// RecursiveReadOnly makes every submount read-only too ("rro"); it
	// needs Readonly, private propagation and runtime support.
	RecursiveReadOnly bool
	Propagation       Propagation
	// SelinuxRelabel is accepted and ignored: pinrt does not relabel.
	SelinuxRelabel bool
	// UIDMappings/GIDMappings idmap the mount; for a userns pod they default
	// to the pod's mappings.
	UIDMappings, GIDMappings []specs.LinuxIDMapping
	// Options are the extra mount options the volume asks for, from
	// VolumeMountOptions only (CRI mount_options).
	Options []string
}

// Device is a host device node exposed in the container.
type Device struct {
	HostPath, ContainerPath string
	// Permissions is the cgroup access string ("rwm" subset); "" means "rwm".
	Permissions string
}

// User is the requested process identity; nil/empty fields fall back to the
// image's USER.
type User struct {
	UID      *int64
	GID      *int64
	Username string
	// SupplementalGroups are added to the groups found in /etc/group
	// (GroupsMerge) or are the only supplementary groups (GroupsStrict).
	SupplementalGroups []int64
	GroupsPolicy       GroupsPolicy
}

// GroupsPolicy is the CRI's SupplementalGroupsPolicy.
type GroupsPolicy int

const (
	// GroupsMerge adds the user's /etc/group memberships in the image.
	GroupsMerge GroupsPolicy = iota
	// GroupsStrict ignores the image's /etc/group: an image must not be
	// able to grant its user groups the pod did not ask for.
	GroupsStrict
)

// ProfileType selects a seccomp or AppArmor profile kind.
type ProfileType int

const (
	ProfileRuntimeDefault ProfileType = iota
	ProfileUnconfined
	ProfileLocalhost
)

// SecurityProfile is a seccomp or AppArmor profile choice. For seccomp,
// Localhost is an absolute path to a JSON profile; for AppArmor it is the
// name of a profile loaded on the host.
type SecurityProfile struct {
	Type      ProfileType
	Localhost string
}

// Hugepage is a hugetlb limit for one page size ("2MB", "1GB").
type Hugepage struct {
	PageSize string
	Limit    uint64
}

// Resources are the container's cgroup limits. Zero values mean "unset".
type Resources struct {
	CPUShares       uint64
	CPUQuota        int64
	CPUPeriod       uint64
	CpusetCpus      string
	CpusetMems      string
	MemoryLimit     int64
	MemorySwapLimit int64
	PidsLimit       int64
	Hugepages       []Hugepage
	Unified         map[string]string
	OOMScoreAdj     int
}

// ContainerSpec is everything pinrt knows about a container when it builds
// its OCI spec. It holds no CRI types; server/ converts into it.
type ContainerSpec struct {
	ID        string
	SandboxID string
	// Rootfs is the already-mounted root filesystem.
	Rootfs     string
	Namespaces Namespaces
	// PodUIDMappings/PodGIDMappings are the pod's userns mappings; they are
	// the default idmap of volumes in a userns pod and never go into
	// linux.uidMappings (the userns is joined by path).
	PodUIDMappings, PodGIDMappings []specs.LinuxIDMapping

	Hostname                                     string
	HostsPath, ResolvPath, HostnamePath, ShmPath string

	Command, Args             []string
	ImageEntrypoint, ImageCmd []string
	// Env and ImageEnv are "KEY=VALUE"; Env wins by key.
	Env, ImageEnv               []string
	WorkingDir, ImageWorkingDir string
	User                        User
	// ImageUser is the image config's USER ("name", "uid", "uid:gid", ...).
	ImageUser string

	CapAdd, CapDrop []string
	Privileged      bool
	ReadonlyRootfs  bool
	NoNewPrivs      bool
	// MaskedPaths/ReadonlyPaths nil means the defaults; an empty, non-nil
	// slice means none.
	MaskedPaths, ReadonlyPaths []string
	Seccomp                    SecurityProfile
	AppArmor                   SecurityProfile
	// SELinuxLabel is the process label; empty means none.
	SELinuxLabel string

	Mounts []Mount
	// ImageVolumes are images mounted read-only (KEP-4639).
	ImageVolumes []ImageVolume
	Devices      []Device
	// CDIDevices are fully qualified CDI device names, resolved by CDI.
	CDIDevices []string
	CDI        *CDIRegistry
	Resources  *Resources
	// CgroupParent, when set, is the parent cgroup; otherwise containers go
	// under /pinrt/<sandbox-id>.
	CgroupParent string
	// CgroupsPath, when set, is linux.cgroupsPath as the cgroup driver
	// names it (systemd: "slice:pinrt:id"); it wins over CgroupParent.
	CgroupsPath string
	Annotations map[string]string
	Sysctls     map[string]string
	Tty, Stdin  bool

	// Host describes the host; nil means probe the real one.
	Host *HostInfo
	// RuntimeFeatures are the chosen runtime's features; required when a
	// mount needs idmap or rro, and checked for a volume's extra options.
	RuntimeFeatures *Features
}

// GenerateSpec builds a spec from pinrt's default Linux spec and opts, in order.
func GenerateSpec(ctx context.Context, opts ...SpecOpt) (*specs.Spec, error) {
	base, err := generate.New("linux")
	if err != nil {
		return nil, fmt.Errorf("generating the base spec: %w", err)
	}
	resetBase(base.Config)
	g := &Generator{Generator: &base, Ctx: ctx}
	for _, o := range opts {
		if err := o(g); err != nil {
			return nil, err
		}
	}
	return g.Config, nil
}

// BuildContainerSpec applies every option for c in the order they depend on
// each other: identity and namespaces first, capabilities before seccomp
// (the default seccomp profile is capability-aware), mounts last so user
// volumes can replace default mounts.
func BuildContainerSpec(ctx context.Context, c *ContainerSpec) (*specs.Spec, error) {
	if c == nil {
		return nil, fmt.Errorf("nil container spec: %w", errdefs.ErrInvalidArgument)
	}
	if err := validateID(c.ID); err != nil {
		return nil, err
	}
	if c.Rootfs == "" {
		return nil, fmt.Errorf("container %s: empty rootfs path: %w", c.ID, errdefs.ErrInvalidArgument)
	}
	host := c.Host
	if host == nil {
		h := ProbeHost()
		host = &h
	}
	hasUserNS := c.Namespaces.User != ""
	opts := []SpecOpt{
		WithRootfs(c.Rootfs, c.ReadonlyRootfs),
		WithNamespaces(c.Namespaces, host.CgroupNS),
		WithProcessArgs(c.Command, c.Args, c.ImageEntrypoint, c.ImageCmd),
		WithEnv(c.ImageEnv, c.Env),
		WithHostname(c.Hostname),
		WithWorkingDir(c.WorkingDir, c.ImageWorkingDir),
		WithUser(c.Rootfs, c.User, c.ImageUser),
		WithTTY(c.Tty, c.Stdin),
		WithNoNewPrivileges(c.NoNewPrivs),
		WithCapabilities(c.Privileged, c.CapAdd, c.CapDrop, host.BoundingCaps),
		WithPrivileged(c.Privileged),
		WithMaskedPaths(c.Privileged, c.MaskedPaths, c.ReadonlyPaths),
		WithSeccomp(c.Privileged, c.Seccomp),
		WithAppArmor(c.AppArmor, host.AppArmor),
		WithSELinux(c.SELinuxLabel, host.SELinux),
		WithSysfs(hasUserNS, c.Namespaces.Net != "", c.Privileged),
		// The pod's files before the volumes: kubelet mounts its own
		// /etc/hosts (hostAliases), which must replace pinrt's. Only
		// Kubernetes' node conformance specs check it (make node-e2e).
		WithPodFiles(c.HostsPath, c.ResolvPath, c.HostnamePath, c.ShmPath, c.ReadonlyRootfs),
		WithMounts(c.Mounts, hasUserNS, c.PodUIDMappings, c.PodGIDMappings, c.RuntimeFeatures),
		WithImageVolumes(c.ImageVolumes, c.RuntimeFeatures),
		WithDevices(c.Devices, c.Privileged, c.PodUserNS()),
		WithCDIDevices(c.CDI, c.CDIDevices, c.PodUserNS()),
		WithResources(c.Resources, host),
		WithOOMScoreAdj(resOOM(c.Resources), host.OOMFloor),
		WithCgroupsPath(c.CgroupParent, c.SandboxID, c.ID),
		WithFixedCgroupsPath(c.CgroupsPath),
		WithSysctls(c.Sysctls),
		WithAnnotations(c.Annotations),
	}
	return GenerateSpec(ctx, opts...)
}

func resOOM(r *Resources) int {
	if r == nil {
		return 0
	}
	return r.OOMScoreAdj
}

// Default masked and read-only paths, as containerd and CRI-O use them:
// kernel interfaces that leak host information or allow host changes.
var (
	DefaultMaskedPaths = []string{
		"/proc/acpi",
		"/proc/asound",
		"/proc/interrupts",
		"/proc/kcore",
		"/proc/keys",
		"/proc/latency_stats",
		"/proc/sched_debug",
		"/proc/scsi",
		"/proc/timer_list",
		"/proc/timer_stats",
		"/sys/devices/virtual/powercap",
		"/sys/firmware",
	}
	DefaultReadonlyPaths = []string{
		"/proc/bus",
		"/proc/fs",
		"/proc/irq",
		"/proc/sys",
		"/proc/sysrq-trigger",
	}
)

// resetBase trims runtime-tools' Linux default spec to the base every
// container starts from: the usual pseudo filesystems and nothing that
// depends on the request. Process identity, namespaces, capabilities and
// masked paths are set by the options; the generator's placeholders for
// them (args "sh", hostname, its capability set) must not leak through.
func resetBase(s *specs.Spec) {
	s.Hostname = ""
	s.Root = &specs.Root{Path: "rootfs"}
	s.Process = &specs.Process{
		Cwd: "/",
		// No rlimits: raising NOFILE needs CAP_SYS_RESOURCE, which the
		// daemon may lack, so containers inherit its limits.
	}
	s.Mounts = []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
	s.Linux = &specs.Linux{
		Resources: &specs.LinuxResources{
			// Deny every device, then allow the defaults runc creates.
			Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
		},
	}
}

// mount returns the index of the mount at dest, or -1.
func (g *Generator) mount(dest string) int {
	for i, m := range g.Config.Mounts {
		if m.Destination == dest {
			return i
		}
	}
	return -1
}

// setMount replaces the mount at m.Destination or appends m.
func (g *Generator) setMount(m specs.Mount) {
	if i := g.mount(m.Destination); i >= 0 {
		g.Config.Mounts[i] = m
		return
	}
	g.Config.Mounts = append(g.Config.Mounts, m)
}

func (g *Generator) resources() *specs.LinuxResources {
	if g.Config.Linux.Resources == nil {
		g.Config.Linux.Resources = &specs.LinuxResources{}
	}
	return g.Config.Linux.Resources
}

func (g *Generator) ctx() context.Context {
	if g.Ctx == nil {
		return context.Background()
	}
	return g.Ctx
}

// PodUserNS is what devices and mounts added to c are rewritten with in a
// pod with its own user namespace; nil in the host's.
func (c *ContainerSpec) PodUserNS() *PodUserNS {
	if c.Namespaces.User == "" {
		return nil
	}
	return &PodUserNS{UIDMappings: c.PodUIDMappings, GIDMappings: c.PodGIDMappings, Features: c.RuntimeFeatures}
}
