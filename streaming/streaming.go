// Package streaming is the runtime side of the CRI Exec, Attach and
// PortForward calls. The CRI calls only return a URL; kubelet (or the API
// server, or kubectl through them) then connects to it over SPDY or
// WebSocket, and k8s.io/cri-streaming's server turns the connection into
// streams and calls the Runtime implemented here. WebSocket clients of
// the protocols the library lacks (v5 exec and attach, port-forward
// tunnelled in a WebSocket) are translated to it (websocket.go).
//
//   - exec runs `runc exec` through package oci, with pipes or a TTY;
//   - attach connects to conmon's attach socket through package oci;
//   - port-forward dials 127.0.0.1:<port> from inside the pod's pinned
//     network namespace, on a locked OS thread, and copies both ways.
//
// Every URL is a single-use token that expires after a minute (the
// library's request cache). Port-forwards are tracked per pod so that
// stopping the pod closes them. An exec or attach ends when its client
// goes away, even when nothing is read or written (see watchedConn).
package streaming

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	cristreaming "k8s.io/cri-streaming/pkg/streaming"

	"github.com/pinrt/pinrt/oci"
)

// ContainerRuntime is what exec and attach need of an OCI runtime driver.
type ContainerRuntime interface {
	ExecStream(ctx context.Context, id string, o oci.ExecOptions) (int, error)
	Attach(ctx context.Context, id string, o oci.AttachOptions) error
}

var _ ContainerRuntime = (*oci.Runtime)(nil)

// Targets resolves the IDs in stream requests; the CRI server implements
// it on its stores. It is consulted when the client connects, not when the
// URL is handed out, so a container that died in between is refused.
type Targets interface {
	// Container returns the runtime of a running container.
	Container(ctx context.Context, id string) (ContainerRuntime, error)
	// PodNetNS returns the pinned network namespace of a Ready pod, or
	// "" for a pod on the host network.
	PodNetNS(ctx context.Context, id string) (string, error)
}

// Config configures the server.
type Config struct {
	// Address and Port are where to listen; port 0 picks a free one.
	Address string
	Port    int
	// TLSCertFile and TLSKeyFile turn on TLS when both are set.
	TLSCertFile, TLSKeyFile string
	// IdleTimeout closes a stream without traffic.
	IdleTimeout time.Duration
	// MaxStreams bounds the connections served at once.
	MaxStreams int
}

// Server serves exec, attach and port-forward streams over HTTP.
type Server struct {
	lib     cristreaming.Server
	targets Targets
	ln      net.Listener
	http    *http.Server
	url     string

	slots  chan struct{}
	active atomic.Int64

	idleTimeout time.Duration
	// tokens keeps each URL's stream options for the WebSocket
	// translation (websocket.go).
	tokens tokens

	// ctx ends every stream when the server closes: hijacked connections
	// are not closed by http.Server.Close.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	forwards map[string]map[*forward]struct{} // by pod ID
}

// forward is one port-forward connection, cancelled when its pod stops.
type forward struct{ cancel context.CancelFunc }

// connIdleTimeout closes a connection idle between two requests. The
// server has no authentication but the tokens, and any local process may
// connect: without it a connection kept after one 404 stayed open for
// ever, and enough of them took every file descriptor the daemon has.
// Streams are hijacked connections, which it does not touch.
var connIdleTimeout = 90 * time.Second

// New listens on cfg's address and returns a server that is not serving
// yet; Serve starts it. Listening here, not in Serve, makes the URLs
// right (the real port) from the first Get call on.
func New(ctx context.Context, cfg Config, targets Targets) (*Server, error) {
	if cfg.MaxStreams <= 0 {
		return nil, fmt.Errorf("streaming: max streams must be positive: %w", errdefs.ErrInvalidArgument)
	}
	var tlsConfig *tls.Config
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("streaming TLS key pair: %w: %w", err, errdefs.ErrInvalidArgument)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("streaming server: %w", err)
	}
	// Under TLS: closing a tls.Conn closes the connection it wraps.
	ln = watchListener{ln}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	base := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	if tlsConfig != nil {
		base.Scheme = "https"
	}
	libCfg := cristreaming.DefaultConfig
	libCfg.Addr = ln.Addr().String()
	libCfg.BaseURL = base
	libCfg.StreamIdleTimeout = cfg.IdleTimeout
	s := &Server{
		targets:  targets,
		ln:       ln,
		url:      base.String(),
		slots:    make(chan struct{}, cfg.MaxStreams),
		forwards: map[string]map[*forward]struct{}{},

		idleTimeout: cfg.IdleTimeout,
	}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	lib, err := cristreaming.NewServer(libCfg, &runtime{s: s})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s.lib = lib
	s.http = &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: connIdleTimeout, ConnContext: connContext}
	return s, nil
}

