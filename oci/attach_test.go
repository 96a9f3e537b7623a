package oci

import (
	"bytes"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// seqpacketPair returns both ends of a SOCK_SEQPACKET socket pair, the
// socket type of conmon's attach socket.
func seqpacketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b := conv(fds[0]), conv(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestCopyAttachOutput(t *testing.T) {
	tests := []struct {
		name             string
		packets          [][]byte
		wantOut, wantErr string
	}{
		{name: "stdout and stderr", packets: [][]byte{[]byte("\x02out1 "), []byte("\x03err1"), []byte("\x02out2")}, wantOut: "out1 out2", wantErr: "err1"},
		{name: "stdin echo and unknown pipes are dropped", packets: [][]byte{[]byte("\x01in"), []byte("\x00none"), []byte("\x02ok")}, wantOut: "ok"},
		{name: "a full conmon buffer", packets: [][]byte{append([]byte{2}, bytes.Repeat([]byte("x"), attachBufSize-1)...)}, wantOut: string(bytes.Repeat([]byte("x"), attachBufSize-1))},
		{name: "nothing", packets: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conmon, client := seqpacketPair(t)
			for _, p := range tc.packets {
				if _, err := conmon.Write(p); err != nil {
					t.Fatal(err)
				}
			}
			conmon.Close() // conmon exits with the container
			var out, errOut bytes.Buffer
			if err := copyAttachOutput(client, &out, &errOut); err != nil {
				t.Fatalf("copyAttachOutput: %v", err)
			}
			if out.String() != tc.wantOut || errOut.String() != tc.wantErr {
				t.Fatalf("stdout %q stderr %q, want %q and %q", out.String(), errOut.String(), tc.wantOut, tc.wantErr)
			}
		})
	}
}
