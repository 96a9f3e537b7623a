package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// taskExits hears of every task (thread) that exits on the machine,
// through the kernel's taskstats interface (generic netlink, root), with
// the CPU time it used over its life. The process events connector says
// when a process exits but not what it cost, and /proc is gone by the
// time a short runc call is seen to end; taskstats is how getdelays(8)
// and atop account for processes that come and go.
type taskExits struct {
	fd     int
	report func(tgid uint32, cpu time.Duration)
	done   chan struct{}
	stop   atomic.Bool
}

// The netlink attribute header and the generic netlink header.
const (
	nlaHdrLen  = 4
	genlHdrLen = 4
	nlaTypeMsk = 0x3fff // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
)

// taskstatsMinVersion is the first with ac_tgid (Linux 5.19), which
// names the process a thread belonged to.
const taskstatsMinVersion = 11

// watchTaskExits registers for the exit statistics of every possible
// CPU and calls report, from its own goroutine, with each task's process
// and CPU time (user and system).
func watchTaskExits(report func(tgid uint32, cpu time.Duration)) (*taskExits, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("taskstats: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = unix.Close(fd)
		}
	}()
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("taskstats: %w", err)
	}
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("taskstats: %w", err)
	}
	family, err := genlFamily(fd, unix.TASKSTATS_GENL_NAME)
	if err != nil {
		return nil, err
	}
	cpus, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return nil, fmt.Errorf("taskstats: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	mask := strings.TrimSpace(string(cpus)) + "\x00"
	if err := genlSend(fd, family, unix.TASKSTATS_CMD_GET, unix.TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, []byte(mask)); err != nil {
		return nil, fmt.Errorf("taskstats: register for exits: %w", err)
	}
	ok = true
	t := &taskExits{fd: fd, report: report, done: make(chan struct{})}
	go t.loop()
	return t, nil
}

// genlSend sends one generic netlink request carrying one attribute.
func genlSend(fd int, family uint16, cmd uint8, attr uint16, val []byte) error {
	alen := nlaHdrLen + len(val)
	b := make([]byte, nlmsgHdrLen+genlHdrLen+(alen+3)&^3)
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(b)))
	le.PutUint16(b[4:], family)
	le.PutUint16(b[6:], unix.NLM_F_REQUEST)
	b[nlmsgHdrLen] = cmd
	b[nlmsgHdrLen+1] = 1 // version
	a := b[nlmsgHdrLen+genlHdrLen:]
	le.PutUint16(a[0:], uint16(alen))
	le.PutUint16(a[2:], attr)
	copy(a[nlaHdrLen:], val)
	return unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// genlFamily asks the generic netlink controller for a family's ID.
func genlFamily(fd int, name string) (uint16, error) {
	if err := genlSend(fd, unix.GENL_ID_CTRL, unix.CTRL_CMD_GETFAMILY, unix.CTRL_ATTR_FAMILY_NAME, []byte(name+"\x00")); err != nil {
		return 0, fmt.Errorf("generic netlink family %s: %w", name, err)
	}
	buf := make([]byte, 1<<16)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("generic netlink family %s: %w", name, err)
	}
	le := binary.LittleEndian
	msg := buf[:n]
	if len(msg) < nlmsgHdrLen+genlHdrLen || le.Uint16(msg[4:]) == unix.NLMSG_ERROR {
		return 0, fmt.Errorf("generic netlink family %s: not in this kernel", name)
	}
	var id uint16
	eachAttr(msg[nlmsgHdrLen+genlHdrLen:min(int(le.Uint32(msg[0:])), len(msg))], func(typ uint16, val []byte) {
		if typ == unix.CTRL_ATTR_FAMILY_ID && len(val) >= 2 {
			id = le.Uint16(val)
		}
	})
	if id == 0 {
		return 0, fmt.Errorf("generic netlink family %s: no ID in the reply", name)
	}
	return id, nil
}

// eachAttr calls f with each netlink attribute in b.
func eachAttr(b []byte, f func(typ uint16, val []byte)) {
	le := binary.LittleEndian
	for len(b) >= nlaHdrLen {
		l := int(le.Uint16(b[0:]))
		if l < nlaHdrLen || l > len(b) {
			return
		}
		f(le.Uint16(b[2:])&nlaTypeMsk, b[nlaHdrLen:l])
		adv := (l + 3) &^ 3
		if adv >= len(b) {
			return
		}
		b = b[adv:]
	}
}

// Close stops the watch; as with ProcWatch, the loop sees stop on its
// receive timeout.
func (t *taskExits) Close() {
	t.stop.Store(true)
	<-t.done
	_ = unix.Close(t.fd)
}

func (t *taskExits) loop() {
	defer close(t.done)
	buf := make([]byte, 1<<16)
	for !t.stop.Load() {
		n, _, err := unix.Recvfrom(t.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			return
		}
		eachMessage(buf[:n], func(payload []byte) {
			if len(payload) >= genlHdrLen {
				eachAttr(payload[genlHdrLen:], t.aggregate)
			}
		})
	}
}

// aggregate reads one TASKSTATS_TYPE_AGGR_PID: a thread's statistics.
// The per-process aggregate (AGGR_TGID) carries no CPU times, so a
// process's CPU is the sum over its threads.
func (t *taskExits) aggregate(typ uint16, val []byte) {
	if typ != unix.TASKSTATS_TYPE_AGGR_PID {
		return
	}
	eachAttr(val, func(typ uint16, val []byte) {
		if typ != unix.TASKSTATS_TYPE_STATS {
			return
		}
		if tgid, cpu, ok := taskCPU(val); ok {
			t.report(tgid, cpu)
		}
	})
}

// taskCPU reads the process and the user and system time out of a
// struct taskstats, whose fields only ever get appended.
func taskCPU(b []byte) (uint32, time.Duration, bool) {
	var ts unix.Taskstats
	if len(b) < int(unsafe.Offsetof(ts.Ac_tgid)+unsafe.Sizeof(ts.Ac_tgid)) {
		return 0, 0, false
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&ts)), unsafe.Sizeof(ts)), b)
	if ts.Version < taskstatsMinVersion {
		return 0, 0, false
	}
	return ts.Ac_tgid, time.Duration(ts.Ac_utime+ts.Ac_stime) * time.Microsecond, true
}
