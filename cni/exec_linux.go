package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
)

// pluginExec runs CNI plugins as libcni's own exec does, but each one dies
// with the daemon (PR_SET_PDEATHSIG). Without it a plugin the daemon had
// just forked when it was SIGKILLed ran on unseen: until its execve it
// carries the daemon's environment, not the pod's CNI_CONTAINERID, so
// killStrays could not find it, and it could reserve an IP after the
// restarted daemon's DEL had released the pod's (found by make chaos:
// one host-local reservation left after 200 kills). A plugin's own
// children (the IPAM plugin it delegates to) carry the pod's ID and are
// left to killStrays.
//
// The death signal follows the thread that forked the plugin, not the
// process: the goroutine stays locked to that thread until the plugin
// has exited, so no other goroutine can end the thread under it
// (osthread.Go ends the threads it locks).
type pluginExec struct {
	*invoke.DefaultExec
}

func newPluginExec() invoke.Exec {
	return &pluginExec{DefaultExec: &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}}}
}

// textBusyRetries is how often a plugin binary being written ("text file
// busy") is tried again, a second apart, as libcni does.
const textBusyRetries = 5

// pluginWaitDelay bounds how long a plugin's output pipes are drained
// after it exited or was killed.
const pluginWaitDelay = 2 * time.Second

func (e *pluginExec) ExecPlugin(ctx context.Context, pluginPath string, stdinData []byte, environ []string) ([]byte, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var stdout, stderr bytes.Buffer
	for i := 0; ; i++ {
		stdout.Reset()
		stderr.Reset()
		c := exec.CommandContext(ctx, pluginPath)
		c.Env = environ
		c.Stdin = bytes.NewReader(stdinData)
		c.Stdout, c.Stderr = &stdout, &stderr
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		// A process the plugin left behind with its stdout or stderr (a
		// helper it daemonized, a child a killed plugin leaves) would
		// otherwise hold Run until it exits, past the plugin's exit and
		// past ctx.
		c.WaitDelay = pluginWaitDelay
		err := c.Run()
		if err == nil || errors.Is(err, exec.ErrWaitDelay) {
			// ErrWaitDelay: the plugin exited 0 and its output was read;
			// only its leftover child's pipes were closed.
			break
		}
		if i < textBusyRetries && strings.Contains(err.Error(), "text file busy") {
			time.Sleep(time.Second)
			continue
		}
		return nil, pluginErr(err, stdout.Bytes(), stderr.Bytes())
	}
	if stderr.Len() > 0 {
		_, _ = stderr.WriteTo(os.Stderr)
	}
	return stdout.Bytes(), nil
}

// pluginErr is the plugin's error as libcni reports it: the CNI error it
// printed on stdout, else its stderr.
func pluginErr(err error, stdout, stderr []byte) error {
	emsg := types.Error{}
	switch {
	case len(stdout) == 0 && len(stderr) == 0:
		emsg.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	case len(stdout) == 0:
		emsg.Msg = fmt.Sprintf("netplugin failed: %q: %v", string(stderr), err)
	default:
		if perr := json.Unmarshal(stdout, &emsg); perr != nil {
			emsg.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", string(stdout), perr)
		}
	}
	return &emsg
}
