package sandbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// deletions reports the names deleted from dir while fn runs, in the
// order the kernel saw them (inotify).
func deletions(t *testing.T, dir string, fn func()) []string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Skipf("no inotify: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_DELETE); err != nil {
		t.Fatal(err)
	}
	fn()
	var names []string
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			if ev.Mask&unix.IN_DELETE != 0 {
				names = append(names, string(bytes.TrimRight(name, "\x00")))
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// TestRemoveDirOrder: the records restore loads go before anything else,
// the intent records after everything else. A daemon killed at any
// instant of the removal leaves a directory restore tears down (an
// intent, or no state record), never one it loads back as a ghost.
func TestRemoveDirOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "abc123")
	if err := os.MkdirAll(filepath.Join(dir, "infra"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Created in every order, so that no directory order makes it pass.
	files := []string{"removing", "state.json", "creating", "config.json", "meta.json", "status.json", "conmon.pid", "exit"}
	for i := range files {
		if err := os.WriteFile(filepath.Join(dir, files[(i*3)%len(files)]), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := deletions(t, dir, func() {
		if err := RemoveDir(dir); err != nil {
			t.Fatal(err)
		}
	})
	records := []string{"state.json", "status.json", "meta.json", "config.json"}
	for i, name := range got {
		isRecord, isIntent := slices.Contains(records, name), name == "removing" || name == "creating"
		switch {
		case i < len(records) && !isRecord:
			t.Errorf("deletion %d is %s, before every record restore loads was gone: %q", i, name, got)
		case i >= len(got)-2 && !isIntent:
			t.Errorf("deletion %d is %s, after an intent record: %q", i, name, got)
		}
	}
	if len(got) != len(files)+1 {
		t.Errorf("deleted %q, want the %d entries", got, len(files)+1)
	}
}
