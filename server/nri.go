package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	nriapi "github.com/containerd/nri/pkg/api"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/nri"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// NRI relays pod and container lifecycle events to NRI plugins (package
// nri). A nil *nri.NRI is NRI disabled.
type NRI interface {
	BlockSync() func()
	RunPodSandbox(ctx context.Context, pod *nriapi.PodSandbox) error
	UpdatePodSandbox(ctx context.Context, pod *nriapi.PodSandbox, overhead, res *nriapi.LinuxResources) error
	PostUpdatePodSandbox(ctx context.Context, pod *nriapi.PodSandbox) error
	StopPodSandbox(ctx context.Context, pod *nriapi.PodSandbox) error
	RemovePodSandbox(ctx context.Context, pod *nriapi.PodSandbox) error
	CreateContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container, check nri.CheckFunc) (*nri.Adjustment, error)
	PostCreateContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) error
	StartContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) error
	PostStartContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) error
	UpdateContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container, res *nriapi.LinuxResources) ([]*nriapi.ContainerUpdate, []*nriapi.ContainerEviction, error)
	PostUpdateContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) error
	StopContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) ([]*nriapi.ContainerUpdate, error)
	RemoveContainer(ctx context.Context, pod *nriapi.PodSandbox, ctr *nriapi.Container) error
}

var (
	_ NRI         = (*nri.NRI)(nil)
	_ nri.Runtime = (*Server)(nil)
)

// SetNRI connects the server to NRI. It is set after Restore and before
// the socket opens: plugins are synchronized with the restored state.
func (s *Server) SetNRI(n NRI) {
	if n != nil {
		s.nri = n
	}
}

// nriPod describes a pod to plugins.
func nriPod(md *sandbox.Metadata) *nriapi.PodSandbox {
	p := &nriapi.PodSandbox{
		Id: md.ID, Name: md.Name, Uid: md.UID, Namespace: md.Namespace,
		Labels: md.Labels, Annotations: md.Annotations, RuntimeHandler: md.Handler,
		Ips:   md.IPs,
		Linux: &nriapi.LinuxPodSandbox{CgroupParent: md.CgroupParent},
	}
	for _, kind := range []string{"user", "net", "ipc", "uts"} {
		if path := md.Pins[kind]; path != "" {
			typ := kind
			if kind == "net" {
				typ = "network"
			}
			p.Linux.Namespaces = append(p.Linux.Namespaces, &nriapi.LinuxNamespace{Type: typ, Path: path})
		}
	}
	return p
}

// nriContainer describes a container to plugins; spec, when known, adds
// what it runs with.
func nriContainer(md *sandbox.ContainerMetadata, st sandbox.ContainerStatus, spec *specs.Spec) *nriapi.Container {
	c := &nriapi.Container{
		Id: md.ID, PodSandboxId: md.SandboxID, Name: md.Name,
		Labels: md.Labels, Annotations: md.Annotations,
		Pid:       uint32(max(st.Pid, 0)),
		CreatedAt: md.CreatedAt.UnixNano(), ExitCode: st.ExitCode,
		StatusReason: st.Reason, StatusMessage: st.Message,
	}
	switch st.State {
	case sandbox.ContainerCreated:
		c.State = nriapi.ContainerState_CONTAINER_CREATED
	case sandbox.ContainerRunning:
		c.State = nriapi.ContainerState_CONTAINER_RUNNING
	case sandbox.ContainerExited:
		c.State = nriapi.ContainerState_CONTAINER_STOPPED
	}
	if !st.StartedAt.IsZero() {
		c.StartedAt = st.StartedAt.UnixNano()
	}
	if !st.FinishedAt.IsZero() {
		c.FinishedAt = st.FinishedAt.UnixNano()
	}
	if spec == nil {
		return c
	}
	if spec.Annotations != nil {
		c.Annotations = spec.Annotations
	}
	c.Mounts = nriapi.FromOCIMounts(spec.Mounts)
	c.Hooks = nriapi.FromOCIHooks(spec.Hooks)
	if p := spec.Process; p != nil {
		c.Args, c.Env = p.Args, p.Env
		for _, r := range p.Rlimits {
			c.Rlimits = append(c.Rlimits, &nriapi.POSIXRlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
		}
		c.User = &nriapi.User{Uid: p.User.UID, Gid: p.User.GID, AdditionalGids: p.User.AdditionalGids}
	}
	if l := spec.Linux; l != nil {
		c.Linux = &nriapi.LinuxContainer{
			Namespaces:  nriapi.FromOCILinuxNamespaces(l.Namespaces),
			Devices:     nriapi.FromOCILinuxDevices(l.Devices),
			Resources:   nriapi.FromOCILinuxResources(l.Resources, nil),
			CgroupsPath: l.CgroupsPath,
		}
		if p := spec.Process; p != nil && p.OOMScoreAdj != nil {
			c.Linux.OomScoreAdj = nriapi.Int(*p.OOMScoreAdj)
		}
	}
	return c
}

// containerSpec reads a container's config.json; nil if it has none yet.
func containerSpec(dir string) *specs.Spec {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil
	}
	var sp specs.Spec
	if json.Unmarshal(b, &sp) != nil {
		return nil
	}
	return &sp
}

