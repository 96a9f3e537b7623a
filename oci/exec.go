package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/limitbuf"
)

// maxExecOutput bounds what ExecSync buffers per stream.
const maxExecOutput = 16 << 20

// execDrain bounds how long ExecSync waits for `runc exec` once the
// process it started exited. runc relays the output through pipes of its
// own and exits only when every holder closed them, so a background child
// the command left holding stdout (`sh -c 'sleep 100 & echo hi'`) would
// hold the call until that child exits, forever for a daemon. Past the
// bound such children are killed: runc reports the exit code only once
// they are gone.
const execDrain = time.Second

// execKillWait bounds the wait for `runc exec` to exit after the process it
// started was killed.
const execKillWait = 5 * time.Second

// execStartGrace bounds the start of an exec that has a timeout, on top
// of that timeout, which runs from the command's start (see wait). A
// variable for the tests.
var execStartGrace = 10 * time.Second

// ExecSync runs cmd in the container and collects its output. Past timeout
// (0 = none), counted from the command's start in the container, or
// execStartGrace past it for a command that never started, the exec'd
// process and its children are killed, not just `runc exec`, and the
// error wraps context.DeadlineExceeded; the output written until then is
// returned with it. Once the exec'd process exited,
// output is read for at most execDrain more.
func (r *Runtime) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int32, err error) {
	if err := validateID(id); err != nil {
		return nil, nil, -1, err
	}
	if len(cmd) == 0 {
		return nil, nil, -1, fmt.Errorf("exec: empty command: %w", errdefs.ErrInvalidArgument)
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return nil, nil, -1, err
	}
	pidDir, err := os.MkdirTemp(rec.Bundle, "exec-")
	if err != nil {
		return nil, nil, -1, err
	}
	defer os.RemoveAll(pidDir)

	run, err := r.startExec(ctx, id, cmd, pidDir)
	if err != nil {
		return nil, nil, -1, err
	}
	defer run.outR.Close()
	defer run.errR.Close()
	out := readExecOutput(run.outR, run.errR)

	done := make(chan error, 1)
	go func() { done <- run.c.Wait() }()
	// The pid file appears while the process runs; learn its identity
	// then, so a later kill can tell it from a process that reused the
	// PID, and learn when it exits.
	stopWatch := make(chan struct{})
	mainStarted, mainExited := make(chan struct{}), make(chan struct{})
	go run.ex.watch(stopWatch, mainStarted, mainExited)
	defer close(stopWatch)

	err, killedBy := run.wait(ctx, id, cmd, timeout, done, mainStarted, mainExited)
	if killedBy != nil {
		// runc exec only relays signals; killing it would orphan the
		// process inside the container, so kill the process it started
		// and everything that process started.
		run.ex.killAll(ctx)
		_ = run.ex.waitRunc(ctx, run.c, done) // The wait error adds nothing to killedBy.
		run.ex.killAll(ctx)
		out.drain(ctx, id, cmd)
		return out.out.Bytes(), out.err.Bytes(), -1, killedBy
	}
	out.drain(ctx, id, cmd)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.out.Bytes(), out.err.Bytes(), int32(ee.ExitCode()), nil
		}
		return nil, nil, -1, fmt.Errorf("exec in %s: %w", id, err)
	}
	return out.out.Bytes(), out.err.Bytes(), 0, nil
}

// execRun is one started `runc exec`.
type execRun struct {
	c  *exec.Cmd
	ex *execProcs
	// outR and errR are the read ends of the command's stdout and
	// stderr; the caller closes them.
	outR, errR *os.File
}

// startExec starts `runc exec` of cmd in container id, its pid file in
// pidDir. On error nothing it opened is left open.
func (r *Runtime) startExec(ctx context.Context, id string, cmd []string, pidDir string) (*execRun, error) {
	// Our own pipes rather than io.Writers: Wait then returns when runc
	// exec exits, whoever else holds the write ends, and the pipe's inode
	// names every process that does.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}

	args := append(r.globalArgs(), "exec", "--pid-file", filepath.Join(pidDir, "pid"), id)
	c := exec.Command(r.binary, append(args, cmd...)...)
	c.Stdout, c.Stderr = outW, errW
	c.WaitDelay = execDrain
	ex := &execProcs{pidFile: filepath.Join(pidDir, "pid"), since: bootTicks(), self: os.Getpid()}
	// Only asked on the kill path: the container's init is in the cgroups
	// that runc exec puts its process in.
	ex.initCgroup = func() []byte {
		st, err := r.State(context.WithoutCancel(ctx), id)
		if err != nil || st.Pid <= 0 {
			return nil
		}
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(st.Pid) + "/cgroup")
		return b
	}
	err = c.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	ex.runc = c.Process.Pid
	if st, err := readProcStat(ex.runc); err == nil {
		ex.runcStart = st.start
	}
	ex.pipes = pipeInodes(outR, errR)
	return &execRun{c: c, ex: ex, outR: outR, errR: errR}, nil
}

