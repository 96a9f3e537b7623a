package nsmgr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/limitbuf"
	"github.com/pinrt/pinrt/nsmgr/nshelper"
)

// cloneFlag is the clone(2) flag, and the NS_GET_NSTYPE answer, per kind.
var cloneFlag = map[Kind]uintptr{
	User: unix.CLONE_NEWUSER,
	Net:  unix.CLONE_NEWNET,
	IPC:  unix.CLONE_NEWIPC,
	UTS:  unix.CLONE_NEWUTS,
}

// Manager creates, reopens and removes the pinned namespaces of pods.
// It keeps no state in memory: everything it knows is the pins on disk,
// so a fresh Manager after a restart sees exactly what the old one made.
type Manager struct {
	runDir       string
	helperPath   string
	helperFile   *os.File // helperPath opened, nil for /proc/self/exe
	readyTimeout time.Duration

	// failAt names a step of Create that fails on purpose. Only the
	// package's own tests set it, to prove each rollback path.
	failAt string
}

// NewManager pins under runDir/ns/<kind>/<id>. helperPath "" means
// /proc/self/exe, which requires the binary to call HelperMain. Another
// helperPath (pinrt-nshelper) is opened here and later exec'd through
// that descriptor: the helper is exec'd after it has become the pod's
// mapped root, an unprivileged host ID that could not search a private
// directory on the way to the file, and the descriptor also keeps the
// binary that was checked here even if the file is replaced later.
func NewManager(runDir, helperPath string) (*Manager, error) {
	if !filepath.IsAbs(runDir) {
		return nil, fmt.Errorf("namespace run directory %q must be an absolute path: %w", runDir, errdefs.ErrInvalidArgument)
	}
	m := &Manager{runDir: filepath.Clean(runDir), helperPath: helperPath, readyTimeout: 10 * time.Second}
	if helperPath == "" {
		m.helperPath = "/proc/self/exe"
		return m, nil
	}
	f, err := os.Open(helperPath)
	if err != nil {
		return nil, fmt.Errorf("namespace helper: %w", err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o001 == 0 {
		f.Close()
		return nil, fmt.Errorf("namespace helper %s must be a regular file executable by all (the pod's mapped root runs it): %w",
			helperPath, errdefs.ErrFailedPrecondition)
	}
	m.helperFile = f
	return m, nil
}

// HelperPath is the helper binary the Manager starts.
func (m *Manager) HelperPath() string { return m.helperPath }

// Path returns the pin path of kind for sandbox id. It does not validate:
// callers pass IDs that Create or ValidateID already accepted.
func (m *Manager) Path(kind Kind, id string) string { return pinPath(m.runDir, kind, id) }

var errInjected = errors.New("injected failure")

func (m *Manager) fail(step string) error {
	if m.failAt == step {
		return fmt.Errorf("step %s: %w", step, errInjected)
	}
	return nil
}

// Create makes the requested namespaces, in one clone of the helper when
// there is a user namespace, else on a thread (see the package doc),
// applies the sysctls inside them and pins them. On failure everything
// done so far is undone: no pin file, mount, helper process or thread in
// the namespaces is left.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ Pins, retErr error) {
	kinds, err := m.validateCreate(req)
	if err != nil {
		return nil, err
	}
	pins := Pins{}
	if len(kinds) == 0 {
		return pins, nil // all host namespaces: nothing to create
	}
	logger := log.G(ctx).WithField("sandbox", req.ID)
	start := time.Now()

	// undo is a LIFO list of the steps done so far, run on failure.
	var undo []func()
	defer func() {
		if retErr == nil {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		logger.WithError(retErr).Debug("namespace creation rolled back")
	}()

	for _, k := range allKinds {
		if kinds[k] {
			if err := os.MkdirAll(filepath.Join(m.runDir, "ns", string(k)), 0o700); err != nil {
				return nil, fmt.Errorf("create pin directory: %w", err)
			}
		}
	}
	if err := m.fail("mkdir"); err != nil {
		return nil, err
	}

	h, err := m.start(ctx, req, kinds)
	if err != nil {
		return nil, err
	}
	undo = append(undo, h.stop)
	if err := m.fail("start"); err != nil {
		return nil, err
	}
	if err := h.waitReady(ctx, m.readyTimeout); err != nil {
		return nil, err
	}
	if err := m.fail("ready"); err != nil {
		return nil, err
	}
	nsDir := h.nsDir()

	for _, k := range allKinds {
		if !kinds[k] {
			continue
		}
		p := m.Path(k, req.ID)
		// O_EXCL: a pin that already exists belongs to another sandbox
		// (or a leftover); never mount over it.
		f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL|syscall.O_CLOEXEC, 0o400)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("%s namespace pin %s already exists: %w", k, p, errdefs.ErrAlreadyExists)
			}
			return nil, fmt.Errorf("create %s namespace pin: %w", k, err)
		}
		f.Close()
		undo = append(undo, func() { _ = os.Remove(p) })
		if err := m.fail("file:" + string(k)); err != nil {
			return nil, err
		}
		src := nsDir + string(k)
		if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("pin %s namespace: bind-mount %s on %s: %w", k, src, p, err)
		}
		undo = append(undo, func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
		if err := m.fail("mount:" + string(k)); err != nil {
			return nil, err
		}
		pins[k] = p
	}
	// The pins hold the namespaces now; the helper or thread has done
	// its job.
	h.stop()
	logger.WithFields(log.Fields{"kinds": req.Kinds, "phase": "namespaces", "duration_ms": sinceMs(start)}).
		Debug("pod namespaces pinned")
	return pins, nil
}

