package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// Restart, in the order Restore runs it:
//
//  1. Every sandbox directory is read. One whose intent record says its
//     creation or removal never finished, that has no state record at
//     all (the daemon died before writing even the intent), or that
//     cannot be loaded or restored, is set aside to be torn down, and its
//     ID range is held until that succeeds. The others are loaded; a pod
//     is Ready again only if its status says Ready, its network was never
//     torn down and its pins are still live.
//  2. Every container directory is read the same way. A container set
//     aside, or whose pod is set aside or gone, is torn down: its monitor
//     and runtime container killed and deleted, its mounts undone, its
//     directory removed.
//  3. The pods set aside are torn down: CNI DEL from the cached result,
//     pins, shm, the idmapped image tree, the cgroup parent, directories.
//     A pod with a container whose teardown failed waits for the next
//     start: that container may still run in its namespaces and range.
//
// Nothing is skipped: an object neither restored nor torn down kept its
// resources for good, or released them to others while it still ran. A
// record that cannot be read is torn down from what else the directory
// holds (the other record, config.json, conmon.pid, the infra bundle).
//
// All of it runs before the socket opens, so kubelet never sees a pod that
// is about to disappear, and a name is never free while its old pod is
// still being taken apart.

// restoreTimeout bounds the teardown of one object found half-made.
const restoreTimeout = time.Minute

// restorePods loads every sandbox from disk and returns the pods to tear
// down after their containers: those found half-made or half-removed, and
// those that cannot be restored. None is skipped: a pod neither restored
// nor torn down kept its IP and pins for good, while its containers went
// as orphans and its ID range went to the next pod. Each one's ID range is
// reserved before any teardown, and stays so until its teardown succeeds.
func (s *Server) restorePods(ctx context.Context) []*sandbox.Metadata {
	dirs, err := os.ReadDir(filepath.Join(s.cfg.Root, "sandboxes"))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).Error("restore: listing sandboxes")
		}
		return nil
	}
	var doomed []*sandbox.Metadata
	for _, d := range dirs {
		id := d.Name()
		if err := sandbox.ValidateID(id); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", id).Error("restore: skipping sandbox")
			continue
		}
		sb, md := s.loadPod(ctx, id)
		if sb != nil {
			err := s.restorePod(ctx, sb)
			s.deps.Metrics.ObserveRestore("pod", err)
			if err == nil {
				continue
			}
			log.G(ctx).WithError(err).WithField("sandbox", id).Error("restore: the pod cannot be restored: tearing it down")
			md = &sb.Metadata
		}
		s.holdIDRange(ctx, md)
		doomed = append(doomed, md)
	}
	return doomed
}

// loadPod returns the pod id to restore, or the metadata of one to tear
// down: its creation or removal was interrupted, or its state record is
// missing or unreadable.
func (s *Server) loadPod(ctx context.Context, id string) (*sandbox.Sandbox, *sandbox.Metadata) {
	dir := s.sandboxDir(id)
	sandbox.RemoveCrashTemps(dir)
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", id))
	md := &sandbox.Metadata{}
	if intent, err := sandbox.ReadIntent(dir, md); intent != "" {
		if err != nil || md.ID != id {
			log.G(ctx).WithError(err).Warnf("restore: unreadable %s record, or another pod's", intent)
			md = s.recoverPod(ctx, id, true)
		}
		log.G(ctx).Infof("restore: finishing interrupted %s: tearing the pod down", intent)
		return nil, md
	}
	sb, err := sandbox.Load(dir)
	switch {
	case err == nil:
		return sb, nil
	case errdefs.IsNotFound(err) || errdefs.IsDataLoss(err):
		log.G(ctx).Info("restore: finishing a creation without a record: tearing the pod down")
	default:
		s.deps.Metrics.ObserveRestore("pod", err)
		log.G(ctx).WithError(err).Error("restore: the pod's state record cannot be read: tearing the pod down")
	}
	return nil, s.recoverPod(ctx, id, false)
}

