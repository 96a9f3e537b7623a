package server

import (
	"context"
	"sync"

	"github.com/containerd/log"

	"github.com/pinrt/pinrt/sandbox"
)

// podOOM tells which container exits were OOM kills that conmon missed.
//
// conmon notes an OOM kill by reading the container cgroup's
// memory.events when it changes. Under the systemd driver the cgroup is
// a transient scope, which systemd removes the moment its last process
// is gone, often before conmon reads it (containers/conmon#426, fixed
// only in releases newer than Debian's); the container then shows
// Error 137 instead of OOMKilled. On cgroup v2 the pod's cgroup, which
// outlives its containers, counts its children's OOM kills too: a
// SIGKILLed container is taken as OOM-killed when that counter has
// risen past what the pod's earlier exits accounted for, unless pinrt was
// stopping it. Two containers of one pod SIGKILLed at once, only one of
// them by the OOM killer, could swap reasons, and so could a container
// killed from outside after an OOM kill of another's child process.
type podOOM struct {
	mu sync.Mutex
	// seen is each pod's oom_kill count already accounted for: read
	// when the pod is created or restored, raised by each exit taken
	// as an OOM kill.
	seen map[string]uint64
	// decided remembers each container's answer, as its status may be
	// refreshed more than once.
	decided map[string]bool
}

func newPodOOM() *podOOM {
	return &podOOM{seen: map[string]uint64{}, decided: map[string]bool{}}
}

// sigkillExit is the exit code of a process killed by SIGKILL, as the
// OOM killer kills.
const sigkillExit = 128 + 9

// notePodOOMBase records sb's current OOM kill count, so that kills
// before the pod was created or pinrt restarted are not attributed.
func (s *Server) notePodOOMBase(ctx context.Context, sb *sandbox.Sandbox) {
	group := s.podCgroup(sb)
	if group == "" {
		return
	}
	n, ok, err := s.deps.Cgroups.OOMKills(group)
	if err != nil {
		log.G(ctx).WithError(err).WithField("sandbox", sb.ID).Debug("reading the pod's OOM kills")
	}
	if !ok {
		// No memory.events yet (a cgroupfs pod's cgroup comes with its
		// first container): nothing was killed in it.
		n = 0
	}
	s.oom.mu.Lock()
	s.oom.seen[sb.ID] = n
	s.oom.mu.Unlock()
}

// exitWasOOMKill tells whether c, which exited with SIGKILL and no OOM
// file from conmon, was killed by the OOM killer.
func (s *Server) exitWasOOMKill(ctx context.Context, c *sandbox.Container) bool {
	s.oom.mu.Lock()
	defer s.oom.mu.Unlock()
	if v, ok := s.oom.decided[c.ID]; ok {
		return v
	}
	base, known := s.oom.seen[c.SandboxID]
	sb, err := s.sandboxes.Get(c.SandboxID)
	if err != nil || !known {
		return false
	}
	group := s.podCgroup(sb)
	if group == "" {
		return false
	}
	n, ok, err := s.deps.Cgroups.OOMKills(group)
	if err != nil || !ok {
		return false
	}
	oom := n > base
	if oom {
		s.oom.seen[c.SandboxID] = base + 1
		log.G(ctx).WithField("container", c.ID).Debug("exit taken as an OOM kill from the pod's memory.events")
	}
	s.oom.decided[c.ID] = oom
	return oom
}

// stopping records that pinrt is stopping c, before it signals it: a
// SIGKILL exit is then the stop's (its grace period over, or a SIGKILL
// stop signal), not an OOM kill, whatever the pod's counter says; a rise
// some child process's OOM kill made stays for an exit of its own.
// conmon's own OOM file still wins.
func (s *Server) stopping(c *sandbox.Container) {
	s.oom.mu.Lock()
	defer s.oom.mu.Unlock()
	if _, ok := s.oom.decided[c.ID]; !ok {
		s.oom.decided[c.ID] = false
	}
}

// forgetOOM drops what podOOM keeps for a removed container or pod.
func (s *Server) forgetOOM(podID, containerID string) {
	s.oom.mu.Lock()
	defer s.oom.mu.Unlock()
	if containerID != "" {
		delete(s.oom.decided, containerID)
	}
	if podID != "" {
		delete(s.oom.seen, podID)
	}
}
