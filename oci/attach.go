package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// AttachOptions describe an attach to a container's stdio.
type AttachOptions struct {
	// Stdin is nil when the client sends none.
	Stdin io.Reader
	// Stdout and Stderr are nil when the client wants none.
	Stdout, Stderr io.Writer
	// Resize carries terminal size changes; nil means none.
	Resize <-chan TerminalSize
}

// conmon's attach protocol: the socket is SOCK_SEQPACKET; every packet
// conmon sends starts with the pipe it came from, followed by at most
// conmon's STDIO_BUF_SIZE bytes. What the client writes goes to the
// container's stdin unchanged. The pipe numbers are conmon's enum
// (NO_PIPE, STDIN_PIPE, STDOUT_PIPE, STDERR_PIPE), as CRI-O uses them:
// stdout is 2 and stderr 3, not 1 and 2.
const (
	attachBufSize    = 8192 + 1
	attachPipeStdout = 2
	attachPipeStderr = 3
	ctlWinResize     = 1
)

// Attach connects o's streams to the container's stdio through conmon's
// attach socket; conmon keeps writing the container log meanwhile. It
// returns when the container's output ends (the container exited), when
// the client's stdin ends (a detach; for a stdin_once container the
// container's stdin is closed first and its remaining output still
// copied), or when ctx ends. The container keeps running after a detach.
func (r *Runtime) Attach(ctx context.Context, id string, o AttachOptions) error {
	if err := validateID(id); err != nil {
		return err
	}
	rec, err := r.loadRecord(id)
	if err != nil {
		return err
	}
	conn, err := dialAttach(id, rec.Bundle)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	// Closing the connection ends both copies.
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	outDone := make(chan error, 1)
	go func() { outDone <- copyAttachOutput(conn, o.Stdout, o.Stderr) }()

	stdinDone := make(chan error, 1)
	if o.Stdin != nil {
		go func() {
			_, err := io.Copy(conn, o.Stdin)
			stdinDone <- err
		}()
	}
	if o.Resize != nil {
		go func() {
			for sz := range o.Resize {
				_ = writeCtl(rec.Bundle, fmt.Sprintf("%d %d %d\n", ctlWinResize, sz.Height, sz.Width))
			}
		}()
	}

	select {
	case err := <-outDone:
		return err
	case <-ctx.Done():
		return nil
	case err := <-stdinDone:
		// A terminal's input has no end of its own: its end is a detach.
		if err != nil || !rec.StdinOnce || rec.Tty {
			return nil // detached
		}
	}
	// stdin_once: the end of the client's stdin closes the container's,
	// which conmon does when the attach socket's write side shuts down.
	if err := conn.CloseWrite(); err != nil {
		return fmt.Errorf("closing stdin of %s: %w", id, err)
	}
	select {
	case err := <-outDone:
		return err
	case <-ctx.Done():
		return nil
	}
}

// dialAttach connects to conmon's attach socket, <bundle>/attach, through
// an O_PATH descriptor of the bundle, as conmon binds it (--full-attach):
// the bundle's own path may be of any length, while a socket address
// holds 108 bytes.
func dialAttach(id, bundle string) (*net.UnixConn, error) {
	fd, err := unix.Open(bundle, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("attach socket of %s: bundle %s: %w", id, bundle, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("attach socket of %s: bundle %s: %w", id, bundle, err)
	}
	defer unix.Close(fd)
	addr := &net.UnixAddr{Net: "unixpacket", Name: procFdPath(fd, attachSocketName)}
	conn, err := net.DialUnix("unixpacket", nil, addr)
	if err != nil {
		return nil, fmt.Errorf("connecting to the attach socket of %s (is the container running?): %w: %w", id, err, errdefs.ErrFailedPrecondition)
	}
	return conn, nil
}

// attachSocketName is the attach socket's name in the bundle.
const attachSocketName = "attach"

// procFdPath is the path of name in the directory open as fd: at most 30
// bytes with a short name, so it always fits a socket address.
func procFdPath(fd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(fd) + "/" + name
}

// copyAttachOutput demultiplexes conmon's packets until conmon closes the
// socket (the container exited) or a client stream fails.
func copyAttachOutput(conn *net.UnixConn, stdout, stderr io.Writer) error {
	buf := make([]byte, attachBufSize)
	for {
		n, err := conn.Read(buf)
		if n > 1 {
			var w io.Writer
			switch buf[0] {
			case attachPipeStdout:
				w = stdout
			case attachPipeStderr:
				w = stderr
			}
			if w != nil {
				if _, werr := w.Write(buf[1:n]); werr != nil {
					return werr
				}
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if n == 0 {
			return nil // a zero-length packet is the end of stream
		}
	}
}

// writeCtl writes one message to conmon's control fifo, <bundle>/ctl.
func writeCtl(bundle, msg string) error {
	// Nonblocking: with conmon gone there is no reader, and open fails
	// with ENXIO instead of hanging.
	fd, err := unix.Open(filepath.Join(bundle, "ctl"), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "ctl")
	defer f.Close()
	_, err = f.WriteString(msg)
	return err
}