// wait waits for runc exec to exit, for the timeout (0 = none) or for ctx.
// It returns runc's wait error, or in killedBy why the exec's processes
// must be killed now. Once the exec'd process exited, background
// processes holding its output are killed after execDrain, since runc
// exits only when they are gone.
//
// The timeout is the command's own: it runs from the moment runc has
// started the command in the container (mainStarted). runc's start alone
// can take longer than an exec probe's usual 1 s on a loaded node, and a
// probe that times out for it restarts a healthy container: kubelet's
// node conformance saw both probes of one container time out so while
// eight test processes shared two CPUs. The start has a bound of its
// own, execStartGrace past the timeout; kubelet gives the call two
// minutes past the timeout.
func (run *execRun) wait(ctx context.Context, id string, cmd []string, timeout time.Duration, done <-chan error, mainStarted, mainExited <-chan struct{}) (err, killedBy error) {
	var timer *time.Timer
	var fired <-chan time.Time
	if timeout > 0 {
		timer = time.NewTimer(timeout + execStartGrace)
		defer timer.Stop()
		fired = timer.C
	} else {
		mainStarted = nil
	}
	for {
		select {
		case <-mainStarted:
			mainStarted = nil
			timer.Reset(timeout)
			continue
		case err = <-done:
		case <-mainExited:
			select {
			case err = <-done:
			case <-time.After(execDrain):
				log.G(ctx).WithField("container", id).Debugf("exec %q exited but background processes hold its output after %s; killing them", strings.Join(cmd, " "), execDrain)
				run.ex.killAll(ctx)
				err = run.ex.waitRunc(ctx, run.c, done)
			}
		case <-fired:
			if mainStarted != nil {
				killedBy = fmt.Errorf("command %q in container %s did not start within %s: %w", strings.Join(cmd, " "), id, timeout+execStartGrace, context.DeadlineExceeded)
			} else {
				killedBy = fmt.Errorf("command %q in container %s timed out after %s: %w", strings.Join(cmd, " "), id, timeout, context.DeadlineExceeded)
			}
		case <-ctx.Done():
			killedBy = fmt.Errorf("exec in container %s: %w", id, ctx.Err())
		}
		return err, killedBy
	}
}

// execOutput copies one exec's stdout and stderr into bounded buffers.
type execOutput struct {
	out, err   limitbuf.Buffer
	outR, errR *os.File
	drained    chan struct{}
}

// readExecOutput starts copying outR and errR until their write ends
// are all closed or drain gives up on them.
func readExecOutput(outR, errR *os.File) *execOutput {
	o := &execOutput{
		out: limitbuf.Buffer{Max: maxExecOutput}, err: limitbuf.Buffer{Max: maxExecOutput},
		outR: outR, errR: errR, drained: make(chan struct{}),
	}
	var copiers sync.WaitGroup
	copiers.Add(2)
	go func() { defer copiers.Done(); _, _ = io.Copy(&o.out, outR) }()
	go func() { defer copiers.Done(); _, _ = io.Copy(&o.err, errR) }()
	go func() { copiers.Wait(); close(o.drained) }()
	return o
}

// drain waits for the output for at most execDrain, then closes the
// read ends so the copiers return and the buffers can be read. id and
// cmd name the exec in the log.
func (o *execOutput) drain(ctx context.Context, id string, cmd []string) {
	select {
	case <-o.drained:
	case <-time.After(execDrain):
		log.G(ctx).WithField("container", id).Debugf("exec %q: a background process still holds its output after %s; not waiting for it", strings.Join(cmd, " "), execDrain)
		o.outR.Close()
		o.errR.Close()
		<-o.drained
	}
}

