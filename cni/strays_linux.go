package cni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// strayWait bounds how long killStrays waits for the processes it killed
// to die.
const strayWait = 5 * time.Second

// killStrays kills every plugin process still working for the pod and
// waits until they are gone. An ADD whose caller went away keeps running
// where pinrt cannot wait for it: after a SIGKILL of the daemon, the plugin
// it started runs on as an orphan, and on a cancelled ADD only the first
// plugin is killed, while the IPAM plugin it delegated to runs on. Such a
// plugin can reserve an IP after the DEL meant to release it, which then
// leaks. Plugins are found by the CNI_CONTAINERID in their environment,
// which delegated plugins inherit.
func killStrays(ctx context.Context, podID string) (int, error) {
	want := []byte("CNI_CONTAINERID=" + podID + "\x00")
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !hasEnv(env, want) {
			continue
		}
		if err := unix.Kill(pid, unix.SIGKILL); err == nil {
			pids = append(pids, pid)
		}
	}
	deadline := time.Now().Add(strayWait)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return len(pids), fmt.Errorf("plugin process %d of sandbox %s survived SIGKILL for %v", pid, podID, strayWait)
			}
			select {
			case <-ctx.Done():
				return len(pids), ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return len(pids), nil
}

// hasEnv reports whether the NUL-separated environment env has the entry
// want (with its trailing NUL).
func hasEnv(env, want []byte) bool {
	return bytes.HasPrefix(env, want) || bytes.Contains(env, append([]byte{0}, want...))
}

// alive reports whether pid still runs: a zombie has stopped doing
// anything and only waits for its parent.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses and may
	// hold anything.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}