// recoverPod is what a pod's directory tells of it when its intent record
// is unreadable (intended) or absent: its state record, else its
// config.json (pins, cgroup parent, ID range), else only its ID. An infra
// bundle means a pause process.
func (s *Server) recoverPod(ctx context.Context, id string, intended bool) *sandbox.Metadata {
	dir := s.sandboxDir(id)
	var md *sandbox.Metadata
	if sb, err := sandbox.Load(dir); err == nil {
		md = &sb.Metadata
	} else if md, err = sandbox.MetadataFromSpec(dir); err != nil {
		md = &sandbox.Metadata{ID: id, Modes: sandbox.NamespaceModes{
			Network: sandbox.ModeNode, IPC: sandbox.ModeNode, User: sandbox.ModeNode,
		}}
		// With no record at all, the creation was killed before its
		// intent, which precedes every side effect: there is no IP to
		// DEL, and a DEL would need a network config the node may not
		// have yet (host-network pods run before the CNI is installed).
		if intended || !errdefs.IsNotFound(err) {
			log.G(ctx).WithError(err).Error("restore: the pod's config.json cannot be read either: " +
				"tearing down every namespace a pod can have; its ID range is unknown and not held")
			md.Modes = sandbox.NamespaceModes{Network: sandbox.ModePod, IPC: sandbox.ModePod, User: sandbox.ModePod}
		}
	}
	if _, err := os.Stat(infraBundle(dir)); err == nil && md.InfraID == "" {
		md.InfraID = id
	}
	return md
}

// holdIDRange reserves the ID range of a pod to tear down: until its
// teardown succeeds, its pins, pause process or containers may still use
// it, and the next pod must not get it.
func (s *Server) holdIDRange(ctx context.Context, md *sandbox.Metadata) {
	if len(md.UIDMappings) == 0 && len(md.GIDMappings) == 0 {
		return
	}
	if err := s.deps.IDs.Restore(md.ID, md.UIDMappings, md.GIDMappings); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", md.ID).Error("restore: the ID range of a pod to tear down not recorded")
	}
}

func (s *Server) restorePod(ctx context.Context, sb *sandbox.Sandbox) error {
	id := sb.ID
	if st := sb.Status(); st.State == sandbox.StateReady {
		reason := ""
		if st.NetworkTornDown {
			// The disk must never claim more than is true: a pod whose
			// IPs were released is not Ready, whatever else it says.
			reason = "the pod's network was torn down"
		} else if _, err := s.deps.Namespaces.Open(ctx, id, pinnedKinds(sb)); err != nil {
			reason = err.Error()
		}
		if reason != "" {
			log.G(ctx).WithField("sandbox", id).Warnf("restore: sandbox is NotReady: %s", reason)
			if uerr := s.spare(ctx, func() error {
				return sb.UpdateStatus(func(st *sandbox.Status) {
					st.State, st.Reason = sandbox.StateNotReady, reason
				})
			}); uerr != nil {
				return uerr
			}
		}
	}
	// Reserved last: a pod that fails above is torn down, holding no name.
	if err := s.podNames.Reserve(sandbox.NameKey(sb.Name, sb.Namespace, sb.UID, sb.Attempt), sb.ID); err != nil {
		return err
	}
	// Allocated and caller-chosen ranges alike: a caller's range left out
	// could be handed to the next pod.
	if len(sb.UIDMappings) > 0 || len(sb.GIDMappings) > 0 {
		if err := s.deps.IDs.Restore(sb.ID, sb.UIDMappings, sb.GIDMappings); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", id).Warn("restore: ID range not recorded")
		}
	}
	s.sandboxes.Add(id, sb)
	s.notePodOOMBase(ctx, sb)
	return nil
}

