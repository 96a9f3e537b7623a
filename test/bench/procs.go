package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ProcWatch counts the processes a daemon starts, through the kernel's
// process events connector (netlink, root only): every fork of the daemon
// or of a process it started is one process (threads are not counted),
// and every exec of one is named by its command (conmon, "runc create",
// "runc init", a CNI plugin). Nothing is polled, so a runc call of a few
// milliseconds is counted as surely as a long-lived conmon. Events of
// other processes on the machine are ignored.
//
// Where the kernel has taskstats, the watch also adds up the CPU time
// of each of those processes when it exits, under the command it last
// ran (a runc create's init that becomes the container's process counts
// as that process): which of them a pod's CPU goes to.
type ProcWatch struct {
	fd    int
	root  int
	done  chan struct{}
	stop  atomic.Bool
	tasks *taskExits // nil without taskstats

	mu    sync.Mutex
	tree  map[uint32]bool // the daemon and its descendants, by tgid
	forks int
	execs map[string]int
	lost  int // receive errors: the counts are lower bounds
	// names are the commands the daemon's descendants ran, by tgid,
	// kept past their exit: taskstats may report a thread after it.
	names map[uint32]string
	cpu   map[string]time.Duration
}

// ProcCounts is a snapshot of a ProcWatch.
type ProcCounts struct {
	Forks int
	Execs map[string]int
	Lost  int
	// CPU is the CPU time of the processes that exited, by command; nil
	// without taskstats.
	CPU map[string]time.Duration
}

// Sub is what happened between before and c.
func (c ProcCounts) Sub(before ProcCounts) ProcCounts {
	out := ProcCounts{Forks: c.Forks - before.Forks, Lost: c.Lost - before.Lost, Execs: map[string]int{}}
	for k, v := range c.Execs {
		if d := v - before.Execs[k]; d != 0 {
			out.Execs[k] = d
		}
	}
	if c.CPU != nil {
		out.CPU = map[string]time.Duration{}
		for k, v := range c.CPU {
			if d := v - before.CPU[k]; d != 0 {
				out.CPU[k] = d
			}
		}
	}
	return out
}

// The connector's constants (linux/connector.h, linux/cn_proc.h).
const (
	cnIdxProc          = 1
	cnValProc          = 1
	procCnMcastListen  = 1
	procEventFork      = 0x1
	procEventExec      = 0x2
	procEventExit      = 0x80000000
	nlmsgHdrLen        = 16
	cnMsgLen           = 20
	procEventHeaderLen = 16 // what, cpu, timestamp_ns
)

// WatchProcs starts counting the processes started by root and its
// descendants.
func WatchProcs(root int) (*ProcWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("process events connector: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("process events connector: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc, Pid: 0}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("bind process events connector: %w", err)
	}
	if err := sendMcast(fd, procCnMcastListen); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("subscribe to process events: %w", err)
	}
	w := &ProcWatch{fd: fd, root: root, done: make(chan struct{}), tree: map[uint32]bool{uint32(root): true}, execs: map[string]int{},
		names: map[uint32]string{}}
	// Without taskstats the counts stand alone.
	if tasks, err := watchTaskExits(w.exited); err == nil {
		w.tasks, w.cpu = tasks, map[string]time.Duration{}
	}
	go w.loop()
	return w, nil
}

// exited adds a thread's CPU time to its process's command.
func (w *ProcWatch) exited(tgid uint32, cpu time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if name, ok := w.names[tgid]; ok {
		w.cpu[name] += cpu
	}
}

func sendMcast(fd int, op uint32) error {
	b := make([]byte, nlmsgHdrLen+cnMsgLen+4)
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(b)))       // nlmsg_len
	le.PutUint16(b[4:], unix.NLMSG_DONE)      // nlmsg_type
	le.PutUint32(b[12:], uint32(os.Getpid())) // nlmsg_pid
	cn := b[nlmsgHdrLen:]
	le.PutUint32(cn[0:], cnIdxProc)
	le.PutUint32(cn[4:], cnValProc)
	le.PutUint16(cn[16:], 4) // len of the payload
	le.PutUint32(cn[cnMsgLen:], op)
	return unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// Counts returns the totals so far.
func (w *ProcWatch) Counts() ProcCounts {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := ProcCounts{Forks: w.forks, Lost: w.lost, Execs: make(map[string]int, len(w.execs))}
	for k, v := range w.execs {
		c.Execs[k] = v
	}
	if w.cpu != nil {
		c.CPU = make(map[string]time.Duration, len(w.cpu))
		for k, v := range w.cpu {
			c.CPU[k] = v
		}
	}
	return c
}

