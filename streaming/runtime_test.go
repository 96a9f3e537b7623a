package streaming

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections, which, unlike
// net.Pipe, can be half-closed.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); sc.Close() })
	return c.(*net.TCPConn), sc.(*net.TCPConn)
}

// TestPipeHalfClose checks that the client's end of input still lets the
// pod answer, and that a pod that ignores it does not hold the forward
// longer than the grace period.
func TestPipeHalfClose(t *testing.T) {
	tests := []struct {
		name      string
		podCloses bool // after answering
		grace     time.Duration
		within    time.Duration // the forward ends within
	}{
		{name: "pod answers and closes", podCloses: true, grace: time.Hour, within: 10 * time.Second},
		// The grace must outlast the pod's answer on a loaded machine.
		{name: "pod ignores the half-close", podCloses: false, grace: 2 * time.Second, within: 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			podApp, podConn := tcpPair(t)
			client, stream := tcpPair(t)
			go func() {
				// A request-reply app: the request ends with the client's
				// EOF, then it answers.
				if b, _ := io.ReadAll(podApp); string(b) == "ping" {
					_, _ = podApp.Write([]byte("pong"))
				}
				if tc.podCloses {
					podApp.Close()
				}
			}()
			done := make(chan error, 1)
			go func() {
				done <- pipe(context.Background(), podConn, stream, graces{afterClient: tc.grace, afterPod: tc.grace})
			}()

			if _, err := client.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if err := client.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			_ = client.SetReadDeadline(time.Now().Add(tc.within))
			if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "pong" {
				t.Fatalf("answer after the client's half-close: %q, %v", buf, err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("pipe: %v", err)
				}
			case <-time.After(tc.within):
				t.Fatalf("the forward still runs %v after the client's EOF", tc.within)
			}
		})
	}
}

// TestForwardRacingClosePod checks that a forward whose pod stops right
// after it was found Ready is ended by the stop, not left running.
func TestForwardRacingClosePod(t *testing.T) {
	tg := &fakeTargets{netns: map[string]string{"host": ""}}
	s := newTestServer(t, tg, 1)
	tg.afterLookup = s.ClosePod
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close() })
	port := int32(echoListener(t))
	done := make(chan error, 1)
	go func() { done <- (&runtime{s: s}).PortForward(context.Background(), "host", port, server) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("PortForward into a pod stopped as it was looked up: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a forward into a pod stopped as it was looked up still runs")
	}
	if n := s.Forwards("host"); n != 0 {
		t.Fatalf("Forwards(host) = %d, want 0", n)
	}
}
