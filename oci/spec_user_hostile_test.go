package oci

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// An image whose /etc/passwd or /etc/group is a FIFO (layers may hold
// FIFOs; nodev on the rootfs does not stop them) must not hang
// CreateContainer on an open that waits for a writer, and one that is a
// directory is the image's fault, not the node's.
func TestWithUserPasswdNotARegularFile(t *testing.T) {
	for _, tt := range []struct {
		name, file string
		make       func(p string) error
	}{
		{"passwd fifo", "passwd", func(p string) error { return unix.Mkfifo(p, 0o644) }},
		{"group fifo", "group", func(p string) error { return unix.Mkfifo(p, 0o644) }},
		{"passwd directory", "passwd", func(p string) error { return os.Mkdir(p, 0o755) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := writeRootfs(t)
			p := filepath.Join(root, "etc", tt.file)
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
			if err := tt.make(p); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := gen(t, WithUser(root, User{Username: "app"}, ""))
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err = %v, want InvalidArgument", err)
				}
			case <-time.After(5 * time.Second):
				// Unblock the open so the goroutine ends.
				if f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				t.Fatal("WithUser hangs on a FIFO in the image")
			}
		})
	}
}

// IDs in an image's /etc/passwd and /etc/group are not range-checked by
// moby/sys/user: one past 32 bits would wrap to root's 0 (a "non-root"
// user app of uid 2^32 ran as root, with group root), and 2^32-1 is
// (uid_t)-1. They are refused like the request's own IDs.
func TestWithUserImageIDsOutOfRange(t *testing.T) {
	for _, tt := range []struct {
		name, passwd, group string
		user                User
		imageUser           string
	}{
		{name: "passwd uid 2^32", passwd: "app:x:4294967296:1001::/home/app:/bin/sh\n", user: User{Username: "app"}},
		{name: "passwd gid 2^32", passwd: "app:x:1000:4294967296::/home/app:/bin/sh\n", user: User{Username: "app"}},
		{name: "passwd uid negative", passwd: "app:x:-1:1001::/home/app:/bin/sh\n", user: User{Username: "app"}},
		{name: "group 2^32 membership", passwd: "app:x:1000:1001::/home/app:/bin/sh\n", group: "evil:x:4294967296:app\n", user: User{Username: "app"}},
		{name: "group 2^32 by name", passwd: "app:x:1000:1001::/home/app:/bin/sh\n", group: "evil:x:4294967296:\n", imageUser: "1000:evil"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte(tt.passwd), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "etc", "group"), []byte(tt.group), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := gen(t, WithUser(root, tt.user, tt.imageUser))
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				if s != nil {
					t.Errorf("user = %+v", s.Process.User)
				}
				t.Fatalf("err = %v, want InvalidArgument", err)
			}
		})
	}
}