func (m *Manager) validateCreate(req CreateRequest) (map[Kind]bool, error) {
	if err := ValidateID(req.ID); err != nil {
		return nil, err
	}
	kinds, err := kindSet(req.Kinds)
	if err != nil {
		return nil, err
	}
	if kinds[User] {
		if err := checkRootMapped("uid", req.UIDMappings); err != nil {
			return nil, err
		}
		if err := checkRootMapped("gid", req.GIDMappings); err != nil {
			return nil, err
		}
	} else if len(req.UIDMappings) > 0 || len(req.GIDMappings) > 0 {
		return nil, fmt.Errorf("ID mappings given but no user namespace requested: %w", errdefs.ErrInvalidArgument)
	}
	if err := ValidateSysctls(req.Sysctls, kinds[Net], kinds[IPC]); err != nil {
		return nil, err
	}
	if h := req.Hostname; h != "" {
		if !kinds[UTS] {
			return nil, fmt.Errorf("hostname %q given but no UTS namespace requested: %w", h, errdefs.ErrInvalidArgument)
		}
		if len(h) > 64 || strings.ContainsAny(h, "=/ \t\n\x00") {
			return nil, fmt.Errorf("hostname %q: at most 64 characters, no '=', '/' or white space: %w", h, errdefs.ErrInvalidArgument)
		}
	}
	return kinds, nil
}

// checkRootMapped requires container ID 0 to be mapped: the helper
// becomes root in the new user namespace so that it may write the pod's
// sysctls, which the kernel lets only the namespace owner's root change.
func checkRootMapped(what string, ms []specs.LinuxIDMapping) error {
	for _, mp := range ms {
		if mp.Size == 0 {
			return fmt.Errorf("%s mapping %+v has size 0: %w", what, mp, errdefs.ErrInvalidArgument)
		}
		if mp.ContainerID == 0 {
			return nil
		}
	}
	return fmt.Errorf("user namespace needs a %s mapping for container ID 0: %w", what, errdefs.ErrInvalidArgument)
}

// holder is what sits in a pod's new namespaces until they are pinned:
// the helper process, or an OS thread of the daemon when there is no user
// namespace to create.
type holder interface {
	waitReady(ctx context.Context, timeout time.Duration) error
	// nsDir is the /proc directory of the holder's namespaces, with a
	// trailing slash.
	nsDir() string
	// stop lets the namespaces go (the pins keep them). Idempotent.
	stop()
}

var (
	_ holder = (*helper)(nil)
	_ holder = (*nsThread)(nil)
)

func (m *Manager) start(ctx context.Context, req CreateRequest, kinds map[Kind]bool) (holder, error) {
	args := setupArgs(req, kinds)
	if !kinds[User] {
		return startThread(ctx, kinds, args)
	}
	return m.startHelper(req, kinds, args)
}

