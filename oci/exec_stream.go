package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/exechelper"
)

// TerminalSize is a terminal's size in characters.
type TerminalSize struct {
	Width, Height uint16
}

// ExecOptions describe an interactive exec.
type ExecOptions struct {
	Cmd []string
	// Stdin is nil when the client sends none.
	Stdin io.Reader
	// Stdout and Stderr are nil when the client wants none; with Tty both
	// streams of the process go to Stdout.
	Stdout, Stderr io.Writer
	Tty            bool
	// Resize carries terminal size changes (Tty only); nil means none.
	Resize <-chan TerminalSize
}

// execWaitDelay is how long output may stand still after the exec'd
// process exited before the stream is cut, and only when the pipes hold
// nothing unread: then everything the process wrote is on its way to the
// client, and what still holds the pipes open is a background grandchild
// that must not hold the stream open. Output still moving to the client,
// a write the client is still taking, or bytes still in a pipe are waited
// for: a client behind a slow link (kubelet, the API server) or a daemon
// starved of CPU gets every byte.
const execWaitDelay = 2 * time.Second

// ExecStream runs o.Cmd in the running container id with its stdio copied
// from and to o's streams, and returns the command's exit code. runc exec
// joins every namespace of the container, its user namespace included.
// Without a TTY, runc runs detached under the exec helper, which hands
// the process pinrt's pipes and waits for its exit code.
//
// With a TTY, runc runs in the foreground with a pseudo-terminal pinrt
// allocates as its stdio: runc then makes the container's own pty and
// relays between them, and a TIOCSWINSZ on pinrt's master reaches the
// container as SIGWINCH to runc. --console-socket is not used because runc
// accepts it only with --detach, and a detached process's exit code is lost.
//
// When ctx ends, or the client stops reading the output, the exec'd process
// itself is killed: killing runc alone would leave it running.
func (r *Runtime) ExecStream(ctx context.Context, id string, o ExecOptions) (int, error) {
	if err := validateID(id); err != nil {
		return -1, err
	}
	if len(o.Cmd) == 0 {
		return -1, fmt.Errorf("exec: empty command: %w", errdefs.ErrInvalidArgument)
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return -1, err
	}
	pidDir, err := os.MkdirTemp(rec.Bundle, "exec-")
	if err != nil {
		return -1, err
	}
	defer os.RemoveAll(pidDir)
	pidFile := filepath.Join(pidDir, "pid")
	ps := execSpec(rec)

	var c *exec.Cmd
	if o.Tty {
		args := append(r.globalArgs(), "exec", "--tty", "--pid-file", pidFile)
		// A terminal wants a TERM, as the container's own terminal gets
		// (WithTTY) and containerd's TTY exec has; the container's env
		// wins, and so does the command's own (`env TERM=...`).
		if envIndex(ps.env(), "TERM") < 0 {
			args = append(args, "--env", "TERM=xterm")
		}
		args = append(args, id)
		c = exec.Command(r.binary, append(args, o.Cmd...)...)
	} else {
		// Detached under the helper, so that only the exec'd process's
		// own exit ends the exec (see package exechelper).
		args := append([]string{exechelper.Command, pidFile, r.binary}, r.globalArgs()...)
		args = append(args, "exec", "--detach", "--pid-file", pidFile, id)
		c = exec.Command(r.execHelper, append(args, o.Cmd...)...)
	}
	c.WaitDelay = execWaitDelay

	var once sync.Once
	since := bootTicks()
	kill := func() {
		once.Do(func() { killPidFile(pidFile, since) })
	}
	var stream *execIO
	if o.Tty {
		stream, err = startTty(c, o, kill, pidFile)
	} else {
		stream, err = startPipes(c, o, kill, execStdioOwner(rec, ps))
	}
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", id, err)
	}

	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		kill()
		select {
		case err = <-done:
		case <-time.After(5 * time.Second):
			_ = c.Process.Kill()
			err = <-done
		}
	}
	stream.finish(ctx)
	if ctx.Err() != nil {
		return -1, fmt.Errorf("exec in %s: %w", id, ctx.Err())
	}
	var ee *exec.ExitError
	switch {
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		return exitCode(c.ProcessState), nil
	case errors.As(err, &ee):
		return exitCode(ee.ProcessState), nil
	}
	return -1, fmt.Errorf("exec in %s: %w", id, err)
}