// restoreContainers loads every container from disk after the pods, and
// tears down those that were half-made, half-removed, cannot be loaded or
// restored, or belong to a pod that is gone or being torn down. Each is
// handled on its own. A container whose teardown fails stays on disk
// (strayContainers), and holds its pod back from its teardown or removal.
func (s *Server) restoreContainers(ctx context.Context, doomedPods []*sandbox.Metadata) {
	dirs, err := os.ReadDir(filepath.Join(s.cfg.Root, "containers"))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.G(ctx).WithError(err).Error("restore: listing containers")
		}
		return
	}
	doomed := map[string]bool{}
	for _, md := range doomedPods {
		doomed[md.ID] = true
	}
	for _, d := range dirs {
		id := d.Name()
		if err := sandbox.ValidateID(id); err != nil {
			log.G(ctx).WithError(err).WithField("container", id).Error("restore: skipping container")
			continue
		}
		c, md, why := s.loadContainer(id, doomed)
		if c != nil {
			err := s.restoreContainer(ctx, c)
			s.deps.Metrics.ObserveRestore("container", err)
			if err == nil {
				continue
			}
			md, why = &c.ContainerMetadata, "it cannot be restored: "+err.Error()
		}
		log.G(ctx).WithField("container", id).Infof("restore: %s: tearing the container down", why)
		if err := s.teardownContainer(ctx, md); err != nil {
			log.G(ctx).WithError(err).WithFields(log.Fields{"container": id, "sandbox": md.SandboxID}).
				Error("restore: container teardown failed: its pod is neither torn down nor removed until it succeeds")
		}
	}
}

// loadContainer returns the container id to restore, or the metadata of
// one to tear down and why.
func (s *Server) loadContainer(id string, doomedPods map[string]bool) (*sandbox.Container, *sandbox.ContainerMetadata, string) {
	dir := s.containerDir(id)
	sandbox.RemoveCrashTemps(dir)
	md := &sandbox.ContainerMetadata{}
	if intent, err := sandbox.ReadIntent(dir, md); intent != "" {
		if err != nil || md.ID != id {
			md = recoverContainer(dir, id)
		}
		return nil, md, "interrupted " + string(intent)
	}
	c, err := sandbox.LoadContainer(dir)
	switch {
	case errdefs.IsNotFound(err) || errdefs.IsDataLoss(err):
		return nil, recoverContainer(dir, id), "no state record"
	case err != nil:
		s.deps.Metrics.ObserveRestore("container", err)
		return nil, recoverContainer(dir, id), "unreadable state record (" + err.Error() + ")"
	case doomedPods[c.SandboxID]:
		return nil, &c.ContainerMetadata, "its pod is being torn down"
	}
	if _, err := s.sandboxes.Get(c.SandboxID); err != nil {
		return nil, &c.ContainerMetadata, "its pod is gone"
	}
	return c, nil, ""
}

// recoverContainer is what a container's directory tells of it when its
// intent or state record is unreadable: its state record, else the pod
// its config.json names. The runtime handler is then unknown, and
// teardownContainer asks every runtime; conmon.pid and the spec's
// cgroupsPath, which it also uses, are read from the directory.
func recoverContainer(dir, id string) *sandbox.ContainerMetadata {
	if c, err := sandbox.LoadContainer(dir); err == nil {
		return &c.ContainerMetadata
	}
	md := &sandbox.ContainerMetadata{ID: id}
	if spec := bundleSpec(dir); spec != nil && sandbox.ValidateID(spec.Annotations[annSandboxID]) == nil {
		md.SandboxID = spec.Annotations[annSandboxID]
	}
	return md
}

func (s *Server) restoreContainer(ctx context.Context, c *sandbox.Container) error {
	id := c.ID
	sb, err := s.sandboxes.Get(c.SandboxID)
	if err != nil {
		return fmt.Errorf("its sandbox: %w", err)
	}
	if err := s.ctrNames.Reserve(sandbox.ContainerNameKey(c.SandboxID, c.Name, c.Attempt), c.ID); err != nil {
		return err
	}
	// Mounting again is a no-op for a mounted rootfs and rebuilds the
	// image store's bookkeeping of which pod uses which idmapped tree.
	if sb.Status().State == sandbox.StateReady {
		if _, err := s.deps.Images.MountRootfs(ctx, s.mountRequest(sb, c.ID, c.ImageID, c.Dir)); err != nil {
			log.G(ctx).WithError(err).WithField("container", id).Warn("restore: rootfs not mounted")
		}
		if _, err := s.mountImageVolumes(ctx, sb, &c.ContainerMetadata, c.Dir); err != nil {
			log.G(ctx).WithError(err).WithField("container", id).Warn("restore: image volumes not mounted")
		}
	}
	s.adoptExitFile(c)
	s.resetPending(ctx, c)
	s.finishUpdate(ctx, c)
	s.refreshContainer(ctx, c, false)
	s.containers.Add(c.ID, c)
	s.watchExit(ctx, c)
	s.watchMonitor(ctx, c)
	if c.Status().State == sandbox.ContainerCreated {
		s.settleIfCreating(ctx, c)
	}
	return nil
}

