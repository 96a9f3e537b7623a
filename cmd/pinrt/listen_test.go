package main

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/pinrt/pinrt/conf"
)

// listen replaces the socket a killed daemon left, with mode 0660, and
// refuses to remove anything else at the listen path: a mistyped listen
// naming a file (kubelet's config, a state file) deleted it at start.
func TestListen(t *testing.T) {
	tests := []struct {
		name string
		// prepare makes what is at path before the start.
		prepare func(t *testing.T, path string)
		wantErr bool
	}{
		{name: "nothing there", prepare: func(*testing.T, string) {}},
		{name: "stale socket of a killed daemon", prepare: func(t *testing.T, path string) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}},
		{name: "regular file", wantErr: true, prepare: func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("kept"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "empty directory", wantErr: true, prepare: func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := conf.Default()
			cfg.Listen = filepath.Join(t.TempDir(), "pinrt.sock")
			tc.prepare(t, cfg.Listen)
			before, _ := os.Lstat(cfg.Listen)
			l, err := listen(cfg)
			if tc.wantErr {
				if err == nil {
					l.Close()
					t.Fatal("listen replaced what is not a socket")
				}
				after, statErr := os.Lstat(cfg.Listen)
				if statErr != nil || !os.SameFile(before, after) {
					t.Fatalf("listen failed (%v) but %s is gone or replaced: %v", err, cfg.Listen, statErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("listen: %v", err)
			}
			defer l.Close()
			fi, err := os.Lstat(cfg.Listen)
			if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
				t.Fatalf("socket %s: %v, %v; want a socket of mode 0660", cfg.Listen, fi.Mode(), err)
			}
			c, err := net.Dial("unix", cfg.Listen)
			if err != nil {
				t.Fatalf("dialing the new socket: %v", err)
			}
			c.Close()
		})
	}
}

// listen must not change the process's umask, which every goroutine
// shares: the daemon's others run meanwhile (restore, image collection,
// NRI, streaming), and a file one of them made while the umask was 0777
// came out with mode 0000.
func TestListenLeavesTheUmask(t *testing.T) {
	dir := t.TempDir()
	stop := make(chan struct{})
	bad := make(chan os.FileMode, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				close(bad)
				return
			default:
			}
			p := filepath.Join(dir, "f")
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				continue
			}
			fi, _ := f.Stat()
			f.Close()
			os.Remove(p)
			if fi.Mode().Perm() == 0 {
				select {
				case bad <- fi.Mode():
				default:
				}
			}
		}
	}()
	cfg := conf.Default()
	cfg.Listen = filepath.Join(t.TempDir(), "pinrt.sock")
	for range 300 {
		l, err := listen(cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	close(stop)
	if m, ok := <-bad; ok {
		t.Fatalf("a file made while listen ran got mode %v", m)
	}
}
