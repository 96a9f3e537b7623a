package test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/pinrt/pinrt/internal/exechelper"
	"github.com/pinrt/pinrt/test/testimage"
)

// httpServer is the port-forward target: it listens on the pod's
// loopback only, so a forward that reached it went through the pod's netns.
const httpServer = `package main

import (
	"fmt"
	"net"
	"net/http"
)

func main() {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.URL.Path)
	})
	http.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	l, err := net.Listen("tcp4", "127.0.0.1:8080")
	if err != nil {
		panic(err)
	}
	panic(http.Serve(l, nil))
}
`

// streamEnv is a userns pod with an HTTP server container and a container
// that echoes its stdin.
type streamEnv struct {
	*ctrEnv
	pod, server, echo string
	// img is the suite's image (tar and sha256sum among its applets).
	img    string
	podCfg *runtimeapi.PodSandboxConfig
	// ctrs is every container the suite ran, for the final leak check.
	ctrs []string
}

// runCtr runs a container in the suite's pod and remembers it.
func (s *streamEnv) runCtr(t *testing.T, cfg *runtimeapi.ContainerConfig) string {
	t.Helper()
	id := s.run(t, s.pod, s.podCfg, cfg)
	s.ctrs = append(s.ctrs, id)
	return id
}

func TestStreaming(t *testing.T) {
	e := newCtrEnv(t)
	img := e.pushStreamImage(t)
	pod, podCfg := e.pod(t, UsernsPod(PodConfig("stream"), 0))
	srv := e.ctr("server", "/bin/httpserver")
	srv.Image.Image = img
	echo := e.ctr("echo", "cat")
	echo.Image.Image = img
	echo.Stdin = true
	s := &streamEnv{ctrEnv: e, pod: pod, podCfg: podCfg, img: img}
	s.server = s.runCtr(t, srv)
	s.echo = s.runCtr(t, echo)

	t.Run("ExecEcho", s.testExecEcho)
	t.Run("ExecUserns", s.testExecUserns)
	t.Run("ExecBackground", s.testExecBackground)
	t.Run("ExecWebSocket", s.testExecWebSocket)
	t.Run("WebSocketV5", s.testWebSocketV5)
	t.Run("WebSocketV5ClientGone", s.testWebSocketV5ClientGone)
	t.Run("ExecExitCode", s.testExecExitCode)
	t.Run("ExecStdin", s.testExecStdin)
	t.Run("ExecTTYResize", s.testExecTTY)
	t.Run("ExecTTYStdinEnds", s.testExecTTYStdinEnds)
	t.Run("Tar", s.testTar)
	t.Run("ExecOutputComplete", s.testExecOutputComplete)
	t.Run("Attach", s.testAttach)
	t.Run("AttachStdinOnce", func(t *testing.T) { s.testAttachStdinOnce(t, img) })
	t.Run("AttachTTYResize", func(t *testing.T) { s.testAttachTTY(t, img) })
	t.Run("PortForward", s.testPortForward)
	t.Run("PortForwardClosedPort", s.testPortForwardClosed)
	t.Run("PortForwardWebSocket", s.testPortForwardWebSocket)
	t.Run("PortForwardUploadAnsweredEarly", s.testPortForwardUpload)
	t.Run("TokenSingleUse", s.testTokenSingleUse)
	t.Run("BadRequests", s.testBadRequests)
	t.Run("ClientGoneEndsStreams", s.testClientGone)
	t.Run("ContainerExitEndsStreams", s.testContainerExit)
	t.Run("StopPodClosesForward", s.testStopPodClosesForward)
	// Last, after every stream of the suite has ended.
	t.Run("NoLeaks", s.testNoLeaks)
}