// setupArgs are the arguments of nshelper.Setup for req.
func setupArgs(req CreateRequest, kinds map[Kind]bool) []string {
	var args []string
	if kinds[Net] {
		args = append(args, loArg)
	}
	if req.Hostname != "" {
		args = append(args, hostnameArg+req.Hostname)
	}
	names := make([]string, 0, len(req.Sysctls))
	for n := range req.Sysctls {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		args = append(args, sysctlPath(NormalizeSysctl(n))+"="+req.Sysctls[n])
	}
	return args
}

// nsThread is an OS thread of the daemon that unshared a pod's net, IPC
// and UTS namespaces, which needs no process of its own: a thread may
// unshare those (not a user namespace, which the kernel refuses to a
// process with threads). Its goroutine is locked to it and never unlocks,
// so no other goroutine ever runs in the pod's namespaces, and when the
// goroutine returns the Go runtime ends the thread, releasing them.
type nsThread struct {
	tid  int
	done chan struct{}
	once sync.Once
	gone chan struct{}
}

func startThread(ctx context.Context, kinds map[Kind]bool, args []string) (*nsThread, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create pod namespaces: %w", err)
	}
	var flags int
	for k := range kinds {
		flags |= int(cloneFlag[k])
	}
	t := &nsThread{done: make(chan struct{}), gone: make(chan struct{})}
	ready := make(chan error, 1)
	go t.run(flags, args, ready)
	if err := <-ready; err != nil {
		<-t.gone
		return nil, err
	}
	return t, nil
}

// run is the thread's goroutine: it unshares, prepares the namespaces,
// reports on ready and holds them until stop.
func (t *nsThread) run(flags int, args []string, ready chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The runtime cannot end the main thread when its locked
		// goroutine returns: it parks it for good, which would keep the
		// pod's namespaces alive. Hold the main thread, so that the
		// work lands on another.
		done := make(chan struct{})
		go func() {
			defer close(done)
			t.run(flags, args, ready)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	defer close(t.gone)
	if err := unix.Unshare(flags); err != nil {
		ready <- fmt.Errorf("create pod namespaces: unshare: %w", err)
		return
	}
	t.tid = unix.Gettid()
	if err := nshelper.Setup(args); err != nil {
		var class error = errdefs.ErrUnknown
		if nshelper.Invalid(err) {
			class = errdefs.ErrInvalidArgument
		}
		ready <- fmt.Errorf("pod namespaces: %w: %w", err, class)
		return
	}
	ready <- nil
	<-t.done
}

func (t *nsThread) waitReady(context.Context, time.Duration) error { return nil }

func (t *nsThread) nsDir() string {
	return "/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(t.tid) + "/ns/"
}

func (t *nsThread) stop() {
	t.once.Do(func() { close(t.done) })
	<-t.gone
}

// helper is a running helper process that created a pod's user namespace
// and the namespaces it owns (see nshelper's userNSMain).
type helper struct {
	cmd    *exec.Cmd
	status *os.File        // read end: the helper's "ok <pid>" or error
	hold   *os.File        // write end of its stdin: EOF tells it to exit
	stderr limitbuf.Buffer // the first 4 KiB of its stderr
	pid    int             // of the process in the namespaces
	once   sync.Once
}

// startHelper starts the helper with no clone flags, on Go's cheap vfork
// path; the helper makes the namespaces itself (nshelper.UserNSArg).
func (m *Manager) startHelper(req CreateRequest, kinds map[Kind]bool, setup []string) (*helper, error) {
	var others []string
	for _, k := range allKinds[1:] {
		if kinds[k] {
			others = append(others, string(k))
		}
	}
	// No Pdeathsig: it fires when the forking *thread* exits, which a
	// caller's locked OS thread may do while the helper is still needed.
	// The helper instead exits when its stdin (our hold pipe) hits EOF,
	// which also happens when the daemon dies.
	args := append([]string{m.helperPath, HelperCommand,
		nshelper.UserNSArg + strings.Join(others, ","),
		nshelper.UIDMapArg + nshelper.FormatIDMap(toSysProcIDMap(req.UIDMappings)),
		nshelper.GIDMapArg + nshelper.FormatIDMap(toSysProcIDMap(req.GIDMappings)),
	}, setup...)

	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("namespace helper status pipe: %w", err)
	}
	holdR, holdW, err := os.Pipe()
	if err != nil {
		statusR.Close()
		statusW.Close()
		return nil, fmt.Errorf("namespace helper stdin pipe: %w", err)
	}
	h := &helper{status: statusR, hold: holdW, stderr: limitbuf.Buffer{Max: 4096}}
	h.cmd = &exec.Cmd{
		Path:       m.helperPath,
		Args:       args,
		Env:        []string{},
		Stdin:      holdR,
		Stderr:     &h.stderr,
		ExtraFiles: []*os.File{statusW},
	}
	if m.helperFile != nil {
		// fd 4 in the child, exec'd by its /proc path like fexecve(3).
		h.cmd.ExtraFiles = append(h.cmd.ExtraFiles, m.helperFile)
		h.cmd.Path = "/proc/self/fd/4"
	}
	err = h.cmd.Start()
	// The child has its own copies now.
	statusW.Close()
	holdR.Close()
	if err != nil {
		statusR.Close()
		holdW.Close()
		return nil, fmt.Errorf("start namespace helper %s: %w", m.helperPath, err)
	}
	return h, nil
}

