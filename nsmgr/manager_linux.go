package nsmgr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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
	"github.com/pinrt/pinrt/internal/osthread"
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
	unsharePath  string // util-linux unshare(1)
	catPath      string // what unshare execs to hold the namespaces
	readyTimeout time.Duration

	// failAt names a step of Create that fails on purpose. Only the
	// package's own tests set it, to prove each rollback path.
	failAt string
}

// NewManager pins under runDir/ns/<kind>/<id>. It resolves unshare(1)
// and cat(1) in PATH now, so that a node without them fails when the
// daemon starts rather than at its first pod with a user namespace.
func NewManager(runDir string) (*Manager, error) {
	if !filepath.IsAbs(runDir) {
		return nil, fmt.Errorf("namespace run directory %q must be an absolute path: %w", runDir, errdefs.ErrInvalidArgument)
	}
	m := &Manager{runDir: filepath.Clean(runDir), readyTimeout: 10 * time.Second}
	for _, tool := range []struct {
		name string
		path *string
	}{{"unshare", &m.unsharePath}, {"cat", &m.catPath}} {
		p, err := exec.LookPath(tool.name)
		if err != nil {
			return nil, fmt.Errorf("pod user namespaces need %s (util-linux, coreutils): %w: %w",
				tool.name, err, errdefs.ErrFailedPrecondition)
		}
		*tool.path = p
	}
	return m, nil
}

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

// Create makes the requested namespaces (see the package doc), applies
// the hostname and sysctls inside them and pins them. On failure
// everything done so far is undone: no pin file, mount, process or
// thread in the namespaces is left.
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

	t, err := m.start(ctx, req, kinds)
	if err != nil {
		return nil, err
	}
	undo = append(undo, t.stop)
	if err := m.fail("start"); err != nil {
		return nil, err
	}
	nsDir := t.nsDir

	for _, k := range allKinds {
		if !kinds[k] {
			continue
		}
		p, err := m.pin(k, req.ID, nsDir, &undo)
		if err != nil {
			return nil, err
		}
		pins[k] = p
	}
	// The pins hold the namespaces now; the thread (and the process
	// holding a user namespace) has done its job.
	t.stop()
	logger.WithFields(log.Fields{"kinds": req.Kinds, "phase": "namespaces", "duration_ms": sinceMs(start)}).
		Debug("pod namespaces pinned")
	return pins, nil
}

// pin bind-mounts the namespace of kind k at nsDir+k onto a new pin file
// for sandbox id and returns the pin's path. It appends the removal of
// what it made to undo as it goes.
func (m *Manager) pin(k Kind, id, nsDir string, undo *[]func()) (string, error) {
	p := m.Path(k, id)
	// O_EXCL: a pin that already exists belongs to another sandbox
	// (or a leftover); never mount over it.
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL|syscall.O_CLOEXEC, 0o400)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("%s namespace pin %s already exists: %w", k, p, errdefs.ErrAlreadyExists)
		}
		return "", fmt.Errorf("create %s namespace pin: %w", k, err)
	}
	f.Close()
	*undo = append(*undo, func() { _ = os.Remove(p) })
	if err := m.fail("file:" + string(k)); err != nil {
		return "", err
	}
	src := nsDir + string(k)
	if err := unix.Mount(src, p, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("pin %s namespace: bind-mount %s on %s: %w", k, src, p, err)
	}
	*undo = append(*undo, func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	if err := m.fail("mount:" + string(k)); err != nil {
		return "", err
	}
	return p, nil
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

// checkRootMapped requires container ID 0 to be mapped: a pod's user
// namespace without a root has no one inside who may administer the net,
// IPC and UTS namespaces it owns (the OCI runtime joins it as root).
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

// start makes the pod's namespaces on a new OS thread of the daemon,
// prepares them there and returns once they are ready to pin.
func (m *Manager) start(ctx context.Context, req CreateRequest, kinds map[Kind]bool) (*nsThread, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("create pod namespaces: %w", err)
	}
	enter := unshareThread
	if kinds[User] {
		enter = func(kinds map[Kind]bool) (string, func(), error) { return m.enterUserNS(ctx, req, kinds) }
	}
	t := &nsThread{done: make(chan struct{}), gone: make(chan struct{})}
	ready := make(chan error, 1)
	args := setupArgs(req, kinds)
	osthread.Go(func() { t.run(enter, kinds, args, ready) })
	if err := <-ready; err != nil {
		<-t.gone
		return nil, err
	}
	return t, nil
}

// setupArgs are the arguments of setup for req.
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

// nsThread is an OS thread of the daemon that is in a pod's new net, IPC
// and UTS namespaces: it unshared them itself, or, for a pod with a user
// namespace, joined those of the process that made them. Its goroutine
// is locked to it and never unlocks, so no other goroutine ever runs in
// the pod's namespaces, and when the goroutine returns the Go runtime
// ends the thread, releasing them.
type nsThread struct {
	nsDir string // /proc directory of the namespaces, with a trailing slash
	done  chan struct{}
	once  sync.Once
	gone  chan struct{}
}

