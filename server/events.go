package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/sandbox"
)

// subscriberBuffer is how many events a subscriber may lag behind before
// it is dropped. kubelet's Evented PLEG reads at once and relists when its
// stream breaks, so dropping a stuck reader loses nothing for good, while
// waiting for it would stall every container operation.
const subscriberBuffer = 256

// refreshTimeout bounds the runtime call that follows a noticed exit.
const refreshTimeout = 30 * time.Second

// eventBus fans container events out to every GetContainerEvents stream.
// publish never blocks.
type eventBus struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
}

type subscriber struct {
	ch chan *runtimeapi.ContainerEventResponse
	// dropped is closed when the subscriber fell too far behind, or the
	// bus closed; err, set before, says which (nil: the bus closed).
	dropped chan struct{}
	err     error
}

func newEventBus() *eventBus { return &eventBus{subs: map[*subscriber]struct{}{}} }

func (b *eventBus) subscribe() *subscriber {
	sub := &subscriber{ch: make(chan *runtimeapi.ContainerEventResponse, subscriberBuffer), dropped: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(sub.dropped)
		return sub
	}
	b.subs[sub] = struct{}{}
	return sub
}

func (b *eventBus) unsubscribe(sub *subscriber) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[sub]; ok {
		delete(b.subs, sub)
		close(sub.dropped)
	}
}

// publish queues ev for every subscriber and drops those whose queue is
// full. It holds the lock only for non-blocking sends.
func (b *eventBus) publish(ev *runtimeapi.ContainerEventResponse) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for sub := range b.subs {
		select {
		case sub.ch <- ev:
		default:
			delete(b.subs, sub)
			sub.err = fmt.Errorf("event subscriber fell %d events behind and was dropped: %w", subscriberBuffer, errdefs.ErrResourceExhausted)
			close(sub.dropped)
		}
	}
}

// close ends every stream cleanly; later subscribers end at once. The
// daemon calls it before draining calls, since a stream kubelet keeps
// open would otherwise hold the graceful stop for its whole timeout.
func (b *eventBus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for sub := range b.subs {
		delete(b.subs, sub)
		close(sub.dropped)
	}
}

// GetContainerEvents streams container lifecycle events until the client
// goes away. A subscriber that does not keep up gets ResourceExhausted and
// is expected to relist and subscribe again.
func (s *Server) GetContainerEvents(req *runtimeapi.GetEventsRequest, stream runtimeapi.RuntimeService_GetContainerEventsServer) error {
	sub := s.events.subscribe()
	defer s.events.unsubscribe(sub)
	ctx := stream.Context()
	for {
		// Drain what is queued before honouring a drop, so a subscriber
		// sees every event up to the point it fell behind.
		select {
		case ev := <-sub.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
			continue
		default:
		}
		select {
		case ev := <-sub.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-sub.dropped:
			// Written before dropped was closed; nil when the daemon ends
			// the stream on shutdown.
			return sub.err
		case <-ctx.Done():
			return nil
		}
	}
}

// containerEvent logs a container's lifecycle step at info and publishes
// it to the event subscribers, with the pod's status and the statuses of
// its containers as CRI wants them. It is the one call the lifecycle paths
// make.
func (s *Server) containerEvent(ctx context.Context, c *sandbox.Container, typ runtimeapi.ContainerEventType) {
	entry := log.G(ctx).WithFields(s.containerFields(c))
	switch typ {
	case runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT:
		entry.Info("container created")
		s.watchExit(ctx, c)
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		entry.Info("container started")
		s.watchMonitor(ctx, c)
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		st := c.Status()
		entry.WithFields(log.Fields{"exitCode": st.ExitCode, "reason": st.Reason}).Info("container exited")
		// Plugins hear of every exit, stopped or not, as in containerd.
		s.nriStopped(ctx, c)
		s.reapLater(ctx, c)
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		entry.Info("container removed")
		s.unwatchExit(c)
		s.unwatchMonitor(c.ID)
	}
	ev := &runtimeapi.ContainerEventResponse{ContainerId: c.ID, ContainerEventType: typ, CreatedAt: time.Now().UnixNano()}
	if sb, err := s.sandboxes.Get(c.SandboxID); err == nil {
		ev.PodSandboxStatus = podStatus(sb)
	}
	for _, pc := range s.podContainers(c.SandboxID) {
		ev.ContainersStatuses = append(ev.ContainersStatuses, containerStatus(pc))
	}
	// A deleted container is no longer in the store; kubelet still wants
	// its last status.
	if typ == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		ev.ContainersStatuses = append(ev.ContainersStatuses, containerStatus(c))
	}
	s.events.publish(ev)
}

