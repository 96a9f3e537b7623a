package server

import (
	"context"
	"os"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/sandbox"
)

// monitorWatch notices the death of a container's conmon as it happens:
// a pidfd per monitor, waited on by the Go runtime's poller (a pidfd
// turns readable when its process exits). A conmon that dies without
// writing an exit file (killed, OOM) leaves a container nobody reaps;
// without this, every ContainerStatus had to read conmon.pid and
// /proc/<pid>/cmdline to find that out, most of the call's cost.
type monitorWatch struct {
	mu sync.Mutex
	// files are the pidfds of the watched monitors, by container ID.
	files map[string]*os.File
}

// monitorWatched says whether c's conmon is watched, so that a status
// read may trust the recorded state without looking at the process.
func (s *Server) monitorWatched(id string) bool {
	s.monitors.mu.Lock()
	defer s.monitors.mu.Unlock()
	_, ok := s.monitors.files[id]
	return ok
}

// watchMonitor starts watching c's conmon, if it has a live one. A
// kernel without pidfds (before 5.3), or a monitor already gone, leaves
// c unwatched: the status reads then look at the process themselves.
func (s *Server) watchMonitor(ctx context.Context, c *sandbox.Container) {
	if c.Status().State == sandbox.ContainerExited {
		return
	}
	pid, alive, _ := monitorPid(c.Dir, c.ID)
	if !alive {
		return
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Debug("no pidfd for the container's monitor")
		return
	}
	// The pid may have been reused between the check and the open: the
	// pidfd is the monitor's only if the pid still names the container.
	if _, alive, _ := monitorPid(c.Dir, c.ID); !alive {
		_ = unix.Close(fd)
		return
	}
	f := os.NewFile(uintptr(fd), "conmon pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return
	}
	s.monitors.mu.Lock()
	if s.monitors.files == nil {
		s.monitors.files = map[string]*os.File{}
	}
	if old := s.monitors.files[c.ID]; old != nil {
		_ = old.Close()
	}
	s.monitors.files[c.ID] = f
	s.monitors.mu.Unlock()

	bg := background(ctx, "monitor-watcher")
	go func() {
		err := rc.Read(func(fd uintptr) bool { return pidfdExited(int(fd)) })
		if !s.dropMonitor(c.ID, f) || err != nil {
			// Unwatched (the container removed, the daemon closing), or
			// a pidfd the poller cannot wait on: the status reads look
			// at the process again.
			return
		}
		rctx, cancel := context.WithTimeout(bg, refreshTimeout)
		defer cancel()
		s.refreshContainer(rctx, c, false)
	}()
}

// dropMonitor forgets c's pidfd f and closes it. It reports whether f
// was still the one watched.
func (s *Server) dropMonitor(id string, f *os.File) bool {
	s.monitors.mu.Lock()
	cur := s.monitors.files[id]
	if cur == f {
		delete(s.monitors.files, id)
	}
	s.monitors.mu.Unlock()
	_ = f.Close()
	return cur == f
}

// unwatchMonitor stops watching container id's conmon.
func (s *Server) unwatchMonitor(id string) {
	s.monitors.mu.Lock()
	f := s.monitors.files[id]
	delete(s.monitors.files, id)
	s.monitors.mu.Unlock()
	if f != nil {
		_ = f.Close()
	}
}

// closeMonitors stops every wait, at the daemon's shutdown.
func (s *Server) closeMonitors() {
	s.monitors.mu.Lock()
	files := s.monitors.files
	s.monitors.files = nil
	s.monitors.mu.Unlock()
	for _, f := range files {
		_ = f.Close()
	}
}

// pidfdExited says whether the process behind pidfd fd has exited,
// without waiting.
func pidfdExited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}} //nolint:gosec // an fd fits
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
}
