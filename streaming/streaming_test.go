package streaming

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/oci"
)

// fakeRuntime is a container runtime whose exec exits with code.
type fakeRuntime struct {
	code    int
	execErr error
	// block makes exec and attach silent until their context ends, like
	// a `sleep` exec'd or attached to without stdin: started gets a value
	// when one begins, ended the cause of its context's end.
	block   bool
	started chan struct{}
	ended   chan error
}

// newBlockingRuntime is a fakeRuntime whose exec and attach block.
func newBlockingRuntime() *fakeRuntime {
	return &fakeRuntime{block: true, started: make(chan struct{}, 1), ended: make(chan error, 1)}
}

func (f *fakeRuntime) wait(ctx context.Context) error {
	if !f.block {
		return nil
	}
	f.started <- struct{}{}
	<-ctx.Done()
	f.ended <- context.Cause(ctx)
	return ctx.Err()
}

func (f *fakeRuntime) ExecStream(ctx context.Context, _ string, _ oci.ExecOptions) (int, error) {
	if err := f.wait(ctx); err != nil {
		return -1, err
	}
	return f.code, f.execErr
}

func (f *fakeRuntime) Attach(ctx context.Context, _ string, _ oci.AttachOptions) error {
	return f.wait(ctx)
}

// fakeTargets resolves one container and pods by a map.
type fakeTargets struct {
	rt     *fakeRuntime
	netns  map[string]string
	ctrErr error
	// afterLookup runs when PodNetNS has found the pod Ready, as a stop
	// of the pod racing the lookup would.
	afterLookup func(id string)
}

func (f *fakeTargets) Container(context.Context, string) (ContainerRuntime, error) {
	if f.ctrErr != nil {
		return nil, f.ctrErr
	}
	return f.rt, nil
}

func (f *fakeTargets) PodNetNS(_ context.Context, id string) (string, error) {
	p, ok := f.netns[id]
	if !ok {
		return "", errdefs.ErrNotFound
	}
	if f.afterLookup != nil {
		f.afterLookup(id)
	}
	return p, nil
}

func newTestServer(t *testing.T, tg Targets, maxStreams int) *Server {
	t.Helper()
	return newTestServerIdle(t, tg, maxStreams, time.Minute)
}

func newTestServerIdle(t *testing.T, tg Targets, maxStreams int, idle time.Duration) *Server {
	t.Helper()
	s, err := New(context.Background(), Config{Address: "127.0.0.1", IdleTimeout: idle, MaxStreams: maxStreams}, tg)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { s.Close() })
	return s
}

func TestExecResult(t *testing.T) {
	tests := []struct {
		name     string
		code     int
		execErr  error
		ctrErr   error
		wantCode int // -1: no exit error
		wantErr  error
	}{
		{name: "success", code: 0, wantCode: -1},
		{name: "non-zero exit is an exit code", code: 3, wantCode: 3},
		{name: "runtime failure", execErr: errdefs.ErrUnknown, wantCode: -1, wantErr: errdefs.ErrUnknown},
		{name: "container gone", ctrErr: errdefs.ErrNotFound, wantCode: -1, wantErr: errdefs.ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tg := &fakeTargets{rt: &fakeRuntime{code: tc.code, execErr: tc.execErr}, ctrErr: tc.ctrErr}
			s := newTestServer(t, tg, 1)
			err := (&runtime{s: s}).Exec(context.Background(), "c1", []string{"echo", "hi"}, nil, nil, nil, false, nil)
			var ee utilexec.CodeExitError
			switch {
			case tc.wantCode >= 0:
				if !errors.As(err, &ee) || ee.ExitStatus() != tc.wantCode || !ee.Exited() {
					t.Fatalf("Exec: %v, want exit code %d", err, tc.wantCode)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Exec: %v, want %v", err, tc.wantErr)
				}
			case err != nil:
				t.Fatalf("Exec: %v", err)
			}
		})
	}
}

func TestMaxStreams(t *testing.T) {
	s := newTestServer(t, &fakeTargets{}, 1)
	s.slots <- struct{}{} // one stream is being served
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/exec/abcdefgh", nil))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a stream over max_streams got %d, want 429", rec.Code)
	}
	<-s.slots
	rec = httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/exec/abcdefgh", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("an unknown token got %d, want 404", rec.Code)
	}
	if n := s.Active(); n != 0 {
		t.Fatalf("Active() = %d after the requests, want 0", n)
	}
}

func TestURLsUseTheListenerPort(t *testing.T) {
	s := newTestServer(t, &fakeTargets{}, 1)
	resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"true"}, Stdout: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Url, s.URL()+"/exec/") || strings.HasSuffix(s.URL(), ":0") {
		t.Fatalf("exec URL %q does not point at the server %q", resp.Url, s.URL())
	}
}

// echoListener accepts connections on the host's loopback and echoes.
func echoListener(t *testing.T) int {
	t.Helper()
	return serve(t, func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() })
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}