// execProcs finds the processes of one exec for killing.
type execProcs struct {
	pidFile string
	// since is the boot-time tick just before runc exec started: a process
	// of this exec cannot have started earlier.
	since uint64
	// self and runc are never killed: runc exec exits by itself once the
	// exec'd process is dead.
	self, runc int
	// runcStart tells runc from a process that reused its PID after
	// runc was reaped: on a busy host with pid_max 32768 that happens
	// within seconds, and that process's pipes and children are not ours.
	runcStart uint64
	pipes     []uint64

	mu   sync.Mutex
	main procID
	// Every process of this exec is in the container's cgroups, where
	// runc exec puts the process it starts. Nothing outside them is ever
	// a victim, whatever pipe it holds (see containerCgroup). cgroup is
	// /proc/<main>/cgroup as read when the pid file appeared.
	cgroup     []byte
	initCgroup func() []byte
	ctrCgroup  []byte // initCgroup's answer, once it gave one
}

// procID identifies a process across PID reuse, as runc's hasInit does.
type procID struct {
	pid   int
	start uint64
}

// watch learns the exec'd process from the pid file, closing started
// then, and closes exited when it has exited (its pidfd polls readable).
func (e *execProcs) watch(stop <-chan struct{}, started, exited chan<- struct{}) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !e.readPid() {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
	close(started)
	e.mu.Lock()
	main := e.main
	e.mu.Unlock()
	if main.pid <= 0 {
		close(exited)
		return
	}
	fd, err := unix.PidfdOpen(main.pid, 0)
	if err != nil {
		close(exited) // ESRCH: already gone.
		return
	}
	defer unix.Close(fd)
	if st, err := readProcStat(main.pid); err != nil || st.start != main.start {
		close(exited)
		return
	}
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 50)
		if err == nil && n > 0 {
			close(exited)
			return
		}
		select {
		case <-stop:
			return
		default:
		}
	}
}

// waitRunc waits for runc exec after its processes were killed. A process
// forked between a scan and the kills keeps runc's output pipes open, so
// the kills are repeated until runc exits; past execKillWait runc itself
// (our own child, so no PID reuse) is killed.
func (e *execProcs) waitRunc(ctx context.Context, c *exec.Cmd, done <-chan error) error {
	deadline := time.NewTimer(execKillWait)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			e.killAll(ctx)
		case <-deadline.C:
			_ = c.Process.Kill()
			return <-done
		}
	}
}

func (e *execProcs) readPid() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.main.pid > 0 {
		return true
	}
	b, err := os.ReadFile(e.pidFile)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	st, err := readProcStat(pid)
	if err != nil || st.start < e.since {
		// Already gone: nothing to kill, and it has exited.
		e.main = procID{pid: -1}
		return true
	}
	e.main = procID{pid: pid, start: st.start}
	e.cgroup, _ = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	return true
}

// killAll SIGKILLs the exec'd process, its descendants and every process
// holding the exec's output pipes, each only while it is still the
// process that was found.
func (e *execProcs) killAll(ctx context.Context) {
	e.readPid()
	e.mu.Lock()
	main := e.main
	e.mu.Unlock()
	cg := e.containerCgroup()
	if len(cg) == 0 {
		// Neither the process nor the container is there to tell which
		// processes are ours: kill nothing rather than a stranger.
		return
	}
	for _, p := range e.victims(main) {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/cgroup"); err != nil || !bytes.Equal(b, cg) {
			continue
		}
		if err := killIfSame(p); err != nil {
			log.G(ctx).WithError(err).Debugf("exec: not killing pid %d", p.pid)
		}
	}
}

// containerCgroup is the container's cgroup membership, as
// /proc/<pid>/cgroup shows it: its init's, asked once. The exec'd
// process's own, read when its pid file appeared, is only the fallback
// for a container whose init is gone: runc can write the pid file before
// it has moved the process into every hierarchy, and a copy taken then
// names runc's cgroup, so that none of the exec's processes matched it
// and a background child of the exec outlived every kill.
func (e *execProcs) containerCgroup() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.ctrCgroup) == 0 && e.initCgroup != nil {
		e.ctrCgroup = e.initCgroup()
	}
	if len(e.ctrCgroup) > 0 {
		return e.ctrCgroup
	}
	return e.cgroup
}

