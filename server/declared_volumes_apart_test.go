package server

import (
	"context"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/image"
)

// An image's declared VOLUME and an image volume (KEP-4639) of the same
// container must not share a directory. The image store keeps image
// volume i under <dir>/volumes/<i> (mnt, empty) and unmounts whatever it
// finds there; a declared volume numbered i in that same place showed
// the container the image volume's mnt and empty at its VOLUME path
// (postgres' initdb refuses a data directory that is not empty).
func TestDeclaredVolumesApartFromImageVolumes(t *testing.T) {
	f := newCtrFixture(t)
	withVolumeImage(t, f)
	const appID = "sha256:5555555555555555555555555555555555555555555555555555555555555555"
	f.images.Registry["reg/app:1"] = image.Image{ID: appID, RepoTags: []string{"reg/app:1"},
		Config: v1.Config{Cmd: []string{"sh"}, Volumes: map[string]struct{}{"/data": {}}}}
	if _, err := f.images.Pull(context.Background(), "reg/app:1", nil); err != nil {
		t.Fatal(err)
	}
	pod, _ := f.pod(t, false)
	cfg := unitCtr("c")
	cfg.Image = &runtimeapi.ImageSpec{Image: "reg/app:1"}
	cfg.Mounts = []*runtimeapi.Mount{imageMount("/tools", "", true)}
	resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	dir := f.srv.containerDir(resp.ContainerId)
	spec := f.rt.Specs[resp.ContainerId]
	data, tools := specMount(spec, "/data"), specMount(spec, "/tools")
	if data == nil || tools == nil {
		t.Fatalf("mounts %+v, want /data and /tools", spec.Mounts)
	}
	if under(filepath.Clean(tools.Source), filepath.Clean(data.Source)) || under(filepath.Clean(data.Source), filepath.Clean(tools.Source)) {
		t.Errorf("declared volume %s and image volume %s share a directory", data.Source, tools.Source)
	}
	if under(filepath.Clean(data.Source), filepath.Join(dir, "volumes")) {
		t.Errorf("declared volume %s is in the image store's image volume directory %s", data.Source, filepath.Join(dir, "volumes"))
	}
}