// containerFields names a container for operators: the pod as
// namespace/name, the container name and the short ID.
func (s *Server) containerFields(c *sandbox.Container) log.Fields {
	f := log.Fields{"container": c.Name, "id": shortID(c.ID)}
	if sb, err := s.sandboxes.Get(c.SandboxID); err == nil {
		f["pod"] = sb.Namespace + "/" + sb.Name
	}
	return f
}

// podEvent logs a pod's lifecycle step at info.
func podEvent(ctx context.Context, sb *sandbox.Sandbox, what string) {
	log.G(ctx).WithFields(log.Fields{"pod": sb.Namespace + "/" + sb.Name, "id": shortID(sb.ID)}).Info("pod " + what)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// exitWatcher notices container exits as conmon records them: conmon
// writes <exit dir>/<id> when the container dies (through a temporary
// file and a rename), and inotify on the exit directory reports that
// within milliseconds, where polling would cost a stat per container per
// tick and still lag.
//
// The exit directory is one for all containers, on the run root (tmpfs),
// as in CRI-O: conmon's write of an exit cannot fail there when the
// containers have filled the root's disk, which is when kubelet evicts
// them and waits for their exits. Containers created before it moved
// there keep their exit files in their own directories, which are
// watched too once restored.
type exitWatcher struct {
	once sync.Once
	w    *fsnotify.Watcher
	err  error
	// active is set once the watcher runs: the read path may then trust
	// the recorded states (see observeContainer).
	active atomic.Bool
	// unwatched holds the IDs of containers whose directory could not be
	// watched: their exits are looked for on every read.
	unwatched sync.Map
	// own maps the IDs of restored containers that keep their exit file
	// in their own directory to that file.
	own sync.Map
}

// exitFile is the path of c's exit file.
func (s *Server) exitFile(c *sandbox.Container) string {
	if p, ok := s.exits.own.Load(c.ID); ok {
		return p.(string)
	}
	return filepath.Join(s.exitDir(), c.ID)
}

// watched says whether c's exits reach the watcher, so that a list may
// take its recorded state as it is.
func (s *Server) watched(c *sandbox.Container) bool {
	if !s.exits.active.Load() {
		return false
	}
	_, un := s.exits.unwatched.Load(c.ID)
	return !un
}

// background is the context of work that outlives the request that
// started it: not cancelled with it, and with the logger without that
// request's fields, so its lines are not attributed to an unrelated call.
func background(ctx context.Context, component string) context.Context {
	return log.WithLogger(context.Background(), logrus.NewEntry(log.G(ctx).Logger).WithField("component", component))
}

// exitDir is where conmon writes every container's exit file.
func (s *Server) exitDir() string { return filepath.Join(s.cfg.RunRoot, "exits") }

func (s *Server) exitWatch(ctx context.Context) *fsnotify.Watcher {
	s.exits.once.Do(func() {
		w, err := fsnotify.NewWatcher()
		if err == nil {
			if err = os.MkdirAll(s.exitDir(), 0o700); err == nil {
				err = w.Add(s.exitDir())
			}
			if err != nil {
				_ = w.Close()
			}
		}
		if err != nil {
			s.exits.err = err
			log.G(ctx).WithError(err).Warn("no inotify: container exits are noticed on the next status call only")
			return
		}
		s.exits.w = w
		go s.exitLoop(background(ctx, "exit-watcher"), s.exits.w)
		s.exits.active.Store(true)
	})
	return s.exits.w
}

// adoptExitFile notes where a restored container's conmon writes its
// exit file: in its own directory for one created before the exit files
// moved to the run root (see exitWatcher).
func (s *Server) adoptExitFile(c *sandbox.Container) {
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return
	}
	if p := rt.ExitFile(c.ID); p == filepath.Join(c.Dir, c.ID) {
		s.exits.own.Store(c.ID, p)
	}
}

