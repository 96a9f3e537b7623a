package server

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// Annotations pinrt puts on every container spec, as containerd and CRI-O
// name them, so tools reading config.json can tell what a container is.
const (
	annContainerType = "io.kubernetes.cri.container-type"
	annSandboxID     = "io.kubernetes.cri.sandbox-id"
	annContainerName = "io.kubernetes.cri.container-name"
	annImageName     = "io.kubernetes.cri.image-name"
)

// containerRequest is a validated CreateContainer request: the metadata to
// record and the spec input, still without anything that needs the image,
// the rootfs or the runtime.
type containerRequest struct {
	md   sandbox.ContainerMetadata
	spec oci.ContainerSpec
	// pidMode is the requested PID namespace mode; target is the container
	// whose PID namespace TARGET mode joins.
	pidMode runtimeapi.NamespaceMode
	target  string
	// checkpoint is the archive a restored container comes from (see
	// checkpoint_restore.go); nil for a new container.
	checkpoint *checkpointImport
	// changes fill the restored container's writable layer.
	changes *image.RootfsChanges
	// userImage is the image as the pod names it (ImageSpec's
	// user_specified_image), which kubelet sends beside the image ID.
	userImage string
}

// containerRequest validates cfg against the pod and converts it. Nothing
// has been created when it fails.
func (s *Server) containerRequest(sb *sandbox.Sandbox, cfg *runtimeapi.ContainerConfig) (*containerRequest, error) {
	m := cfg.GetMetadata()
	if m == nil {
		return nil, invalid("container config metadata is missing")
	}
	if err := validName("container name", m.Name); err != nil {
		return nil, err
	}
	if cfg.GetImage().GetImage() == "" {
		return nil, invalid("container %q names no image", m.Name)
	}
	if err := validImageName("user-specified image", cfg.Image.UserSpecifiedImage); err != nil {
		return nil, err
	}
	logPath, err := containerLogPath(sb.LogDirectory, cfg.LogPath)
	if err != nil {
		return nil, err
	}
	if err := validProcess(cfg); err != nil {
		return nil, err
	}
	stop, err := criSignalName(cfg.GetStopSignal())
	if err != nil {
		return nil, err
	}
	r := &containerRequest{
		md: sandbox.ContainerMetadata{
			SandboxID: sb.ID, Name: m.Name, Attempt: m.Attempt,
			Labels: cfg.Labels, Annotations: cfg.Annotations, Image: cfg.Image.Image,
			LogPath: logPath, Handler: sb.Handler, StopSignal: stop,
			Privileged: cfg.GetLinux().GetSecurityContext().GetPrivileged(),
		},
		userImage: cfg.Image.UserSpecifiedImage,
		spec: oci.ContainerSpec{
			SandboxID: sb.ID,
			Namespaces: oci.Namespaces{
				User: sb.Pins["user"], Net: sb.Pins["net"], IPC: sb.Pins["ipc"], UTS: sb.Pins["uts"],
			},
			PodUIDMappings: sb.UIDMappings, PodGIDMappings: sb.GIDMappings,
			Hostname:  sb.Hostname,
			HostsPath: sb.HostsPath, ResolvPath: sb.ResolvPath, HostnamePath: sb.HostnamePath, ShmPath: sb.ShmPath,
			Command: cfg.Command, Args: cfg.Args, WorkingDir: cfg.WorkingDir,
			Tty: cfg.Tty, Stdin: cfg.Stdin,
		},
	}
	for _, kv := range cfg.Envs {
		r.spec.Env = append(r.spec.Env, kv.Key+"="+string(kv.Value))
	}
	if err := r.addMounts(cfg.Mounts); err != nil {
		return nil, err
	}
	if err := checkMountMappings(sb, r.md.Mounts); err != nil {
		return nil, err
	}
	if err := r.addDevices(cfg.Devices); err != nil {
		return nil, err
	}
	if err := s.cdiDevices(&r.spec, cfg); err != nil {
		return nil, err
	}
	linux := cfg.GetLinux()
	if err := validResources(linux.GetResources()); err != nil {
		return nil, err
	}
	r.spec.Resources = toResources(linux.GetResources())
	if err := securityContext(&r.spec, linux.GetSecurityContext()); err != nil {
		return nil, err
	}
	if r.spec.Seccomp, err = s.seccompProfile(linux.GetSecurityContext().GetSeccomp()); err != nil {
		return nil, err
	}
	ns := linux.GetSecurityContext().GetNamespaceOptions()
	r.target = ns.GetTargetId()
	if r.pidMode, err = containerPIDMode(sb, ns); err != nil {
		return nil, err
	}
	r.spec.Annotations = specAnnotations(sb, cfg)
	return r, nil
}

