package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
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

func labelsMatch(labels, selector map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// timeoutSeconds is a CRI timeout in seconds as a duration. A negative one is
// none (0), and one too long for a Duration is the longest there is,
// halved so that a bound added to it cannot wrap into the past.
func timeoutSeconds(s int64) time.Duration {
	const longest = int64(math.MaxInt64/time.Second) / 2
	return time.Duration(min(max(s, 0), longest)) * time.Second
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// cleanupTimeout bounds a rollback or teardown; it runs on a fresh
// context so a cancelled request still undoes what it did.
const cleanupTimeout = 2 * time.Minute

// cleanups is a LIFO list of undo steps, each with a description for the
// log when it fails.
type cleanups []cleanup

type cleanup struct {
	what string
	fn   func(context.Context) error
	// ifClean: run only when every step run before succeeded.
	ifClean bool
}

func (c *cleanups) add(what string, fn func(context.Context) error) {
	*c = append(*c, cleanup{what: what, fn: fn})
}

// addIfClean adds a step that runs only when every step run before it
// (added after it) succeeded: removing an intent record, or releasing an
// ID range, while a pin, an IP or a process the failed step left still
// exists would leave them to nothing. Kept, the record is torn down by
// the next start, as any interrupted creation is.
func (c *cleanups) addIfClean(what string, fn func(context.Context) error) {
	*c = append(*c, cleanup{what: what, fn: fn, ifClean: true})
}

// run undoes everything in reverse order on a fresh, bounded context.
func (c cleanups) run(ctx context.Context) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	failed := false
	for i := len(c) - 1; i >= 0; i-- {
		if c[i].ifClean && failed {
			log.G(ctx).Warnf("rollback: %s: skipped, an undo step failed; left for the next start's teardown", c[i].what)
			continue
		}
		if err := c[i].fn(cctx); err != nil {
			log.G(ctx).WithError(err).Warnf("rollback: %s", c[i].what)
			failed = true
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

func (s *Server) containerDir(id string) string { return filepath.Join(s.cfg.Root, "containers", id) }

// strayContainers maps each pod to the containers on disk that name it
// but are not in the store: those restore could not tear down (or a
// CreateContainer's, before it reaches the store; it holds the pod's
// lock). Such a container may still run in its pod's namespaces and ID
// range, so the pod is neither torn down nor stopped while one is left.
// One whose pod nothing on disk names is listed under "".
func (s *Server) strayContainers() map[string][]*sandbox.ContainerMetadata {
	dirs, _ := os.ReadDir(filepath.Join(s.cfg.Root, "containers"))
	strays := map[string][]*sandbox.ContainerMetadata{}
	for _, d := range dirs {
		id := d.Name()
		if sandbox.ValidateID(id) != nil {
			continue
		}
		if c, err := s.containers.Get(id); err == nil && c.ID == id {
			continue
		}
		dir := s.containerDir(id)
		md := &sandbox.ContainerMetadata{}
		if intent, err := sandbox.ReadIntent(dir, md); intent == "" || err != nil || md.ID != id {
			md = recoverContainer(dir, id)
		}
		strays[md.SandboxID] = append(strays[md.SandboxID], md)
	}
	return strays
}

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

// lockPod finds a pod and takes its lifecycle lock. Under the lock, the
// pod must still be in the store: a RemovePodSandbox that got the lock
// first has removed it.
func (s *Server) lockPod(id string) (*sandbox.Sandbox, func(), error) {
	sb, err := s.sandboxes.Get(id)
	if err != nil {
		return nil, nil, err
	}
	unlock := sb.Lock()
	if cur, err := s.sandboxes.Get(sb.ID); err != nil || cur != sb {
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s was removed: %w", sb.ID, errdefs.ErrNotFound)
	}
	return sb, unlock, nil
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
// A monitor watched through its pidfd (monitors.go) costs nothing here;
// for another, monitor costs two small file reads, which ListContainers,
// called by kubelet every second for every container, leaves to
// ContainerStatus.
func (s *Server) observeContainer(ctx context.Context, c *sandbox.Container, monitor bool) {
	st := c.Status()
	if st.State == sandbox.ContainerExited {
		return
	}
	if !s.exits.active.Load() {
		s.refreshContainer(ctx, c, false)
		return
	}
	if _, err := os.Stat(s.exitFile(c)); err == nil {
		s.refreshContainer(ctx, c, false)
		return
	}
	// A watched monitor's death is noticed as it happens (monitors.go).
	if !monitor || s.monitorWatched(c.ID) {
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
	// A start being recorded looks at the exit itself once it is
	// (startContainer); it holds c, so this is a reader or a watcher.
	if _, starting := s.starting.Load(c.ID); starting {
		return
	}
	// A container only prepared is not in the runtime, which would call
	// it gone; unless conmon was started for it (a start a crash cut
	// short), there is nothing to look at.
	if st.RuntimePending {
		if _, _, recorded := monitorPid(c.Dir, c.ID); !recorded {
			return
		}
	}
	if cheap && st.State == sandbox.ContainerRunning {
		if _, err := os.Stat(s.exitFile(c)); errors.Is(err, os.ErrNotExist) {
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
	// An exit is recorded and told under LockEvents: this may be the exit
	// watcher, and a stop or removal that sees the exit waits for its
	// events before it goes on with its own (stopLocked).
	if err == nil && rs.Status != oci.StatusStopped {
		unlockEvents := c.LockEvents()
		gone, fresh, ferr := s.monitorGone(ctx, rt, c)
		unlockEvents()
		if gone {
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
	unlockEvents := c.LockEvents()
	defer unlockEvents()
	if err := s.spare(ctx, func() error {
		return c.UpdateStatus(func(st *sandbox.ContainerStatus) {
			was := st.State
			applyState(st, rs, err)
			exited = was != sandbox.ContainerExited && st.State == sandbox.ContainerExited
		})
	}); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("saving container state")
	} else if exited {
		s.containerEvent(ctx, c, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	}
}

// applyState folds the runtime's view into st. A container the runtime no
// longer knows (after a reboot) is exited with an unknown code.
//
// An exit is final: a status another path recorded Exited while the
// runtime was being asked (a stop, the exit watcher) keeps its exit, and
// does not go back to running on the older answer.
func applyState(st *sandbox.ContainerStatus, rs *oci.State, err error) {
	if st.State == sandbox.ContainerExited {
		return
	}
	// Whatever the runtime says of it, the container is past its
	// creation there (or gone).
	st.RuntimePending = false
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

// idMappings converts CRI user or group ID mappings to OCI ones.
func idMappings(in []*runtimeapi.IDMapping) []specs.LinuxIDMapping {
	var out []specs.LinuxIDMapping
	for _, m := range in {
		out = append(out, specs.LinuxIDMapping{ContainerID: m.ContainerId, HostID: m.HostId, Size: m.Length})
	}
	return out
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
