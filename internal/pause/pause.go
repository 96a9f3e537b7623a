// Package pause is the infra process of a pod that shares one PID
// namespace. It imports nothing else of pinrt's, so that the small
// pinrt-exec binary can run it: every shared-PID pod has one for its
// whole life, and a small binary starts faster and maps less memory than
// the daemon's.
package pause

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Command is the argument that runs Main, in pinrt and in pinrt-exec.
const Command = "pause"

// Main runs the pause process: as PID 1 it reaps orphans, and it exits on
// SIGTERM or SIGINT. It needs no image.
func Main() int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGCHLD)
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			return 0
		}
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return 0
}