// pushStreamImage pushes and pulls the streaming tests' image: busybox
// with the HTTP server as /bin/httpserver, and stty, tar and sha256sum.
func (e *ctrEnv) pushStreamImage(t *testing.T) string {
	t.Helper()
	var extra []testimage.File
	for _, a := range []string{"stty", "tar", "sha256sum"} {
		extra = append(extra, testimage.File{Path: "bin/" + a, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	img := e.reg.Push(t, "stream:1", testimage.Build(t, testimage.Spec{
		Programs: map[string]string{"/bin/httpserver": httpServer},
		Layers:   [][]testimage.File{extra},
	}))
	e.pull(t, img)
	return img
}

// execURL asks for an exec URL the way kubelet does.
func (s *streamEnv) execURL(t *testing.T, id string, cmd []string, stdin, tty bool) *url.URL {
	t.Helper()
	resp, err := s.d.Runtime.Exec(Ctx(t), &runtimeapi.ExecRequest{
		ContainerId: id, Cmd: cmd, Stdin: stdin, Stdout: true, Stderr: !tty, Tty: tty,
	})
	if err != nil {
		t.Fatalf("Exec(%v): %v", cmd, err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// streamOpts are the client's side of an exec or attach.
type streamOpts struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	tty    bool
	sizes  remotecommand.TerminalSizeQueue
}

func spdyStream(ctx context.Context, u *url.URL, o streamOpts) error {
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{
		Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr, Tty: o.tty, TerminalSizeQueue: o.sizes,
	})
}

// exec runs cmd through a SPDY exec and returns stdout, stderr and the
// stream error.
func (s *streamEnv) streamExec(t *testing.T, id string, stdin io.Reader, cmd ...string) (string, string, error) {
	t.Helper()
	u := s.execURL(t, id, cmd, stdin != nil, false)
	var out, errOut bytes.Buffer
	err := spdyStream(Ctx(t), u, streamOpts{stdin: stdin, stdout: &out, stderr: &errOut})
	return out.String(), errOut.String(), err
}

// testBadRequests: what cannot run is refused as the caller's fault
// before a URL is handed out. A NUL in an exec's command was the runtime's
// "fork/exec: invalid argument" (Unknown).
func (s *streamEnv) testBadRequests(t *testing.T) {
	_, err := s.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: s.server, Cmd: []string{"ec\x00ho"}})
	wantCode(t, err, codes.InvalidArgument, "contains a NUL byte")
	_, err = s.d.Runtime.Exec(Ctx(t), &runtimeapi.ExecRequest{ContainerId: s.server, Cmd: []string{"sh", "-c\x00"}, Stdout: true})
	wantCode(t, err, codes.InvalidArgument, "contains a NUL byte")
	for _, port := range []int32{0, -1, 65536} {
		_, err = s.d.Runtime.PortForward(Ctx(t), &runtimeapi.PortForwardRequest{PodSandboxId: s.pod, Port: []int32{8080, port}})
		wantCode(t, err, codes.InvalidArgument, fmt.Sprintf("port %d is not a port", port))
	}
}

func (s *streamEnv) testExecEcho(t *testing.T) {
	out, errOut, err := s.streamExec(t, s.server, nil, "sh", "-c", "echo hello; echo oops >&2")
	if err != nil || out != "hello\n" || errOut != "oops\n" {
		t.Fatalf("exec echo: stdout %q stderr %q err %v", out, errOut, err)
	}
}

// testExecUserns checks that a streaming exec joins the pod's user
// namespace: the process sees the pod's mapping, not the host's identity
// mapping, and runs as the container's root.
func (s *streamEnv) testExecUserns(t *testing.T) {
	_, info := s.d.PodStatus(t, s.pod)
	if len(info.UIDMappings) != 1 || info.UIDMappings[0].HostID == 0 {
		t.Fatalf("pod mappings %+v, want one allocated range", info.UIDMappings)
	}
	m := info.UIDMappings[0]
	out, errOut, err := s.streamExec(t, s.server, nil, "cat", "/proc/self/uid_map")
	if err != nil {
		t.Fatalf("exec cat uid_map: %v (stderr %q)", err, errOut)
	}
	got := strings.Join(strings.Fields(out), " ")
	if want := fmt.Sprintf("%d %d %d", m.ContainerID, m.HostID, m.Size); got != want {
		t.Errorf("uid_map through a streaming exec = %q, want the pod's %q (not the host's 0 0 4294967295)", got, want)
	}
	out, errOut, err = s.streamExec(t, s.server, nil, "id", "-u")
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Errorf("id -u through a streaming exec = %q, %v (stderr %q), want 0", out, err, errOut)
	}
}

// A background process that keeps the output pipes open does not hold the
// exec open past the command's exit.
func (s *streamEnv) testExecBackground(t *testing.T) {
	start := time.Now()
	out, _, err := s.streamExec(t, s.server, nil, "sh", "-c", "sleep 30 & echo started")
	if err != nil || out != "started\n" {
		t.Fatalf("exec with a background child: %q, %v", out, err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("exec took %v: the background child held it", d)
	}
}

func (s *streamEnv) testExecWebSocket(t *testing.T) {
	u := s.execURL(t, s.server, []string{"echo", "over websocket"}, false, false)
	// cri-streaming's own WebSocket side, up to v4.channel.k8s.io.
	ex, err := remotecommand.NewWebSocketExecutorForProtocols(&rest.Config{}, "GET", u.String(), "v4.channel.k8s.io")
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err = ex.StreamWithContext(Ctx(t), remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || out.String() != "over websocket\n" {
		t.Fatalf("websocket exec: stdout %q stderr %q err %v", out.String(), errOut.String(), err)
	}
}

// wsStream is spdyStream over WebSocket with v5.channel.k8s.io,
// client-go's WebSocket executor as crictl --transport websocket and
// critest -websocket-exec use it.
func wsStream(ctx context.Context, u *url.URL, o streamOpts) error {
	ex, err := remotecommand.NewWebSocketExecutor(&rest.Config{}, "GET", u.String())
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{
		Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr, Tty: o.tty, TerminalSizeQueue: o.sizes,
	})
}

// testWebSocketV5: exec and attach over WebSocket v5, which pinrt
// translates to the library's SPDY: both output streams, stdin to its
// end (v5's close signal), the exit code, single-use tokens across both
// transports and a token never handed out.
func (s *streamEnv) testWebSocketV5(t *testing.T) {
	ctx := Ctx(t)
	u := s.execURL(t, s.server, []string{"sh", "-c", "echo out; echo err >&2"}, false, false)
	var out, errOut bytes.Buffer
	if err := wsStream(ctx, u, streamOpts{stdout: &out, stderr: &errOut}); err != nil || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Fatalf("v5 exec: stdout %q stderr %q err %v; want \"out\\n\", \"err\\n\", nil", out.String(), errOut.String(), err)
	}
	if err := spdyStream(ctx, u, streamOpts{stdout: io.Discard, stderr: io.Discard}); err == nil {
		t.Error("a token used over WebSocket was accepted again over SPDY")
	}
	if err := wsStream(ctx, u, streamOpts{stdout: io.Discard, stderr: io.Discard}); err == nil {
		t.Error("a token used over WebSocket was accepted again")
	}

	// cat ends only when stdin does.
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	u = s.execURL(t, s.server, []string{"cat"}, true, false)
	out.Reset()
	errOut.Reset()
	if err := wsStream(ctx, u, streamOpts{stdin: bytes.NewReader(data), stdout: &out, stderr: &errOut}); err != nil {
		t.Fatalf("v5 exec cat: %v (stderr %q)", err, errOut.String())
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("v5 cat returned %d bytes, want the %d sent byte for byte", out.Len(), len(data))
	}

	u = s.execURL(t, s.server, []string{"sh", "-c", "exit 3"}, false, false)
	var ee utilexec.ExitError
	if err := wsStream(ctx, u, streamOpts{stdout: io.Discard, stderr: io.Discard}); !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("v5 exec exit 3: got %v (%T), want an exit error with code 3", err, err)
	}

	// A TTY with a resize: stty reports the size the client set.
	u = s.execURL(t, s.server, []string{"sh"}, true, true)
	inR, inW := io.Pipe()
	var term lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- wsStream(ctx, u, streamOpts{stdin: inR, stdout: &term, tty: true, sizes: oneSize(91, 17)})
	}()
	sendUntil(t, inW, "stty size\n", &term, "17 91")
	fmt.Fprintf(inW, "exit 0\n")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("v5 exec with a TTY: %v\n%s", err, term.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("v5 exec with a TTY did not end after exit:\n%s", term.String())
	}
	inW.Close()

	bad := *u
	bad.Path = path.Join(path.Dir(u.Path), "notatoken")
	if err := wsStream(ctx, &bad, streamOpts{stdout: io.Discard}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("v5 exec with a token never handed out: %v, want a 404", err)
	}

	// Attach to the echoing container; the end of stdin detaches.
	resp, err := s.d.Runtime.Attach(ctx, &runtimeapi.AttachRequest{ContainerId: s.echo, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	au, _ := url.Parse(resp.Url)
	inR, inW = io.Pipe()
	term = lockedBuffer{}
	go func() { done <- wsStream(ctx, au, streamOpts{stdin: inR, stdout: &term, stderr: io.Discard}) }()
	sendUntil(t, inW, "over v5\n", &term, "over v5")
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("v5 attach: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a v5 attach did not end with its stdin")
	}
	if st := s.status(t, s.echo); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container is %v after a v5 attach detached, want running", st.State)
	}
}

