package server

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci/ocitest"
)

// readTar returns the regular files of the tar archive r by name.
func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files, err := tarFiles(r)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// tarFiles returns the regular files of the tar archive r by name.
func tarFiles(r io.Reader) (map[string][]byte, error) {
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[hdr.Name] = b
	}
}

// checkpointFixture is a running container of the fake runtime, with a
// writable layer holding one file.
func checkpointFixture(t *testing.T) (*ctrFixture, string) {
	t.Helper()
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("app"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	upper := filepath.Join(f.srv.containerDir(resp.ContainerId), "upper", "data")
	if err := os.MkdirAll(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "state"), []byte("written by the container"), 0o640); err != nil {
		t.Fatal(err)
	}
	return f, resp.ContainerId
}

// noDumpsLeft checks that no dump directory remains under the root.
func noDumpsLeft(t *testing.T, f *ctrFixture) {
	t.Helper()
	if ents, _ := os.ReadDir(filepath.Join(f.cfg.Root, checkpointWorkDir)); len(ents) > 0 {
		t.Errorf("%d dump directories left under %s, the first %s", len(ents), checkpointWorkDir, ents[0].Name())
	}
}

func TestCheckpointContainerArchive(t *testing.T) {
	f, id := checkpointFixture(t)
	out := filepath.Join(t.TempDir(), "ck.tar")
	if _, err := f.srv.CheckpointContainer(context.Background(), &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: out, Timeout: 30}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("archive mode %v, want 0600: it holds the container's memory", fi.Mode().Perm())
	}
	ar, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ar.Close()
	files := readTar(t, ar)
	if got := string(files["checkpoint/pstree.img"]); got != "fake pstree of "+id {
		t.Errorf("checkpoint/pstree.img = %q", got)
	}
	if got := string(files["dump.log"]); got != "fake dump of "+id+"\n" {
		t.Errorf("dump.log = %q", got)
	}
	var cfg checkpointConfig
	if err := json.Unmarshal(files["config.dump"], &cfg); err != nil {
		t.Fatalf("config.dump: %v", err)
	}
	if cfg.ID != id || cfg.Name != "app" || cfg.RootfsImage != testImageID || cfg.RootfsImageName != "docker.io/library/busybox:latest" ||
		cfg.OCIRuntime != "runc" || cfg.CreatedTime.IsZero() || cfg.CheckpointedAt.Before(cfg.CreatedTime) {
		t.Errorf("config.dump = %+v", cfg)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(files["spec.dump"], &spec); err != nil {
		t.Fatalf("spec.dump: %v", err)
	}
	if spec.Annotations["io.kubernetes.cri.container-name"] != "app" || spec.Annotations["io.kubernetes.cri.sandbox-name"] != "p" ||
		spec.Annotations["io.kubernetes.cri.sandbox-namespace"] != "ns" {
		t.Errorf("spec.dump annotations = %v, want the container's and its pod's names", spec.Annotations)
	}
	diff := readTar(t, bytes.NewReader(files["rootfs-diff.tar"]))
	if got := string(diff["data/state"]); got != "written by the container" {
		t.Errorf("rootfs-diff.tar data/state = %q (entries %v)", got, keys(diff))
	}
	if _, ok := files["deleted.files"]; ok {
		t.Errorf("deleted.files without a deleted file: %s", files["deleted.files"])
	}
	if st := f.rt.Containers[id].Status; st != "running" {
		t.Errorf("container is %s after the checkpoint, want running", st)
	}
	noDumpsLeft(t, f)
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A request that cannot be served is refused with its code before
// anything is dumped, and a dump that fails leaves no archive and no
// dump directory.
func TestCheckpointContainerRefusals(t *testing.T) {
	f, id := checkpointFixture(t)
	ctx := context.Background()
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.tar")
	if err := os.WriteFile(existing, []byte("the operator's"), 0o600); err != nil {
		t.Fatal(err)
	}
	created, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: f.srv.containers.List()[0].SandboxID, Config: unitCtr("idle"), SandboxConfig: unitPod("p", false).Config})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  *runtimeapi.CheckpointContainerRequest
		want func(error) bool
	}{
		{"no location", &runtimeapi.CheckpointContainerRequest{ContainerId: id}, errdefs.IsInvalidArgument},
		{"relative location", &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: "ck.tar"}, errdefs.IsInvalidArgument},
		{"unclean location", &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: dir + "/../" + filepath.Base(dir) + "/ck.tar"}, errdefs.IsInvalidArgument},
		{"location in a missing directory", &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "missing", "ck.tar")}, errdefs.IsInvalidArgument},
		{"location taken", &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: existing}, errdefs.IsAlreadyExists},
		{"location is a directory", &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: dir}, errdefs.IsAlreadyExists},
		{"negative timeout", &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "ck.tar"), Timeout: -1}, errdefs.IsInvalidArgument},
		{"unknown container", &runtimeapi.CheckpointContainerRequest{ContainerId: "0123456789ab", Location: filepath.Join(dir, "ck.tar")}, errdefs.IsNotFound},
		{"hostile container ID", &runtimeapi.CheckpointContainerRequest{ContainerId: "../../etc", Location: filepath.Join(dir, "ck.tar")}, errdefs.IsNotFound},
		{"container not started", &runtimeapi.CheckpointContainerRequest{ContainerId: created.ContainerId, Location: filepath.Join(dir, "ck.tar")}, errdefs.IsFailedPrecondition},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.srv.CheckpointContainer(ctx, tc.req)
			if !tc.want(err) {
				t.Fatalf("err = %v", err)
			}
		})
	}
	f.rt.CheckpointErr = errors.New("criu failed: type DUMP errno 0")
	if _, err := f.srv.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: filepath.Join(dir, "ck.tar")}); err == nil {
		t.Fatal("a failed dump succeeded")
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "the operator's" {
		t.Errorf("the file at a taken location changed: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in the location's directory, want only the one there before", len(ents))
	}
	noDumpsLeft(t, f)
}

// A dump a crash cut short is removed at the next start.
func TestCheckpointDumpsSweptAtRestore(t *testing.T) {
	f := newCtrFixture(t)
	left := filepath.Join(f.cfg.Root, checkpointWorkDir, "0123456789ab-1", "checkpoint")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "pages-1.img"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	f.srv.Restore(context.Background())
	noDumpsLeft(t, f)
}

// deadlineRuntime fails a checkpoint whose context is done, as runc's
// killed dump would, and records the deadline it was given.
type deadlineRuntime struct {
	*ocitest.Runtime
	deadline time.Time
}

func (r *deadlineRuntime) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	r.deadline, _ = ctx.Deadline()
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.Runtime.Checkpoint(ctx, id, imageDir, workDir)
}

// A timeout too long for a Duration is as good as none; it must not
// wrap into one already past.
func TestCheckpointContainerHugeTimeout(t *testing.T) {
	for _, timeout := range []int64{math.MaxInt64, math.MaxInt64 / 1000, 1 << 40} {
		t.Run(fmt.Sprint(timeout), func(t *testing.T) {
			f, id := checkpointFixture(t)
			rt := &deadlineRuntime{Runtime: f.rt}
			f.srv.deps.Runtimes["runc"] = rt
			out := filepath.Join(t.TempDir(), "ck.tar")
			if _, err := f.srv.CheckpointContainer(context.Background(), &runtimeapi.CheckpointContainerRequest{ContainerId: id, Location: out, Timeout: timeout}); err != nil {
				t.Fatal(err)
			}
			if left := time.Until(rt.deadline); left < 24*time.Hour {
				t.Errorf("the dump had %v left, want practically no bound", left)
			}
		})
	}
}
