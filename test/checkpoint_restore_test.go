package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// TestCheckpointRestore restores a checkpoint into a new pod the way
// CRI-O's users do: crictl checkpoint --export, the container and its
// pod removed, then crictl create with the archive as the image and
// crictl start. The processes come back where they were (the counter
// goes on from its value, not from 1), with the rootfs changes the
// checkpoint held and the bind mount the request gives again, and
// crictl inspect says restored.
func TestCheckpointRestore(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnv(t)
	c := &crictlEnv{ctrEnv: e, bin: crictlBinary(t)}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	withData := func(cfg *runtimeapi.ContainerConfig) *runtimeapi.ContainerConfig {
		cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/data", HostPath: data}}
		return cfg
	}
	pod, podCfg := e.pod(t, PodConfig("rs-before"))
	// It logs every count too: kubectl logs of the restored container.
	workload := "echo mounted > /data/m; " + strings.Replace(checkpointWorkload, "echo $i > /tmp/count;", "echo $i > /tmp/count; echo tick $i;", 1)
	id := e.run(t, pod, podCfg, withData(e.ctr("worker", "sh", "-c", workload)))
	waitEstablished(t, e, id)
	archive := filepath.Join(dir, "worker.tar")
	// Read before: the workload counts on while it is dumped.
	at := counter(t, e, id)
	c.run(t, "checkpoint", "--export="+archive, id)
	c.run(t, "rm", "-f", id)
	c.run(t, "rmp", "-f", pod)

	pod2, podCfg2 := e.pod(t, PodConfig("rs-after"))
	podJSON := filepath.Join(dir, "pod.json")
	writeJSON(t, podJSON, podCfg2)
	restore := e.ctr("worker", "true")
	restore.Image.Image = archive
	ctrJSON := filepath.Join(dir, "ctr.json")
	writeJSON(t, ctrJSON, restore)
	dirs := e.containerDirs(t)
	if _, errOut, err := c.try("create", pod2, ctrJSON, podJSON); err == nil || !strings.Contains(errOut, "/data") {
		t.Fatalf("create without the checkpoint's bind mount: %v, %s; want a refusal naming /data", err, errOut)
	}
	if n := e.containerDirs(t); n != dirs {
		t.Errorf("a refused restore left %d container directories", n-dirs)
	}
	writeJSON(t, ctrJSON, withData(restore))
	ctr := strings.TrimSpace(c.run(t, "create", pod2, ctrJSON, podJSON))
	if out := strings.TrimSpace(c.run(t, "start", ctr)); out != ctr {
		t.Fatalf("crictl start printed %q", out)
	}
	if st := e.status(t, ctr).State; st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("restored container is %v", st)
	}
	if got := strings.TrimSpace(c.run(t, "inspect", "--output", "go-template", "--template", "{{.info.restored}}", ctr)); got != "true" {
		t.Errorf("crictl inspect .info.restored = %q, want true", got)
	}
	n := counter(t, e, ctr)
	if n < at {
		t.Errorf("restored counter at %d, below the %d it had at the checkpoint: the workload started again", n, at)
	}
	time.Sleep(time.Second)
	if after := counter(t, e, ctr); after <= n {
		t.Errorf("restored counter stands at %d", after)
	}
	logPath := e.status(t, ctr).LogPath
	waitFor(t, 10*time.Second, "the restored workload's lines in its new log", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), fmt.Sprintf("stdout F tick %d\n", n+1))
	})
	if got := e.mustExec(t, ctr, "cat", "/data-file"); got != "hello\n" {
		t.Errorf("/data-file of the restored container: %q", got)
	}
	if _, code := e.exec(t, ctr, "test", "-e", "/etc/group"); code == 0 {
		t.Error("/etc/group, deleted before the checkpoint, is back")
	}
	if got := e.mustExec(t, ctr, "cat", "/data/m"); got != "mounted\n" {
		t.Errorf("/data/m through the bind mount: %q", got)
	}
	if _, err := os.Stat(filepath.Join(e.d.Root, "containers", ctr, "checkpoint")); !os.IsNotExist(err) {
		t.Errorf("the checkpoint's images are still in the restored container's directory: %v", err)
	}
	// It stops and goes as any container does.
	c.run(t, "stop", ctr)
	c.run(t, "rm", ctr)
	c.run(t, "stopp", pod2)
}