// Close stops the watch. Closing a socket does not wake a blocked
// receive, so the loop wakes on its receive timeout and sees stop.
func (w *ProcWatch) Close() {
	w.stop.Store(true)
	<-w.done
	_ = unix.Close(w.fd)
	if w.tasks != nil {
		w.tasks.Close()
	}
}

func (w *ProcWatch) loop() {
	defer close(w.done)
	buf := make([]byte, 1<<16)
	for {
		if w.stop.Load() {
			return
		}
		n, _, err := unix.Recvfrom(w.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue
			}
			if errors.Is(err, unix.ENOBUFS) {
				w.mu.Lock()
				w.lost++
				w.mu.Unlock()
				continue
			}
			return
		}
		if n == 0 {
			return // shut down
		}
		eachMessage(buf[:n], w.event)
	}
}

// eachMessage calls f with the payload of each netlink message in b.
func eachMessage(b []byte, f func(payload []byte)) {
	le := binary.LittleEndian
	for len(b) >= nlmsgHdrLen {
		l := int(le.Uint32(b[0:]))
		if l < nlmsgHdrLen || l > len(b) {
			return
		}
		f(b[nlmsgHdrLen:l])
		adv := (l + 3) &^ 3
		if adv >= len(b) {
			return
		}
		b = b[adv:]
	}
}

func (w *ProcWatch) event(b []byte) {
	le := binary.LittleEndian
	if len(b) < cnMsgLen+procEventHeaderLen+8 {
		return
	}
	ev := b[cnMsgLen:]
	data := ev[procEventHeaderLen:]
	switch le.Uint32(ev[0:]) {
	case procEventFork:
		if len(data) < 16 {
			return
		}
		parentTgid, childPid, childTgid := le.Uint32(data[4:]), le.Uint32(data[8:]), le.Uint32(data[12:])
		if childPid != childTgid {
			return // a thread
		}
		w.mu.Lock()
		if w.tree[parentTgid] {
			w.tree[childTgid] = true
			w.forks++
			// Until it execs, a child is its parent's: conmon's
			// daemonised half is conmon.
			w.names[childTgid] = w.names[parentTgid]
			if int(parentTgid) == w.root {
				w.names[childTgid] = "?"
			}
		}
		w.mu.Unlock()
	case procEventExit:
		// A pid the kernel hands out again must not count as ours.
		pid, tgid := le.Uint32(data[0:]), le.Uint32(data[4:])
		if pid == tgid {
			w.mu.Lock()
			if w.tree[tgid] && int(tgid) != w.root {
				delete(w.tree, tgid)
			}
			w.mu.Unlock()
		}
	case procEventExec:
		tgid := le.Uint32(data[4:])
		w.mu.Lock()
		ours := w.tree[tgid]
		w.mu.Unlock()
		if !ours {
			return
		}
		name := procName(tgid)
		w.mu.Lock()
		w.execs[name]++
		w.names[tgid] = name
		w.mu.Unlock()
	}
}

// runcCommands are the runc subcommands pinrt runs; the first of them on
// a runc command line names the call.
var runcCommands = map[string]bool{
	"create": true, "start": true, "state": true, "kill": true, "delete": true, "list": true,
	"exec": true, "update": true, "features": true, "init": true, "ps": true, "events": true,
	"pause": true, "resume": true, "run": true,
}

// procName names an exec'd process from its command line: the binary's
// base name, with the subcommand for runc ("runc state"). A process that
// is already gone is "?".
func procName(pid uint32) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/cmdline")
	if err != nil || len(b) == 0 {
		return "?"
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	name := filepath.Base(args[0])
	if strings.HasPrefix(name, "runc") {
		for _, a := range args[1:] {
			if runcCommands[a] {
				return "runc " + a
			}
		}
	}
	return name
}

// FormatExecs lists exec counts divided by per, largest first:
// "runc state=3.00 conmon=1.00".
func FormatExecs(execs map[string]int, per int) string {
	if per <= 0 {
		per = 1
	}
	names := make([]string, 0, len(execs))
	for k := range execs {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if execs[names[i]] != execs[names[j]] {
			return execs[names[i]] > execs[names[j]]
		}
		return names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s=%.2f", k, float64(execs[k])/float64(per))
	}
	return strings.Join(parts, " ")
}