// resetPending undoes the runtime create of a container whose start a
// crash cut short before its pid was recorded: conmon may still be
// running `runc create`, and whatever it made is torn down. The
// container never ran; it stays created, and a StartContainer creates it
// in the runtime again.
func (s *Server) resetPending(ctx context.Context, c *sandbox.Container) {
	if !c.Status().RuntimePending {
		return
	}
	if _, _, recorded := monitorPid(c.Dir, c.ID); recorded {
		rt, err := s.runtimeFor(c.Handler)
		if err != nil {
			return
		}
		if c.Restored && s.awaitCheckpointRestore(ctx, rt, c) {
			return
		}
		if err := rt.Reset(ctx, c.ID); err != nil {
			log.G(ctx).WithError(err).WithField("container", c.ID).Warn("restore: undoing an interrupted runtime create")
			return
		}
	}
	// As in teardownContainer: a create killed before runc recorded its
	// state leaves a cgroup runc does not know of. It is removed even
	// when no monitor is recorded any more: a start killed between the
	// Reset above, which drops that record, and this removal left the
	// cgroup to the next one (the chaos test's killed restarts found it).
	if cg := specCgroupsPath(c.Dir); cg != "" {
		if err := killCgroup(ctx, cg); err != nil {
			log.G(ctx).WithError(err).WithField("container", c.ID).Warn("restore: removing the cgroup of an interrupted runtime create")
		}
	}
}

// checkpointRestoreWait bounds the wait for a checkpoint's restore a
// crash cut short: CRIU is never killed in the middle of one (it leaves
// its mounts and half a process tree), it is waited for.
const checkpointRestoreWait = 30 * time.Second

// awaitCheckpointRestore waits for the restore of c's checkpoint that a
// crash cut short (rt.WaitRestore): a container the runtime ends up
// running under that start's conmon is adopted as started (true); a
// restore that failed, or outlasts the wait, is left to Reset.
func (s *Server) awaitCheckpointRestore(ctx context.Context, rt ContainerRuntime, c *sandbox.Container) bool {
	pid, ok := rt.WaitRestore(ctx, c.ID, checkpointRestoreWait)
	if !ok {
		return false
	}
	if err := c.UpdateStatus(func(cs *sandbox.ContainerStatus) {
		cs.State, cs.Pid, cs.RuntimePending, cs.StartedAt = sandbox.ContainerRunning, pid, false, time.Now()
	}); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("restore: saving a restored container's state")
		return false
	}
	s.checkpointRestored(ctx, c)
	log.G(ctx).WithField("container", c.ID).WithField("pid", pid).Info("restore: adopted a container restored from a checkpoint")
	return true
}

// finishUpdate completes an UpdateContainerResources a crash cut short
// between the cgroup and config.json, before ContainerStatus reports the
// limits from config.json again.
func (s *Server) finishUpdate(ctx context.Context, c *sandbox.Container) {
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return
	}
	if err := rt.FinishUpdate(ctx, c.ID); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("restore: finishing an interrupted resources update")
	}
}

// settleTimeout bounds the re-check of a container that restore found in
// the runtime's "creating" state.
const settleTimeout = 30 * time.Second

