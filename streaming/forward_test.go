package streaming

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// kubectlForward forwards a local port to port on the host "pod" through
// s, with client-go's port forwarder, as `kubectl port-forward` does: one
// SPDY connection, a stream pair per local connection. It returns the
// local port.
func kubectlForward(t *testing.T, s *Server, port int) int {
	t.Helper()
	resp, err := s.GetPortForward(&runtimeapi.PortForwardRequest{PodSandboxId: "host", Port: []int32{int32(port)}})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		t.Fatal(err)
	}
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	t.Cleanup(func() { close(stop); <-errc })
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("port-forward: %v", err)
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	return int(ports[0].Local)
}

// serve answers each connection to a new loopback port with handle.
func serve(t *testing.T, handle func(net.Conn)) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// TestForwardAnswerBeforeTheUploadEnds posts large bodies through a
// kubectl-style forward to an HTTP server that answers without reading
// them, as agnhost's netexec does in Kubernetes' port-forward spec. Go's
// server then half-closes, and resets the connection 500 ms later. Each
// answer must reach its client: ending the forward at the pod's end made
// kubectl reset the client mid-upload, and left the rest of the body
// unread in its stream, stalling the whole SPDY connection after a few
// requests.
func TestForwardAnswerBeforeTheUploadEnds(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "answered") }),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { hs.Close() })
	s := newTestServer(t, &fakeTargets{netns: map[string]string{"host": ""}}, 8)
	local := kubectlForward(t, s, l.Addr().(*net.TCPAddr).Port)

	for i := range 30 {
		size := 1<<20 + i*(3<<20)/30 // 1 to 4 MiB, as the spec's up to 4 MiB
		client := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
		resp, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d/header", local), "text/plain", bytes.NewReader(make([]byte, size)))
		if err != nil {
			t.Fatalf("POST %d of %d bytes: %v", i, size, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "answered" {
			t.Fatalf("POST %d of %d bytes: answer %q, %v", i, size, body, err)
		}
	}
}

// TestForwardClientSendingAfterThePodClosed checks that a client that
// keeps sending into a forward whose pod ended its side (and stopped
// reading) does not hold up the other forwards of its connection: its
// stream must be read to its end or reset, not left half-read.
func TestForwardClientSendingAfterThePodClosed(t *testing.T) {
	testDone := make(chan struct{})
	defer close(testDone)
	port := serve(t, func(c net.Conn) {
		defer c.Close()
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err == nil && string(b) == "ping" {
			_, _ = c.Write([]byte("pong"))
			return
		}
		// Anything else is answered and the pod's side ended, but the
		// connection is held unread, not closed: a reset would be an
		// error of the forward, which ends kubectl's.
		_, _ = c.Write([]byte("bye"))
		_ = c.(*net.TCPConn).CloseWrite()
		<-testDone
	})
	s := newTestServer(t, &fakeTargets{netns: map[string]string{"host": ""}}, 8)
	local := kubectlForward(t, s, port)
	addr := "127.0.0.1:" + strconv.Itoa(local)

	flood, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		chunk := make([]byte, 64<<10)
		for range 512 { // 32 MiB, far more than SPDY's frame queues hold
			if _, err := flood.Write(chunk); err != nil {
				return
			}
		}
	}()
	defer func() { flood.Close(); <-flooded }()
	time.Sleep(500 * time.Millisecond)

	for i := range 3 {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 4)
		_, err = c.Write([]byte("ping"))
		if err == nil {
			_, err = io.ReadFull(c, b)
		}
		c.Close()
		if err != nil || string(b) != "pong" {
			t.Fatalf("forward %d after a client kept sending into a closed pod's: %q, %v", i, b, err)
		}
	}
}