// exitCode is a process's exit status as a shell reports it: 128 plus the
// signal that killed it. Go's ExitCode says -1 for a signal, which kubelet
// passes on and client-go refuses ("invalid exit code value").
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// execPidFileWait bounds how long a hangup waits for runc to start the
// exec'd process.
const execPidFileWait = 10 * time.Second

// waitPidFile reports whether pidFile appeared within d.
func waitPidFile(pidFile string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(pidFile); err == nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killPidFile SIGKILLs the process runc wrote into pidFile, if any, and
// only if it started after since: once the exec'd process is gone its PID
// may belong to anything on the host.
func killPidFile(pidFile string, since uint64) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		return
	}
	st, err := readProcStat(pid)
	if err != nil || st.start < since {
		return
	}
	_ = killIfSame(procID{pid: pid, start: st.start})
}

// execIO is the copying around one started exec.
type execIO struct {
	// finish runs after runc exited: it waits for the output to drain
	// while it moves (see execWaitDelay) and ctx lasts, and releases what
	// the copies hold.
	finish func(ctx context.Context)
}

// progress counts the output written to the client, and the writes in
// flight, so that draining can tell a slow client from idle pipes.
type progress struct {
	written atomic.Int64
	writing atomic.Int32
}

// writer wraps w to count on p.
func (p *progress) writer(w io.Writer) io.Writer { return progressWriter{w, p} }

type progressWriter struct {
	w io.Writer
	p *progress
}

func (w progressWriter) Write(b []byte) (int, error) {
	w.p.writing.Add(1)
	defer w.p.writing.Add(-1)
	n, err := w.w.Write(b)
	w.p.written.Add(int64(n))
	return n, err
}

// waitDrained waits until done closes (every copy read EOF: all writers
// are gone) or ctx ends. Failing that, once the process exited, the only
// writers left are processes it left in the background: the wait ends when
// the output stood still for execWaitDelay (nothing written, no write in
// flight) and unread says the kernel holds no byte the copies have yet to
// read. Progress alone would cut the tail of a 20 MB `tar c` whenever the
// copies stalled for execWaitDelay between two writes with bytes still in
// the pipe (a daemon starved of CPU); whatever the copies already read is
// written after the read ends close (see finish), so only unread bytes
// can be lost.
func waitDrained(ctx context.Context, done <-chan struct{}, p *progress, unread func() int) {
	last := p.written.Load()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-time.After(execWaitDelay):
		}
		now := p.written.Load()
		if now == last && p.writing.Load() == 0 && unread() == 0 {
			return
		}
		last = now
	}
}

// unreadBytes is how many bytes the kernel holds in fs that nobody read
// yet (TIOCINQ, which is FIONREAD: pipes and a pty's master answer it). A
// file that cannot say counts as holding some, so that it is waited for.
func unreadBytes(fs ...*os.File) int {
	n := 0
	for _, f := range fs {
		v := 1
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				if got, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil {
					v = got
				}
			})
		}
		n += v
	}
	return n
}

// killOnError wraps a client stream: when writing to the client fails,
// nobody reads the output any more, so the process is killed.
type killOnError struct {
	w    io.Writer
	kill func()
}

func (k killOnError) Write(p []byte) (int, error) {
	n, err := k.w.Write(p)
	if err != nil {
		k.kill()
	}
	return n, err
}

