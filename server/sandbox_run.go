package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// podRequest is a validated RunPodSandbox request in pinrt's own terms.
type podRequest struct {
	md      sandbox.Metadata
	dns     *sandbox.DNS
	sysctls map[string]string
	uids    []specs.LinuxIDMapping // from kubelet; empty means allocate
	gids    []specs.LinuxIDMapping
}

// runPod creates a pod's namespaces, its network and its state, in that
// order, and undoes all of it if any step fails.
func (s *Server) runPod(ctx context.Context, req *podRequest) (_ *sandbox.Sandbox, retErr error) {
	md := req.md
	md.ID = newID()
	md.CreatedAt = time.Now()
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", md.ID))

	var undo cleanups
	defer func() {
		if retErr != nil {
			undo.run(ctx)
		}
	}()

	if err := s.reservePod(&md, req, &undo); err != nil {
		return nil, err
	}

	// The intent is on disk before the first side effect: a daemon killed
	// from here on leaves a record that the next start tears down. So does
	// a rollback whose undo failed: it keeps the record.
	dir, runDir := s.sandboxDir(md.ID), s.sandboxRunDir(md.ID)
	undo.addIfClean("remove directories", func(context.Context) error {
		return errors.Join(sandbox.RemoveDir(dir), os.RemoveAll(runDir))
	})
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := sandbox.MarkIntent(dir, sandbox.IntentCreating, md); err != nil {
		return nil, err
	}

	if err := s.createPodNamespaces(ctx, &md, req.sysctls, &undo); err != nil {
		return nil, err
	}
	if err := s.makePodRunDir(&md, runDir, &undo); err != nil {
		return nil, err
	}
	if err := s.setupPodNetwork(ctx, &md, runDir, req.dns, &undo); err != nil {
		return nil, err
	}

	if err := s.startPodInfra(ctx, &md, &undo); err != nil {
		return nil, err
	}

	// From the NRI event until the pod is in the store, a plugin
	// connecting now waits: it then sees the pod in its sync.
	defer s.nri.BlockSync()()
	if err := s.nri.RunPodSandbox(ctx, nriPod(&md)); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", md.Namespace, md.Name, err)
	}
	// Only told: the plugins hold nothing the pod's record would free.
	undo.add("NRI RemovePodSandbox", func(ctx context.Context) error {
		nriNotify(ctx, "RemovePodSandbox", s.nri.RemovePodSandbox(ctx, nriPod(&md)))
		return nil
	})

	sb, saveStart := sandbox.New(md, dir), time.Now()
	if err := sb.Save(); err != nil {
		return nil, fmt.Errorf("saving sandbox state: %w", err)
	}
	if err := sandbox.ClearIntent(dir, sandbox.IntentCreating); err != nil {
		return nil, fmt.Errorf("completing sandbox state: %w", err)
	}
	s.sandboxes.Add(md.ID, sb)
	s.notePodOOMBase(ctx, sb)
	log.G(ctx).WithFields(log.Fields{"ips": md.IPs, "phase": "state", "duration_ms": float64(time.Since(saveStart).Microseconds()) / 1000}).Debug("sandbox ready")
	return sb, nil
}

// startPodInfra starts the pause process of a pod sharing one PID
// namespace, which lives as long as its first process; undo removes it
// and the pod cgroup. It starts last, so it joins the finished pins.
func (s *Server) startPodInfra(ctx context.Context, md *sandbox.Metadata, undo *cleanups) error {
	// The infra process is the pod's first cgroup member: its creation
	// makes the pod cgroup (cgroupfs: runc mkdirs the parent; systemd:
	// EnsurePod starts the slice), which removing the infra leaves behind.
	// critest's NRI spec refusing RunPodSandbox left one per run.
	undo.add("remove pod cgroup", func(ctx context.Context) error {
		return s.deps.CgroupDriver.RemovePod(ctx, md.CgroupParent, md.ID)
	})
	if md.Modes.PID != sandbox.ModePod {
		return nil
	}
	// The undo comes first: startInfra's own rollback only logs a removal
	// that failed, and the pause process would hold the pins and the ID
	// range with no record left of it.
	undo.add("remove infra process", func(ctx context.Context) error {
		if err := s.removeInfra(ctx, md); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return nil
	})
	if err := s.startInfra(ctx, md); err != nil {
		return fmt.Errorf("starting the pod's infra process: %w", err)
	}
	return nil
}

