package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image/imagetest"
)

// kubelet's IsContainerFsSeparateFromImageFs compares the two
// filesystems' mountpoints as strings: one filesystem must have one
// name, and a containers' directory on a filesystem of its own its own.
func TestImageFsInfoSplitOnlyWhenSplit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		apart bool // a tmpfs mounted on <root>/containers
	}{{"one filesystem", false}, {"containers on a filesystem of their own", true}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range []string{"containers", "images"} {
				if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			want := filepath.Join(root, "images")
			if tc.apart {
				if os.Geteuid() != 0 {
					t.Skip("mounting a tmpfs needs root")
				}
				want = filepath.Join(root, "containers")
				if err := unix.Mount("tmpfs", want, "tmpfs", 0, "size=1m"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = unix.Unmount(want, unix.MNT_DETACH) })
			}
			cfg := conf.Default()
			cfg.Root = root
			s := New(cfg, Deps{Images: fakeImages{Fake: &imagetest.Fake{}, root: filepath.Join(root, "images")}})
			resp, err := s.ImageFsInfo(context.Background(), &runtimeapi.ImageFsInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			img, ctr := resp.ImageFilesystems[0].GetFsId().GetMountpoint(), resp.ContainerFilesystems[0].GetFsId().GetMountpoint()
			if ctr != want || img != filepath.Join(root, "images") {
				t.Errorf("image filesystem %q, container filesystem %q; want %q and %q", img, ctr, filepath.Join(root, "images"), want)
			}
		})
	}
}