// nriOf describes a stored container and its pod; the pod is nil when it
// is gone.
func (s *Server) nriOf(c *sandbox.Container, spec *specs.Spec) (*nriapi.PodSandbox, *nriapi.Container) {
	var pod *nriapi.PodSandbox
	if sb, err := s.sandboxes.Get(c.SandboxID); err == nil {
		pod = nriPod(&sb.Metadata)
	}
	return pod, nriContainer(&c.ContainerMetadata, c.Status(), spec)
}

// Snapshot lists every pod and container for a plugin being synchronized.
// It takes no pod or container lock: a creation holds those while it
// waits for a synchronization to end (nri.BlockSync).
func (s *Server) Snapshot(context.Context) ([]*nriapi.PodSandbox, []*nriapi.Container, error) {
	var pods []*nriapi.PodSandbox
	for _, sb := range s.sandboxes.List() {
		pods = append(pods, nriPod(&sb.Metadata))
	}
	var ctrs []*nriapi.Container
	for _, c := range s.containers.List() {
		ctrs = append(ctrs, nriContainer(&c.ContainerMetadata, c.Status(), containerSpec(c.Dir)))
	}
	return pods, ctrs, nil
}

// UpdateContainers applies the resource updates plugins ask for, and
// returns those that failed and were not marked to ignore failure.
func (s *Server) UpdateContainers(ctx context.Context, updates []*nriapi.ContainerUpdate) ([]*nriapi.ContainerUpdate, error) {
	var failed []*nriapi.ContainerUpdate
	var errs []error
	for _, u := range updates {
		res := u.GetLinux().GetResources()
		if res == nil {
			continue
		}
		c, err := s.containers.Get(u.GetContainerId())
		if err == nil {
			err = s.applyResources(ctx, c, res.ToOCI())
		}
		if err != nil && !u.GetIgnoreFailure() {
			failed = append(failed, u)
			errs = append(errs, fmt.Errorf("container %s: %w", u.GetContainerId(), err))
		}
	}
	return failed, errors.Join(errs...)
}

// evict stops the containers plugins asked to evict. It runs on its own
// goroutine and context: the request that carried the eviction must not
// wait for, or take locks for, other containers.
func (s *Server) evict(ctx context.Context, evictions []*nriapi.ContainerEviction) {
	if len(evictions) == 0 {
		return
	}
	lg := log.G(ctx)
	go func() {
		ctx, cancel := context.WithTimeout(log.WithLogger(context.Background(), lg), time.Minute)
		defer cancel()
		for _, e := range evictions {
			c, err := s.containers.Get(e.GetContainerId())
			if err != nil {
				continue
			}
			lg.WithField("container", c.ID).Warnf("NRI plugin evicts the container: %s", e.GetReason())
			if err := s.stopContainer(ctx, c, 0); err != nil {
				lg.WithError(err).WithField("container", c.ID).Warn("NRI eviction")
			}
		}
	}()
}