// reservePod reserves the pod's name and its user namespace ID range; undo
// releases them.
func (s *Server) reservePod(md *sandbox.Metadata, req *podRequest, undo *cleanups) error {
	key := sandbox.NameKey(md.Name, md.Namespace, md.UID, md.Attempt)
	if err := s.podNames.Reserve(key, md.ID); err != nil {
		return fmt.Errorf("pod %s/%s (uid %s, attempt %d): %w", md.Namespace, md.Name, md.UID, md.Attempt, err)
	}
	undo.add("release name", func(context.Context) error { s.podNames.Release(key, md.ID); return nil })

	if err := s.resolveMappings(md, req); err != nil {
		return err
	}
	if md.Allocated || len(md.UIDMappings) > 0 {
		undo.addIfClean("release ID range", func(context.Context) error { s.deps.IDs.Release(md.ID); return nil })
	}
	return nil
}

// createPodNamespaces creates and pins the pod's namespaces and records
// the pins in md; undo removes them.
func (s *Server) createPodNamespaces(ctx context.Context, md *sandbox.Metadata, sysctls map[string]string, undo *cleanups) error {
	pins, err := s.deps.Namespaces.Create(ctx, nsmgr.CreateRequest{
		ID: md.ID, Kinds: podKinds(md.Modes),
		UIDMappings: md.UIDMappings, GIDMappings: md.GIDMappings,
		Sysctls: sysctls, Hostname: podHostname(*md),
	})
	if err != nil {
		return fmt.Errorf("creating pod namespaces: %w", err)
	}
	undo.add("remove pins", func(ctx context.Context) error { return s.deps.Namespaces.Remove(ctx, md.ID) })
	md.Pins = map[string]string{}
	for k, p := range pins {
		md.Pins[string(k)] = p
	}
	return nil
}

// makePodRunDir makes the pod's run directory and, for a pod IPC
// namespace, mounts the pod's /dev/shm in it; undo unmounts it. The
// directory itself is removed by the caller's undo.
func (s *Server) makePodRunDir(md *sandbox.Metadata, runDir string, undo *cleanups) error {
	// The pod files are bind-mounted into containers whose root may be a
	// mapped uid: the directory must be traversable.
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return err
	}
	if md.Modes.IPC == sandbox.ModePod {
		md.ShmPath = filepath.Join(runDir, "shm")
		uid, gid := rootOf(md.UIDMappings), rootOf(md.GIDMappings)
		if err := s.deps.Shm.Mount(md.ShmPath, uid, gid); err != nil {
			return err
		}
		undo.add("unmount shm", func(context.Context) error { return s.deps.Shm.Unmount(md.ShmPath) })
	}
	return nil
}

// setupPodNetwork sets up a pod network through CNI (undo tears it down)
// and writes the pod's hostname, hosts and resolv.conf files into runDir,
// the hosts file naming the pod's first IP.
func (s *Server) setupPodNetwork(ctx context.Context, md *sandbox.Metadata, runDir string, dns *sandbox.DNS, undo *cleanups) error {
	if md.Modes.Network == sandbox.ModePod {
		res, err := s.deps.Network.Setup(ctx, cniPod(md))
		if err != nil {
			// The ADD's own DEL ran (cni.Setup), and its failure is in
			// err (cni.ErrRollback). The record is not kept for it: a
			// plugin that refused the network (a broken configuration)
			// refuses the DEL too, and kubelet's retries, each a new pod,
			// would pile up records and hold ID ranges until a restart.
			return fmt.Errorf("setting up the pod network: %w", err)
		}
		// Past a successful ADD the pod has an IP: a rollback whose DEL
		// fails keeps the record, for the next start to DEL again.
		undo.add("CNI DEL", func(ctx context.Context) error { return s.deps.Network.Teardown(ctx, cniPod(md)) })
		md.IPs, md.Network, md.CNIResult = res.IPs, res.Network, res.Raw
	}
	ip := ""
	if len(md.IPs) > 0 {
		ip = md.IPs[0]
	}
	files, err := sandbox.WritePodFiles(runDir, md.Hostname, ip, dns, md.Modes.Network == sandbox.ModeNode)
	if err != nil {
		return fmt.Errorf("writing pod files: %w", err)
	}
	md.HostnamePath, md.HostsPath, md.ResolvPath = files.Hostname, files.Hosts, files.Resolv
	return nil
}

