package server

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/image"
)

// A checkpoint archive named as a CreateContainer's image makes a
// container of the checkpoint's image with its rootfs changes, which
// StartContainer restores from the archive's images instead of starting.
func TestRestoreFromCheckpointArchive(t *testing.T) {
	f, src := checkpointFixture(t)
	ctx := context.Background()
	archive := filepath.Join(t.TempDir(), "ck.tar")
	if _, err := f.srv.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: src, Location: archive}); err != nil {
		t.Fatal(err)
	}
	pod := f.srv.containers.List()[0].SandboxID
	cfg := unitCtr("restored")
	cfg.Image.Image = archive
	cfg.Annotations = map[string]string{criuConfigAnnotation: "/tmp/evil.conf"}
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	dir := f.srv.containerDir(id)
	if got := string(f.images.changes[id].files["data/state"]); got != "written by the container" {
		t.Errorf("the rootfs mount got data/state %q from the archive's diff", got)
	}
	spec := f.rt.Specs[id]
	conf := spec.Annotations[criuConfigAnnotation]
	if b, err := os.ReadFile(conf); conf != filepath.Join(dir, restoreCRIUConfig) || err != nil || string(b) != "tcp-close\n" {
		t.Errorf("CRIU configuration %q: %q, %v; want pinrt's, closing TCP connections", conf, b, err)
	}
	if got := strings.Join(spec.Process.Args, " "); got != "sleep 1" {
		t.Errorf("restored container's process %q, want the checkpoint's", got)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if got := f.rt.RestoredFrom[id]; got != "fake pstree of "+src {
		t.Errorf("restored from %q, want the checkpoint of %s", got, src)
	}
	if slices.Contains(f.rt.Calls, "start "+id) {
		t.Errorf("runtime calls %v: a restored container is not started again", f.rt.Calls)
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.Status.Image.Image != "docker.io/library/busybox:latest" {
		t.Errorf("restored container %v, image %q", st.Status.State, st.Status.Image.Image)
	}
	var info struct {
		Restored bool `json:"restored"`
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil || !info.Restored {
		t.Errorf("verbose info restored = %v (%v)", info.Restored, err)
	}
	if _, err := os.Stat(filepath.Join(dir, checkpointImagesDir)); !os.IsNotExist(err) {
		t.Errorf("the checkpoint's images outlive the restore: %v", err)
	}

	// A container's own org.criu.config never reaches runc.
	plain := unitCtr("plain")
	plain.Annotations = map[string]string{criuConfigAnnotation: "/tmp/evil.conf"}
	presp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: plain})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := f.rt.Specs[presp.ContainerId].Annotations[criuConfigAnnotation]; ok {
		t.Errorf("the request's %s reached the spec: %q", criuConfigAnnotation, v)
	}
}