// Serve serves until Close; it returns nil after Close.
func (s *Server) Serve() error {
	err := s.http.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops listening and ends every stream.
func (s *Server) Close() error {
	err := s.http.Close()
	s.cancel()
	return err
}

// URL is the server's base URL.
func (s *Server) URL() string { return s.url }

// Active is the number of streams being served.
func (s *Server) Active() int { return int(s.active.Load()) }

// ServeHTTP bounds the concurrent streams, then hands over to the library.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case s.slots <- struct{}{}:
	default:
		http.Error(w, "too many concurrent streams", http.StatusTooManyRequests)
		return
	}
	defer func() { <-s.slots }()
	n := s.active.Add(1)
	l := log.G(s.ctx).WithField("path", r.URL.Path)
	l.WithField("active", n).Debug("stream started")
	defer func() {
		l.WithField("active", s.active.Add(-1)).Debug("stream finished")
	}()
	if !s.serveWebSocket(w, r) {
		s.tokens.consumed(r)
		s.lib.ServeHTTP(w, r)
	}
}

// GetExec returns the URL of an exec.
func (s *Server) GetExec(req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	resp, err := s.lib.GetExec(req)
	if err == nil {
		s.tokens.add(resp.Url, streamOptions{kind: "exec", stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr, tty: req.Tty})
	}
	return resp, err
}

// GetAttach returns the URL of an attach.
func (s *Server) GetAttach(req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	resp, err := s.lib.GetAttach(req)
	if err == nil {
		s.tokens.add(resp.Url, streamOptions{kind: "attach", stdin: req.Stdin, stdout: req.Stdout, stderr: req.Stderr, tty: req.Tty})
	}
	return resp, err
}

// GetPortForward returns the URL of a port-forward.
func (s *Server) GetPortForward(req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	resp, err := s.lib.GetPortForward(req)
	if err == nil {
		s.tokens.add(resp.Url, streamOptions{kind: "portforward"})
	}
	return resp, err
}

// ClosePod ends the pod's port-forwards; new ones are refused by Targets
// once the pod is not Ready.
func (s *Server) ClosePod(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for f := range s.forwards[id] {
		f.cancel()
	}
	delete(s.forwards, id)
}

// trackForward registers a port-forward of pod id; the returned context
// ends when the pod stops or the server closes. The caller checks that the
// pod is Ready after registering: a stop marks the pod not Ready before it
// calls ClosePod, so a forward either sees the stop or is ended by it.
func (s *Server) trackForward(ctx context.Context, id string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	f := &forward{cancel: cancel}
	s.mu.Lock()
	if s.forwards[id] == nil {
		s.forwards[id] = map[*forward]struct{}{}
	}
	s.forwards[id][f] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		stop()
		cancel()
		s.mu.Lock()
		delete(s.forwards[id], f)
		if len(s.forwards[id]) == 0 {
			delete(s.forwards, id)
		}
		s.mu.Unlock()
	}
}

// Forwards is the number of open port-forward connections of pod id.
func (s *Server) Forwards(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.forwards[id])
}

// errConnEnded ends the streams of a connection that was closed.
var errConnEnded = errors.New("the stream's connection was closed")

// watchListener accepts watchedConns.
type watchListener struct{ net.Listener }

func (l watchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c}, nil
}

// watchedConn ends the context of the requests it carries when it is
// closed. The library hands exec and attach the request's context, which
// net/http cancels when a read of the connection fails: that covers a
// client that vanished. But a SPDY client that leaves properly (client-go's
// executor when its context ends) resets its streams and sends GOAWAY, and
// the server answers by closing the connection without reading again. An attach to a silent container, or an exec of a silent
// command, without stdin then outlived its client until the container
// wrote or the command ended.
type watchedConn struct {
	net.Conn

	mu     sync.Mutex
	closed bool
	cancel context.CancelCauseFunc
}

// lingerTimeout bounds how long a closed connection is read for the
// client's end (see linger).
const lingerTimeout = 30 * time.Second

func (c *watchedConn) Close() error {
	c.mu.Lock()
	again := c.closed
	c.closed = true
	if c.cancel != nil {
		c.cancel(errConnEnded)
	}
	c.mu.Unlock()
	if again {
		return nil
	}
	tc, ok := c.Conn.(*net.TCPConn)
	if !ok {
		return c.Conn.Close()
	}
	if err := tc.CloseWrite(); err != nil {
		return tc.Close()
	}
	go linger(tc)
	return nil
}

// linger closes c, whose writing side is shut, once the client closed its
// side or lingerTimeout passed, and reads what the client sends meanwhile.
// The kernel resets a TCP connection closed with received bytes nobody
// read (RFC 2525), or that receives bytes after its close (RFC 1122), and
// drops the output it had not sent yet. The library closes as soon as the
// exec ended, while a slow client (kubelet, the API server under TCG) may
// have megabytes of stdout still to receive; a SPDY ping (client-go sends
// one every 5 s) or stdin the exec no longer read then cost the tail of a
// 20 MB `tar c` and the exit status, and the client saw a clean end.
func linger(c *net.TCPConn) {
	defer func() { _ = c.Close() }()
	if err := c.SetReadDeadline(time.Now().Add(lingerTimeout)); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// watch makes the connection's close cancel ctx.
func (c *watchedConn) watch(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel = cancel
	if c.closed {
		cancel(errConnEnded)
	}
	return ctx
}

// connContext is the http.Server's ConnContext: a connection's requests
// share a context that ends when the connection is closed.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if wc, ok := c.(*watchedConn); ok {
		return wc.watch(ctx)
	}
	return ctx
}