func TestPortForwardHostNetwork(t *testing.T) {
	open, closed := echoListener(t), closedPort(t)
	tests := []struct {
		name    string
		pod     string
		port    int
		wantErr func(error) bool
	}{
		{name: "echo", pod: "host", port: open},
		{name: "closed port", pod: "host", port: closed, wantErr: func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }},
		{name: "unknown pod", pod: "nope", port: open, wantErr: errdefs.IsNotFound},
		{name: "bad port", pod: "host", port: 0, wantErr: errdefs.IsInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, &fakeTargets{netns: map[string]string{"host": ""}}, 1)
			client, server := net.Pipe()
			done := make(chan error, 1)
			go func() { done <- (&runtime{s: s}).PortForward(context.Background(), tc.pod, int32(tc.port), server) }()
			if tc.wantErr != nil {
				if err := <-done; !tc.wantErr(err) {
					t.Fatalf("PortForward: %v", err)
				}
				return
			}
			if _, err := client.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("echo through the forward: %q, %v", buf, err)
			}
			if n := s.Forwards(tc.pod); n != 1 {
				t.Fatalf("Forwards(%s) = %d while open, want 1", tc.pod, n)
			}
			// Stopping the pod ends the forward.
			s.ClosePod(tc.pod)
			select {
			case err := <-done:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("PortForward after ClosePod: %v, want context.Canceled", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("PortForward still running after ClosePod")
			}
			if n := s.Forwards(tc.pod); n != 0 {
				t.Fatalf("Forwards(%s) = %d after ClosePod, want 0", tc.pod, n)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no streams", Config{Address: "127.0.0.1", MaxStreams: 0}},
		{"missing key pair", Config{Address: "127.0.0.1", MaxStreams: 1, TLSCertFile: "/nonexistent/c.pem", TLSKeyFile: "/nonexistent/k.pem"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(context.Background(), tc.cfg, &fakeTargets{}); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("New: %v, want InvalidArgument", err)
			}
		})
	}
}

// writeKeyPair writes a self-signed certificate for 127.0.0.1.
func writeKeyPair(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pinrt-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLS(t *testing.T) {
	certFile, keyFile, pool := writeKeyPair(t)
	s, err := New(context.Background(), Config{Address: "127.0.0.1", IdleTimeout: time.Minute, MaxStreams: 1, TLSCertFile: certFile, TLSKeyFile: keyFile}, &fakeTargets{})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve() }()
	t.Cleanup(func() { s.Close() })
	resp, err := s.GetPortForward(&runtimeapi.PortForwardRequest{PodSandboxId: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(resp.Url, "https://127.0.0.1:") {
		t.Fatalf("URL %q is not https on the listener", resp.Url)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	r, err := client.Get(s.URL() + "/exec/unknown0")
	if err != nil {
		t.Fatalf("GET over TLS: %v", err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown token over TLS: %d, want 404", r.StatusCode)
	}
	// The WebSocket v5 translation under TLS: the exec's exit code
	// arrives.
	s.targets = &fakeTargets{rt: &fakeRuntime{code: 3}}
	ex, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"false"}, Stdout: true, Stderr: true})
	if err != nil {
		t.Fatal(err)
	}
	err = clientStreamTLS(context.Background(), ex.Url, "v5", rest.TLSClientConfig{CAFile: certFile})
	var ee interface{ ExitStatus() int } // client-go's exit error
	if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
		t.Fatalf("v5 exec over TLS: %v, want exit code 3", err)
	}
}

