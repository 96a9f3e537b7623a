package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// pause is the infra process of a pod that shares one PID namespace. As
// PID 1 it reaps orphans and exits on SIGTERM or SIGINT. It needs no image.
func pause() int {
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