// specAnnotations are the OCI spec's annotations: the container's own
// and those saying which pod and image it belongs to.
func specAnnotations(sb *sandbox.Sandbox, cfg *runtimeapi.ContainerConfig) map[string]string {
	out := map[string]string{}
	for k, v := range cfg.Annotations {
		out[k] = v
	}
	out[annContainerType] = "container"
	out[annSandboxID] = sb.ID
	// The pod by name, as containerd gives it: checkpointctl shows a
	// checkpoint's pod and namespace from them, NRI plugins match on them.
	out[sandbox.AnnotationName] = sb.Name
	out[sandbox.AnnotationNamespace] = sb.Namespace
	out[sandbox.AnnotationUID] = sb.UID
	out[annContainerName] = cfg.GetMetadata().GetName()
	out[annImageName] = cfg.GetImage().GetImage()
	delete(out, criuConfigAnnotation)
	return out
}

// addMounts converts the requested mounts: each is recorded, and each but
// an image volume, which is mounted once the image is there, goes into
// the spec now.
func (r *containerRequest) addMounts(mounts []*runtimeapi.Mount) error {
	for _, mnt := range mounts {
		if mnt.GetImage().GetImage() != "" {
			cm, err := imageVolume(mnt)
			if err != nil {
				return err
			}
			r.md.Mounts = append(r.md.Mounts, cm)
			continue
		}
		cm, om, err := convertMount(mnt)
		if err != nil {
			return err
		}
		r.md.Mounts = append(r.md.Mounts, cm)
		r.spec.Mounts = append(r.spec.Mounts, om)
	}
	return nil
}

// addDevices converts the requested host devices.
func (r *containerRequest) addDevices(devices []*runtimeapi.Device) error {
	for _, d := range devices {
		for _, p := range []string{d.HostPath, d.ContainerPath} {
			if err := validate.Path("device path", p); err != nil {
				return err
			}
		}
		if !filepath.IsAbs(d.HostPath) || !path.IsAbs(d.ContainerPath) {
			return invalid("device %q -> %q: paths must be absolute", d.HostPath, d.ContainerPath)
		}
		r.spec.Devices = append(r.spec.Devices, oci.Device{HostPath: d.HostPath, ContainerPath: d.ContainerPath, Permissions: d.Permissions})
	}
	return nil
}

// cdiDevices merges the CDI devices of the CRI field and the cdi.k8s.io/
// annotations and checks they are all defined, before anything is made.
func (s *Server) cdiDevices(c *oci.ContainerSpec, cfg *runtimeapi.ContainerConfig) error {
	var field []string
	for _, d := range cfg.CDIDevices {
		field = append(field, d.GetName())
	}
	names, err := oci.CDIDeviceNames(field, cfg.Annotations)
	if err != nil || len(names) == 0 {
		return err
	}
	if s.deps.CDI == nil {
		return fmt.Errorf("CDI devices requested, but CDI is not configured: %w", errdefs.ErrFailedPrecondition)
	}
	if err := s.deps.CDI.Resolve(names); err != nil {
		return err
	}
	c.CDIDevices, c.CDI = names, s.deps.CDI
	return nil
}

// checkMountMappings refuses the ID-mapped volumes runc would refuse only
// at the start: any in a pod without a user namespace, one with UID but
// no GID mappings or the reverse, and a mapping that is empty or runs
// past the 32-bit IDs.
func checkMountMappings(sb *sandbox.Sandbox, mounts []sandbox.ContainerMount) error {
	for _, cm := range mounts {
		nu, ng := len(cm.UIDMappings), len(cm.GIDMappings)
		switch {
		case nu+ng == 0:
			continue
		case sb.Modes.User != sandbox.ModePod:
			return invalid("mount %s has ID mappings, but pod %s has no user namespace", cm.ContainerPath, sb.ID)
		case nu == 0 || ng == 0:
			return invalid("mount %s has %d UID and %d GID mappings: an ID-mapped mount needs both", cm.ContainerPath, nu, ng)
		}
		for _, m := range slices.Concat(cm.UIDMappings, cm.GIDMappings) {
			if m.Size == 0 || uint64(m.HostID)+uint64(m.Size) > 1<<32 || uint64(m.ContainerID)+uint64(m.Size) > 1<<32 {
				return invalid("mount %s: ID mapping %d:%d:%d is empty or runs past the 32-bit IDs", cm.ContainerPath, m.ContainerID, m.HostID, m.Size)
			}
		}
	}
	return nil
}

// containerPIDMode is the PID mode the container asks for, else the pod's.
func containerPIDMode(sb *sandbox.Sandbox, ns *runtimeapi.NamespaceOption) (runtimeapi.NamespaceMode, error) {
	mode := podPIDMode(sb)
	if ns != nil {
		mode = ns.Pid
	}
	if _, known := runtimeapi.NamespaceMode_name[int32(mode)]; !known {
		return mode, invalid("unknown pid namespace mode %d", mode)
	}
	if mode == runtimeapi.NamespaceMode_NODE && sb.Modes.User == sandbox.ModePod {
		return mode, invalid("a container in a pod with its own user namespace cannot use the host's PID namespace")
	}
	return mode, nil
}

