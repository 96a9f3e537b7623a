package oci

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// A privileged container sees the host's device nodes, as in containerd
// (oci.WithHostDevices) and CRI-O: kubelet asks for none, and the device
// cgroup already allows them all. The pseudo filesystems /dev/pts,
// /dev/shm and /dev/mqueue, the console and symlinks are not device
// nodes of the host to copy; a device the request names keeps its own
// entry.
func TestWithDevicesPrivilegedGetsHostDevices(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes (mknod) needs root")
	}
	root := t.TempDir()
	defer func(old string) { devRoot = old }(devRoot)
	devRoot = root
	for _, d := range []string{"dri", "pts", "shm"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []struct {
		name         string
		mode         uint32
		major, minor uint32
	}{
		{"null", unix.S_IFCHR | 0o666, 1, 3},
		{"dri/card0", unix.S_IFCHR | 0o660, 226, 0},
		{"loop0", unix.S_IFBLK | 0o660, 7, 0},
		{"pts/0", unix.S_IFCHR | 0o620, 136, 0},
		{"console", unix.S_IFCHR | 0o600, 5, 1},
	} {
		p := filepath.Join(root, n.name)
		if err := unix.Mknod(p, n.mode, int(unix.Mkdev(n.major, n.minor))); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(p, n.mode&0o7777); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/proc/self/fd/1", filepath.Join(root, "stdout")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "notadevice"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	s, err := gen(t, WithDevices(nil, true, nil))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range s.Linux.Devices {
		got = append(got, d.Path+" "+d.Type)
		if d.Path == "/dev/dri/card0" && (d.Major != 226 || d.Minor != 0 || d.FileMode == nil || *d.FileMode != 0o660) {
			t.Errorf("card0 = %+v", d)
		}
	}
	slices.Sort(got)
	want := []string{"/dev/dri/card0 c", "/dev/loop0 b", "/dev/null c"}
	if !slices.Equal(got, want) {
		t.Errorf("privileged devices = %q, want %q", got, want)
	}

	// Unprivileged: none of the host's.
	s, err = gen(t, WithDevices(nil, false, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Devices) != 0 {
		t.Errorf("unprivileged devices = %+v, want none", s.Linux.Devices)
	}
}