// What a restore cannot bring back is refused before anything is made.
func TestRestoreRefusals(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, _ := f.pod(t, false)
	ureq := unitPod("q", true)
	ureq.Config.LogDirectory = t.TempDir()
	uresp, err := f.srv.RunPodSandbox(ctx, ureq)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	archive := func(name, spec string) string {
		p := filepath.Join(dir, name+".tar")
		writeTestTar(t, p, map[string]string{
			"config.dump":              `{"id":"x","name":"x","rootfsImageName":"docker.io/library/busybox:latest"}`,
			"spec.dump":                spec,
			"checkpoint/inventory.img": "",
		})
		return p
	}
	const plainSpec = `{"process":{"args":["sh"],"cwd":"/"},"linux":{}}`
	for _, tc := range []struct {
		name    string
		archive string
		mounts  []*runtimeapi.Mount
		userns  bool
		want    error
	}{
		{"terminal", archive("tty", `{"process":{"terminal":true,"args":["sh"],"cwd":"/"},"linux":{}}`), nil, false, errdefs.ErrFailedPrecondition},
		{"user namespace in the checkpoint", archive("userns", `{"process":{"args":["sh"],"cwd":"/"},"linux":{"namespaces":[{"type":"user","path":"/run/x"}]}}`), nil, false, errdefs.ErrFailedPrecondition},
		{"user namespace in the pod", archive("plain", plainSpec), nil, true, errdefs.ErrFailedPrecondition},
		{"bind mount not given again", archive("mount", `{"process":{"args":["sh"],"cwd":"/"},"linux":{},"mounts":[{"destination":"/data","type":"bind","source":"/srv/data","options":["rbind"]},{"destination":"/etc/hosts","type":"bind","source":"/x/hosts","options":["bind"]}]}`), nil, false, errdefs.ErrInvalidArgument},
		{"no process", archive("noproc", `{"linux":{}}`), nil, false, errdefs.ErrInvalidArgument},
		{"relative archive path is an image reference", "ck.tar", nil, false, errdefs.ErrNotFound},
	} {
		p := pod
		if tc.userns {
			p = uresp.PodSandboxId
		}
		cfg := unitCtr("restored")
		cfg.Image.Image = tc.archive
		cfg.Mounts = tc.mounts
		_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p, Config: cfg})
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// The bind mount given again, the same archive is accepted.
	cfg := unitCtr("restored")
	cfg.Image.Image = filepath.Join(dir, "mount.tar")
	cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data/", HostPath: t.TempDir()}}
	if _, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg}); err != nil {
		t.Errorf("with its bind mount: %v", err)
	}
	if n := len(f.srv.containers.List()); n != 1 {
		t.Errorf("%d containers after the refusals, want the accepted one", n)
	}
}

func writeTestTar(t *testing.T, p string, files map[string]string) {
	t.Helper()
	out, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	tw := tar.NewWriter(out)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint image (the archive's files added to an empty image, with
// the checkpoint annotation), as kubelet pulls it for a pod, is restored
// like the archive; an image without the annotation is an image.
func TestRestoreFromCheckpointImage(t *testing.T) {
	f, src := checkpointFixture(t)
	ctx := context.Background()
	archive := filepath.Join(t.TempDir(), "ck.tar")
	if _, err := f.srv.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: src, Location: archive}); err != nil {
		t.Fatal(err)
	}
	ar, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for name, b := range readTar(t, ar) {
		files[name] = string(b)
	}
	ar.Close()
	const ckID = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	f.images.Registry["localhost/ck:1"] = image.Image{ID: ckID, RepoTags: []string{"localhost/ck:1"},
		Annotations: map[string]string{checkpointImageAnnotation: "app"}}
	f.images.TopLayers = map[string]map[string]string{ckID: files}
	if _, err := f.images.Pull(ctx, "localhost/ck:1", nil); err != nil {
		t.Fatal(err)
	}
	pod := f.srv.containers.List()[0].SandboxID
	cfg := unitCtr("restored")
	cfg.Image.Image = "localhost/ck:1"
	// Off by default: the image is the pod author's, the credentials
	// its processes come back with are the checkpoint's.
	if _, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "restore_checkpoint_images") {
		t.Fatalf("checkpoint image with restore_checkpoint_images off: %v, want FailedPrecondition naming the option", err)
	}
	f.cfg.Runtime.RestoreCheckpointImages = true
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	if got := f.rt.RestoredFrom[resp.ContainerId]; got != "fake pstree of "+src {
		t.Errorf("restored from %q, want the checkpoint of %s", got, src)
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.ImageId != testImageID {
		t.Errorf("restored container's image %s, want the checkpointed one's %s", st.Status.ImageId, testImageID)
	}
	// The same files without the annotation make no checkpoint.
	const plainID = "sha256:4444444444444444444444444444444444444444444444444444444444444444"
	f.images.Registry["localhost/plain:1"] = image.Image{ID: plainID, RepoTags: []string{"localhost/plain:1"}, Config: v1.Config{Cmd: []string{"sh"}}}
	f.images.TopLayers[plainID] = files
	if _, err := f.images.Pull(ctx, "localhost/plain:1", nil); err != nil {
		t.Fatal(err)
	}
	cfg = unitCtr("plain")
	cfg.Image.Image = "localhost/plain:1"
	presp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := f.srv.containers.Get(presp.ContainerId); c == nil || c.Restored {
		t.Errorf("a container of an image without the checkpoint annotation was restored")
	}
}