// podPIDMode is the PID mode a container gets when it names none: the pod's.
func podPIDMode(sb *sandbox.Sandbox) runtimeapi.NamespaceMode {
	switch sb.Modes.PID {
	case sandbox.ModePod:
		return runtimeapi.NamespaceMode_POD
	case sandbox.ModeNode:
		return runtimeapi.NamespaceMode_NODE
	}
	return runtimeapi.NamespaceMode_CONTAINER
}

// containerLogPath joins the pod's log directory and the container's
// relative log path, refusing any path that leaves the directory. Without
// either, the container has no log.
func containerLogPath(dir, rel string) (string, error) {
	if dir == "" || rel == "" {
		return "", nil
	}
	if filepath.IsAbs(rel) {
		return "", invalid("log path %q must be relative to the pod's log directory", rel)
	}
	p := filepath.Join(dir, rel)
	if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
		return "", invalid("log path %q escapes the pod's log directory %q", rel, dir)
	}
	if err := oci.CheckLogPath(p); err != nil {
		return "", err
	}
	return p, validate.Path("log path", p)
}

// validProcess refuses a process the kernel cannot start: a NUL in its
// command, arguments, environment or working directory. runc would fail
// only at the start, with a runtime error. An environment variable's name
// must be there and hold no "=": the process would see another variable
// (runc refuses an empty one, as the API server refuses both).
func validProcess(cfg *runtimeapi.ContainerConfig) error {
	if err := validate.NoNUL("command", cfg.Command...); err != nil {
		return err
	}
	if err := validate.NoNUL("argument", cfg.Args...); err != nil {
		return err
	}
	for _, kv := range cfg.Envs {
		if err := validate.NoNUL("environment variable", kv.Key, string(kv.Value)); err != nil {
			return err
		}
		if kv.Key == "" || strings.Contains(kv.Key, "=") {
			return invalid("environment variable name %q is empty or holds \"=\"", kv.Key)
		}
	}
	return validate.NoNUL("working dir", cfg.WorkingDir)
}

// validContainerPath refuses a mount destination that is not an absolute
// path below the container's root.
func validContainerPath(what, p string) error {
	if err := validate.Path(what, p); err != nil {
		return err
	}
	if !path.IsAbs(p) {
		return invalid("%s %q is not absolute", what, p)
	}
	if path.Clean(p) == "/" {
		return invalid("%s %q is the container's root", what, p)
	}
	return nil
}

func convertMount(m *runtimeapi.Mount) (sandbox.ContainerMount, oci.Mount, error) {
	if err := validate.Path("mount host path", m.HostPath); err != nil {
		return sandbox.ContainerMount{}, oci.Mount{}, err
	}
	if !filepath.IsAbs(m.HostPath) {
		return sandbox.ContainerMount{}, oci.Mount{}, invalid("mount host path %q is not absolute", m.HostPath)
	}
	if err := validContainerPath("mount container path", m.ContainerPath); err != nil {
		return sandbox.ContainerMount{}, oci.Mount{}, err
	}
	opts, err := oci.ValidMountOptions(m.ContainerPath, m.MountOptions)
	if err != nil {
		return sandbox.ContainerMount{}, oci.Mount{}, err
	}
	cm := sandbox.ContainerMount{
		ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.Readonly,
		Propagation: int32(m.Propagation), RecursiveReadOnly: m.RecursiveReadOnly,
		UIDMappings: idMappings(m.UidMappings), GIDMappings: idMappings(m.GidMappings),
		MountOptions: opts,
	}
	om := oci.Mount{
		HostPath: m.HostPath, ContainerPath: m.ContainerPath, Readonly: m.Readonly,
		RecursiveReadOnly: m.RecursiveReadOnly, SelinuxRelabel: m.SelinuxRelabel,
		UIDMappings: cm.UIDMappings, GIDMappings: cm.GIDMappings, Options: opts,
	}
	switch m.Propagation {
	case runtimeapi.MountPropagation_PROPAGATION_PRIVATE:
		om.Propagation = oci.PropagationPrivate
	case runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER:
		om.Propagation = oci.PropagationHostToContainer
	case runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL:
		om.Propagation = oci.PropagationBidirectional
	default:
		return cm, om, invalid("mount %s: unknown propagation %v", m.ContainerPath, m.Propagation)
	}
	return cm, om, nil
}