func (h *helper) nsDir() string { return "/proc/" + strconv.Itoa(h.pid) + "/ns/" }

// waitReady reads the helper's report: "ok", or "invalid <msg>" for a
// sysctl the kernel refused, or "error <msg>".
func (h *helper) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = h.status.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = h.status.SetReadDeadline(time.Now()) })
	defer stop()

	buf := make([]byte, 4096)
	n, err := h.status.Read(buf)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("wait for namespace helper: %w", ctx.Err())
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("namespace helper not ready after %s: %w", timeout, context.DeadlineExceeded)
		}
		// EOF: it died before reporting. Reap it to read its stderr.
		h.stop()
		return fmt.Errorf("namespace helper exited before reporting (%v): %s: %w",
			h.cmd.ProcessState, strings.TrimSpace(h.stderr.String()), errdefs.ErrUnknown)
	}
	msg := strings.TrimSpace(string(buf[:n]))
	verb, rest, _ := strings.Cut(msg, " ")
	switch verb {
	case "ok":
		pid, err := strconv.Atoi(rest)
		if err != nil || pid <= 0 {
			return fmt.Errorf("namespace helper: bad report %q: %w", msg, errdefs.ErrUnknown)
		}
		h.pid = pid
		return nil
	case "invalid":
		return fmt.Errorf("namespace helper: %s: %w", rest, errdefs.ErrInvalidArgument)
	default:
		return fmt.Errorf("namespace helper: %s: %w", msg, errdefs.ErrUnknown)
	}
}

// helperExitWait bounds how long stop waits for the helper to exit on its
// own before killing it.
const helperExitWait = time.Second

// stop ends and reaps the helper. It is idempotent. EOF on its stdin
// makes the process in the namespaces exit and the helper reap it and
// exit, so nothing is left for init to reap; a helper that does not, a
// stuck one or one that never started the clone, is killed (the clone
// dies with it: Pdeathsig).
func (h *helper) stop() {
	h.once.Do(func() {
		h.hold.Close()
		kill := time.AfterFunc(helperExitWait, func() { _ = h.cmd.Process.Kill() })
		_ = h.cmd.Wait()
		kill.Stop()
		h.status.Close()
	})
}

func toSysProcIDMap(ms []specs.LinuxIDMapping) []syscall.SysProcIDMap {
	out := make([]syscall.SysProcIDMap, len(ms))
	for i, mp := range ms {
		out[i] = syscall.SysProcIDMap{ContainerID: int(mp.ContainerID), HostID: int(mp.HostID), Size: int(mp.Size)}
	}
	return out
}