// nriCreate asks plugins for their adjustments to a container about to be
// created and applies them to spec. A refusal fails the creation.
// Once plugins have seen the event, a failure tells them the container
// is gone again: they may have reserved resources for it.
func (s *Server) nriCreate(ctx context.Context, rt ContainerRuntime, sb *sandbox.Sandbox, md *sandbox.ContainerMetadata, spec *specs.Spec, undo *cleanups) error {
	u, err := podUserNS(ctx, rt, sb)
	if err != nil {
		return err
	}
	// Tried on a copy inside NRI, where the plugins that made an
	// adjustment pinrt cannot apply are still known.
	check := func(adj *nriapi.ContainerAdjustment) error {
		var try specs.Spec
		b, err := json.Marshal(spec)
		if err == nil {
			err = json.Unmarshal(b, &try)
		}
		if err != nil {
			return err
		}
		if err := s.nriCgroupsPath(sb, adj); err != nil {
			return err
		}
		return oci.ApplyNRIAdjustment(&try, adj, s.deps.CDI, u)
	}
	adj, err := s.nri.CreateContainer(ctx, nriPod(&sb.Metadata), nriContainer(md, sandbox.ContainerStatus{State: sandbox.ContainerCreated}, spec), check)
	if err != nil {
		return fmt.Errorf("container %q: %w", md.Name, err)
	}
	undo.add("NRI RemoveContainer", func(ctx context.Context) error {
		return s.nri.RemoveContainer(ctx, nriPod(&sb.Metadata), nriContainer(md, sandbox.ContainerStatus{State: sandbox.ContainerExited}, nil))
	})
	if err := s.nriCgroupsPath(sb, adj.Adjust); err != nil {
		return fmt.Errorf("container %q: %w", md.Name, err)
	}
	if err := oci.ApplyNRIAdjustment(spec, adj.Adjust, s.deps.CDI, u); err != nil {
		return fmt.Errorf("container %q: %w", md.Name, err)
	}
	if failed, err := s.UpdateContainers(ctx, adj.Update); err != nil {
		log.G(ctx).WithError(err).Warnf("NRI: %d updates to other containers failed", len(failed))
	}
	s.evict(ctx, adj.Evict)
	return nil
}

// nriCgroupsPath refuses a plugin's cgroups path the cgroup driver cannot
// place a container at, or one that is the pod's cgroup or holds it (the
// root included): runc would fail the creation only once conmon runs,
// naming no plugin, or put the container in a cgroup shared with others,
// which runc deletes with the container and which a restore after a
// crash mid-creation kills every process of. The container's stats,
// metrics and restore follow the path (they read it from the bundle's
// config.json).
func (s *Server) nriCgroupsPath(sb *sandbox.Sandbox, adj *nriapi.ContainerAdjustment) error {
	p := adj.GetLinux().GetCgroupsPath()
	if p == "" {
		return nil
	}
	drv := s.deps.CgroupDriver
	fs := drv.FSPath(p)
	if fs == "" {
		return fmt.Errorf("NRI adjustment: cgroups path %q is no container cgroup for the %s driver: %w", p, drv.Name(), errdefs.ErrInvalidArgument)
	}
	if pod := s.podCgroup(sb); fs == "/" || fs == pod || strings.HasPrefix(pod, fs+"/") {
		return fmt.Errorf("NRI adjustment: cgroups path %q is the pod's cgroup %s or holds it: %w", p, pod, errdefs.ErrInvalidArgument)
	}
	return nil
}

