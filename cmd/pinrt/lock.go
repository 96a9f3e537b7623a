package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// lockWait bounds how long a start waits for a lock that no live pinrt
// holds: a daemon killed while it forked a child leaves that child, until
// it execs (which closes the descriptor) or dies, holding the lock's open
// file. A restart 30 ms after a SIGKILL met such a child 1 time in 200.
var lockWait = 10 * time.Second

// lockPoll is how often a start tries the lock again meanwhile.
const lockPoll = 10 * time.Millisecond

// lockDir takes an exclusive flock on <dir>/pinrt.lock so a second daemon
// on the same directory fails fast. Both directories need one: a second
// daemon on the same run dir would steal the socket and the pins, and one
// on the same root (with another run dir) would find none of the first
// one's pins and rewrite every pod on disk as NotReady and every container
// as gone. what names the directory in the message ("run dir", "root").
// The lock lives as long as the process.
//
// A lock held while the pinrt recorded in it is no longer among its
// holders is waited for, up to lockWait; a refusal names the processes
// that hold it.
func lockDir(dir, what string) (*os.File, error) {
	path := filepath.Join(dir, "pinrt.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var waitedFor []lockHolder
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		recorded, _ := os.ReadFile(path)
		pid, _ := strconv.Atoi(strings.TrimSpace(string(recorded)))
		holders := lockHolders(path, int(f.Fd()))
		if pid > 0 && slices.ContainsFunc(holders, func(h lockHolder) bool { return h.pid == pid }) {
			f.Close()
			return nil, fmt.Errorf("another pinrt (pid %d) is already running on %s %s (lock %s is held)", pid, what, dir, path)
		}
		if time.Since(start) > lockWait {
			f.Close()
			return nil, fmt.Errorf("%s %s is locked: %s holds %s, though the pinrt that took it (pid %s) is gone; waited %s",
				what, dir, describeHolders(holders), path, strings.TrimSpace(string(recorded)), lockWait)
		}
		waitedFor = holders
		time.Sleep(lockPoll)
	}
	if waitedFor != nil {
		log.L.WithField("lock", path).Warnf("waited %s for the lock of the %s, held by %s after its pinrt died",
			time.Since(start).Round(time.Millisecond), what, describeHolders(waitedFor))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	return f, nil
}

// lockHolder is a process with the lock file open.
type lockHolder struct {
	pid int
	cmd string
}

// lockHolders lists the processes that have path open, from their
// /proc/<pid>/fd, but for this process's descriptor skipFd: flock
// follows the open file, which a forked child shares, so /proc/locks
// names only the process that took the lock.
func lockHolders(path string, skipFd int) []lockHolder {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return nil
	}
	procs, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var out []lockHolder
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join("/proc", p.Name(), "fd")
		fds, _ := os.ReadDir(fdDir)
		for _, fd := range fds {
			n, _ := strconv.Atoi(fd.Name())
			if pid == self && n == skipFd {
				continue
			}
			var st unix.Stat_t
			if unix.Stat(filepath.Join(fdDir, fd.Name()), &st) != nil || st.Dev != want.Dev || st.Ino != want.Ino {
				continue
			}
			cmd, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
			out = append(out, lockHolder{pid: pid, cmd: strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))})
			break
		}
	}
	return out
}

func describeHolders(hs []lockHolder) string {
	if len(hs) == 0 {
		return "no process with it open (a process in the middle of exiting)"
	}
	var parts []string
	for _, h := range hs {
		parts = append(parts, fmt.Sprintf("pid %d (%s)", h.pid, h.cmd))
	}
	return strings.Join(parts, ", ")
}