// TestCheckpointRestoreRefusals: what cannot be restored is refused at
// CreateContainer with its code, and nothing of the container is left.
func TestCheckpointRestoreRefusals(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnv(t)
	dir := t.TempDir()
	pod, podCfg := e.pod(t, PodConfig("rs-refuse"))
	src := e.run(t, pod, podCfg, e.ctr("src", "sleep", "100000"))
	archive := filepath.Join(dir, "src.tar")
	if _, err := e.d.Runtime.CheckpointContainer(Ctx(t), &runtimeapi.CheckpointContainerRequest{ContainerId: src, Location: archive}); err != nil {
		t.Fatal(err)
	}
	usernsPod, usernsCfg := e.pod(t, UsernsPod(PodConfig("rs-userns"), 3700000))

	garbage := filepath.Join(dir, "garbage.tar")
	if err := os.WriteFile(garbage, []byte("not a tar archive at all"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A checkpoint of an image this node does not have.
	foreign := filepath.Join(dir, "foreign.tar")
	writeTar(t, foreign, map[string]string{
		"config.dump":              `{"id":"x","name":"x","rootfsImageName":"registry.invalid/nothere:1"}`,
		"spec.dump":                `{"ociVersion":"1.0.2","process":{"cwd":"/","args":["sh"]},"linux":{}}`,
		"checkpoint/inventory.img": "",
	})
	notCheckpoint := filepath.Join(dir, "plain.tar")
	writeTar(t, notCheckpoint, map[string]string{"etc/passwd": "root:x:0:0::/:/bin/sh\n"})
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	dirs := e.containerDirs(t)
	for _, tc := range []struct {
		name         string
		pod, archive string
		podCfg       *runtimeapi.PodSandboxConfig
		want         codes.Code
	}{
		{"missing archive", pod, filepath.Join(dir, "none.tar"), podCfg, codes.NotFound},
		{"not a tar archive", pod, garbage, podCfg, codes.InvalidArgument},
		{"a tar archive but no checkpoint", pod, notCheckpoint, podCfg, codes.InvalidArgument},
		{"a directory", pod, dir, podCfg, codes.InvalidArgument},
		{"a FIFO", pod, fifo, podCfg, codes.InvalidArgument},
		{"unclean path", pod, dir + "/../" + filepath.Base(dir) + "/src.tar", podCfg, codes.InvalidArgument},
		{"image not present", pod, foreign, podCfg, codes.NotFound},
		{"pod with a user namespace", usernsPod, archive, usernsCfg, codes.FailedPrecondition},
	} {
		cfg := e.ctr("restored", "true")
		cfg.Image.Image = tc.archive
		_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: tc.pod, Config: cfg, SandboxConfig: tc.podCfg})
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	if n := e.containerDirs(t); n != dirs {
		t.Errorf("refused restores left %d container directories", n-dirs)
	}
	resp, err := e.d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Containers) != 1 {
		t.Errorf("%d containers after the refusals, want the checkpointed one", len(resp.Containers))
	}
}

// writeTar writes an archive of the named regular files.
func writeTar(t *testing.T, p string, files map[string]string) {
	t.Helper()
	var fs []testimage.File
	for name, body := range files {
		fs = append(fs, testimage.File{Path: name, Content: []byte(body), Mode: 0o600})
	}
	if err := os.WriteFile(p, testimage.TarBytes(t, fs), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointRestoreKilled kills the daemon while a container is
// restored from a checkpoint (its create, then its start), at a
// different instant each round. After the restart the container is
// gone (a create cut short), created (a start cut short: starting it
// again restores it) or running, and once removed nothing of it is left:
// no directory, no process.
func TestCheckpointRestoreKilled(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnv(t)
	pod, podCfg, archive, at := checkpointCounter(t, e, "rs-killed")
	dirs := e.containerDirs(t)
	// A restart between the create and the start: the start restores.
	cfg := e.ctr("restored-between", "true")
	cfg.Image.Image = archive
	between := e.create(t, pod, podCfg, cfg)
	if err := e.d.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: between}); err != nil {
		log, _ := os.ReadFile(filepath.Join(e.d.Root, "containers", between, "restore.log"))
		t.Fatalf("start after a restart: %v\nrestore.log:\n%s", err, log)
	}
	if n := counter(t, e, between); n < at {
		t.Errorf("restored counter at %d, below the checkpoint's %d", n, at)
	}
	removeContainer(t, e, between)
	for round, delay := range []time.Duration{0, 30 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, 900 * time.Millisecond} {
		cfg := e.ctr("restored-"+strconv.Itoa(round), "true")
		cfg.Image.Image = archive
		rt := e.d.Runtime
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := rt.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			if err == nil {
				_, _ = rt.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId})
			}
		}()
		time.Sleep(delay)
		if err := e.d.Restart(); err != nil {
			t.Fatalf("round %d: restart: %v", round, err)
		}
		<-done
		resp, err := e.d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Containers {
			t.Logf("round %d (kill after %v): the container is %v", round, delay, c.State)
			switch c.State {
			case runtimeapi.ContainerState_CONTAINER_CREATED:
				if _, err := e.d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: c.Id}); err != nil {
					log, _ := os.ReadFile(filepath.Join(e.d.Root, "containers", c.Id, "restore.log"))
					t.Fatalf("round %d (kill after %v): starting the container a kill left created: %v\nrestore.log:\n%s", round, delay, err, log)
				}
			case runtimeapi.ContainerState_CONTAINER_RUNNING:
			default:
				st := e.status(t, c.Id)
				log, _ := os.ReadFile(filepath.Join(e.d.Root, "containers", c.Id, "restore.log"))
				t.Fatalf("round %d (kill after %v): restored container is %v: %s, %s\nrestore.log:\n%s", round, delay, c.State, st.Reason, st.Message, log)
			}
			if n := counter(t, e, c.Id); n < at {
				t.Errorf("round %d: restored counter at %d, below the checkpoint's %d", round, n, at)
			}
			removeContainer(t, e, c.Id)
		}
		if n := e.containerDirs(t); n != dirs {
			t.Errorf("round %d (kill after %v): %d container directories left", round, delay, n-dirs)
		}
		if out, err := exec.Command("pgrep", "-f", restoreMarker).Output(); err == nil {
			t.Errorf("round %d (kill after %v): the workload's processes outlive their container: %s", round, delay, out)
		}
	}
}