// enterFunc puts the calling thread into new namespaces of kinds and
// returns the /proc directory to pin them from, and what to release
// once they are pinned (or on failure).
type enterFunc func(kinds map[Kind]bool) (nsDir string, release func(), err error)

// run is the thread's goroutine: it enters the namespaces, prepares them,
// reports on ready and holds them until stop.
func (t *nsThread) run(enter enterFunc, kinds map[Kind]bool, args []string, ready chan<- error) {
	defer close(t.gone)
	dir, release, err := enter(kinds)
	if err != nil {
		ready <- err
		return
	}
	// After the thread's namespaces are let go, before t.gone.
	defer release()
	if err := setup(args); err != nil {
		var class error = errdefs.ErrUnknown
		if invalidSetup(err) {
			class = errdefs.ErrInvalidArgument
		}
		ready <- fmt.Errorf("pod namespaces: %w: %w", err, class)
		return
	}
	t.nsDir = dir
	ready <- nil
	<-t.done
}

// unshareThread gives the calling thread new namespaces of kinds: a
// thread may unshare net, IPC and UTS namespaces (not a user namespace,
// which the kernel refuses to a process with threads).
func unshareThread(kinds map[Kind]bool) (string, func(), error) {
	var flags int
	for k := range kinds {
		flags |= int(cloneFlag[k])
	}
	if err := unix.Unshare(flags); err != nil {
		return "", nil, fmt.Errorf("create pod namespaces: unshare: %w", err)
	}
	dir := "/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(unix.Gettid()) + "/ns/"
	return dir, func() {}, nil
}

func (t *nsThread) stop() {
	t.once.Do(func() { close(t.done) })
	<-t.gone
}

// holderExitWait bounds how long the process holding a user namespace
// gets to exit on EOF before it is killed.
const holderExitWait = time.Second

// enterUserNS makes the pod's user namespace, and the kinds it owns, in
// a process, and joins the calling thread to the owned ones. A Go
// process cannot create a user namespace in itself (it has threads), and
// a clone with CLONE_NEWUSER cannot take Go's cheap vfork path: it would
// copy the daemon's page tables. So the daemon starts
// `unshare --user --net --ipc --uts -- cat`, which costs about a
// millisecond: unshare(2) with all the flags at once creates the user
// namespace first and the others owned by it, and cat, echoing one byte,
// proves the unshare is done and then holds the namespaces until its
// stdin closes. The daemon, root in the parent user namespace, writes the
// ID maps and may join (setns) namespaces owned by the child one.
//
// The process is started from this thread, which lives until release
// has reaped it: Pdeathsig fires when the forking thread ends, so it
// kills the process only when the daemon dies.
func (m *Manager) enterUserNS(ctx context.Context, req CreateRequest, kinds map[Kind]bool) (_ string, _ func(), retErr error) {
	h, err := m.startHolder(kinds)
	if err != nil {
		return "", nil, err
	}
	defer func() {
		if retErr != nil {
			h.release(true)
		}
	}()

	if err := handshake(ctx, h.inW, h.outR, m.readyTimeout); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) {
			h.release(false)
			return "", nil, fmt.Errorf("unshare exited before it ran cat (%v): %s: %w",
				h.cmd.ProcessState, strings.TrimSpace(h.stderr.String()), errdefs.ErrUnknown)
		}
		return "", nil, err
	}
	if err := m.fail("unshare"); err != nil {
		return "", nil, err
	}
	pid := strconv.Itoa(h.cmd.Process.Pid)
	dir := "/proc/" + pid + "/ns/"
	if err := m.mapAndJoin(req, kinds, pid); err != nil {
		return "", nil, err
	}
	return dir, func() { h.release(false) }, nil
}

// nsHolder is the `unshare --user ... -- cat` process holding a new user
// namespace and the namespaces it owns until release.
type nsHolder struct {
	cmd *exec.Cmd
	// inW is cat's stdin and outR its stdout, for the handshake; closing
	// inW makes cat exit.
	inW, outR *os.File
	stderr    *limitbuf.Buffer
	once      sync.Once
}

// startHolder starts the holder with unshare flags for kinds. On error
// nothing it opened is left open.
func (m *Manager) startHolder(kinds map[Kind]bool) (*nsHolder, error) {
	args := []string{m.unsharePath, "--user"}
	for _, k := range allKinds[1:] {
		if kinds[k] {
			args = append(args, "--"+string(k))
		}
	}
	args = append(args, "--", m.catPath)
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("user namespace holder stdin: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("user namespace holder stdout: %w", err)
	}
	stderr := &limitbuf.Buffer{Max: 4096}
	cmd := &exec.Cmd{
		Path:        m.unsharePath,
		Args:        args,
		Env:         []string{},
		Stdin:       inR,
		Stdout:      outW,
		Stderr:      stderr,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
		// A grandchild holding stderr must not hold the daemon.
		WaitDelay: holderExitWait,
	}
	err = cmd.Start()
	// The child has its own copies now.
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("start %s: %w", m.unsharePath, err)
	}
	return &nsHolder{cmd: cmd, inW: inW, outR: outR, stderr: stderr}, nil
}

