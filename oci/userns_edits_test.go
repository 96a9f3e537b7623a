package oci

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestHostDeviceNode(t *testing.T) {
	root := t.TempDir()
	// As udev makes them: /dev/char/M:m links to the node.
	if err := os.MkdirAll(filepath.Join(root, "char"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(root, "char", "1:3")); err != nil {
		t.Fatal(err)
	}
	defer func(old string) { devRoot = old }(devRoot)
	devRoot = root

	for _, tc := range []struct {
		name string
		dev  specs.LinuxDevice
		want string
		err  error
	}{
		{"the same path on the host", specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 1, Minor: 3}, "/dev/null", nil},
		{"found by its numbers", specs.LinuxDevice{Path: "/dev/renamed-null", Type: "c", Major: 1, Minor: 3}, "/dev/null", nil},
		{"a block device is not a char device", specs.LinuxDevice{Path: "/dev/renamed-null", Type: "b", Major: 1, Minor: 3}, "", errdefs.ErrFailedPrecondition},
		{"the host path is another device", specs.LinuxDevice{Path: "/dev/null", Type: "c", Major: 4000, Minor: 1}, "", errdefs.ErrFailedPrecondition},
		{"a FIFO runc makes", specs.LinuxDevice{Path: "/dev/fifo", Type: "p"}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := hostDeviceNode(tc.dev)
			if got != tc.want || !errors.Is(err, tc.err) {
				t.Errorf("hostDeviceNode(%+v) = %q, %v; want %q, %v", tc.dev, got, err, tc.want, tc.err)
			}
		})
	}
}
