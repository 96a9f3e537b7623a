package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cni"
	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// lookupForRemoval finds id for a Stop or Remove RPC. api.proto says
// stopping or removing something that does not exist (or no longer does)
// must succeed, so an unknown ID reports gone rather than NotFound:
// kubelet retries a removal whose answer it lost, and the object is gone
// by then. An ID that could never name anything (empty, or not in ID
// syntax) is still InvalidArgument: that is a caller bug, not a retry.
func lookupForRemoval[T any](store *sandbox.Store[T], id string) (v T, gone bool, err error) {
	if err := validate.ID("", id); err != nil {
		return v, false, err
	}
	v, err = store.Get(id)
	if errdefs.IsNotFound(err) {
		return v, true, nil
	}
	return v, false, err
}

// validName checks a pod or container name, namespace or uid against the
// one shared rule.
func validName(what, v string) error { return validate.Name(what, v) }

// lockReadyPod finds a pod and takes its lifecycle lock for a
// CreateContainer. Under the lock, the pod must still be in the store and
// Ready: a StopPodSandbox or RemovePodSandbox that got the lock first has
// stopped or removed it, and a container created after that would outlive
// its pod, holding its rootfs mount and its cgroup directories. The caller
// holds the lock until the container is recorded, so a Stop or Remove that
// comes later sees it and cleans it up.
func (s *Server) lockReadyPod(id string) (*sandbox.Sandbox, func(), error) {
	sb, err := s.sandboxes.Get(id)
	if err != nil {
		return nil, nil, err
	}
	unlock := sb.Lock()
	if cur, err := s.sandboxes.Get(sb.ID); err != nil || cur != sb {
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s was removed: %w", sb.ID, errdefs.ErrNotFound)
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

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

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

func (s *Server) sandboxDir(id string) string { return filepath.Join(s.cfg.Root, "sandboxes", id) }

func (s *Server) sandboxRunDir(id string) string {
	return filepath.Join(s.cfg.RunRoot, "sandboxes", id)
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
	p.PortMappings = slices.Clone(md.PortMappings)
	if b := md.Bandwidth; b != nil {
		bw := *b
		p.Bandwidth = &bw
	}
	return p
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

// ContainerRuntime is one OCI runtime handler (package oci, *oci.Runtime).
type ContainerRuntime interface {
	Create(ctx context.Context, o oci.CreateOptions) (int, error)
	Start(ctx context.Context, id string) error
	Kill(ctx context.Context, id string, sig syscall.Signal, all bool) error
	Stop(ctx context.Context, id string, sig syscall.Signal, timeout time.Duration) error
	Delete(ctx context.Context, id string, force bool) error
	State(ctx context.Context, id string) (*oci.State, error)
	// ExitState is the state of a container whose exit conmon recorded,
	// without a runtime call; ok is false while it has not exited.
	ExitState(id string) (st *oci.State, ok bool)
	ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int32, error)
	Update(ctx context.Context, id string, res *specs.LinuxResources) error
	ReopenLog(ctx context.Context, id string) error
	Features(ctx context.Context) (*oci.Features, error)
	CheckIDMap(ctx context.Context) error
	// Probe fails when the runtime cannot run the containers pinrt makes.
	Probe(ctx context.Context) error
}

var _ ContainerRuntime = (*oci.Runtime)(nil)

// podContainers lists a pod's containers.
func (s *Server) podContainers(id string) []*sandbox.Container {
	var out []*sandbox.Container
	for _, c := range s.containers.List() {
		if c.SandboxID == id {
			out = append(out, c)
		}
	}
	return out
}

// containersByPod lists every container once, by sandbox ID, for the
// RPCs that report all pods with their containers: podContainers per pod
// would list and sort the whole store once per pod.
func (s *Server) containersByPod() map[string][]*sandbox.Container {
	out := map[string][]*sandbox.Container{}
	for _, c := range s.containers.List() {
		out[c.SandboxID] = append(out[c.SandboxID], c)
	}
	return out
}

func (s *Server) containerDir(id string) string { return filepath.Join(s.cfg.Root, "containers", id) }

// runtimeFor is the runtime of a handler. A configured handler whose
// binary was missing at start has no runtime.
func (s *Server) runtimeFor(handler string) (ContainerRuntime, error) {
	if rt, ok := s.deps.Runtimes[handler]; ok && rt != nil {
		return rt, nil
	}
	if _, ok := s.cfg.Runtime.Runtimes[handler]; ok {
		return nil, fmt.Errorf("runtime handler %q is configured but its binary was not found at start: %w", handler, errdefs.ErrFailedPrecondition)
	}
	return nil, fmt.Errorf("unknown runtime handler %q: %w", handler, errdefs.ErrInvalidArgument)
}

var errGone = errors.New("container is gone from the runtime")

// observeContainer is the read path's view of a container: the recorded
// status, kept current by the operations themselves and by the exit
// watcher, with no process started and no runtime call while nothing
// happened. Only a transition the watcher may not have handled yet sends
// it to refreshContainer: conmon's exit file is there (the container died
// and the watcher's event is still queued), or, with monitor set, conmon
// is gone (nothing will ever write the exit file: MonitorGone). Without
// inotify every read refreshes, as before the watcher existed.
//
// monitor costs two small file reads; ListContainers, which kubelet calls
// every second for every container, leaves it to ContainerStatus.
func (s *Server) observeContainer(ctx context.Context, c *sandbox.Container, monitor bool) {
	st := c.Status()
	if st.State == sandbox.ContainerExited {
		return
	}
	if !s.exits.active.Load() {
		s.refreshContainer(ctx, c, false)
		return
	}
	if _, err := os.Stat(filepath.Join(c.Dir, c.ID)); err == nil {
		s.refreshContainer(ctx, c, false)
		return
	}
	if !monitor {
		return
	}
	if _, alive, recorded := monitorPid(c.Dir, c.ID); recorded && !alive {
		s.refreshContainer(ctx, c, false)
	}
}

// refreshContainer brings the recorded status in line with the runtime
// and conmon's exit file. cheap skips the runtime call for a running
// container whose exit file is not there yet: conmon writes it when the
// container dies, so ListContainers need not exec runc for every
// container on every kubelet relist.
func (s *Server) refreshContainer(ctx context.Context, c *sandbox.Container, cheap bool) {
	st := c.Status()
	if st.State == sandbox.ContainerExited {
		return
	}
	if cheap && st.State == sandbox.ContainerRunning {
		if _, err := os.Stat(filepath.Join(c.Dir, c.ID)); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return
	}
	// An exit conmon recorded needs no runtime call.
	rs, recorded := rt.ExitState(c.ID)
	if !recorded {
		rs, err = rt.State(ctx, c.ID)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("refreshing container state")
		return
	}
	if err == nil && rs.Status != oci.StatusStopped {
		gone, fresh, ferr := s.monitorGone(ctx, rt, c)
		if gone {
			s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
			return
		}
		if fresh != nil || ferr != nil {
			rs, err = fresh, ferr
			if err != nil && !errdefs.IsNotFound(err) {
				log.G(ctx).WithError(err).WithField("container", c.ID).Warn("refreshing container state")
				return
			}
		}
	}
	if err == nil && rs.Status == oci.StatusStopped && !rs.OOMKilled && rs.ExitCode == sigkillExit && s.exitWasOOMKill(ctx, c) {
		oom := *rs
		oom.OOMKilled = true
		rs = &oom
	}
	exited := false
	if err := c.UpdateStatus(func(st *sandbox.ContainerStatus) {
		was := st.State
		applyState(st, rs, err)
		exited = was != sandbox.ContainerExited && st.State == sandbox.ContainerExited
	}); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("saving container state")
	} else if exited {
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	}
}

// applyState folds the runtime's view into st. A container the runtime no
// longer knows (after a reboot) is exited with an unknown code.
func applyState(st *sandbox.ContainerStatus, rs *oci.State, err error) {
	if err != nil {
		st.State, st.ExitCode, st.Reason, st.Message = sandbox.ContainerExited, -1, reasonError, errGone.Error()
		if st.FinishedAt.IsZero() {
			st.FinishedAt = time.Now()
		}
		return
	}
	switch rs.Status {
	case oci.StatusCreated, oci.StatusCreating:
		// runc start's success already made the container running; runc
		// state can still say created for a few tens of milliseconds
		// after it, and the state never goes back.
		if st.State != sandbox.ContainerRunning {
			st.State = sandbox.ContainerCreated
		}
		st.Pid = rs.Pid
	case oci.StatusRunning, oci.StatusPaused:
		st.State, st.Pid = sandbox.ContainerRunning, rs.Pid
	case oci.StatusStopped:
		st.State, st.ExitCode, st.FinishedAt = sandbox.ContainerExited, rs.ExitCode, rs.FinishedAt
		if st.FinishedAt.IsZero() {
			st.FinishedAt = time.Now()
		}
		switch {
		case rs.OOMKilled:
			st.Reason = reasonOOMKilled
		case rs.ExitCode == 0:
			st.Reason = reasonCompleted
		default:
			st.Reason = reasonError
		}
		if rs.ExitCode == -1 {
			st.Message = "conmon recorded no exit code"
		}
	}
}