// imageVolume records an image volume (KEP-4639). It is read-only and
// private: nothing mounts below an image. A request for a writable one is
// refused, as the CRI asks (critest checks it); kubelet always sends
// readonly for image volumes. Kubernetes' API refuses bindMountOptions on
// an image volume, but the CRI does not: a direct caller's noexec is
// applied like a host volume's. The sub path is checked where it is
// resolved, against the image.
func imageVolume(m *runtimeapi.Mount) (sandbox.ContainerMount, error) {
	if err := validContainerPath("image volume container path", m.ContainerPath); err != nil {
		return sandbox.ContainerMount{}, err
	}
	if m.HostPath != "" {
		return sandbox.ContainerMount{}, invalid("image volume %s has a host path too", m.ContainerPath)
	}
	if !m.Readonly {
		return sandbox.ContainerMount{}, invalid("image volume %s must be read-only: an image is never writable", m.ContainerPath)
	}
	opts, err := oci.ValidMountOptions(m.ContainerPath, m.MountOptions)
	if err != nil {
		return sandbox.ContainerMount{}, err
	}
	return sandbox.ContainerMount{
		ContainerPath: m.ContainerPath, Readonly: true,
		Image: m.Image.Image, ImageSubPath: m.ImageSubPath, MountOptions: opts,
	}, nil
}

func toResources(r *runtimeapi.LinuxContainerResources) *oci.Resources {
	if r == nil {
		return nil
	}
	out := &oci.Resources{
		CPUShares: uint64(r.CpuShares), CPUQuota: r.CpuQuota, CPUPeriod: uint64(r.CpuPeriod),
		CpusetCpus: r.CpusetCpus, CpusetMems: r.CpusetMems,
		MemoryLimit: r.MemoryLimitInBytes, MemorySwapLimit: r.MemorySwapLimitInBytes,
		Unified: r.Unified, OOMScoreAdj: int(r.OomScoreAdj),
	}
	for _, h := range r.HugepageLimits {
		out.Hugepages = append(out.Hugepages, oci.Hugepage{PageSize: h.PageSize, Limit: h.Limit})
	}
	return out
}

func securityProfile(p *runtimeapi.SecurityProfile) (oci.SecurityProfile, error) {
	switch p.GetProfileType() {
	case runtimeapi.SecurityProfile_RuntimeDefault:
		return oci.SecurityProfile{Type: oci.ProfileRuntimeDefault}, nil
	case runtimeapi.SecurityProfile_Unconfined:
		return oci.SecurityProfile{Type: oci.ProfileUnconfined}, nil
	case runtimeapi.SecurityProfile_Localhost:
		if p.LocalhostRef == "" {
			return oci.SecurityProfile{}, invalid("localhost security profile without a reference")
		}
		return oci.SecurityProfile{Type: oci.ProfileLocalhost, Localhost: p.LocalhostRef}, nil
	}
	return oci.SecurityProfile{}, invalid("unknown security profile type %v", p.GetProfileType())
}

// securityContext copies the container security context into c; the
// seccomp profile is Server.seccompProfile's, as it depends on the config.
func securityContext(c *oci.ContainerSpec, sc *runtimeapi.LinuxContainerSecurityContext) error {
	if sc == nil {
		return nil
	}
	if err := validRunAs("container", sc.RunAsUser, sc.RunAsUsername, sc.RunAsGroup); err != nil {
		return err
	}
	var err error
	if c.User.GroupsPolicy, err = groupsPolicy(sc.SupplementalGroupsPolicy); err != nil {
		return err
	}
	c.Privileged, c.ReadonlyRootfs, c.NoNewPrivs = sc.Privileged, sc.ReadonlyRootfs, sc.NoNewPrivs
	c.CapAdd, c.CapDrop = sc.GetCapabilities().GetAddCapabilities(), sc.GetCapabilities().GetDropCapabilities()
	if sc.RunAsUser != nil {
		v := sc.RunAsUser.Value
		c.User.UID = &v
	}
	if sc.RunAsGroup != nil {
		v := sc.RunAsGroup.Value
		c.User.GID = &v
	}
	c.User.Username = sc.RunAsUsername
	c.User.SupplementalGroups = sc.SupplementalGroups
	for _, p := range append(slices.Clip(sc.MaskedPaths), sc.ReadonlyPaths...) {
		if err := validate.NoNUL("masked or read-only path", p); err != nil {
			return err
		}
		if !path.IsAbs(p) {
			return invalid("masked or read-only path %q is not absolute", p)
		}
	}
	// kubelet sends the default lists itself, and empty ones for
	// procMount: Unmasked (proto3 cannot tell empty from absent), so a
	// security context's lists are taken as they are, as containerd and
	// CRI-O take them. Only a request without a security context gets
	// oci's defaults (nil).
	c.MaskedPaths = append([]string{}, sc.MaskedPaths...)
	c.ReadonlyPaths = append([]string{}, sc.ReadonlyPaths...)
	if sc.Apparmor != nil {
		if c.AppArmor, err = securityProfile(sc.Apparmor); err != nil {
			return err
		}
	}
	if o := sc.SelinuxOptions; o != nil && o.Type != "" {
		c.SELinuxLabel = strings.Join([]string{o.User, o.Role, o.Type, o.Level}, ":")
	}
	return nil
}