// settleIfCreating re-examines, in the background, a container whose
// `runtime create` was still running when restore looked, until the
// runtime's state settles: a single look would record whatever the
// runtime said at that instant and never look again.
func (s *Server) settleIfCreating(ctx context.Context, c *sandbox.Container) {
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return
	}
	if st, err := rt.State(ctx, c.ID); err != nil || st.Status != oci.StatusCreating {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				log.G(ctx).WithField("container", c.ID).Warnf("restore: the runtime still creates the container after %s", settleTimeout)
				return
			case <-tick.C:
			}
			if st, err := rt.State(ctx, c.ID); err != nil || st.Status != oci.StatusCreating {
				s.refreshContainer(ctx, c, false)
				return
			}
		}
	}()
}

// finishStops finishes the stops a crash interrupted. StopPodSandbox
// records NotReady before its first step and the stop's time after its
// last, so a pod NotReady without a stop time still has (some of) its
// containers, network, pins and shm: it is stopped now, before the
// socket opens, so kubelet never sees a NotReady pod that still holds
// its IP. The stops run a few at a time; one that fails leaves its pod
// NotReady for kubelet's next StopPodSandbox, as any failed stop does.
func (s *Server) finishStops(ctx context.Context) {
	var pending []*sandbox.Sandbox
	for _, sb := range s.sandboxes.List() {
		if st := sb.Status(); st.State == sandbox.StateNotReady && st.StoppedAt.IsZero() {
			pending = append(pending, sb)
		}
	}
	if len(pending) == 0 {
		return
	}
	start := time.Now()
	sem := make(chan struct{}, restoreStopParallel)
	var wg sync.WaitGroup
	for _, sb := range pending {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			sctx, cancel := context.WithTimeout(ctx, restoreTimeout)
			defer cancel()
			sctx = log.WithLogger(sctx, log.G(sctx).WithField("sandbox", sb.ID))
			if err := s.stopPod(sctx, sb); err != nil {
				log.G(sctx).WithError(err).Warn("restore: finishing an interrupted stop failed; the pod stays NotReady")
			}
		}()
	}
	wg.Wait()
	log.G(ctx).Infof("restore: finished %d interrupted pod stops in %s", len(pending), time.Since(start).Round(time.Millisecond))
}

// restoreStopParallel bounds the interrupted stops finished at once.
const restoreStopParallel = 8

// teardownPods tears down the pods restore set aside, but not one with a
// container restore could not tear down: that container may still run in
// the pod's namespaces and ID range, so the pod keeps them (and its range
// stays held) for the next start to try again.
func (s *Server) teardownPods(ctx context.Context, pods []*sandbox.Metadata) {
	var strays map[string][]*sandbox.ContainerMetadata
	if len(pods) > 0 {
		strays = s.strayContainers()
	}
	for _, md := range pods {
		if left := strays[md.ID]; len(left) > 0 {
			log.G(ctx).WithFields(log.Fields{"sandbox": md.ID, "containers": len(left), "container": left[0].ID}).
				Error("restore: pod teardown deferred to the next start: some of its containers could not be torn down")
			continue
		}
		if err := s.teardownPod(ctx, md); err != nil {
			log.G(ctx).WithError(err).WithField("sandbox", md.ID).Error("restore: pod teardown")
		}
	}
}

