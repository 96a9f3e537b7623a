package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/sandbox"
)

// cleanupTimeout bounds a rollback or teardown; it runs on a fresh
// context so a cancelled request still undoes what it did.
const cleanupTimeout = 2 * time.Minute

// cleanups is a LIFO list of undo steps, each with a description for the
// log when it fails.
type cleanups []struct {
	what string
	fn   func(context.Context) error
}

func (c *cleanups) add(what string, fn func(context.Context) error) {
	*c = append(*c, struct {
		what string
		fn   func(context.Context) error
	}{what, fn})
}

// run undoes everything in reverse order on a fresh, bounded context.
func (c cleanups) run(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	for i := len(c) - 1; i >= 0; i-- {
		if err := c[i].fn(cctx); err != nil {
			log.G(ctx).WithError(err).Warnf("rollback: %s", c[i].what)
		}
	}
}

func newID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// podRequest is a validated RunPodSandbox request in pinrt's own terms.
type podRequest struct {
	md      sandbox.Metadata
	dns     *sandbox.DNS
	sysctls map[string]string
	uids    []specs.LinuxIDMapping // from kubelet; empty means allocate
	gids    []specs.LinuxIDMapping
}

func (s *Server) sandboxDir(id string) string { return filepath.Join(s.cfg.Root, "sandboxes", id) }
func (s *Server) sandboxRunDir(id string) string {
	return filepath.Join(s.cfg.RunRoot, "sandboxes", id)
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

	key := sandbox.NameKey(md.Name, md.Namespace, md.UID, md.Attempt)
	if err := s.podNames.Reserve(key, md.ID); err != nil {
		return nil, fmt.Errorf("pod %s/%s (uid %s, attempt %d): %w", md.Namespace, md.Name, md.UID, md.Attempt, err)
	}
	undo.add("release name", func(context.Context) error { s.podNames.Release(key, md.ID); return nil })

	if err := s.resolveMappings(&md, req); err != nil {
		return nil, err
	}
	if md.Allocated || len(md.UIDMappings) > 0 {
		undo.add("release ID range", func(context.Context) error { s.deps.IDs.Release(md.ID); return nil })
	}

	// The intent is on disk before the first side effect: a daemon killed
	// from here on leaves a record that the next start tears down.
	dir, runDir := s.sandboxDir(md.ID), s.sandboxRunDir(md.ID)
	undo.add("remove directories", func(context.Context) error {
		return errors.Join(os.RemoveAll(dir), os.RemoveAll(runDir))
	})
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := sandbox.MarkIntent(dir, sandbox.IntentCreating, md); err != nil {
		return nil, err
	}

	pins, err := s.deps.Namespaces.Create(ctx, nsmgr.CreateRequest{
		ID: md.ID, Kinds: podKinds(md.Modes),
		UIDMappings: md.UIDMappings, GIDMappings: md.GIDMappings,
		Sysctls: req.sysctls, Hostname: podHostname(md),
	})
	if err != nil {
		return nil, fmt.Errorf("creating pod namespaces: %w", err)
	}
	undo.add("remove pins", func(ctx context.Context) error { return s.deps.Namespaces.Remove(ctx, md.ID) })
	md.Pins = map[string]string{}
	for k, p := range pins {
		md.Pins[string(k)] = p
	}

	// The pod files are bind-mounted into containers whose root may be a
	// mapped uid: the directory must be traversable.
	if err := os.MkdirAll(runDir, 0o711); err != nil {
		return nil, err
	}
	if md.Modes.IPC == sandbox.ModePod {
		md.ShmPath = filepath.Join(runDir, "shm")
		uid, gid := rootOf(md.UIDMappings), rootOf(md.GIDMappings)
		if err := s.deps.Shm.Mount(md.ShmPath, uid, gid); err != nil {
			return nil, err
		}
		undo.add("unmount shm", func(context.Context) error { return s.deps.Shm.Unmount(md.ShmPath) })
	}

	if md.Modes.Network == sandbox.ModePod {
		res, err := s.deps.Network.Setup(ctx, cniPod(&md))
		if err != nil {
			return nil, fmt.Errorf("setting up the pod network: %w", err)
		}
		undo.add("CNI DEL", func(ctx context.Context) error { return s.deps.Network.Teardown(ctx, cniPod(&md)) })
		md.IPs, md.Network, md.CNIResult = res.IPs, res.Network, res.Raw
	}
	ip := ""
	if len(md.IPs) > 0 {
		ip = md.IPs[0]
	}
	files, err := sandbox.WritePodFiles(runDir, md.Hostname, ip, req.dns, md.Modes.Network == sandbox.ModeNode)
	if err != nil {
		return nil, fmt.Errorf("writing pod files: %w", err)
	}
	md.HostnamePath, md.HostsPath, md.ResolvPath = files.Hostname, files.Hosts, files.Resolv

	// A shared PID namespace lives as long as its first process: the
	// pod's pause process, started last so it joins the finished pins.
	if md.Modes.PID == sandbox.ModePod {
		if err := s.startInfra(ctx, &md); err != nil {
			return nil, fmt.Errorf("starting the pod's infra process: %w", err)
		}
		undo.add("remove infra process", func(ctx context.Context) error { return s.removeInfra(ctx, &md) })
	}

	sb, saveStart := sandbox.New(md, dir), time.Now()
	if err := sb.Save(); err != nil {
		return nil, fmt.Errorf("saving sandbox state: %w", err)
	}
	if err := sandbox.ClearIntent(dir, sandbox.IntentCreating); err != nil {
		return nil, fmt.Errorf("completing sandbox state: %w", err)
	}
	s.sandboxes.Add(md.ID, sb)
	log.G(ctx).WithFields(log.Fields{"ips": md.IPs, "phase": "state", "duration_ms": float64(time.Since(saveStart).Microseconds()) / 1000}).Debug("sandbox ready")
	return sb, nil
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

// rootOf is the host ID of container ID 0, or 0 without a mapping.
func rootOf(m []specs.LinuxIDMapping) uint32 {
	for _, e := range m {
		if e.ContainerID == 0 {
			return e.HostID
		}
	}
	return 0
}

// podHostname is the name nsmgr gives the pod's own UTS namespace; a pod
// on the host network keeps the node's.
func podHostname(md sandbox.Metadata) string {
	if md.Modes.Network != sandbox.ModePod {
		return ""
	}
	return md.Hostname
}

func podKinds(m sandbox.NamespaceModes) []nsmgr.Kind {
	var kinds []nsmgr.Kind
	if m.User == sandbox.ModePod {
		kinds = append(kinds, nsmgr.User)
	}
	if m.Network == sandbox.ModePod {
		// A pod on the host network also keeps the host's UTS namespace,
		// as kubelet expects (hostNetwork implies the node's hostname).
		kinds = append(kinds, nsmgr.Net, nsmgr.UTS)
	}
	if m.IPC == sandbox.ModePod {
		kinds = append(kinds, nsmgr.IPC)
	}
	return kinds
}

func cniPod(md *sandbox.Metadata) cni.Pod {
	p := cni.Pod{ID: md.ID, Name: md.Name, Namespace: md.Namespace, UID: md.UID, NetNS: md.Pins[string(nsmgr.Net)]}
	for _, pm := range md.PortMappings {
		p.PortMappings = append(p.PortMappings, cni.PortMapping{HostPort: pm.HostPort, ContainerPort: pm.ContainerPort, Protocol: pm.Protocol, HostIP: pm.HostIP})
	}
	if b := md.Bandwidth; b != nil {
		p.Bandwidth = &cni.Bandwidth{IngressRate: b.IngressRate, IngressBurst: b.IngressBurst, EgressRate: b.EgressRate, EgressBurst: b.EgressBurst}
	}
	return p
}

// stopPod tears a pod down to NotReady: containers, network, pins, shm.
// Every step is idempotent, so Stop works on a half-made, NotReady or
// already stopped sandbox. NotReady is on disk before anything is torn
// down, and the network's end as soon as DEL succeeded: a daemon killed
// in between never restores the pod Ready without its IP.
func (s *Server) stopPod(ctx context.Context, sb *sandbox.Sandbox) error {
	unlock := sb.Lock()
	defer unlock()
	return s.stopPodLocked(ctx, sb)
}

func (s *Server) stopPodLocked(ctx context.Context, sb *sandbox.Sandbox) error {
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", sb.ID))
	if err := sb.UpdateStatus(func(st *sandbox.Status) { st.State = sandbox.StateNotReady }); err != nil {
		return err
	}
	s.closePodStreams(sb.ID) // port-forwards into the pod end with it
	if err := s.stopPodContainers(ctx, sb); err != nil {
		return err
	}
	if err := s.teardownPodNetwork(ctx, sb); err != nil {
		return err
	}
	if err := s.deps.Namespaces.Remove(ctx, sb.ID); err != nil {
		return fmt.Errorf("removing pod namespaces: %w", err)
	}
	if err := s.deps.Shm.Unmount(sb.ShmPath); err != nil {
		return err
	}
	if !sb.Status().StoppedAt.IsZero() {
		return nil
	}
	return sb.UpdateStatus(func(st *sandbox.Status) { st.StoppedAt = time.Now() })
}

// teardownPodNetwork runs CNI DEL once and records that it succeeded.
func (s *Server) teardownPodNetwork(ctx context.Context, sb *sandbox.Sandbox) error {
	if sb.Modes.Network != sandbox.ModePod || sb.Status().NetworkTornDown {
		return nil
	}
	pod := cniPod(&sb.Metadata)
	// After a reboot the pin is gone: DEL runs from the cached result
	// with no netns, as the CNI spec allows.
	if _, err := s.deps.Namespaces.Open(ctx, sb.ID, pinnedKinds(sb)); err != nil {
		pod.NetNS = ""
	}
	if err := s.deps.Network.Teardown(ctx, pod); err != nil {
		return fmt.Errorf("tearing down the pod network: %w", err)
	}
	return sb.UpdateStatus(func(st *sandbox.Status) { st.NetworkTornDown = true })
}

// removePod stops a pod if needed and deletes everything it had. The
// removal is recorded first, so a start after a crash finishes it.
func (s *Server) removePod(ctx context.Context, sb *sandbox.Sandbox) error {
	// One lock for the stop and the removal: a CreateContainer waiting
	// for the pod then finds it gone, never half-removed.
	unlock := sb.Lock()
	defer unlock()
	if err := sandbox.MarkIntent(sb.Dir, sandbox.IntentRemoving, sb.Metadata); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := s.stopPodLocked(ctx, sb); err != nil {
		return err
	}
	if err := s.removePodContainers(ctx, sb); err != nil {
		return err
	}
	if err := errors.Join(os.RemoveAll(s.sandboxRunDir(sb.ID)), os.RemoveAll(sb.Dir)); err != nil {
		return fmt.Errorf("removing sandbox directories: %w", err)
	}
	s.deps.IDs.Release(sb.ID)
	s.sandboxes.Delete(sb.ID)
	s.podNames.Release(sandbox.NameKey(sb.Name, sb.Namespace, sb.UID, sb.Attempt), sb.ID)
	return nil
}

// pinnedKinds are the namespaces a sandbox pinned. Open checks them as a
// set: net, ipc and uts must be owned by the pinned user namespace.
func pinnedKinds(sb *sandbox.Sandbox) []nsmgr.Kind {
	kinds := make([]nsmgr.Kind, 0, len(sb.Pins))
	for k := range sb.Pins {
		kinds = append(kinds, nsmgr.Kind(k))
	}
	return kinds
}

// podInfo is the verbose PodSandboxStatus info.
func (s *Server) podInfo(sb *sandbox.Sandbox) (map[string]string, error) {
	info := map[string]any{
		"pins":        sb.Pins,
		"uidMappings": sb.UIDMappings,
		"gidMappings": sb.GIDMappings,
		"allocated":   sb.Allocated,
		"configPath":  filepath.Join(sb.Dir, "config.json"),
		"status":      sb.Status(),
	}
	if len(sb.CNIResult) > 0 {
		info["cniResult"] = sb.CNIResult
	}
	if r, ok := s.podResources.Load(sb.ID); ok {
		info["resources"] = r
	}
	b, err := json.Marshal(info)
	if err != nil {
		return nil, fmt.Errorf("encoding sandbox info: %w", errdefs.ErrInternal)
	}
	return map[string]string{"info": string(b)}, nil
}
