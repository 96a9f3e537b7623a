package cni

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
)

// TestExecHelper is the "daemon" of TestPluginsDieWithTheDaemon: it runs
// the plugin named by PINRT_CNI_PLUGIN through pinrt's exec, or libcni's
// own with PINRT_CNI_EXEC=raw, and is killed while it waits.
func TestExecHelper(t *testing.T) {
	plugin := os.Getenv("PINRT_CNI_PLUGIN")
	if plugin == "" {
		t.Skip("run by TestPluginsDieWithTheDaemon")
	}
	e := newPluginExec()
	if os.Getenv("PINRT_CNI_EXEC") == "raw" {
		e = &invoke.DefaultExec{RawExec: &invoke.RawExec{}}
	}
	_, _ = e.ExecPlugin(context.Background(), plugin, nil, os.Environ())
}

// TestPluginsDieWithTheDaemon: a plugin running when the daemon is
// SIGKILLed dies with it. With libcni's own exec it runs on.
func TestPluginsDieWithTheDaemon(t *testing.T) {
	dir := t.TempDir()
	plugin := filepath.Join(dir, "plugin")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho $$ > \"$PIDFILE.tmp\" && mv \"$PIDFILE.tmp\" \"$PIDFILE\"\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"pinrt", "raw"} {
		t.Run(mode, func(t *testing.T) {
			pidFile := filepath.Join(dir, mode+".pid")
			helper := exec.Command(os.Args[0], "-test.run=^TestExecHelper$")
			helper.Env = append(os.Environ(), "PINRT_CNI_PLUGIN="+plugin, "PINRT_CNI_EXEC="+mode, "PIDFILE="+pidFile)
			if err := helper.Start(); err != nil {
				t.Fatal(err)
			}
			var pid int
			for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
				if b, err := os.ReadFile(pidFile); err == nil {
					pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				}
				if time.Now().After(deadline) {
					_ = helper.Process.Kill()
					t.Fatal("the plugin never started")
				}
			}
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			_ = helper.Process.Kill()
			_ = helper.Wait()
			gone := false
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if !alive(pid) {
					gone = true
					break
				}
			}
			if want := mode == "pinrt"; gone != want {
				t.Errorf("plugin %d gone after the daemon's SIGKILL: %v, want %v", pid, gone, want)
			}
		})
	}
}

// TestPluginOutlivesEndedThreads: the death signal follows the thread
// that forked the plugin, so threads other goroutines end (as
// osthread.Go does) while the plugin runs must not kill it.
func TestPluginOutlivesEndedThreads(t *testing.T) {
	plugin := filepath.Join(t.TempDir(), "plugin")
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\nsleep 0.5\necho '{\"cniVersion\":\"1.0.0\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				done := make(chan struct{})
				go func() {
					runtime.LockOSThread() // never unlocked: the thread ends
					close(done)
				}()
				<-done
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	var errs sync.Map
	var runs sync.WaitGroup
	for i := range 4 {
		runs.Add(1)
		go func() {
			defer runs.Done()
			if _, err := newPluginExec().ExecPlugin(context.Background(), plugin, nil, os.Environ()); err != nil {
				errs.Store(i, err)
			}
		}()
	}
	runs.Wait()
	errs.Range(func(k, v any) bool {
		t.Errorf("plugin run %v: %v", k, v)
		return true
	})
}

// TestPluginChildHoldingOutput: a process a plugin leaves behind with
// its stdout and stderr (a helper it daemonized, an IPAM plugin it ran
// with its own stdio) must not hold the ADD once the plugin has exited
// or its context is done: the pipes are closed after a bounded wait.
func TestPluginChildHoldingOutput(t *testing.T) {
	tests := []struct {
		name    string
		script  string // after the child is started
		timeout time.Duration
		want    string // stdout; "" means an error
	}{
		{name: "plugin exits", script: "echo '{\"cniVersion\":\"1.0.0\"}'\n", timeout: time.Minute, want: "{\"cniVersion\":\"1.0.0\"}\n"},
		{name: "context done", script: "exec sleep 120\n", timeout: 200 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			plugin, pidFile := filepath.Join(dir, "plugin"), filepath.Join(dir, "child.pid")
			script := "#!/bin/sh\nsleep 40 &\necho $! > " + pidFile + "\n" + tc.script
			if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if b, err := os.ReadFile(pidFile); err == nil {
					if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			start := time.Now()
			out, err := newPluginExec().ExecPlugin(ctx, plugin, nil, os.Environ())
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("ExecPlugin returned after %v: held by the plugin's child", d)
			}
			if tc.want == "" {
				if err == nil {
					t.Fatalf("ExecPlugin() = %q, nil; want an error", out)
				}
				return
			}
			if err != nil || string(out) != tc.want {
				t.Fatalf("ExecPlugin() = %q, %v; want %q", out, err, tc.want)
			}
		})
	}
}