// startPipes starts c with pipes of its own for the streams the client
// has, given to owner (nil: host root) so that a user-namespaced process
// can reopen them (see stdio.go). The exec helper hands them on to the
// process. After c exited, finish drains the output to EOF, or, when a
// background grandchild holds the pipes, until they stand empty and idle
// (see waitDrained).
func startPipes(c *exec.Cmd, o ExecOptions, kill func(), owner *hostIDs) (_ *execIO, retErr error) {
	var childEnds, readEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	defer func() {
		closeAll(childEnds) // the child has its copies
		if retErr != nil {
			closeAll(readEnds)
		}
	}()
	type copyOut struct {
		r *os.File
		w io.Writer
	}
	prog := &progress{}
	var outs []copyOut
	// A stream the client did not ask for is /dev/null (exec.Cmd's nil).
	for i, w := range []io.Writer{o.Stdout, o.Stderr} {
		if w == nil {
			continue
		}
		r, pw, err := ownedPipe(owner)
		if err != nil {
			return nil, err
		}
		childEnds = append(childEnds, pw)
		readEnds = append(readEnds, r)
		if i == 0 {
			c.Stdout = pw
		} else {
			c.Stderr = pw
		}
		outs = append(outs, copyOut{r, prog.writer(killOnError{w, kill})})
	}
	var stdin *os.File
	if o.Stdin != nil {
		pr, w, err := ownedPipe(owner)
		if err != nil {
			return nil, err
		}
		childEnds = append(childEnds, pr)
		c.Stdin, stdin = pr, w
	}
	if err := c.Start(); err != nil {
		if stdin != nil {
			stdin.Close()
		}
		return nil, err
	}
	if stdin != nil {
		// Copied here rather than by exec.Cmd: the copy blocks on the
		// client, and Cmd.Wait would wait for it after the process exited.
		go func() {
			_, _ = io.Copy(stdin, o.Stdin)
			// EOF from the client closes the process's stdin (`cat`
			// ends); an EPIPE after the process exited is expected.
			stdin.Close()
		}()
	}
	var copies sync.WaitGroup
	for _, oc := range outs {
		copies.Go(func() { _, _ = io.Copy(oc.w, oc.r) })
	}
	drained := make(chan struct{})
	go func() { copies.Wait(); close(drained) }()
	return &execIO{finish: func(ctx context.Context) {
		waitDrained(ctx, drained, prog, func() int { return unreadBytes(readEnds...) })
		// Closing the read ends ends the copies of output a background
		// process still holds open.
		closeAll(readEnds)
		<-drained
	}}, nil
}

// startTty runs c on a new pty; pidFile is where runc records the exec'd
// process, which a hangup waits for.
func startTty(c *exec.Cmd, o ExecOptions, kill func(), pidFile string) (*execIO, error) {
	master, slave, err := openPty()
	if err != nil {
		return nil, err
	}
	c.Stdin, c.Stdout, c.Stderr = slave, slave, slave
	// runc must own the terminal: it finds its console on its stdio and
	// gets SIGWINCH as the terminal's foreground process group.
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = c.Start()
	// Only runc may hold the slave, so that the master reads EIO once runc
	// and the container's process are gone.
	slave.Close()
	if err != nil {
		master.Close()
		return nil, err
	}
	outDone := make(chan struct{})
	prog := &progress{}
	go func() {
		defer close(outDone)
		if o.Stdout == nil {
			_, _ = io.Copy(io.Discard, master)
			return
		}
		_, _ = io.Copy(prog.writer(killOnError{o.Stdout, kill}), master)
	}()
	if o.Stdin != nil {
		// A terminal has no EOF to pass on: the end of the client's input
		// means the client is gone (kubectl uses a TTY only when its own
		// stdin is one). Hang up, as a closed terminal does: runc relays
		// SIGHUP to the process, and a shell left alone does not leak.
		go func() {
			_, _ = io.Copy(master, o.Stdin)
			// runc relays signals only once its handler is in place,
			// which is before it writes the pid file; a hangup sent
			// earlier kills runc itself (kubectl exec -it with a stdin
			// that ends at once).
			if waitPidFile(pidFile, execPidFileWait) {
				_ = c.Process.Signal(syscall.SIGHUP)
			}
		}()
	}
	stopResize := make(chan struct{})
	if o.Resize != nil {
		go func() {
			for {
				select {
				case <-stopResize:
					return
				case sz, ok := <-o.Resize:
					if !ok {
						return
					}
					_ = setWinsize(master, sz)
				}
			}
		}()
	}
	return &execIO{finish: func(ctx context.Context) {
		close(stopResize)
		waitDrained(ctx, outDone, prog, func() int { return unreadBytes(master) })
		master.Close()
		<-outDone
	}}, nil
}

// openPty returns a new pseudo-terminal's master and slave.
func openPty() (master, slave *os.File, retErr error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	// Non-blocking, so the runtime poller serves it and Close ends a Read.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	defer func() {
		if retErr != nil {
			master.Close()
		}
	}()
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("unlockpt: %w", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("ptsname: %w", err)
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	return master, slave, nil
}

func setWinsize(f *os.File, sz TerminalSize) error {
	ws := &unix.Winsize{Row: sz.Height, Col: sz.Width}
	var err error
	rc, _ := f.SyscallConn()
	if cerr := rc.Control(func(fd uintptr) { err = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws) }); cerr != nil {
		return cerr
	}
	return err
}