// Remove unpins every namespace of sandbox id. It is idempotent: missing
// pins, pins that are files but no longer mounts, and repeated calls are
// all fine.
func (m *Manager) Remove(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	start := time.Now()
	var errs []error
	for i := len(allKinds) - 1; i >= 0; i-- {
		if err := unpin(m.Path(allKinds[i], id)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": id, "phase": "unpin", "duration_ms": sinceMs(start)}).
		Debug("pod namespaces unpinned")
	return nil
}

// sinceMs is the time since start in milliseconds, the unit of the
// duration_ms field that pinrt-bench reads from the debug log.
func sinceMs(start time.Time) float64 {
	return float64(time.Since(start).Microseconds()) / 1000
}

func unpin(p string) error {
	// MNT_DETACH: a CNI plugin or runtime may still hold the file open.
	// Loop because someone may have stacked a second bind mount on it;
	// EINVAL means no mount is left, ENOENT that the file is gone.
	for range 8 {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if err == unix.EINVAL || err == unix.ENOENT {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount namespace pin %s: %w", p, err)
		}
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove namespace pin %s: %w", p, err)
	}
	return nil
}

// Open checks that the pins of kinds for sandbox id are still live
// namespaces of the right type, and that net, IPC and UTS are owned by
// the pinned user namespace (or by the daemon's own one when User is not
// among kinds). A missing or closed pin is errdefs.ErrNotFound; a pin of
// the wrong type or owner is errdefs.ErrFailedPrecondition.
func (m *Manager) Open(ctx context.Context, id string, kinds []Kind) (Pins, error) {
	if err := ValidateID(id); err != nil {
		return nil, err
	}
	set, err := kindSet(kinds)
	if err != nil {
		return nil, err
	}
	pins := Pins{}
	var owner unix.Stat_t
	ownerName := "the daemon's user namespace"
	if set[User] {
		p := m.Path(User, id)
		fd, err := openPin(id, User, p)
		if err != nil {
			return nil, err
		}
		err = unix.Fstat(fd, &owner)
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("stat user namespace pin %s: %w", p, err)
		}
		pins[User] = p
		ownerName = "the pinned user namespace"
	} else if err := unix.Stat("/proc/self/ns/user", &owner); err != nil {
		return nil, fmt.Errorf("stat own user namespace: %w", err)
	}

	for _, k := range allKinds[1:] {
		if !set[k] {
			continue
		}
		p := m.Path(k, id)
		if err := checkOwner(id, k, p, owner, ownerName); err != nil {
			return nil, err
		}
		pins[k] = p
	}
	log.G(ctx).WithField("sandbox", id).Debug("pod namespaces reopened")
	return pins, nil
}

func checkOwner(id string, k Kind, p string, owner unix.Stat_t, ownerName string) error {
	fd, err := openPin(id, k, p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ufd, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err != nil {
		return fmt.Errorf("%s namespace of sandbox %q: get owning user namespace: %w", k, id, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(ufd, &st)
	unix.Close(ufd)
	if err != nil {
		return fmt.Errorf("%s namespace of sandbox %q: stat owning user namespace: %w", k, id, err)
	}
	if st.Dev != owner.Dev || st.Ino != owner.Ino {
		return fmt.Errorf("%s namespace of sandbox %q is owned by user namespace %d, not by %s (%d): %w",
			k, id, st.Ino, ownerName, owner.Ino, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// openPin opens a pin and checks that it is still an nsfs mount of the
// expected namespace type. The caller closes the returned fd.
func openPin(id string, k Kind, p string) (int, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT {
			return -1, fmt.Errorf("%s namespace of sandbox %q: pin %s is missing: %w", k, id, p, errdefs.ErrNotFound)
		}
		return -1, fmt.Errorf("%s namespace of sandbox %q: open pin %s: %w", k, id, p, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("%s namespace of sandbox %q: statfs pin %s: %w", k, id, p, err)
	}
	if sfs.Type != unix.NSFS_MAGIC {
		unix.Close(fd)
		return -1, fmt.Errorf("%s namespace of sandbox %q is closed: %s is no longer an nsfs mount: %w",
			k, id, p, errdefs.ErrNotFound)
	}
	typ, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("%s namespace of sandbox %q: get namespace type of %s: %w", k, id, p, err)
	}
	if uintptr(typ) != cloneFlag[k] {
		unix.Close(fd)
		return -1, fmt.Errorf("%s namespace of sandbox %q: pin %s holds a namespace of another type (%#x): %w",
			k, id, p, typ, errdefs.ErrFailedPrecondition)
	}
	return fd, nil
}