// testWebSocketV5ClientGone: a v5 exec whose client goes away ends, as
// its SPDY twin does (testClientGone).
func (s *streamEnv) testWebSocketV5ClientGone(t *testing.T) {
	s.settleStreams(t)
	ctx, cancel := context.WithCancel(Ctx(t))
	defer cancel()
	done := make(chan error, 1)
	u := s.execURL(t, s.server, []string{"sleep", "1000"}, false, false)
	go func() { done <- wsStream(ctx, u, streamOpts{stdout: io.Discard, stderr: io.Discard}) }()
	waitFor(t, 30*time.Second, "the exec'd sleep and its stream", func() bool {
		return execStarted(s.server) && s.streamsOpen() == 1
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not return after its context ended")
	}
	waitFor(t, 20*time.Second, "the daemon's stream ended after its client went away", func() bool {
		return s.streamsOpen() == 0
	})
	waitFor(t, 15*time.Second, "no runc exec left after the client went away", func() bool {
		return len(runcExecs(s.server)) == 0
	})
}

func (s *streamEnv) testExecExitCode(t *testing.T) {
	_, _, err := s.streamExec(t, s.server, nil, "sh", "-c", "exit 3")
	var ee utilexec.ExitError
	if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("exec exit 3: got %v (%T), want an exit error with code 3", err, err)
	}
}