// release ends the holder: EOF on stdin makes cat exit; one that does not
// (stuck, or unshare still running) is killed. Only the first call acts.
func (h *nsHolder) release(kill bool) {
	h.once.Do(func() {
		h.inW.Close()
		if kill {
			_ = h.cmd.Process.Kill()
		}
		timer := time.AfterFunc(holderExitWait, func() { _ = h.cmd.Process.Kill() })
		_ = h.cmd.Wait()
		timer.Stop()
		h.outR.Close()
	})
}

// mapAndJoin writes the ID maps of the holder pid's user namespace, then
// joins this thread to the namespaces it owns and makes the thread the
// pod's root in them.
func (m *Manager) mapAndJoin(req CreateRequest, kinds map[Kind]bool, pid string) error {
	for _, mp := range []struct {
		file string
		ms   []specs.LinuxIDMapping
	}{{"uid_map", req.UIDMappings}, {"gid_map", req.GIDMappings}} {
		if err := writeIDMap("/proc/"+pid+"/"+mp.file, mp.ms); err != nil {
			return err
		}
	}
	if err := m.fail("idmap"); err != nil {
		return err
	}
	dir := "/proc/" + pid + "/ns/"
	for _, k := range allKinds[1:] {
		if kinds[k] {
			if err := setns(dir+string(k), k); err != nil {
				return err
			}
		}
	}
	if err := actAsPodRoot(req); err != nil {
		return err
	}
	return m.fail("setns")
}

// actAsPodRoot makes the pod's mapped root the effective user and group
// of the calling thread, keeping its capabilities: the kernel lets only
// the root of the owning user namespace write IPC sysctls (ipc_permissions
// compares the euid, capabilities do not help), while net sysctls, the
// hostname and lo need capabilities over that namespace. Raw syscalls,
// because Go's Setresuid changes every thread of the daemon; the thread
// never runs anything else and ends with its goroutine.
func actAsPodRoot(req CreateRequest) error {
	// Without it, an euid other than 0 clears the effective capabilities.
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0, 0, 0); err != nil {
		return fmt.Errorf("pod namespaces: keep capabilities: %w", err)
	}
	keep := ^uintptr(0) // -1: leave the real and saved IDs at 0
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(rootHostID(req.GIDMappings)), keep); errno != 0 {
		return fmt.Errorf("pod namespaces: act as the pod's root group: %w", errno)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(rootHostID(req.UIDMappings)), keep); errno != 0 {
		return fmt.Errorf("pod namespaces: act as the pod's root: %w", errno)
	}
	return nil
}

// secbitNoSetuidFixup is SECBIT_NO_SETUID_FIXUP of linux/securebits.h.
const secbitNoSetuidFixup = 1 << 2

// rootHostID is the host ID of container ID 0 (checkRootMapped made
// sure there is one).
func rootHostID(ms []specs.LinuxIDMapping) uint32 {
	for _, mp := range ms {
		if mp.ContainerID == 0 {
			return mp.HostID
		}
	}
	return 0
}

// handshake writes a byte to cat's stdin and reads it back: when it
// arrives, cat runs, so unshare(2) is done. io.EOF or EPIPE means the
// process exited first.
func handshake(ctx context.Context, in, out *os.File, timeout time.Duration) error {
	if _, err := in.Write([]byte{'.'}); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = out.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = out.SetReadDeadline(time.Now()) })
	defer stop()
	var b [1]byte
	_, err := out.Read(b[:])
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("create user namespace: %w", ctx.Err())
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("unshare did not run cat within %s: %w", timeout, context.DeadlineExceeded)
	}
	return err
}

// writeIDMap writes a uid_map or gid_map in one write(2), as the kernel
// requires. The writer is root in the parent user namespace, so the
// process's setgroups stays "allow": containers of the pod may call
// setgroups(2), as with the mappings runc writes.
func writeIDMap(file string, ms []specs.LinuxIDMapping) error {
	var b strings.Builder
	for _, mp := range ms {
		fmt.Fprintf(&b, "%d %d %d\n", mp.ContainerID, mp.HostID, mp.Size)
	}
	f, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(b.String())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		var class error = errdefs.ErrUnknown
		if errors.Is(err, syscall.EINVAL) {
			class = errdefs.ErrInvalidArgument // refused by the kernel: overlapping ranges, too many lines
		}
		return fmt.Errorf("write %s %q: %w: %w", filepath.Base(file), b.String(), err, class)
	}
	return nil
}

// setns joins the calling thread to the namespace at p, of kind k.
func setns(p string, k Kind) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("join pod %s namespace: open %s: %w", k, p, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, int(cloneFlag[k])); err != nil {
		return fmt.Errorf("join pod %s namespace: setns %s: %w", k, p, err)
	}
	return nil
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