// restoreWorkload counts in /tmp/count; its marker names its processes.
const (
	restoreMarker   = "sleep 100003"
	restoreWorkload = `i=0; sleep 100003 & while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done`
)

// checkpointCounter runs the counting workload in a new pod, checkpoints
// it into an archive and removes it; at is its counter before the dump
// (it counts on while it is dumped).
func checkpointCounter(t *testing.T, e *ctrEnv, podName string) (pod string, podCfg *runtimeapi.PodSandboxConfig, archive string, at int) {
	t.Helper()
	pod, podCfg = e.pod(t, PodConfig(podName))
	src := e.run(t, pod, podCfg, e.ctr("counter", "sh", "-c", restoreWorkload))
	archive = filepath.Join(t.TempDir(), "counter.tar")
	at = counter(t, e, src)
	if _, err := e.d.Runtime.CheckpointContainer(Ctx(t), &runtimeapi.CheckpointContainerRequest{ContainerId: src, Location: archive}); err != nil {
		t.Fatal(err)
	}
	removeContainer(t, e, src)
	return pod, podCfg, archive, at
}

func removeContainer(t *testing.T, e *ctrEnv, id string) {
	t.Helper()
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointRestoreFromImage restores the way Kubernetes users do:
// the checkpoint archive's files added to an empty image with the
// checkpoint annotation (what buildah add and buildah config
// --annotation make), pushed to a registry, pulled over the CRI as
// kubelet pulls a pod's image, and named as the new container's image.
func TestCheckpointRestoreFromImage(t *testing.T) {
	requireCRIU(t)
	e := newCtrEnvWith(t, "", func(o *Options) {
		o.Config = strings.Replace(o.Config, "[runtime]\n", "[runtime]\nrestore_checkpoint_images = true\n", 1)
	})
	_, _, archive, at := checkpointCounter(t, e, "rs-image-before")

	var files []testimage.File
	for name, body := range testimage.TarFileAt(t, archive) {
		files = append(files, testimage.File{Path: name, Content: body, Mode: 0o600})
	}
	img, err := mutate.AppendLayers(empty.Image, testimage.Layer(t, files))
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.Annotations(img, map[string]string{"io.kubernetes.cri-o.annotations.checkpoint.name": "counter"}).(v1.Image)
	ref := e.reg.Push(t, "counter-checkpoint:1", img)
	e.pull(t, ref)

	pod2, podCfg2 := e.pod(t, PodConfig("rs-image-after"))
	cfg := e.ctr("counter", "true")
	cfg.Image.Image = ref
	id := e.run(t, pod2, podCfg2, cfg)
	st := e.status(t, id)
	if st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.ImageId != e.bbID {
		t.Errorf("restored container %v of image %s, want running, of the checkpointed container's image %s", st.State, st.ImageId, e.bbID)
	}
	if n := counter(t, e, id); n < at {
		t.Errorf("restored counter at %d, below the checkpoint's %d", n, at)
	}
	if !e.info(t, id).Restored {
		t.Error("verbose info does not say restored")
	}
	removeContainer(t, e, id)
}
