package streaming

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/websocket"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// The library serves exec and attach over SPDY and over WebSocket up to
// v4.channel.k8s.io, and port-forward over SPDY only. The WebSocket
// clients of today speak what it lacks:
//
//   - v5.channel.k8s.io for exec and attach (client-go's WebSocket
//     executor: `crictl exec|attach --transport websocket`, critest
//     -websocket-exec and -websocket-attach). v5 adds a signal that closes
//     one stream, which is how such a client ends stdin.
//   - SPDY tunnelled in a WebSocket for port-forward (client-go's
//     SPDY-over-WebSocket dialer: `crictl port-forward --transport
//     websocket`, critest -websocket-portforward).
//
// Both are served by translation, as the API server translates for
// kubelet: the library gets the same request as a SPDY upgrade, on one
// end of an in-memory pipe (exec, attach) or on the tunnel itself
// (port-forward), so its token check, stream setup and status codes stay
// the only ones. The URL's token is taken from the library's cache as for
// any other client; the stream options, which the WebSocket side must
// know before the library does, are kept here from the CRI call.

// tunnelPrefix starts the subprotocol of SPDY tunnelled in a WebSocket.
const tunnelPrefix = "SPDY/3.1+"

// tokenTTL and maxTokens mirror the library's request cache.
const (
	tokenTTL  = time.Minute
	maxTokens = 1000
)

// streamOptions are the streams a CRI call asked for, by its URL's token.
type streamOptions struct {
	kind                       string // exec, attach or portforward
	stdin, stdout, stderr, tty bool
	expires                    time.Time
}

// tokens remembers the options of the URLs handed out.
type tokens struct {
	mu sync.Mutex
	m  map[string]streamOptions
}

// add records o under rawURL's token.
func (t *tokens) add(rawURL string, o streamOptions) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return
	}
	now := time.Now()
	o.expires = now.Add(tokenTTL)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]streamOptions{}
	}
	for k, v := range t.m {
		if now.After(v.expires) {
			delete(t.m, k)
		}
	}
	if len(t.m) < maxTokens {
		t.m[path.Base(u.Path)] = o
	}
}

// take removes and returns the options of token, when they are kind's
// and not expired.
func (t *tokens) take(kind, token string) (streamOptions, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.m[token]
	if !ok || o.kind != kind {
		return streamOptions{}, false
	}
	delete(t.m, token)
	return o, time.Now().Before(o.expires)
}

// consumed forgets the token of r, a request the library serves: it
// consumes the token of every GET or POST to one of its paths, whatever
// comes of the request, so the token can serve no WebSocket client
// after. Kept, it would hold one of the maxTokens places for its TTL.
func (t *tokens) consumed(r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		return
	}
	dir, token := path.Split(r.URL.Path)
	switch strings.Trim(dir, "/") {
	case "exec", "attach", "portforward":
		t.mu.Lock()
		delete(t.m, token)
		t.mu.Unlock()
	}
}

// serveWebSocket serves the requests the library cannot and reports
// whether r was one.
func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request) bool {
	dir, token := path.Split(r.URL.Path)
	kind := strings.Trim(dir, "/")
	switch {
	case (kind == "exec" || kind == "attach") && wsstream.IsWebSocketRequestWithStreamCloseProtocol(r):
	case kind == "portforward" && wsstream.IsWebSocketRequestWithTunnelingProtocol(r):
	default:
		return false
	}
	o, ok := s.tokens.take(kind, token)
	if !ok {
		http.NotFound(w, r)
		return true
	}
	if kind == "portforward" {
		s.tunnelPortForward(w, r)
	} else {
		s.translateV5(w, r, o)
	}
	return true
}

// libWriter is the library's response writer for a translated request:
// its upgrade hijacks conn; a refusal is kept for the client.
type libWriter struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	conn     net.Conn
	hijacked chan struct{}
}

func (w *libWriter) Header() http.Header { return w.header }

func (w *libWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *libWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.body.Len() < 4096 {
		w.body.Write(b)
	}
	return len(b), nil
}

func (w *libWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	close(w.hijacked)
	return w.conn, bufio.NewReadWriter(bufio.NewReader(w.conn), bufio.NewWriter(w.conn)), nil
}

// toLibrary hands r to the library as a SPDY upgrade asking for protocol,
// with conn as the connection its upgrade takes over. done closes when
// the library is finished with the request.
func (s *Server) toLibrary(ctx context.Context, r *http.Request, protocol string, conn net.Conn) (lw *libWriter, done <-chan struct{}) {
	in := r.Clone(ctx)
	in.Method = http.MethodPost
	in.Header = http.Header{}
	in.Header.Set(httpstream.HeaderConnection, httpstream.HeaderUpgrade)
	in.Header.Set(httpstream.HeaderUpgrade, spdy.HeaderSpdy31)
	in.Header.Set(httpstream.HeaderProtocolVersion, protocol)
	lw = &libWriter{header: http.Header{}, conn: conn, hijacked: make(chan struct{})}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		s.lib.ServeHTTP(lw, in)
	}()
	return lw, ch
}

// upgraded waits until the library took the connection over, or gave
// its refusal, which then goes to the client.
func upgraded(w http.ResponseWriter, lw *libWriter, done <-chan struct{}) bool {
	select {
	case <-lw.hijacked:
		return true
	case <-done:
	}
	select {
	case <-lw.hijacked:
		return true
	default:
	}
	for k, v := range lw.header {
		w.Header()[k] = v
	}
	if lw.status == 0 {
		lw.status = http.StatusInternalServerError
	}
	w.WriteHeader(lw.status)
	_, _ = w.Write(lw.body.Bytes())
	return false
}