// resolveMappings fills the pod's user namespace mappings: kubelet's,
// validated and recorded, or a fresh block from the allocator.
func (s *Server) resolveMappings(md *sandbox.Metadata, req *podRequest) error {
	if md.Modes.User != sandbox.ModePod {
		return nil
	}
	if len(req.uids) == 0 && len(req.gids) == 0 {
		m, err := s.deps.IDs.Allocate(md.ID)
		if err != nil {
			return fmt.Errorf("allocating a user namespace ID range: %w", err)
		}
		md.UIDMappings, md.GIDMappings, md.Allocated = []specs.LinuxIDMapping{m}, []specs.LinuxIDMapping{m}, true
		return nil
	}
	if err := s.deps.IDs.Reserve(md.ID, req.uids, req.gids); err != nil {
		return fmt.Errorf("user namespace mappings: %w", err)
	}
	md.UIDMappings, md.GIDMappings = req.uids, req.gids
	return nil
}

// podHostname is the name nsmgr gives the pod's own UTS namespace; a pod
// on the host network keeps the node's.
func podHostname(md sandbox.Metadata) string {
	if md.Modes.Network != sandbox.ModePod {
		return ""
	}
	return md.Hostname
}

// RunPodSandbox creates a pod: its pinned namespaces, its network and its
// state on disk.
func (s *Server) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	pr, err := s.podRequest(req)
	if err != nil {
		return nil, err
	}
	// A pod of a handler that cannot run containers (its binary gone,
	// its probe failed) would be Ready with every container failing to
	// be created: it is refused now, as containerd's pause container
	// fails. (CRI-O does not start with a handler whose binary is gone.)
	if _, err := s.usableRuntime(ctx, pr.md.Handler); err != nil {
		if !errdefs.IsFailedPrecondition(err) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
		}
		return nil, err
	}
	sb, err := s.runPod(ctx, pr)
	if err != nil {
		return nil, err
	}
	podEvent(ctx, sb, "created")
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: sb.ID}, nil
}

// podLinux validates the pod's Linux settings and returns its namespace
// modes. The cgroup parent is checked now, not at the first container's
// create.
func (s *Server) podLinux(linux *runtimeapi.LinuxPodSandboxConfig) (sandbox.NamespaceModes, error) {
	if sc := linux.GetSecurityContext(); sc != nil {
		if err := validRunAs("pod", sc.RunAsUser, "", sc.RunAsGroup); err != nil {
			return sandbox.NamespaceModes{}, err
		}
	}
	modes, err := namespaceModes(linux.GetSecurityContext().GetNamespaceOptions())
	if err != nil {
		return modes, err
	}
	if p := linux.GetCgroupParent(); p != "" {
		if _, err := s.deps.CgroupDriver.PodParent(p, ""); err != nil {
			return modes, err
		}
	}
	return modes, nsmgr.ValidateSysctls(linux.GetSysctls(), modes.Network == sandbox.ModePod, modes.IPC == sandbox.ModePod)
}

// podRequest validates a RunPodSandbox request and converts it into
// pinrt's own terms. Nothing has been created when it fails.
func (s *Server) podRequest(req *runtimeapi.RunPodSandboxRequest) (*podRequest, error) {
	cfg := req.GetConfig()
	m := cfg.GetMetadata()
	if m == nil {
		return nil, invalid("sandbox config metadata is missing")
	}
	for _, f := range []struct{ what, v string }{{"pod name", m.Name}, {"pod namespace", m.Namespace}, {"pod uid", m.Uid}} {
		if err := validName(f.what, f.v); err != nil {
			return nil, err
		}
		if err := validate.CNIArg(f.what, f.v); err != nil {
			return nil, err
		}
	}
	if err := validate.LabelsAndAnnotations("pod", cfg.Labels, cfg.Annotations); err != nil {
		return nil, err
	}
	if d := cfg.LogDirectory; d != "" {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d {
			return nil, invalid("log directory %q must be a clean absolute path", d)
		}
		if err := validate.Path("log directory", d); err != nil {
			return nil, err
		}
		// Every container's log would be refused: it is refused now.
		if err := oci.CheckLogPath(d); err != nil {
			return nil, err
		}
	}
	handler := req.RuntimeHandler
	if handler == "" {
		handler = s.cfg.Runtime.DefaultRuntime
	}
	if _, ok := s.cfg.Runtime.Runtimes[handler]; !ok {
		return nil, invalid("unknown runtime handler %q", handler)
	}
	hostname := cfg.Hostname
	if hostname == "" {
		hostname = hostnameFromName(m.Name)
	}
	if err := validate.Hostname(hostname); err != nil {
		return nil, err
	}
	linux := cfg.GetLinux()
	modes, err := s.podLinux(linux)
	if err != nil {
		return nil, err
	}
	pr := &podRequest{
		md: sandbox.Metadata{
			Name: m.Name, Namespace: m.Namespace, UID: m.Uid, Attempt: m.Attempt,
			Labels: cfg.Labels, Annotations: cfg.Annotations, LogDirectory: cfg.LogDirectory,
			Handler: handler, Hostname: hostname, CgroupParent: linux.GetCgroupParent(), Modes: modes,
		},
		sysctls: linux.GetSysctls(),
	}
	if dns := cfg.DnsConfig; dns != nil {
		if err := validate.DNS(dns.Servers, dns.Searches, dns.Options); err != nil {
			return nil, err
		}
		pr.dns = &sandbox.DNS{Servers: dns.Servers, Searches: dns.Searches, Options: dns.Options}
	}
	if pr.md.PortMappings, err = portMappings(cfg.PortMappings); err != nil {
		return nil, err
	}
	bw, err := podBandwidth(cfg.Annotations)
	if err != nil {
		return nil, err
	}
	if bw != nil && modes.Network == sandbox.ModeNode {
		return nil, invalid("bandwidth annotations need a pod network, not the host's")
	}
	pr.md.Bandwidth = bw
	userns := linux.GetSecurityContext().GetNamespaceOptions().GetUsernsOptions()
	pr.uids, pr.gids = idMappings(userns.GetUids()), idMappings(userns.GetGids())
	if modes.User != sandbox.ModePod && (len(pr.uids) > 0 || len(pr.gids) > 0) {
		return nil, invalid("user namespace mappings given without user namespace mode POD")
	}
	return pr, nil
}