func (s *streamEnv) testExecStdin(t *testing.T) {
	data := make([]byte, 10<<20)
	_, _ = rand.Read(data)
	out, errOut, err := s.streamExec(t, s.server, bytes.NewReader(data), "cat")
	if err != nil {
		t.Fatalf("exec cat: %v (stderr %q)", err, errOut)
	}
	if !bytes.Equal([]byte(out), data) {
		t.Fatalf("cat returned %d bytes, want the %d sent byte for byte", len(out), len(data))
	}
}

// sizeQueue hands the client's terminal sizes to the executor.
type sizeQueue chan remotecommand.TerminalSize

// sendUntil writes line to w every 100 ms until out shows want: a
// terminal or an attach may take a moment to pass input through.
func sendUntil(t *testing.T, w io.Writer, line string, out *lockedBuffer, want string) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%q in the output after sending %q", want, line), func() bool {
		fmt.Fprint(w, line)
		time.Sleep(100 * time.Millisecond)
		return strings.Contains(out.String(), want)
	})
}

// oneSize is a queue of one terminal size.
func oneSize(width, height uint16) sizeQueue {
	q := make(sizeQueue, 1)
	q <- remotecommand.TerminalSize{Width: width, Height: height}
	close(q)
	return q
}

func (q sizeQueue) Next() *remotecommand.TerminalSize {
	sz, ok := <-q
	if !ok {
		return nil
	}
	return &sz
}

// lockedBuffer is written by the stream and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testExecTTYStdinEnds runs TTY execs whose stdin ends at once, as
// `kubectl exec -it` with a stdin that is not a terminal does: the hangup
// that ends reaches the command, never runc before it relays signals, and
// the exit code is one client-go accepts (the command's own, or 129 for
// the hangup), never -1.
func (s *streamEnv) testExecTTYStdinEnds(t *testing.T) {
	for i := 0; i < 10; i++ {
		u := s.execURL(t, s.server, []string{"sh", "-c", "exit 3"}, true, true)
		var out lockedBuffer
		err := spdyStream(Ctx(t), u, streamOpts{stdin: strings.NewReader(""), stdout: &out, tty: true})
		var ee utilexec.ExitError
		if !errors.As(err, &ee) || (ee.ExitStatus() != 3 && ee.ExitStatus() != 129) {
			t.Fatalf("try %d: TTY exec with an ended stdin: got %v (%T), want an exit error with code 3 or 129; output %q", i, err, err, out.String())
		}
	}
}

func (s *streamEnv) testExecTTY(t *testing.T) {
	u := s.execURL(t, s.server, []string{"sh"}, true, true)
	sizes := make(sizeQueue, 2)
	sizes <- remotecommand.TerminalSize{Width: 80, Height: 24}
	inR, inW := io.Pipe()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- spdyStream(Ctx(t), u, streamOpts{stdin: inR, stdout: &out, tty: true, sizes: sizes}) }()

	defer func() {
		if t.Failed() {
			t.Logf("terminal output: %q", out.String())
		}
	}()
	// The first size may reach the terminal after the shell's first
	// prompt: ask until it did.
	sendUntil(t, inW, "stty size\n", &out, "24 80")
	sizes <- remotecommand.TerminalSize{Width: 123, Height: 45}
	// The resize travels client -> stream -> pty -> SIGWINCH to runc ->
	// the container's pty; ask until it arrived.
	sendUntil(t, inW, "stty size\n", &out, "45 123")
	fmt.Fprintf(inW, "exit 0\n")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("tty exec: %v\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("tty exec did not end after exit:\n%s", out.String())
	}
	close(sizes)
	inW.Close()

	// A client that goes away hangs the terminal up: the shell ends.
	u = s.execURL(t, s.server, []string{"sh"}, true, true)
	inR, inW = io.Pipe()
	go func() { done <- spdyStream(Ctx(t), u, streamOpts{stdin: inR, stdout: io.Discard, tty: true}) }()
	fmt.Fprintf(inW, "echo hi\n")
	inW.Close()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a tty exec whose client closed its input is still running")
	}
}