// podUserNS is what devices and mounts a plugin adds to a container of
// sb are rewritten with: nil for a pod in the host's user namespace.
func podUserNS(ctx context.Context, rt ContainerRuntime, sb *sandbox.Sandbox) (*oci.PodUserNS, error) {
	if sb.Pins["user"] == "" {
		return nil, nil
	}
	feat, err := rt.Features(ctx)
	if err != nil {
		return nil, err
	}
	return &oci.PodUserNS{UIDMappings: sb.UIDMappings, GIDMappings: sb.GIDMappings, Features: feat}, nil
}

// nriNotify logs a failed notification: the operation it reports on has
// happened, and a plugin cannot undo it.
func nriNotify(ctx context.Context, event string, err error) {
	if err != nil {
		log.G(ctx).WithError(err).Warnf("NRI %s", event)
	}
}

// swapFollowsPlugin keeps swap off under a plugin's memory limit m in
// its answer to UpdateContainer. The plugins saw the request's limits
// (res), without the swap limit pinrt adds to a memory limit; and where
// the request turned swap off itself (kubelet sends a swap limit equal to
// the memory on cgroup v1), a plugin that changed the memory alone would
// leave that swap limit below a raised one, which runc cannot set.
func swapFollowsPlugin(res *oci.Resources, m *specs.LinuxMemory) {
	host := oci.ProbeHost()
	if m == nil || !host.SwapController {
		return
	}
	swapOff := res.MemorySwapLimit == 0 || res.MemorySwapLimit == res.MemoryLimit
	if !swapOff || (m.Swap != nil && *m.Swap != res.MemorySwapLimit) {
		return // the plugin's own swap limit, or the request's swap
	}
	m.Swap = nil
	oci.DefaultSwap(m, &host)
}

// nriResources converts CRI-side resources for an UpdateContainer event.
func nriResources(res *oci.Resources) *nriapi.LinuxResources {
	if res == nil {
		return nil
	}
	lr := &specs.LinuxResources{
		CPU:     &specs.LinuxCPU{Cpus: res.CpusetCpus, Mems: res.CpusetMems},
		Memory:  &specs.LinuxMemory{},
		Unified: res.Unified,
	}
	if res.CPUShares != 0 {
		lr.CPU.Shares = &res.CPUShares
	}
	if res.CPUQuota != 0 {
		lr.CPU.Quota = &res.CPUQuota
	}
	if res.CPUPeriod != 0 {
		lr.CPU.Period = &res.CPUPeriod
	}
	if res.MemoryLimit != 0 {
		lr.Memory.Limit = &res.MemoryLimit
	}
	if res.MemorySwapLimit != 0 {
		lr.Memory.Swap = &res.MemorySwapLimit
	}
	for _, h := range res.Hugepages {
		lr.HugepageLimits = append(lr.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: h.PageSize, Limit: h.Limit})
	}
	return nriapi.FromOCILinuxResources(lr, nil)
}

// nriUpdate tells plugins about new resources for c and returns those to
// set, the request's or a plugin's update for c, and the plugins' updates
// of other containers, for the caller to apply once c is unlocked.
func (s *Server) nriUpdate(ctx context.Context, c *sandbox.Container, res *oci.Resources, lr *specs.LinuxResources) (*specs.LinuxResources, []*nriapi.ContainerUpdate, error) {
	pod, ctr := s.nriOf(c, nil)
	updates, evictions, err := s.nri.UpdateContainer(ctx, pod, ctr, nriResources(res))
	if err != nil {
		return nil, nil, fmt.Errorf("container %s: %w", c.ID, err)
	}
	var others []*nriapi.ContainerUpdate
	for _, u := range updates {
		if u.GetContainerId() == c.ID && u.GetLinux().GetResources() != nil {
			lr = u.GetLinux().GetResources().ToOCI()
			swapFollowsPlugin(res, lr.Memory)
			continue
		}
		others = append(others, u)
	}
	s.evict(ctx, evictions)
	return lr, others, nil
}
