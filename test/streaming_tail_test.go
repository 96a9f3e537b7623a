package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// blobMB is the size of the file the tail tests copy out: kubectl cp of
// 20 MB lost its tail in the VM's Kubernetes node.
const blobMB = 24

// digest is the size and SHA-256 of an output.
type digest struct {
	size int64
	sum  string
}

// slowSink hashes what it is given, sleeping on every write as a client
// behind a slow link does, and once, for pause, when pauseAt bytes came:
// the output's end then waits in the socket buffers, with the exec over,
// while the client's SPDY pings (every 5 s) still reach the daemon.
type slowSink struct {
	mu      sync.Mutex
	h       hash.Hash
	n       int64
	delay   time.Duration
	pauseAt int64
	pause   time.Duration
}

func newSlowSink(delay time.Duration) *slowSink {
	return &slowSink{h: sha256.New(), delay: delay}
}

func (w *slowSink) Write(p []byte) (int, error) {
	time.Sleep(w.delay)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pause > 0 && w.n < w.pauseAt && w.n+int64(len(p)) >= w.pauseAt {
		time.Sleep(w.pause)
	}
	w.h.Write(p)
	w.n += int64(len(p))
	return len(p), nil
}

func (w *slowSink) digest() digest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return digest{w.n, hex.EncodeToString(w.h.Sum(nil))}
}

// zeros is an endless stdin.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// tailCase is one way of copying a file out of a container.
type tailCase struct {
	name   string
	script string  // run by sh -c
	want   *digest // of the script's stdout, taken inside the container
	rounds int
	// stdin sends an endless stdin the script never reads: it waits,
	// unread, in the daemon when the exec ends.
	stdin bool
	// websocket uses the v4 WebSocket protocol instead of SPDY.
	websocket bool
	// starve stops the daemon for longer than its drain delay, again and
	// again, while the exec runs.
	starve bool
	// pause stops the client for longer than its ping period 1 MB before
	// the output's end.
	pause bool
	// within bounds the exec (a background child holds stdout for longer).
	within time.Duration
}

// testExecOutputComplete copies a 24 MB file out of a container whose CPU
// is capped, the way kubectl cp does (`tar cf -` over a streaming exec),
// to clients that read slowly, and checks every byte arrives, again and
// again: the tail was lost with exit code 0 in the VM's Kubernetes node.
func (s *streamEnv) testExecOutputComplete(t *testing.T) {
	cfg := s.ctr("tail", "sleep", "100000")
	cfg.Image.Image = s.img
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{CpuPeriod: 100000, CpuQuota: 20000}
	id := s.runCtr(t, cfg)
	s.mustExec(t, id, "dd", "if=/dev/urandom", "of=/tmp/blob", "bs=1M", "count="+strconv.Itoa(blobMB))
	tarSum := s.sumIn(t, id, "tar cf - -C /tmp blob")
	blobSum := s.sumIn(t, id, "cat /tmp/blob")
	endSum := s.sumIn(t, id, "cat /tmp/blob; printf END")
	tar := "tar cf - -C /tmp blob"
	for _, tc := range []tailCase{
		{name: "SlowClient", script: tar, want: &tarSum, rounds: 2},
		{name: "ClientPausesAtTheEnd", script: tar, want: &tarSum, rounds: 2, pause: true},
		{name: "SlowClientUnreadStdin", script: tar, want: &tarSum, rounds: 3, stdin: true},
		{name: "LastBytesAtExit", script: "cat /tmp/blob; printf END", want: &endSum, rounds: 2, pause: true},
		{name: "WebSocket", script: tar, want: &tarSum, rounds: 1, websocket: true, pause: true},
		{name: "StarvedDaemon", script: tar, want: &tarSum, rounds: 2, starve: true},
		{name: "StarvedDaemonUnreadStdin", script: tar, want: &tarSum, rounds: 1, starve: true, stdin: true},
		// The exec still ends, as kubelet expects, while a background
		// child holds stdout open: after the output drained.
		{name: "BackgroundChildHoldsStdout", script: "sleep 45 & cat /tmp/blob", want: &blobSum, rounds: 1, within: 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range tc.rounds {
				s.copyOut(t, id, tc, round)
			}
		})
	}
}

// sumIn is the digest of script's stdout, taken inside the container.
func (s *streamEnv) sumIn(t *testing.T, id, script string) digest {
	t.Helper()
	// Reading the blob twice at the container's 20 % of a CPU took more
	// than mustExec's 20 s once, under CI's load: this has 90.
	cmd := []string{"sh", "-c", fmt.Sprintf("(%s) | wc -c; (%s) | sha256sum", script, script)}
	resp, err := s.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 90})
	if err != nil || resp.ExitCode != 0 {
		t.Fatalf("ExecSync(%v): %v, exit %d, stderr %q", cmd, err, resp.GetExitCode(), resp.GetStderr())
	}
	out := string(resp.Stdout)
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("digest of %q: %q", script, out)
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n < blobMB<<20 {
		t.Fatalf("digest of %q: %q", script, out)
	}
	return digest{n, f[1]}
}

// copyOut runs tc's script once through a streaming exec and checks what
// the slow client received.
func (s *streamEnv) copyOut(t *testing.T, id string, tc tailCase, round int) {
	t.Helper()
	u := s.execURL(t, id, []string{"sh", "-c", tc.script}, tc.stdin, false)
	out, errOut := newSlowSink(3*time.Millisecond), newSlowSink(0)
	if tc.pause {
		out.pauseAt, out.pause = tc.want.size-1<<20, 6*time.Second
	}
	o := remotecommand.StreamOptions{Stdout: out, Stderr: errOut}
	if tc.stdin {
		o.Stdin = io.LimitReader(zeros{}, 1<<30)
	}
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	if tc.websocket {
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(&rest.Config{}, "GET", u.String(), "v4.channel.k8s.io")
	}
	if err != nil {
		t.Fatal(err)
	}
	if tc.starve {
		defer s.starveDaemon(t)()
	}
	ctx, cancel := context.WithTimeout(Ctx(t), 3*time.Minute)
	defer cancel()
	start := time.Now()
	err = ex.StreamWithContext(ctx, o)
	took := time.Since(start)
	got := out.digest()
	t.Logf("round %d: %d bytes in %s", round, got.size, took.Round(100*time.Millisecond))
	if err != nil || got != *tc.want {
		t.Fatalf("round %d: the client got %d of %d bytes (sha256 %s, want %s), exec error %v, stderr %d bytes",
			round, got.size, tc.want.size, got.sum, tc.want.sum, err, errOut.digest().size)
	}
	if tc.within > 0 && took > tc.within {
		t.Fatalf("round %d: the exec took %s, want at most %s: the background child held it", round, took, tc.within)
	}
}

// starveDaemon stops the daemon for longer than its output drain delay
// (2 s), again and again, until the returned function is called: a daemon
// starved of CPU, as under TCG, with every timer due when it runs again.
func (s *streamEnv) starveDaemon(t *testing.T) func() {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = s.d.Signal(syscall.SIGCONT) }()
		for {
			_ = s.d.Signal(syscall.SIGSTOP)
			select {
			case <-stop:
				return
			case <-time.After(2500 * time.Millisecond):
			}
			_ = s.d.Signal(syscall.SIGCONT)
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
		}
	}()
	return func() { close(stop); <-done }
}