// victims lists main, its descendants, the descendants of runc exec (a
// subreaper: orphans of the exec'd process land there) and the holders of
// the exec's pipes and runc's, all started after the exec began.
func (e *execProcs) victims(main procID) []procID {
	// runc's pipes are remembered: once runc is gone, processes that
	// escaped a kill still hold them. Only while the PID is still runc.
	runcAlive := false
	if st, err := readProcStat(e.runc); err == nil && e.runcStart != 0 && st.start == e.runcStart {
		runcAlive = true
		for _, ino := range pipesOf(e.runc) {
			if !slices.Contains(e.pipes, ino) {
				e.pipes = append(e.pipes, ino)
			}
		}
	}
	pipes := e.pipes
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	stats := map[int]procStat{}
	children := map[int][]int{}
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == e.self || pid == e.runc {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil || st.start < e.since {
			continue
		}
		stats[pid] = st
		children[st.ppid] = append(children[st.ppid], pid)
	}
	seen := map[int]bool{}
	var out []procID
	add := func(pid int) {
		if !seen[pid] {
			seen[pid] = true
			out = append(out, procID{pid: pid, start: stats[pid].start})
		}
	}
	var queue []int
	if runcAlive {
		queue = slices.Clone(children[e.runc])
	}
	if st, ok := stats[main.pid]; ok && main.pid > 0 && st.start == main.start {
		queue = append(queue, main.pid)
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		add(pid)
		queue = append(queue, children[pid]...)
	}
	for pid := range stats {
		if holdsPipe(pid, pipes) {
			add(pid)
		}
	}
	return out
}

// pipesOf is the inodes of the pipes pid holds.
func pipesOf(pid int) []uint64 {
	var out []uint64
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, _ := os.ReadDir(dir)
	for _, d := range ents {
		if ino, ok := pipeInode(dir + "/" + d.Name()); ok {
			out = append(out, ino)
		}
	}
	return out
}

func pipeInode(link string) (uint64, bool) {
	l, err := os.Readlink(link)
	if err != nil || !strings.HasPrefix(l, "pipe:[") {
		return 0, false
	}
	ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "pipe:["), "]"), 10, 64)
	return ino, err == nil
}

// killIfSame sends SIGKILL through a pidfd opened after checking that pid
// still has the start time it was found with, so a reused PID is never
// signalled.
func killIfSame(p procID) error {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	st, err := readProcStat(p.pid)
	if err != nil {
		return err
	}
	if st.start != p.start {
		return fmt.Errorf("pid %d was reused (start time %d, want %d)", p.pid, st.start, p.start)
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// pipeInodes are the inodes of the exec's pipes; /proc/<pid>/fd links of
// their holders read "pipe:[<inode>]". It stats them through
// os.File.Stat: Fd would put them in blocking mode, and a Close could
// then no longer end a read blocked in them (drain's), which waited for
// ever on a pipe a process outside the container held.
func pipeInodes(files ...*os.File) []uint64 {
	var out []uint64
	for _, f := range files {
		if fi, err := f.Stat(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				out = append(out, st.Ino)
			}
		}
	}
	return out
}

func holdsPipe(pid int, inodes []uint64) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, d := range ents {
		if ino, ok := pipeInode(dir + "/" + d.Name()); ok && slices.Contains(inodes, ino) {
			return true
		}
	}
	return false
}

type procStat struct {
	ppid  int
	start uint64 // clock ticks since boot
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

// parseProcStat reads ppid and starttime from /proc/<pid>/stat. The
// command name may hold spaces and parentheses, so fields are counted
// from its last ')'.
func parseProcStat(s string) (procStat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("malformed stat %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): ppid is field 4, starttime field 22.
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("short stat %q", s)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("stat ppid %q: %w", f[1], err)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("stat starttime %q: %w", f[19], err)
	}
	return procStat{ppid: ppid, start: start}, nil
}

// bootTicks is now in the unit of /proc/<pid>/stat's starttime: USER_HZ
// (100 on every Linux ABI) ticks of CLOCK_BOOTTIME. One tick is taken off
// so rounding cannot make a process look older than the exec.
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	t := uint64(ts.Nano()) / uint64(time.Second/100)
	if t > 0 {
		t--
	}
	return t
}