// watchExit starts watching c's exit file. A container whose exit file
// appeared before the watch was in place is refreshed at once; the others
// cost no runtime call.
func (s *Server) watchExit(ctx context.Context, c *sandbox.Container) {
	w := s.exitWatch(ctx)
	if w == nil {
		return
	}
	if _, own := s.exits.own.Load(c.ID); own {
		if err := w.Add(c.Dir); err != nil {
			log.G(ctx).WithError(err).WithField("container", c.ID).Warn("watching for the container's exit")
			s.exits.unwatched.Store(c.ID, struct{}{})
			return
		}
	}
	if _, err := os.Stat(s.exitFile(c)); err == nil {
		s.refreshContainer(ctx, c, false)
	}
}

// unwatchExit forgets c, removed, and its exit file: a conmon that wrote
// it after the runtime's delete would leave it behind.
func (s *Server) unwatchExit(c *sandbox.Container) {
	s.exits.unwatched.Delete(c.ID)
	_ = os.Remove(filepath.Join(s.exitDir(), c.ID))
	if _, own := s.exits.own.LoadAndDelete(c.ID); own && s.exits.w != nil {
		_ = s.exits.w.Remove(c.Dir) // gone with the directory already
	}
}

// pruneExits removes the exit files of containers and infra processes
// the server does not know: those whose conmon wrote them after the
// removal, just before a crash. It runs once restored, before serving.
func (s *Server) pruneExits(ctx context.Context) {
	entries, err := os.ReadDir(s.exitDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		id := e.Name()
		if strings.Contains(id, ".") {
			continue // the temporary file of a conmon writing now
		}
		if _, err := s.containers.Get(id); err == nil {
			continue
		}
		if sb, err := s.sandboxes.Get(id); err == nil {
			s.infraExited(ctx, sb) // it died while the daemon was down
			continue
		}
		if err := os.Remove(filepath.Join(s.exitDir(), id)); err != nil {
			log.G(ctx).WithError(err).Warn("removing a stale exit file")
		}
	}
}

// infraExited marks a shared-PID pod NotReady once its pause process has
// exited (a container's `kill 1`, an OOM kill): the kernel ended every
// process of the pod's PID namespace with it, and no container can join
// that namespace again. kubelet then stops the pod and makes a new one,
// as it does when containerd's or CRI-O's pause container dies.
func (s *Server) infraExited(ctx context.Context, sb *sandbox.Sandbox) {
	if sb.InfraID == "" || sb.Status().State != sandbox.StateReady {
		return
	}
	if _, err := os.Stat(filepath.Join(s.exitDir(), sb.InfraID)); err != nil {
		return
	}
	const reason = "the pod's pause process exited"
	log.G(ctx).WithField("sandbox", sb.ID).Warnf("sandbox is NotReady: %s", reason)
	if err := s.spare(ctx, func() error {
		return sb.UpdateStatus(func(st *sandbox.Status) {
			if st.State == sandbox.StateReady {
				st.State, st.Reason = sandbox.StateNotReady, reason
			}
		})
	}); err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sb.ID).Warn("saving the sandbox's state")
	}
}

func (s *Server) exitLoop(ctx context.Context, w *fsnotify.Watcher) {
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Op&(fsnotify.Create|fsnotify.Write|fsnotify.Rename) == 0 {
				continue
			}
			id, dir := filepath.Base(ev.Name), filepath.Dir(ev.Name)
			if dir != s.exitDir() && filepath.Base(dir) != id {
				continue // not an exit file: a temp file, the pidfile of a restored container
			}
			if c, err := s.containers.Get(id); err == nil && c.ID == id {
				// A hung runtime must not stop the loop for good.
				rctx, cancel := context.WithTimeout(ctx, refreshTimeout)
				s.refreshContainer(rctx, c, false)
				cancel()
			} else if sb, err := s.sandboxes.Get(id); err == nil && sb.ID == id {
				s.infraExited(ctx, sb)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost: look at every container once.
				rctx, cancel := context.WithTimeout(ctx, refreshTimeout)
				for _, c := range s.containers.List() {
					s.refreshContainer(rctx, c, true)
				}
				cancel()
				for _, sb := range s.sandboxes.List() {
					s.infraExited(ctx, sb)
				}
				continue
			}
			log.G(ctx).WithError(err).Warn("exit watcher")
		}
	}
}