// translateV5 serves an exec or attach over WebSocket v5 through the
// library's SPDY v4 server. Both carry the same streams and the same
// status (a JSON Status on the error stream); v5's close signal on stdin
// becomes a half-close of the SPDY stdin stream.
func (s *Server) translateV5(w http.ResponseWriter, r *http.Request, o streamOptions) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	near, far := net.Pipe()
	defer func() { _ = near.Close() }()
	lw, done := s.toLibrary(ctx, r, remotecommand.StreamProtocolV4Name, far)
	if !upgraded(w, lw, done) {
		return
	}
	sc, err := spdy.NewClientConnection(near)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer func() { _ = sc.Close() }()
	wc := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		remotecommand.StreamProtocolV5Name: {Binary: true, Channels: v5Channels(o)},
	})
	wc.SetIdleTimeout(s.idleTimeout)
	_, ws, err := wc.Open(w, r) // a failed handshake is answered by Open
	if err != nil {
		return
	}
	defer func() { _ = wc.Close() }()
	// The client learns the streams are up from a first, empty message on
	// the lowest stream it reads, as the library sends it.
	switch {
	case o.stdout:
		_, _ = ws[remotecommand.StreamStdOut].Write(nil)
	case o.stderr:
		_, _ = ws[remotecommand.StreamStdErr].Write(nil)
	default:
		_, _ = ws[remotecommand.StreamErr].Write(nil)
	}
	relayV5(sc, ws, o, done)
}

// v5Channels are the WebSocket channels of o's streams, by their v5
// numbers.
func v5Channels(o streamOptions) []wsstream.ChannelType {
	read := func(on bool) wsstream.ChannelType {
		if on {
			return wsstream.ReadChannel
		}
		return wsstream.IgnoreChannel
	}
	write := func(on bool) wsstream.ChannelType {
		if on {
			return wsstream.WriteChannel
		}
		return wsstream.IgnoreChannel
	}
	channels := make([]wsstream.ChannelType, remotecommand.StreamResize+1)
	channels[remotecommand.StreamStdIn] = read(o.stdin)
	channels[remotecommand.StreamStdOut] = write(o.stdout)
	channels[remotecommand.StreamStdErr] = write(o.stderr)
	channels[remotecommand.StreamErr] = wsstream.WriteChannel
	channels[remotecommand.StreamResize] = read(o.tty)
	return channels
}

// relayV5 opens the SPDY streams a v4 client opens, error first, and
// copies each to or from its WebSocket channel in ws until the library
// is done. The library starts the exec or attach once all are open.
func relayV5(sc httpstream.Connection, ws []io.ReadWriteCloser, o streamOptions, done <-chan struct{}) {
	var copies sync.WaitGroup
	open := func(kind string) (httpstream.Stream, error) {
		h := http.Header{}
		h.Set(remotecommand.StreamType, kind)
		return sc.CreateStream(h)
	}
	fromLib := func(kind string, to io.Writer) error {
		st, err := open(kind)
		if err != nil {
			return err
		}
		copies.Go(func() { _, _ = io.Copy(to, st) })
		return nil
	}
	toLib := func(kind string, from io.Reader) error {
		st, err := open(kind)
		if err != nil {
			return err
		}
		go func() {
			_, _ = io.Copy(st, from)
			_ = st.Close() // a half-close: stdin's end
		}()
		return nil
	}
	steps := []func() error{func() error { return fromLib(remotecommand.StreamTypeError, ws[remotecommand.StreamErr]) }}
	if o.stdin {
		steps = append(steps, func() error { return toLib(remotecommand.StreamTypeStdin, ws[remotecommand.StreamStdIn]) })
	}
	if o.stdout {
		steps = append(steps, func() error { return fromLib(remotecommand.StreamTypeStdout, ws[remotecommand.StreamStdOut]) })
	}
	if o.stderr {
		steps = append(steps, func() error { return fromLib(remotecommand.StreamTypeStderr, ws[remotecommand.StreamStdErr]) })
	}
	if o.tty {
		steps = append(steps, func() error { return toLib(remotecommand.StreamTypeResize, ws[remotecommand.StreamResize]) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			_, _ = fmt.Fprintf(ws[remotecommand.StreamErr], "setting up the streams: %v", err)
			return
		}
	}
	<-done
	// The library closed its end after the status: what it sent before
	// is read to the end.
	copies.Wait()
}

// tunnelPortForward serves a port-forward whose SPDY connection is
// tunnelled in a WebSocket: the tunnel, once accepted, is the
// connection the library's SPDY upgrade takes over.
func (s *Server) tunnelPortForward(w http.ResponseWriter, r *http.Request) {
	want := tunnelPrefix + portforward.ProtocolV1Name
	srv := websocket.Server{
		Handshake: func(cfg *websocket.Config, _ *http.Request) error {
			if !slices.Contains(cfg.Protocol, want) {
				return fmt.Errorf("port-forward over WebSocket needs subprotocol %s, got %v", want, cfg.Protocol)
			}
			cfg.Protocol = []string{want}
			return nil
		},
		Handler: func(c *websocket.Conn) {
			c.PayloadType = websocket.BinaryFrame
			_, done := s.toLibrary(r.Context(), r, portforward.ProtocolV1Name, c)
			<-done
		},
	}
	srv.ServeHTTP(w, r)
}
