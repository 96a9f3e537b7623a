package test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestAttachAnyRunRootLength runs a container with stdin under run
// directories of the lengths that broke attach, attaches to it (stdin in,
// stdout out) and execs in it, restarts the daemon and does both again
// on the same container, then removes the pod and checks nothing is left.
//
// Attach used to go through conmon's link <runroot>/oci/runc/attach/<id>
// (--socket-dir-path). conmon cuts a link of exactly 107 bytes by one
// byte, which a 26-byte runroot hits with a 64-byte ID: attach then found
// no socket at all. The long case puts both the runroot and the root,
// where the bundle and its socket are, far beyond sun_path's 108 bytes.
func TestAttachAnyRunRootLength(t *testing.T) {
	const id64, handler = 64, "runc"
	tests := []struct {
		name             string
		runRoot, rootLen int
	}{
		{"link of exactly 107 bytes", 107 - id64 - len("/oci/"+handler+"/attach/"), 0},
		{"runroot and root of 150 bytes", 150, 150},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newCtrEnvWith(t, "", func(o *Options) { o.RunRootLen, o.RootLen = tc.runRoot, tc.rootLen })
			if len(e.d.RunRoot) != tc.runRoot {
				t.Fatalf("runroot %q is %d bytes, want %d", e.d.RunRoot, len(e.d.RunRoot), tc.runRoot)
			}
			pod, podCfg := e.pod(t, PodConfig("attachpath"))
			cfg := e.ctr("echo", "cat")
			cfg.Stdin = true
			s := &streamEnv{ctrEnv: e, pod: pod, podCfg: podCfg}
			ctr := s.runCtr(t, cfg)
			s.attachEcho(t, ctr, "before restart")
			if out, _, err := s.streamExec(t, ctr, nil, "echo", "exec ok"); err != nil || out != "exec ok\n" {
				t.Fatalf("exec: %q, %v", out, err)
			}
			// conmon outlives the daemon: the restarted daemon must find
			// the socket of a container it did not create.
			if err := e.d.Restart(); err != nil {
				t.Fatalf("restart: %v", err)
			}
			s.attachEcho(t, ctr, "after restart")
			if out, _, err := s.streamExec(t, ctr, strings.NewReader("from stdin\n"), "cat"); err != nil || out != "from stdin\n" {
				t.Fatalf("exec after restart: %q, %v", out, err)
			}
			if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
				t.Fatalf("RemovePodSandbox: %v", err)
			}
			left := append(e.d.Leftovers(), e.containerLeftovers()...)
			left = append(left, attachLeftovers(e.d.RunRoot)...)
			if len(left) > 0 {
				t.Errorf("left after removing the pod: %v", left)
			}
		})
	}
}

// attachEcho attaches to a `cat` with stdin and checks that a line sent
// comes back on stdout; closing stdin detaches.
func (s *streamEnv) attachEcho(t *testing.T, id, line string) {
	t.Helper()
	inR, inW := io.Pipe()
	var out lockedBuffer
	var streamErr error
	ended := make(chan struct{})
	u := s.attachURL(t, id, false)
	go func() {
		streamErr = spdyStream(Ctx(t), u, streamOpts{stdin: inR, stdout: &out, stderr: io.Discard})
		// Writes to a stream that ended must fail, not block.
		inR.CloseWithError(io.ErrClosedPipe)
		close(ended)
	}()
	waitFor(t, 10*time.Second, fmt.Sprintf("the echo of %q through attach", line), func() bool {
		select {
		case <-ended:
			t.Fatalf("attach ended before %q came back: %v (stdout %q)", line, streamErr, out.String())
		default:
		}
		fmt.Fprintln(inW, line)
		time.Sleep(100 * time.Millisecond)
		return strings.Contains(out.String(), line)
	})
	inW.Close()
	select {
	case <-ended:
		if streamErr != nil {
			t.Fatalf("attach ended with %v", streamErr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("attach did not end after the client's stdin closed")
	}
}

// attachLeftovers lists what is under every handler's attach link
// directory, <runroot>/oci/<handler>/attach, which conmon filled with a
// link per container before --full-attach.
func attachLeftovers(runRoot string) []string {
	dirs, _ := filepath.Glob(filepath.Join(runRoot, "oci", "*", "attach"))
	var left []string
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, en := range entries {
			left = append(left, filepath.Join(d, en.Name()))
		}
	}
	return left
}

// TestAttachAfterUpgrade creates a container with an older pinrt
// ($PINRT_E2E_OLD_BINARY, which passed conmon --socket-dir-path) under
// the 26-byte runroot whose link conmon cut, restarts into this pinrt, and
// attaches: the socket is found in the bundle. Removing the pod removes
// the old link and its directory. Skipped without an old binary.
func TestAttachAfterUpgrade(t *testing.T) {
	old := os.Getenv("PINRT_E2E_OLD_BINARY")
	if old == "" {
		t.Skip("PINRT_E2E_OLD_BINARY names no older pinrt to upgrade from")
	}
	e := newCtrEnvWith(t, "", func(o *Options) { o.RunRootLen, o.Binary = 26, old })
	pod, podCfg := e.pod(t, PodConfig("upgrade"))
	cfg := e.ctr("echo", "cat")
	cfg.Stdin = true
	s := &streamEnv{ctrEnv: e, pod: pod, podCfg: podCfg}
	ctr := s.runCtr(t, cfg)
	links := attachLeftovers(e.d.RunRoot)
	if len(links) != 1 {
		t.Fatalf("the old pinrt left links %v, want conmon's one", links)
	}
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	e.d.opts.Binary = ""
	if err := e.d.Start(); err != nil {
		t.Fatal(err)
	}
	s.attachEcho(t, ctr, "after the upgrade")
	if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if left := attachLeftovers(e.d.RunRoot); len(left) > 0 {
		t.Errorf("links left after removing the pod: %v", left)
	}
	if dir := filepath.Dir(links[0]); pathExists(dir) {
		t.Errorf("%s is left after its last link was removed", dir)
	}
}

func pathExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// oldConmon answers --help as a conmon before 2.0.23 does: no
// --full-attach.
const oldConmon = `#!/bin/sh
echo 'Application Options:'
echo '  --socket-dir-path            Location of container attach sockets'
echo '  --version                    Print the version and exit'
`

// TestOldConmonStopsStart checks that a conmon without --full-attach is
// refused when the daemon starts, with a message naming the option and
// the limit, instead of failing every container create.
func TestOldConmonStopsStart(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "conmon")
	if err := os.WriteFile(fake, []byte(oldConmon), 0o755); err != nil {
		t.Fatal(err)
	}
	d := NewDaemon(t, Options{Config: fmt.Sprintf("[runtime]\nconmon = %q\n", fake)})
	out, err := runWithTimeout(exec.Command(Binary(t), d.Args()...), 20*time.Second)
	if err == nil {
		t.Fatalf("pinrt started with a conmon that has no --full-attach:\n%s", out)
	}
	for _, want := range []string{fake, "--full-attach", "107 bytes"} {
		if !strings.Contains(out, want) {
			t.Errorf("message %q does not name %q", out, want)
		}
	}
	if _, err := os.Stat(d.Socket); !os.IsNotExist(err) {
		t.Errorf("a socket exists after a failed start: %v", err)
	}
}