// createContainer creates a container in its pod: name, rootfs, spec,
// state on disk and the runtime container under conmon, undoing all of it
// on failure.
func (s *Server) createContainer(ctx context.Context, sandboxID string, cfg *runtimeapi.ContainerConfig) (_ *sandbox.Container, retErr error) {
	sb, unlock, err := s.lockReadyPod(sandboxID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	req, cfg, err := s.requestFor(sb, cfg)
	if err != nil {
		return nil, err
	}
	rt, err := s.usableRuntime(ctx, sb.Handler)
	if err != nil {
		return nil, err
	}
	md, img, err := s.newContainerMetadata(req)
	if err != nil {
		return nil, err
	}
	ctx = log.WithLogger(ctx, log.G(ctx).WithFields(log.Fields{"sandbox": sb.ID, "container": md.ID}))

	var undo cleanups
	defer func() {
		if retErr != nil {
			undo.run(ctx)
		}
	}()
	if err := s.reserveContainerName(sb.ID, &md, &undo); err != nil {
		return nil, err
	}

	dir := s.containerDir(md.ID)
	checkpointDone, err := s.startContainerDir(sb, req, &md, dir, &undo)
	defer checkpointDone()
	if err != nil {
		return nil, err
	}
	rootfs, hostPathsDone, err := s.mountContainerFS(ctx, sb, req, &md, img, dir, &undo)
	defer hostPathsDone()
	if err != nil {
		return nil, err
	}

	if req.spec.CgroupsPath, err = s.placeContainerCgroup(ctx, sb.CgroupParent, sb.ID, md.ID); err != nil {
		return nil, err
	}
	spec, err := s.buildSpec(ctx, rt, sb, req, md.ID, rootfs, img)
	if err != nil {
		return nil, err
	}
	if md.Restored {
		if err := writeRestoreCRIUConfig(dir, spec); err != nil {
			return nil, err
		}
	}
	// From the NRI event until the container is in the store, a plugin
	// connecting now waits: it then sees the container in its sync.
	defer s.nri.BlockSync()()
	if err := s.nriCreate(ctx, rt, sb, &md, spec, &undo); err != nil {
		return nil, err
	}
	md.User = sandbox.ContainerUser{UID: spec.Process.User.UID, GID: spec.Process.User.GID, SupplementalGroups: spec.Process.User.AdditionalGids}
	if md.LogPath != "" {
		if err := os.MkdirAll(filepath.Dir(md.LogPath), 0o755); err != nil {
			return nil, fmt.Errorf("creating the log directory: %w", err)
		}
	}

	c, err := s.createRuntimeContainer(rt, &md, dir, spec, cfg, &undo)
	if err != nil {
		return nil, err
	}
	if err := sandbox.ClearIntent(dir, sandbox.IntentCreating); err != nil {
		return nil, fmt.Errorf("completing container state: %w", err)
	}
	s.containers.Add(md.ID, c)
	s.statsCreated(ctx, c, spec)
	nriNotify(ctx, "PostCreateContainer", s.nri.PostCreateContainer(ctx, nriPod(&sb.Metadata), nriContainer(&md, c.Status(), spec)))
	log.G(ctx).Debug("container created")
	return c, nil
}

// requestFor is the validated request for cfg in pod sb; for a
// checkpoint (see checkpoint_restore.go), the request that restores it,
// returned with the config it was made from.
func (s *Server) requestFor(sb *sandbox.Sandbox, cfg *runtimeapi.ContainerConfig) (*containerRequest, *runtimeapi.ContainerConfig, error) {
	var ci *checkpointImport
	src, ok, err := s.checkpointOf(cfg.GetImage().GetImage())
	if err != nil {
		return nil, nil, err
	}
	if ok {
		if ci, cfg, err = s.importCheckpoint(sb, cfg, src); err != nil {
			return nil, nil, err
		}
	}
	req, err := s.containerRequest(sb, cfg)
	if err != nil {
		return nil, nil, err
	}
	req.checkpoint = ci
	return req, cfg, nil
}

// startContainerDir makes the new container's directory, undone by
// undo, and records the intent to create it; for a restore it also
// extracts the checkpoint there (done closes its rootfs changes).
func (s *Server) startContainerDir(sb *sandbox.Sandbox, req *containerRequest, md *sandbox.ContainerMetadata, dir string, undo *cleanups) (done func(), err error) {
	undo.addIfClean("remove directory", func(context.Context) error { return sandbox.RemoveDir(dir) })
	if err := makeContainerDir(dir, sb); err != nil {
		return func() {}, err
	}
	// Recorded before the first mount: a daemon killed from here until
	// the intent is cleared leaves a container the next start tears down.
	if err := sandbox.MarkIntent(dir, sandbox.IntentCreating, *md); err != nil {
		return func() {}, err
	}
	if req.checkpoint == nil {
		return func() {}, nil
	}
	md.Restored = true
	return req.extractCheckpoint(dir)
}

// newContainerMetadata is the metadata of a new container for req, with
// its image and image volumes resolved; it returns the image too.
func (s *Server) newContainerMetadata(req *containerRequest) (sandbox.ContainerMetadata, *image.Image, error) {
	img, err := s.deps.Images.Get(req.md.Image)
	if err != nil {
		return sandbox.ContainerMetadata{}, nil, fmt.Errorf("image %q: %w", req.md.Image, err)
	}
	md := req.md
	if md.Mounts, err = s.resolveImageVolumes(md.Mounts); err != nil {
		return sandbox.ContainerMetadata{}, nil, err
	}
	md.ID, md.CreatedAt = newID(), time.Now()
	md.ImageID, md.ImageRef = img.ID, img.ID
	if md.StopSignal == "" {
		// The pod's lifecycle.stopSignal, when kubelet sent one, wins
		// over the image's STOPSIGNAL, as KEP-4960 orders them.
		md.StopSignal = img.Config.StopSignal
	}
	if len(img.RepoDigests) > 0 {
		md.ImageRef = img.RepoDigests[0]
	}
	md.Image = statusImage(req.userImage, md.Image, img)
	return md, img, nil
}

// statusImage is the image a container's status names, which kubelet
// shows as the pod's status.containerStatuses[].image: the pod's own
// name for it (kubelet asks for the image by its ID), else the name
// the request used, else, for a request by ID, the image's first tag,
// as containerd reports it.
func statusImage(user, requested string, img *image.Image) string {
	switch {
	case user != "":
		return user
	case requested != img.ID && requested != strings.TrimPrefix(img.ID, "sha256:"):
		return requested
	case len(img.RepoTags) > 0:
		return img.RepoTags[0]
	}
	return requested
}

// maxImageName bounds an image name kept only to be shown back: a
// reference is far shorter (the registry's name limit is 255).
const maxImageName = 4096

func validImageName(what, name string) error {
	if len(name) > maxImageName {
		return invalid("%s is %d bytes, over %d", what, len(name), maxImageName)
	}
	return validate.NoNUL(what, name)
}

// reserveContainerName reserves md's name and attempt in pod sandboxID;
// undo releases it.
func (s *Server) reserveContainerName(sandboxID string, md *sandbox.ContainerMetadata, undo *cleanups) error {
	key := sandbox.ContainerNameKey(sandboxID, md.Name, md.Attempt)
	if err := s.ctrNames.Reserve(key, md.ID); err != nil {
		return fmt.Errorf("container %q (attempt %d) in sandbox %s: %w", md.Name, md.Attempt, sandboxID, err)
	}
	id := md.ID
	undo.add("release name", func(context.Context) error { s.ctrNames.Release(key, id); return nil })
	return nil
}

// mountContainerFS makes the volumes' missing host paths, mounts the
// container's rootfs from img and its image volumes, which go into req's
// spec with the image's declared volumes; undo unmounts them all and
// removes what it made. The
// host paths count as in use until hostPathsDone is called, also after
// an error: the caller calls it once the container is in the store or
// the create failed, before undo runs.
func (s *Server) mountContainerFS(ctx context.Context, sb *sandbox.Sandbox, req *containerRequest, md *sandbox.ContainerMetadata, img *image.Image, dir string, undo *cleanups) (rootfs string, hostPathsDone func(), err error) {
	if hostPathsDone, err = s.hostPaths.make(req.spec.Mounts, undo); err != nil {
		return "", hostPathsDone, err
	}
	mr := s.mountRequest(sb, md.ID, img.ID, dir)
	mr.Changes = req.changes
	rootfs, err = s.deps.Images.MountRootfs(ctx, mr)
	if err != nil {
		return "", hostPathsDone, fmt.Errorf("mounting the rootfs: %w", err)
	}
	undo.add("unmount rootfs and image volumes", func(ctx context.Context) error {
		return s.deps.Images.UnmountRootfs(ctx, md.ID, sb.ID, dir)
	})
	declared, err := declaredVolumes(rootfs, dir, img.Config.Volumes, md.Mounts)
	if err != nil {
		return "", hostPathsDone, err
	}
	req.spec.Mounts = append(req.spec.Mounts, declared...)
	if req.spec.ImageVolumes, err = s.mountImageVolumes(ctx, sb, md, dir); err != nil {
		return "", hostPathsDone, err
	}
	return rootfs, hostPathsDone, nil
}

// createRuntimeContainer saves the container's state and writes its
// bundle; undo deletes both. The runtime creates it (conmon, `runc
// create`) only when it starts (see startContainer): CreateContainer
// then costs no process, and a container kubelet never starts never
// holds a conmon.
func (s *Server) createRuntimeContainer(rt ContainerRuntime, md *sandbox.ContainerMetadata, dir string, spec *specs.Spec, cfg *runtimeapi.ContainerConfig, undo *cleanups) (*sandbox.Container, error) {
	c := sandbox.NewContainer(*md, dir)
	if err := c.UpdateStatus(func(st *sandbox.ContainerStatus) { st.RuntimePending = true }); err != nil {
		return nil, fmt.Errorf("saving container state: %w", err)
	}
	o := oci.CreateOptions{
		ID: md.ID, Bundle: dir, Spec: spec, LogPath: md.LogPath,
		Stdin: cfg.Stdin, StdinOnce: cfg.StdinOnce, Tty: cfg.Tty, ExitDir: s.exitDir(),
	}
	if md.Restored {
		o.Restore = filepath.Join(dir, checkpointImagesDir)
	}
	if err := rt.Prepare(o); err != nil {
		return nil, fmt.Errorf("creating container %q: %w", md.Name, err)
	}
	undo.add("delete runtime container", func(ctx context.Context) error { return rt.Delete(ctx, md.ID, true) })
	s.resources.prime(dir, spec)
	return c, nil
}

// resolveImageVolumes records the image ID of every image volume, so the
// volume keeps showing the image it was created with. An image that is
// not in the store is refused before anything is created: kubelet pulls
// image volumes first.
func (s *Server) resolveImageVolumes(mounts []sandbox.ContainerMount) ([]sandbox.ContainerMount, error) {
	out := slices.Clone(mounts)
	for i, m := range out {
		if m.Image == "" {
			continue
		}
		img, err := s.deps.Images.Get(m.Image)
		if err != nil {
			return nil, fmt.Errorf("image volume %s: image %q must be pulled first: %w", m.ContainerPath, m.Image, err)
		}
		out[i].ImageRef = img.ID
	}
	return out, nil
}

// mountImageVolumes mounts a container's image volumes. The container's
// UnmountRootfs unmounts them; after a restart, mounting again rebuilds
// the store's bookkeeping.
func (s *Server) mountImageVolumes(ctx context.Context, sb *sandbox.Sandbox, md *sandbox.ContainerMetadata, dir string) ([]oci.ImageVolume, error) {
	var vols []oci.ImageVolume
	for i, m := range md.Mounts {
		if m.Image == "" {
			continue
		}
		src, err := s.deps.Images.MountImageVolume(ctx, image.VolumeRequest{
			ContainerID: md.ID, PodID: sb.ID, Index: i, ImageID: m.ImageRef, Dir: dir,
			SubPath: m.ImageSubPath, UsernsPath: sb.Pins["user"],
		})
		if err != nil {
			return nil, fmt.Errorf("image volume %s: %w", m.ContainerPath, err)
		}
		vols = append(vols, oci.ImageVolume{Source: src, ContainerPath: m.ContainerPath, Options: m.MountOptions})
	}
	return vols, nil
}

// mountRequest describes a container's rootfs; for a userns pod the image
// layers are idmapped through the pod's pinned user namespace.
func (s *Server) mountRequest(sb *sandbox.Sandbox, id, imageID, dir string) image.MountRequest {
	return image.MountRequest{
		ContainerID: id, PodID: sb.ID, ImageID: imageID, Dir: dir,
		UsernsPath: sb.Pins["user"], RootUID: rootOf(sb.UIDMappings), RootGID: rootOf(sb.GIDMappings),
	}
}

// buildSpec completes the spec input with the image, the rootfs, the PID
// namespace and the runtime's features, and generates the OCI spec.
func (s *Server) buildSpec(ctx context.Context, rt ContainerRuntime, sb *sandbox.Sandbox, req *containerRequest, id, rootfs string, img *image.Image) (*specs.Spec, error) {
	c := req.spec
	c.ID, c.Rootfs = id, rootfs
	c.ImageEntrypoint, c.ImageCmd, c.ImageEnv = img.Config.Entrypoint, img.Config.Cmd, img.Config.Env
	c.ImageWorkingDir, c.ImageUser = img.Config.WorkingDir, img.Config.User
	switch req.pidMode {
	case runtimeapi.NamespaceMode_NODE:
		c.Namespaces.PIDMode = oci.PIDNode
	case runtimeapi.NamespaceMode_POD:
		c.Namespaces.PIDMode = oci.PIDContainer
		// A container asking for the pod's PID namespace in a pod that has
		// none (no infra process) gets its own, as in containerd.
		if sb.InfraID != "" {
			p, err := s.pidNamespaceOf(ctx, sb.Handler, sb.InfraID)
			if err != nil {
				return nil, fmt.Errorf("the pod's infra process: %w", err)
			}
			c.Namespaces.PIDMode, c.Namespaces.PID = oci.PIDPod, p
		}
	case runtimeapi.NamespaceMode_TARGET:
		t, err := s.containers.Get(req.target)
		if err != nil {
			return nil, fmt.Errorf("pid namespace target: %w", err)
		}
		if t.SandboxID != sb.ID {
			return nil, invalid("pid namespace target %s is in another pod", t.ID)
		}
		p, err := s.pidNamespaceOf(ctx, t.Handler, t.ID)
		if err != nil {
			return nil, fmt.Errorf("pid namespace target: %w", err)
		}
		c.Namespaces.PIDMode, c.Namespaces.PID = oci.PIDPod, p
	default:
		c.Namespaces.PIDMode = oci.PIDContainer
	}
	if c.Namespaces.User != "" && len(c.Mounts) > 0 {
		if err := rt.CheckIDMap(ctx); err != nil {
			return nil, err
		}
	}
	feat, err := rt.Features(ctx)
	if err != nil {
		return nil, err
	}
	c.RuntimeFeatures = feat
	return oci.BuildContainerSpec(ctx, &c)
}

// pidNamespaceOf is the PID namespace of a running container.
func (s *Server) pidNamespaceOf(ctx context.Context, handler, id string) (string, error) {
	rt, err := s.runtimeFor(handler)
	if err != nil {
		return "", err
	}
	st, err := rt.State(ctx, id)
	if err != nil {
		return "", err
	}
	if st.Status != oci.StatusRunning || st.Pid <= 0 {
		return "", fmt.Errorf("container %s is %s, not running: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	return fmt.Sprintf("/proc/%d/ns/pid", st.Pid), nil
}

// CreateContainer creates a container in a Ready pod; it does not start it.
func (s *Server) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	// Labels and annotations come back in every ListContainers response.
	if err := validate.LabelsAndAnnotations("container", req.GetConfig().GetLabels(), req.GetConfig().GetAnnotations()); err != nil {
		return nil, err
	}
	// api.proto: a privileged container needs a sandbox config that says
	// the pod runs privileged containers; containerd and CRI-O refuse it
	// too. The request's, as theirs: kubelet sends the pod's config from
	// its spec of the moment, so the privileged ephemeral container of
	// `kubectl debug --profile=sysadmin` in a pod created unprivileged
	// comes with one that says so. A request without a sandbox config is
	// not held to it, as in CRI-O.
	if sc := req.GetSandboxConfig(); sc != nil && req.GetConfig().GetLinux().GetSecurityContext().GetPrivileged() &&
		!sc.GetLinux().GetSecurityContext().GetPrivileged() {
		return nil, invalid("container %q is privileged, and its pod's sandbox config is not", req.GetConfig().GetMetadata().GetName())
	}
	c, err := s.createContainer(ctx, req.PodSandboxId, req.GetConfig())
	if err != nil {
		return nil, err
	}
	s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)
	return &runtimeapi.CreateContainerResponse{ContainerId: c.ID}, nil
}

// lockReadyPod finds a pod and takes its lifecycle lock for a
// CreateContainer. Under the lock, the pod must still be in the store and
// Ready: a StopPodSandbox or RemovePodSandbox that got the lock first has
// stopped or removed it, and a container created after that would outlive
// its pod, holding its rootfs mount and its cgroup directories. The caller
// holds the lock until the container is recorded, so a Stop or Remove that
// comes later sees it and cleans it up.
func (s *Server) lockReadyPod(id string) (*sandbox.Sandbox, func(), error) {
	sb, unlock, err := s.lockPod(id)
	if err != nil {
		return nil, nil, err
	}
	if st := sb.Status().State; st != sandbox.StateReady {
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	return sb, unlock, nil
}

// makeContainerDir creates <root>/containers/<id>, which holds the
// container's rootfs mount. Any host user who could reach the rootfs could
// run its setuid binaries or read its files, so the directory is 0700. A
// userns container's runc init resolves the rootfs path after joining the
// pod's user namespace, as the pod's root, which has no rights over files
// of the host's root: for it the directory is 0710 with the group of the
// pod's root (the host GID of container GID 0), as Docker does for its
// remapped root (CVE-2021-41091). Other users still cannot enter.
func makeContainerDir(dir string, sb *sandbox.Sandbox) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if sb.Modes.User != sandbox.ModePod {
		return os.Chmod(dir, 0o700)
	}
	// The daemon runs as root; unit tests may not, and cannot chown.
	if err := os.Chown(dir, -1, int(rootOf(sb.GIDMappings))); err != nil && os.Geteuid() == 0 {
		return fmt.Errorf("giving the pod's root access to %s: %w", dir, err)
	}
	return os.Chmod(dir, 0o710)
}