// teardownPod removes everything a pod may have had, knowing only its
// recorded intent: every step is idempotent and runs even when an earlier
// one failed, so what can go, goes. The directory, and with it the intent
// record, is removed only when all the rest succeeded, and the ID range
// released only then: a failure is retried at the next start.
func (s *Server) teardownPod(ctx context.Context, md *sandbox.Metadata) error {
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	ctx = log.WithLogger(ctx, log.G(ctx).WithField("sandbox", md.ID))
	var errs []error
	if md.Modes.PID == sandbox.ModePod || md.InfraID != "" {
		errs = append(errs, s.teardownInfra(ctx, md))
	}
	if md.Modes.Network == sandbox.ModePod && !networkTornDown(s.sandboxDir(md.ID)) {
		pod := cniPod(md)
		// Open checks the pins as a set (a userns pod's net namespace must
		// be owned by its pinned user namespace), so it is asked for all
		// the pod's kinds; a pod pinned only in part is torn down without
		// its netns, as the CNI spec allows.
		pod.NetNS = ""
		if pins, err := s.deps.Namespaces.Open(ctx, md.ID, podKinds(md.Modes)); err == nil {
			pod.NetNS = pins[nsmgr.Net]
		}
		if err := s.deps.Network.Teardown(ctx, pod); err != nil {
			errs = append(errs, fmt.Errorf("tearing down the pod network: %w", err))
		}
	}
	if err := s.deps.Namespaces.Remove(ctx, md.ID); err != nil {
		errs = append(errs, fmt.Errorf("removing pod namespaces: %w", err))
	}
	if err := s.deps.Shm.Unmount(filepath.Join(s.sandboxRunDir(md.ID), "shm")); err != nil {
		errs = append(errs, err)
	}
	if err := s.deps.Images.ReleasePod(ctx, md.ID); err != nil {
		errs = append(errs, fmt.Errorf("releasing the pod's image mounts: %w", err))
	}
	if err := s.deps.CgroupDriver.RemovePod(ctx, md.CgroupParent, md.ID); err != nil {
		errs = append(errs, fmt.Errorf("removing the pod's cgroup: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := errors.Join(os.RemoveAll(s.sandboxRunDir(md.ID)), sandbox.RemoveDir(s.sandboxDir(md.ID))); err != nil {
		return err
	}
	s.deps.IDs.Release(md.ID)
	return nil
}

// networkTornDown reports whether the pod in dir recorded its CNI DEL
// done: a removal killed after its stop has nothing left to DEL, and no
// cache entry to DEL from.
func networkTornDown(dir string) bool {
	sb, err := sandbox.Load(dir)
	return err == nil && sb.Status().NetworkTornDown
}

// teardownInfra removes a pod's pause process. Its handler is unknown for
// a pod torn down from what its directory holds: every runtime is asked,
// as teardownContainer does, and one that does not know it is no error.
func (s *Server) teardownInfra(ctx context.Context, md *sandbox.Metadata) error {
	var errs []error
	for _, h := range s.handlersOf(md.Handler) {
		m := *md
		m.Handler = h
		if err := s.removeInfra(ctx, &m); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// handlersOf is the runtime handlers an object recorded with handler may
// be in: that one, or every runtime when none is recorded.
func (s *Server) handlersOf(handler string) []string {
	if handler != "" {
		return []string{handler}
	}
	var handlers []string
	for h, rt := range s.deps.Runtimes {
		if rt != nil {
			handlers = append(handlers, h)
		}
	}
	slices.Sort(handlers)
	return handlers
}

// teardownContainer removes everything a container may have had: its
// monitor and processes, the runtime's container, its mounts and its
// directory. Like teardownPod, it leaves the directory for the next start
// when a step fails.
func (s *Server) teardownContainer(ctx context.Context, md *sandbox.ContainerMetadata) error {
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	dir := s.containerDir(md.ID)
	var errs []error
	// A conmon caught before it reported the pid still runs `runtime
	// create`; it and its children are killed before the runtime deletes
	// the container, or runc init could be left behind.
	killMonitor(dir, md.ID)
	for _, h := range s.handlersOf(md.Handler) {
		if rt, err := s.runtimeFor(h); err == nil {
			if err := rt.Delete(ctx, md.ID, true); err != nil && !errdefs.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("deleting container %s: %w", md.ID, err))
			}
		}
	}
	if err := s.deps.Images.UnmountRootfs(ctx, md.ID, md.SandboxID, dir); err != nil {
		errs = append(errs, fmt.Errorf("unmounting the rootfs of %s: %w", md.ID, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// runc init makes the container's cgroup before runc records its
	// state; a create killed in between leaves a cgroup that runc delete
	// does not know of.
	if cg := specCgroupsPath(dir); cg != "" {
		if err := killCgroup(ctx, cg); err != nil {
			return err
		}
	}
	return sandbox.RemoveDir(dir)
}

// cgroupRoot is where the cgroup hierarchies are mounted.
var cgroupRoot = cgroups.DefaultRoot

// cgroupDrainTimeout bounds the wait for killed processes to leave a
// container's cgroup.
const cgroupDrainTimeout = 10 * time.Second

// killCgroup SIGKILLs every process left in a container's cgroup (a runc
// init orphaned by its killed conmon is one) and removes the cgroup from
// every hierarchy once the kernel lets go of it.
func killCgroup(ctx context.Context, rel string) error {
	if c := path.Clean("/" + rel); c == "/" || strings.Contains(rel, ":") {
		// The root holds every process of the host, and a systemd
		// "slice:prefix:name" path is not a directory: kill nothing.
		return nil
	}
	dirs := []string{filepath.Join(cgroupRoot, rel)}
	entries, _ := os.ReadDir(cgroupRoot)
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(cgroupRoot, e.Name(), rel))
		}
	}
	deadline := time.Now().Add(cgroupDrainTimeout)
	for _, d := range dirs {
		for {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("removing cgroup %s: %w", d, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// bundleSpec is a bundle's config.json, or nil (none yet, or unreadable).
func bundleSpec(bundle string) *specs.Spec {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil
	}
	var spec specs.Spec
	if json.Unmarshal(b, &spec) != nil {
		return nil
	}
	return &spec
}

// specCgroupsPath is the cgroupfs path of a bundle's config.json, or ""
// (no spec yet, or a systemd slice, which systemd removes itself).
func specCgroupsPath(bundle string) string {
	spec := bundleSpec(bundle)
	if spec == nil || spec.Linux == nil {
		return ""
	}
	p := spec.Linux.CgroupsPath
	if !path.IsAbs(p) || strings.Contains(p, ":") || strings.Contains(p, "..") {
		return ""
	}
	return p
}

// monitorPid is the pid of a container's conmon if it is still alive:
// recorded in the bundle's conmon.pid, and the process with that pid
// names the container on its command line (a recycled pid does not).
// ok is false when no monitor was recorded (the runtime fakes have none).
func monitorPid(dir, id string) (pid int, alive, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, "conmon.pid"))
	if err != nil {
		return 0, false, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false, false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return pid, false, true
	}
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		if arg == id {
			return pid, true, true
		}
	}
	return pid, false, true
}

// killMonitor SIGKILLs a container's conmon and its process group, which
// holds `runtime create` and its init while the create is in flight.
func killMonitor(dir, id string) {
	pid, alive, _ := monitorPid(dir, id)
	if !alive {
		return
	}
	// conmon calls setsid: its pid is its process group.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// monitorGone handles a live container whose conmon is dead: nothing will
// ever write its exit file, so its processes are killed and it is
// recorded Exited with reason MonitorGone, and told (the caller holds
// LockEvents). It reports whether the monitor was gone; an exit another
// path recorded meanwhile stays, and is not told twice.
func (s *Server) monitorGone(ctx context.Context, rt ContainerRuntime, c *sandbox.Container) (bool, *oci.State, error) {
	if _, alive, recorded := monitorPid(c.Dir, c.ID); !recorded || alive {
		return false, nil, nil
	}
	// A container that just exited: conmon reaps it, writes the exit file
	// and exits, so a runtime state read before conmon was found dead can
	// still say running. Asked again now, the runtime says stopped, and
	// the caller goes on with that answer.
	if rs, err := rt.State(ctx, c.ID); err != nil || rs.Status == oci.StatusStopped {
		return false, rs, err
	}
	log.G(ctx).WithField("container", c.ID).Warn("the container's monitor (conmon) is gone; killing the container")
	if err := rt.Kill(ctx, c.ID, syscall.SIGKILL, true); err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("killing a container without its monitor")
	}
	exited := false
	if err := s.spare(ctx, func() error {
		return c.UpdateStatus(func(st *sandbox.ContainerStatus) {
			if exited = st.State != sandbox.ContainerExited; !exited {
				return
			}
			st.State, st.ExitCode, st.Reason = sandbox.ContainerExited, -1, reasonMonitorGone
			st.Message = "conmon died: the exit code is unknown"
			if st.FinishedAt.IsZero() {
				st.FinishedAt = time.Now()
			}
		})
	}); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("saving container state")
	} else if exited {
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	}
	return true, nil, nil
}