// portMappings validates a pod's port mappings and converts them.
func portMappings(pms []*runtimeapi.PortMapping) ([]sandbox.PortMapping, error) {
	if len(pms) > maxPortMappings {
		return nil, invalid("%d port mappings, at most %d allowed", len(pms), maxPortMappings)
	}
	var out []sandbox.PortMapping
	for _, pm := range pms {
		// An unknown enum value's String() is its number, which the
		// validator refuses along with the names it does not know.
		proto := strings.ToLower(pm.Protocol.String())
		if err := validate.PortMapping(proto, pm.ContainerPort, pm.HostPort, pm.HostIp); err != nil {
			return nil, err
		}
		out = append(out, sandbox.PortMapping{
			HostPort: pm.HostPort, ContainerPort: pm.ContainerPort, Protocol: proto, HostIP: pm.HostIp,
		})
	}
	return out, nil
}

// maxPortMappings bounds a pod's port mappings; kubelet sends one per
// container port, and a pod has far fewer.
const maxPortMappings = 1024

// hostnameFromName derives a hostname from the pod name when kubelet sends
// none: characters a DNS name can't hold become '-', and the result is cut
// to 63 characters.
func hostnameFromName(name string) string {
	h := strings.Map(func(r rune) rune {
		if validate.HostnameChar(r) {
			return r
		}
		return '-'
	}, name)
	// 63, not the kernel's 64: kubelet cuts pod hostnames there, and a
	// single label may not be longer.
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.Trim(strings.ReplaceAll(h, "..", "-"), "-.")
}

func namespaceModes(o *runtimeapi.NamespaceOption) (sandbox.NamespaceModes, error) {
	m := sandbox.NamespaceModes{Network: sandbox.ModePod, IPC: sandbox.ModePod, PID: sandbox.ModeContainer, User: sandbox.ModeNode}
	if o.GetNetwork() == runtimeapi.NamespaceMode_NODE {
		m.Network = sandbox.ModeNode
	}
	if o.GetIpc() == runtimeapi.NamespaceMode_NODE {
		m.IPC = sandbox.ModeNode
	}
	switch o.GetPid() {
	case runtimeapi.NamespaceMode_POD:
		m.PID = sandbox.ModePod
	case runtimeapi.NamespaceMode_NODE:
		m.PID = sandbox.ModeNode
	case runtimeapi.NamespaceMode_TARGET:
		return m, invalid("pid namespace mode TARGET is only valid for containers")
	}
	// No user namespace options at all means the host's, as for kubelet
	// before user namespaces existed; the enum's zero value is POD.
	switch u := o.GetUsernsOptions(); {
	case u == nil || u.Mode == runtimeapi.NamespaceMode_NODE:
	case u.Mode == runtimeapi.NamespaceMode_POD:
		m.User = sandbox.ModePod
	default:
		return m, invalid("user namespace mode %v is not supported (POD or NODE)", o.GetUsernsOptions().GetMode())
	}
	if m.User == sandbox.ModePod && (m.Network == sandbox.ModeNode || m.IPC == sandbox.ModeNode || m.PID == sandbox.ModeNode) {
		return m, invalid("a pod with its own user namespace cannot share the host's network, IPC or PID namespace")
	}
	return m, nil
}