// TestDefaultConfig checks the [streaming] defaults the daemon starts the
// server with: loopback only, any free port, kubelet's 4h idle timeout.
func TestDefaultConfig(t *testing.T) {
	d := conf.Default().Streaming
	want := conf.StreamingConfig{Address: "127.0.0.1", Port: 0, IdleTimeout: conf.Duration(4 * time.Hour), MaxStreams: 256}
	if d != want {
		t.Fatalf("default [streaming] = %+v, want %+v", d, want)
	}
	s, err := New(context.Background(), Config{
		Address: d.Address, Port: d.Port, TLSCertFile: d.TLSCertFile, TLSKeyFile: d.TLSKeyFile,
		IdleTimeout: d.IdleTimeout.Std(), MaxStreams: d.MaxStreams,
	}, &fakeTargets{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	u, err := url.Parse(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "" || u.Port() == "0" {
		t.Fatalf("server URL with the defaults = %q, want http://127.0.0.1:<the port picked>", s.URL())
	}
	if cap(s.slots) != 256 {
		t.Fatalf("max streams = %d, want 256", cap(s.slots))
	}
}

// clientStream drives an exec or attach URL as kubectl does, with output
// only, until ctx ends or the server ends the stream.
// clientStream runs an exec or attach of rawURL with stdout and stderr
// over proto: "" for SPDY, "v4" or "v5" for that WebSocket protocol
// (v5 through pinrt's translation, websocket.go).
func clientStream(ctx context.Context, rawURL, proto string) error {
	return clientStreamTLS(ctx, rawURL, proto, rest.TLSClientConfig{})
}

func clientStreamTLS(ctx context.Context, rawURL, proto string, tc rest.TLSClientConfig) error {
	var ex remotecommand.Executor
	var err error
	cfg := &rest.Config{TLSClientConfig: tc}
	switch proto {
	case "v4":
		ex, err = remotecommand.NewWebSocketExecutorForProtocols(cfg, "GET", rawURL, "v4.channel.k8s.io")
	case "v5":
		ex, err = remotecommand.NewWebSocketExecutor(cfg, "GET", rawURL)
	default:
		var u *url.URL
		if u, err = url.Parse(rawURL); err == nil {
			ex, err = remotecommand.NewSPDYExecutor(cfg, "POST", u)
		}
	}
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard})
}

// waitEnded waits for a blocked exec or attach of rt to see its context
// end, then for the server to count no stream. Which cancellation comes
// first is not asserted: net/http's, when a read fails, or the connection
// close's.
func waitEnded(t *testing.T, s *Server, rt *fakeRuntime) {
	t.Helper()
	select {
	case <-rt.ended:
	case <-time.After(15 * time.Second):
		t.Fatal("the stream's exec or attach still runs after its connection ended")
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Active() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Active() = %d after the stream ended, want 0", s.Active())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClientGoneEndsStream checks that an exec or attach that neither
// reads nor writes (a silent command or container, no stdin) ends when its
// client goes away. A cancelled SPDY client says GOAWAY, to which the
// server answers by closing the connection without another read, so
// net/http alone never cancels the request's context (see watchedConn).
func TestClientGoneEndsStream(t *testing.T) {
	tests := []struct {
		name  string
		url   func(*Server) (string, error)
		proto string
	}{
		{name: "exec over SPDY", url: func(s *Server) (string, error) {
			r, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"sleep", "1000"}, Stdout: true, Stderr: true})
			return r.GetUrl(), err
		}},
		{name: "attach over SPDY", url: func(s *Server) (string, error) {
			r, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c1", Stdout: true, Stderr: true})
			return r.GetUrl(), err
		}},
		{name: "exec over WebSocket v4", proto: "v4", url: func(s *Server) (string, error) {
			r, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"sleep", "1000"}, Stdout: true, Stderr: true})
			return r.GetUrl(), err
		}},
		{name: "exec over WebSocket v5", proto: "v5", url: func(s *Server) (string, error) {
			r, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"sleep", "1000"}, Stdout: true, Stderr: true})
			return r.GetUrl(), err
		}},
		{name: "attach over WebSocket v5", proto: "v5", url: func(s *Server) (string, error) {
			r, err := s.GetAttach(&runtimeapi.AttachRequest{ContainerId: "c1", Stdout: true, Stderr: true})
			return r.GetUrl(), err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := newBlockingRuntime()
			s := newTestServer(t, &fakeTargets{rt: rt}, 1)
			u, err := tc.url(s)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- clientStream(ctx, u, tc.proto) }()
			select {
			case <-rt.started:
			case err := <-done:
				t.Fatalf("the client ended before the stream started: %v", err)
			case <-time.After(15 * time.Second):
				t.Fatal("the stream did not start")
			}
			cancel()
			<-done
			waitEnded(t, s, rt)
		})
	}
}

// TestIdleTimeoutEndsStream checks that idle_timeout closes a stream with
// no traffic, and that the exec on it ends with it.
func TestIdleTimeoutEndsStream(t *testing.T) {
	for _, proto := range []string{"", "v5"} {
		t.Run("proto="+proto, func(t *testing.T) {
			rt := newBlockingRuntime()
			s := newTestServerIdle(t, &fakeTargets{rt: rt}, 1, 300*time.Millisecond)
			resp, err := s.GetExec(&runtimeapi.ExecRequest{ContainerId: "c1", Cmd: []string{"sleep", "1000"}, Stdout: true, Stderr: true})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- clientStream(ctx, resp.Url, proto) }()
			select {
			case <-done:
				if ctx.Err() != nil {
					t.Fatal("the client's context ended first")
				}
			case <-time.After(20 * time.Second):
				t.Fatal("an idle stream is still open 20s into a 300ms idle timeout")
			}
			waitEnded(t, s, rt)
		})
	}
}

// TestIdleConnectionsAreClosed checks that a connection idle between two
// requests is closed: without a bound, any local process could keep
// connections to the unauthenticated streaming port open after one 404
// each until the daemon ran out of file descriptors. max_streams counts
// only requests being served.
func TestIdleConnectionsAreClosed(t *testing.T) {
	old := connIdleTimeout
	connIdleTimeout = 200 * time.Millisecond
	t.Cleanup(func() { connIdleTimeout = old })
	s := newTestServer(t, &fakeTargets{}, 1)
	c, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /exec/unknown0 HTTP/1.1\r\nHost: pinrt\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the 404: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Close {
		t.Fatalf("unknown token: %d (close %v), want a kept-alive 404", resp.StatusCode, resp.Close)
	}
	// The server closes the idle connection: EOF well before the deadline.
	start := time.Now()
	if n, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("an idle connection still open after %s: read %d, %v; want EOF", time.Since(start).Round(time.Millisecond), n, err)
	}
}