// testTar copies a 50 MB directory into the container and back with tar
// over exec, as kubectl cp does, using GNU tar on the host.
func (s *streamEnv) testTar(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("needs GNU tar on the host")
	}
	src := t.TempDir()
	for i := range 10 {
		dir := filepath.Join(src, "d"+strconv.Itoa(i%3))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 5<<20)
		_, _ = rand.Read(b)
		if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := treeSum(t, src)

	in := exec.Command("tar", "cf", "-", "-C", src, ".")
	tarIn, err := in.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := s.streamExec(t, s.server, tarIn, "sh", "-c", "mkdir -p /tmp/cp && tar xf - -C /tmp/cp")
	if werr := in.Wait(); err != nil || werr != nil {
		t.Fatalf("tar into the container: %v, %v (stderr %q)", err, werr, errOut)
	}

	dst := t.TempDir()
	out := exec.Command("tar", "xf", "-", "-C", dst)
	tarOut, err := out.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var outErr bytes.Buffer
	out.Stderr = &outErr
	if err := out.Start(); err != nil {
		t.Fatal(err)
	}
	u := s.execURL(t, s.server, []string{"tar", "cf", "-", "-C", "/tmp/cp", "."}, false, false)
	var stderr bytes.Buffer
	err = spdyStream(Ctx(t), u, streamOpts{stdout: tarOut, stderr: &stderr})
	tarOut.Close()
	if werr := out.Wait(); err != nil || werr != nil {
		t.Fatalf("tar out of the container: %v, %v (%s %s)", err, werr, stderr.String(), outErr.String())
	}
	if got := treeSum(t, dst); got != want {
		t.Fatalf("the tree that came back differs: %s, want %s", got, want)
	}
	s.mustExec(t, s.server, "rm", "-rf", "/tmp/cp")
}

// treeSum hashes every regular file's relative path and content.
func treeSum(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s *streamEnv) testAttach(t *testing.T) {
	for round := range 2 {
		s.attachDetach(t, fmt.Sprintf("ping %d", round))
		if st := s.status(t, s.echo); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container is %v after a detach, want running", st.State)
		}
	}
	// The log kept being written while attached.
	if log := readFile(t, s.status(t, s.echo).LogPath); !strings.Contains(log, "ping 1") {
		t.Fatalf("container log lacks what was echoed while attached:\n%s", log)
	}
}

// attachDetach attaches to the echo container, sends line until it
// comes back, and detaches by ending its stdin: the container is not
// stdin_once, so it keeps running.
func (s *streamEnv) attachDetach(t *testing.T, line string) {
	t.Helper()
	resp, err := s.d.Runtime.Attach(Ctx(t), &runtimeapi.AttachRequest{ContainerId: s.echo, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	u, _ := url.Parse(resp.Url)
	inR, inW := io.Pipe()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() { done <- spdyStream(Ctx(t), u, streamOpts{stdin: inR, stdout: &out, stderr: io.Discard}) }()
	sendUntil(t, inW, line+"\n", &out, line)
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("attach ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("attach did not end after the client's stdin closed")
	}
}

// forward starts a SPDY port-forward to port in the pod and returns the
// local port and a stop function.
func (s *streamEnv) forward(t *testing.T, port int32) (int, func()) {
	t.Helper()
	return s.forwardVia(t, port, spdyDialer)
}

// spdyDialer dials a port-forward URL over SPDY, as kubectl does.
func spdyDialer(u *url.URL) (httpstream.Dialer, error) {
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		return nil, err
	}
	return spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, "POST", u), nil
}

// webSocketDialer dials a port-forward URL with SPDY tunnelled in a
// WebSocket (crictl port-forward --transport websocket, critest
// -websocket-portforward).
func webSocketDialer(u *url.URL) (httpstream.Dialer, error) {
	return portforward.NewSPDYOverWebsocketDialerForStreaming(u, &rest.Config{})
}

