package streaming

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// Closing a stream's connection keeps what the client has yet to read,
// whatever the client sends around the close (a SPDY ping, stdin an exec
// that ended no longer wanted). A plain close reset the connection, when
// client bytes were unread at the close or came after it, and the kernel
// dropped the unsent tail of the output: a slow client saw the stream end
// early, with no error.
func TestCloseKeepsWhatTheClientHasYetToRead(t *testing.T) {
	tests := []struct {
		name          string
		before, after int // bytes the client sends before and after the close
	}{
		{name: "client bytes unread at the close", before: 4096},
		{name: "a client ping after the close", after: 16},
		{name: "nothing from the client"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client, sc := lingerPair(t)
			if _, err := client.Write(make([]byte, tc.before)); err != nil {
				t.Fatal(err)
			}
			want := bytes.Repeat([]byte("0123456789abcdef"), 128<<10/16)
			_ = sc.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := sc.Write(want); err != nil {
				t.Fatalf("the output did not fit in the socket buffers: %v", err)
			}
			// Let the client's bytes arrive before the close.
			time.Sleep(100 * time.Millisecond)
			if err := sc.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.after > 0 {
				if _, err := client.Write(make([]byte, tc.after)); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, err := io.ReadAll(client)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("the client read %d of the %d bytes written before the close, then %v", len(got), len(want), err)
			}
		})
	}
}

// lingerPair is a client connection and the server's watchedConn of it.
// The client's receive window is small, so most of what the server writes
// waits on the server's side, where a reset drops it.
func lingerPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if err := client.(*net.TCPConn).SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	sc, err := watchListener{ln}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.(*watchedConn).Conn.(*net.TCPConn).SetWriteBuffer(1 << 20); err != nil {
		t.Fatal(err)
	}
	return client, sc
}
