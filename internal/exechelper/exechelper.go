// Package exechelper is the subreaper that waits for a detached `runc
// exec` of a streaming exec. It imports nothing of pinrt's, so that its
// own small binary, cmd/pinrt-exec, starts in 2 ms where the daemon's
// binary, re-executed, takes 11-13 ms before its main (package
// initialisers, page faults in 38 MB): a tenth of every kubectl exec.
package exechelper

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Command is the first argument of the helper, whichever binary runs
// it: cmd/pinrt-exec, or the daemon's own as a hidden subcommand when
// that one is not installed. Each main dispatches it to Main:
//
//	if len(os.Args) > 1 && os.Args[1] == exechelper.Command {
//		os.Exit(exechelper.Main(os.Args[2:]))
//	}
//
// In the foreground, runc copies the process's output through pipes of its
// own and exits only when every holder of them closed, so a background
// child (`sh -c 'daemon & echo started'`) would hold the exec open. With
// --detach the process gets the caller's stdio directly, but runc exits at
// once and the exit code is lost. The helper runs the detached runc as a
// child subreaper: the exec'd process is reparented to it, and it exits
// with that process's status, as containerd's shim and conmon do.
const Command = "__pinrt-exec-helper"

// Main runs `<runtime> <args...>` (a `runc exec --detach
// --pid-file <pidFile> ...`) and returns the exec'd process's exit code:
// args are <pidFile> <runtime> <args...>.
func Main(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: "+Command+" <pid-file> <runtime> <args...>")
		return 255
	}
	pidFile := args[0]
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "exec helper: PR_SET_CHILD_SUBREAPER:", err)
		return 255
	}
	c := exec.Command(args[1], args[2:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.WaitDelay = time.Second
	if err := c.Run(); err != nil {
		// runc said why on stderr, which is the client's.
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, "exec helper:", err)
		return 255
	}
	b, err := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		fmt.Fprintln(os.Stderr, "exec helper: no pid from the runtime:", err)
		return 255
	}
	// Orphans of the exec'd process are reparented here as well; reap
	// them along the way.
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "exec helper: lost the exec'd process:", err)
			return 255
		}
		if wpid != pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}