// forwardVia forwards a local port to the pod's port through the dialer
// dial makes for the PortForward URL.
func (s *streamEnv) forwardVia(t *testing.T, port int32, dial func(*url.URL) (httpstream.Dialer, error)) (int, func()) {
	t.Helper()
	resp, err := s.d.Runtime.PortForward(Ctx(t), &runtimeapi.PortForwardRequest{PodSandboxId: s.pod, Port: []int32{port}})
	if err != nil {
		t.Fatalf("PortForward: %v", err)
	}
	u, _ := url.Parse(resp.Url)
	dialer, err := dial(u)
	if err != nil {
		t.Fatal(err)
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(int(port))}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("port-forward: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("port-forward not ready after 10s")
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stopFn := func() {
		once.Do(func() {
			close(stop)
			select {
			case <-errc:
			case <-time.After(10 * time.Second):
				t.Error("port-forward did not stop")
			}
		})
	}
	t.Cleanup(stopFn)
	return int(ports[0].Local), stopFn
}

func get(client *http.Client, port int, path string) (string, error) {
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func (s *streamEnv) testPortForward(t *testing.T) {
	local, stop := s.forward(t, 8080)
	defer stop()
	// A fresh connection per request: each is its own stream pair.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 100 {
		got, err := get(client, local, "/seq/"+strconv.Itoa(i))
		if want := "hello /seq/" + strconv.Itoa(i); err != nil || got != want {
			t.Fatalf("request %d: %q, %v; want %q", i, got, err, want)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := get(client, local, "/par/"+strconv.Itoa(i))
			if want := "hello /par/" + strconv.Itoa(i); err != nil || got != want {
				errs <- fmt.Errorf("concurrent request %d: %q, %w", i, got, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testPortForwardWebSocket: a port-forward whose SPDY is tunnelled in a
// WebSocket (crictl port-forward --transport websocket, critest
// -websocket-portforward) carries requests as the plain one does.
func (s *streamEnv) testPortForwardWebSocket(t *testing.T) {
	local, stop := s.forwardVia(t, 8080, webSocketDialer)
	defer stop()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 20 {
		got, err := get(client, local, "/ws/"+strconv.Itoa(i))
		if want := "hello /ws/" + strconv.Itoa(i); err != nil || got != want {
			t.Fatalf("request %d through the tunnel: %q, %v; want %q", i, got, err, want)
		}
	}
}

// testPortForwardUpload: uploads the pod's server answers without reading
// them (its handler ignores the body; Go's server then half-closes, and
// resets 500 ms later), as agnhost's netexec answers Kubernetes'
// port-forward spec. Every answer must reach its client, and no upload's
// unread rest may stall the forwards after it, over SPDY as over the
// WebSocket tunnel.
func (s *streamEnv) testPortForwardUpload(t *testing.T) {
	dialers := map[string]func(*url.URL) (httpstream.Dialer, error){"SPDY": spdyDialer, "WebSocket": webSocketDialer}
	for name, dial := range dialers {
		t.Run(name, func(t *testing.T) {
			local, stop := s.forwardVia(t, 8080, dial)
			defer stop()
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			for i := range 20 {
				size := 1<<20 + i*(3<<20)/20
				path := "/upload/" + strconv.Itoa(i)
				resp, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d%s", local, path), "text/plain", bytes.NewReader(make([]byte, size)))
				if err != nil {
					t.Fatalf("upload %d of %d bytes: %v", i, size, err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := "hello " + path; err != nil || string(b) != want {
					t.Fatalf("upload %d of %d bytes: %q, %v; want %q", i, size, b, err, want)
				}
			}
		})
	}
}

func (s *streamEnv) testPortForwardClosed(t *testing.T) {
	local, stop := s.forward(t, 8081)
	defer stop()
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	got, err := get(client, local, "/")
	if err == nil {
		t.Fatalf("request to a closed port answered %q", got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a closed port took %v to fail: %v", d, err)
	}

	// What kubectl prints comes from the error stream: speak the
	// protocol as client-go's port-forwarder does and read that stream.
	msg := s.forwardError(t, 8081)
	if !strings.Contains(msg, "connection refused") || !strings.Contains(msg, "8081") {
		t.Fatalf("error stream of a forward to a closed port = %q, want the connection refused for port 8081", msg)
	}
}

// forwardError opens one port-forward stream pair to port, the way
// client-go's PortForwarder does for each local connection, and returns
// what the server wrote on the error stream before ending it.
func (s *streamEnv) forwardError(t *testing.T, port int32) string {
	t.Helper()
	resp, err := s.d.Runtime.PortForward(Ctx(t), &runtimeapi.PortForwardRequest{PodSandboxId: s.pod, Port: []int32{port}})
	if err != nil {
		t.Fatalf("PortForward: %v", err)
	}
	u, _ := url.Parse(resp.Url)
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	conn, _, err := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", u).Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		t.Fatalf("dialing the port-forward URL: %v", err)
	}
	defer conn.Close()
	// The header names and values of k8s.io/api/core/v1 (StreamType,
	// PortHeader, PortForwardRequestIDHeader).
	h := http.Header{}
	h.Set("streamType", "error")
	h.Set("port", strconv.Itoa(int(port)))
	h.Set("requestID", "0")
	errStream, err := conn.CreateStream(h)
	if err != nil {
		t.Fatalf("creating the error stream: %v", err)
	}
	errStream.Close() // the client never writes to it
	h.Set("streamType", "data")
	if _, err := conn.CreateStream(h); err != nil {
		t.Fatalf("creating the data stream: %v", err)
	}
	type result struct {
		b   []byte
		err error
	}
	read := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(errStream)
		read <- result{b, err}
	}()
	select {
	case r := <-read:
		if r.err != nil {
			t.Fatalf("reading the error stream: %v (read %q)", r.err, r.b)
		}
		return string(r.b)
	case <-time.After(20 * time.Second):
		t.Fatal("the error stream of a forward to a closed port did not end")
	}
	return ""
}

func (s *streamEnv) testTokenSingleUse(t *testing.T) {
	u := s.execURL(t, s.server, []string{"true"}, false, false)
	if err := spdyStream(Ctx(t), u, streamOpts{stdout: io.Discard, stderr: io.Discard}); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if err := spdyStream(Ctx(t), u, streamOpts{stdout: io.Discard, stderr: io.Discard}); err == nil {
		t.Fatal("a used token was accepted again")
	}
	// Tokens expire after the library's one-minute TTL.
	if testing.Short() {
		t.Skip("the expiry check waits a minute")
	}
	u = s.execURL(t, s.server, []string{"true"}, false, false)
	time.Sleep(61 * time.Second)
	if err := spdyStream(Ctx(t), u, streamOpts{stdout: io.Discard, stderr: io.Discard}); err == nil {
		t.Fatal("an expired token was accepted")
	}
}

// testClientGone checks that an exec and an attach whose client goes away
// end, although the container is silent and neither has stdin: nothing is
// read or written that could fail, so only the end of the connection can
// tell the daemon.
func (s *streamEnv) testClientGone(t *testing.T) {
	id := s.runCtr(t, s.ctr("silent", "sleep", "100000"))
	s.settleStreams(t)
	ctx, cancel := context.WithCancel(Ctx(t))
	defer cancel()
	done := make(chan error, 2)
	eu := s.execURL(t, id, []string{"sleep", "1000"}, false, false)
	go func() { done <- spdyStream(ctx, eu, streamOpts{stdout: io.Discard, stderr: io.Discard}) }()
	resp, err := s.d.Runtime.Attach(Ctx(t), &runtimeapi.AttachRequest{ContainerId: id, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	au, _ := url.Parse(resp.Url)
	go func() { done <- spdyStream(ctx, au, streamOpts{stdout: io.Discard, stderr: io.Discard}) }()
	waitFor(t, 15*time.Second, "the exec'd sleep, under pinrt-exec alone, and both streams", func() bool {
		return execStarted(id) && s.streamsOpen() == 2
	})
	// Let the attach reach conmon's socket: only its stream start shows.
	time.Sleep(time.Second)

	cancel()
	for range 2 {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a client did not return after its context ended")
		}
	}
	waitFor(t, 20*time.Second, "the daemon's streams ended after their client went away", func() bool {
		return s.streamsOpen() == 0
	})
	waitFor(t, 15*time.Second, "no runc exec left after the exec's client went away", func() bool {
		return len(runcExecs(id)) == 0
	})
	if st := s.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("container is %v after its attach client went away, want running", st.State)
	}
}

// testContainerExit checks that an exec and an attach end when their
// container stops.
func (s *streamEnv) testContainerExit(t *testing.T) {
	id := s.runCtr(t, s.ctr("victim", "sh", "-c", "while :; do echo tick; sleep 0.2; done"))
	execDone := make(chan error, 1)
	u := s.execURL(t, id, []string{"sleep", "1000"}, false, false)
	go func() { execDone <- spdyStream(Ctx(t), u, streamOpts{stdout: io.Discard, stderr: io.Discard}) }()
	resp, err := s.d.Runtime.Attach(Ctx(t), &runtimeapi.AttachRequest{ContainerId: id, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	au, _ := url.Parse(resp.Url)
	var out lockedBuffer
	attachDone := make(chan error, 1)
	go func() { attachDone <- spdyStream(Ctx(t), au, streamOpts{stdout: &out, stderr: io.Discard}) }()
	waitFor(t, 10*time.Second, "attached output", func() bool { return strings.Contains(out.String(), "tick") })
	waitFor(t, 10*time.Second, "the exec'd sleep", func() bool { return execStarted(id) })

	if _, err := s.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 0}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	for what, ch := range map[string]chan error{"exec": execDone, "attach": attachDone} {
		select {
		case err := <-ch:
			t.Logf("%s ended with %v", what, err)
		case <-time.After(15 * time.Second):
			t.Fatalf("the %s stream stayed open after its container stopped", what)
		}
	}
	_, err = s.d.Runtime.Exec(Ctx(t), &runtimeapi.ExecRequest{ContainerId: id, Cmd: []string{"true"}, Stdout: true})
	wantCode(t, err, codes.FailedPrecondition, "not running")
}

// attachURL asks for an attach URL with stdin and stdout.
func (s *streamEnv) attachURL(t *testing.T, id string, tty bool) *url.URL {
	t.Helper()
	resp, err := s.d.Runtime.Attach(Ctx(t), &runtimeapi.AttachRequest{ContainerId: id, Stdin: true, Stdout: true, Stderr: !tty, Tty: tty})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	u, _ := url.Parse(resp.Url)
	return u
}

// testAttachStdinOnce checks that the end of the attached client's stdin
// closes a stdin_once container's stdin: cat sees EOF and exits.
func (s *streamEnv) testAttachStdinOnce(t *testing.T, img string) {
	cfg := s.ctr("once", "cat")
	cfg.Image.Image = img
	cfg.Stdin, cfg.StdinOnce = true, true
	id := s.runCtr(t, cfg)
	var out lockedBuffer
	err := spdyStream(Ctx(t), s.attachURL(t, id, false), streamOpts{stdin: strings.NewReader("once\n"), stdout: &out, stderr: io.Discard})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	if st := s.waitExit(t, id, 10*time.Second); st.ExitCode != 0 {
		t.Fatalf("cat exited %d after its stdin closed", st.ExitCode)
	}
	if !strings.Contains(out.String(), "once") {
		t.Fatalf("attach output %q lacks the echo", out.String())
	}
}

// testAttachTTY resizes an attached TTY through conmon's control fifo.
func (s *streamEnv) testAttachTTY(t *testing.T, img string) {
	cfg := s.ctr("tty", "sh")
	cfg.Image.Image = img
	cfg.Stdin, cfg.Tty = true, true
	id := s.runCtr(t, cfg)
	sizes := make(sizeQueue, 1)
	sizes <- remotecommand.TerminalSize{Width: 77, Height: 33}
	inR, inW := io.Pipe()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- spdyStream(Ctx(t), s.attachURL(t, id, true), streamOpts{stdin: inR, stdout: &out, tty: true, sizes: sizes})
	}()
	sendUntil(t, inW, "stty size\n", &out, "33 77")
	inW.Close()
	close(sizes)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("attach did not end after the client's stdin closed")
	}
	if st := s.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("tty container is %v after a detach, want running", st.State)
	}
}

// streamsOpen is the number of streams the daemon started and has not
// finished, from its debug log. Counting both kinds of lines, rather than
// reading the last count logged, holds when two streams end together and
// log out of order, and when a stream that never ended follows one that
// did.
// settleStreams waits until the streams of earlier tests have ended:
// their "stream finished" lines come a little after their clients
// return. The daemon's stream count is then 0.
func (s *streamEnv) settleStreams(t *testing.T) {
	t.Helper()
	waitFor(t, 20*time.Second, "the earlier tests' streams to end", func() bool { return s.streamsOpen() == 0 })
}

func (s *streamEnv) streamsOpen() int {
	log := s.d.Log()
	return strings.Count(log, `msg="stream started"`) - strings.Count(log, `msg="stream finished"`)
}

// testNoLeaks runs after every other streaming test: no `runc exec` or
// exec helper is left in any container the suite ran, and the daemon's
// stream count is back at zero.
func (s *streamEnv) testNoLeaks(t *testing.T) {
	if !strings.Contains(s.d.Log(), `msg="stream started"`) {
		t.Skip("no stream was logged: none ran, or the daemon does not log at debug")
	}
	waitFor(t, 15*time.Second, "no runc exec processes", func() bool { return len(runcExecs(s.ctrs...)) == 0 })
	waitFor(t, 15*time.Second, "the active stream count back at 0", func() bool { return s.streamsOpen() == 0 })
}

// runcExecs lists the command lines of running `runc exec` processes, and
// of pinrt's exec helpers that wait for them, in the containers ids.
// execStarted reports whether the one exec in ids' containers is past its
// start: only its helper, pinrt-exec (its own small binary, beside the
// daemon's), is left, and the pid file runc wrote names a live process.
// A count of exec processes alone caught the start too, and under load
// saw the helper before runc, then both.
func execStarted(ids ...string) bool {
	execs := runcExecs(ids...)
	if len(execs) != 1 {
		return false
	}
	args := strings.Fields(execs[0]) // helper, its command, the pid file, runc...
	if len(args) < 3 || filepath.Base(args[0]) != "pinrt-exec" || args[1] != exechelper.Command {
		return false
	}
	b, err := os.ReadFile(args[2])
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && pid > 0 && unix.Kill(pid, 0) == nil
}

func runcExecs(ids ...string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		isExec := containsArg(args, exechelper.Command) || (filepath.Base(args[0]) == "runc" && containsArg(args, "exec"))
		if !isExec {
			continue
		}
		for _, id := range ids {
			if containsArg(args, id) {
				out = append(out, strings.Join(args, " "))
				break
			}
		}
	}
	return out
}

func containsArg(args []string, a string) bool {
	for _, x := range args {
		if x == a {
			return true
		}
	}
	return false
}

func (s *streamEnv) testStopPodClosesForward(t *testing.T) {
	local, stop := s.forward(t, 8080)
	defer stop()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/hang", local))
	if err != nil {
		t.Fatalf("GET /hang: %v", err)
	}
	defer resp.Body.Close()
	read := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		read <- err
	}()
	if _, err := s.d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.pod}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	select {
	case <-read:
	case <-time.After(15 * time.Second):
		t.Fatal("the forwarded connection stayed open after the pod stopped")
	}
	if _, err := s.d.Runtime.PortForward(Ctx(t), &runtimeapi.PortForwardRequest{PodSandboxId: s.pod, Port: []int32{8080}}); err == nil {
		t.Fatal("PortForward into a stopped pod succeeded")
	}
}
