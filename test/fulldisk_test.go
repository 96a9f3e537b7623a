package test

import (
	"crypto/rand"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// TestFullDisk runs pinrt on a small ext4 of its own and fills it: a
// pull, a CreateContainer and a RunPodSandbox that meet the full disk
// fail with ResourceExhausted naming where, leave nothing of themselves,
// and the daemon keeps serving; a SIGKILL while the disk is full loses
// nothing; once there is room again, the same requests succeed.
func TestFullDisk(t *testing.T) {
	RequireRoot(t)
	for _, tool := range []string{"mkfs.ext4", "fallocate", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	reg := testimage.StartRegistry(t)
	small := reg.Push(t, "fulldisk/small:1", testimage.Busybox(t))
	big := make([]byte, 48<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	large := reg.Push(t, "fulldisk/large:1", testimage.Build(t, testimage.Spec{Layers: [][]testimage.File{{{Path: "big", Content: big}}}}))

	d := NewDaemon(t, Options{Network: true})
	fsImage := filepath.Join(d.Dir, "root.img")
	if err := os.MkdirAll(d.Root, 0o711); err != nil {
		t.Fatal(err)
	}
	run(t, "truncate", "-s", "160M", fsImage)
	run(t, "mkfs.ext4", "-q", "-F", "-m", "0", fsImage)
	run(t, "mount", "-o", "loop", fsImage, d.Root)
	// The daemon goes before its root: this runs before the harness's
	// cleanup, which finds it stopped.
	filler, rest := filepath.Join(d.Root, "filler"), filepath.Join(d.Root, "filler.rest")
	unfill := func() {
		for _, f := range []string{filler, rest} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() {
		unfill()
		if d.conn != nil && d.Running() {
			d.removeAllPods()
		}
		if err := d.Stop(); err != nil {
			t.Errorf("stopping pinrt: %v", err)
		}
		if out, err := exec.Command("umount", d.Root).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", d.Root, err, out)
			_ = exec.Command("umount", "-l", d.Root).Run()
		}
	})
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	// fill leaves about leave bytes free; 0 fills the last block too.
	fill := func(leave int64) {
		t.Helper()
		unfill()
		var st unix.Statfs_t
		if err := unix.Statfs(d.Root, &st); err != nil {
			t.Fatal(err)
		}
		// The extents of a file that size need blocks of their own.
		n := int64(st.Bavail)*st.Bsize - max(leave, 8<<20)
		if n > 0 {
			run(t, "fallocate", "-l", strconv.FormatInt(n, 10), filler)
		}
		if leave == 0 {
			// dd stops at the full disk, which is the point.
			_ = exec.Command("dd", "if=/dev/zero", "of="+rest, "bs=4096").Run()
		}
	}
	wantFull := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), d.Root) {
			t.Errorf("%s on a full disk: %v, want ResourceExhausted naming a path under %s", what, err, d.Root)
		}
		if _, err := d.Runtime.Version(Ctx(t), &runtimeapi.VersionRequest{}); err != nil {
			t.Fatalf("the daemon stopped serving after %s on a full disk: %v", what, err)
		}
	}

	// A pull that runs out of room: nothing of it stays.
	before := rootFiles(t, d.Root)
	fill(16 << 20)
	_, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: large}})
	wantFull("PullImage", err)
	if diff := fileDiff(before, rootFiles(t, d.Root)); len(diff) > 0 {
		t.Errorf("the failed pull left:\n%s", strings.Join(diff, "\n"))
	}

	// A pod, and a container in it, on a full disk.
	unfill()
	if _, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: small}}); err != nil {
		t.Fatal(err)
	}
	podCfg := PodConfig("fulldisk-a")
	pod := d.RunPod(t, podCfg)
	ips := d.LeasedIPs(t)
	before = rootFiles(t, d.Root)
	fill(0)
	ctrCfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: small},
		Command: []string{"sleep", "1000"},
	}
	_, err = d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: ctrCfg, SandboxConfig: podCfg})
	wantFull("CreateContainer", err)
	_, err = d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: PodConfig("fulldisk-b")})
	wantFull("RunPodSandbox", err)
	if diff := fileDiff(before, rootFiles(t, d.Root)); len(diff) > 0 {
		t.Errorf("the failed requests left:\n%s", strings.Join(diff, "\n"))
	}
	if got := d.LeasedIPs(t); len(got) != len(ips) {
		t.Errorf("leased IPs after the failed RunPodSandbox: %v, want %v", got, ips)
	}
	if resp, err := d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{}); err != nil || len(resp.Containers) != 0 {
		t.Errorf("ListContainers after the failed CreateContainer: %v, %v; want none", resp, err)
	}

	// A crash while the disk is full, and a start on it: nothing lost.
	d.Kill()
	if err := d.Start(); err != nil {
		t.Fatalf("start on a full disk: %v", err)
	}
	if st, _ := d.PodStatus(t, pod); st.State != runtimeapi.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod after a SIGKILL on a full disk: %s, want READY", st.State)
	}

	// Room again: the same requests succeed.
	unfill()
	ctr, err := d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: ctrCfg, SandboxConfig: podCfg})
	if err != nil {
		t.Fatalf("CreateContainer with room: %v", err)
	}
	if _, err := d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId}); err != nil {
		t.Fatalf("StartContainer with room: %v", err)
	}
	d.RunPod(t, PodConfig("fulldisk-b"))
	if _, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: large}}); err != nil {
		t.Fatalf("PullImage with room: %v", err)
	}

	// kubelet's eviction of the pod that filled the disk: the container
	// writes until nothing is left, then kubelet stops and removes it and
	// its pod, as it does under disk pressure. Each step must work on the
	// full disk, and the room must come back.
	evictFullDisk(t, d, small, func() {
		// What the container's own writes left (a block ext4 kept back
		// for its delayed allocation) is taken too: no block is free.
		run(t, "sync")
		_ = exec.Command("dd", "if=/dev/zero", "of="+rest, "bs=4096").Run()
		run(t, "sync")
	})
}

// evictFullDisk runs a pod whose container fills d's root (topUp then
// takes what is left), then stops and removes it the way kubelet's
// eviction does, and checks the space comes back.
func evictFullDisk(t *testing.T, d *Daemon, image string, topUp func()) {
	podCfg := PodConfig("fulldisk-hog")
	pod := d.RunPod(t, podCfg)
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "hog"}, Image: &runtimeapi.ImageSpec{Image: image},
		Command: []string{"sh", "-c", "dd if=/dev/zero of=/hog bs=1M; dd if=/dev/zero of=/hog.rest bs=4k; sleep 1000"},
	}
	ctr, err := d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	id := ctr.ContainerId
	if _, err := d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(d.Root, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	deadline := time.Now().Add(time.Minute)
	for free() >= 4096 {
		if time.Now().After(deadline) {
			t.Fatalf("the container did not fill the disk: %d bytes free", free())
		}
		time.Sleep(100 * time.Millisecond)
	}
	topUp()
	t.Logf("disk full: %d bytes free", free())
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s on the disk the container filled: %v", what, err)
		}
	}
	_, err = d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 2})
	step("StopContainer", err)
	st, err := d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	step("ContainerStatus", err)
	// conmon records the exit on the run root, not on the full disk: the
	// code is the SIGKILL's, not an unknown one.
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Status.ExitCode != 137 {
		t.Errorf("container after StopContainer: %s exit %d, want EXITED with 137", st.Status.State, st.Status.ExitCode)
	}
	_, err = d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id})
	step("RemoveContainer", err)
	_, err = d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod})
	step("StopPodSandbox", err)
	_, err = d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod})
	step("RemovePodSandbox", err)
	if f := free(); f < 16<<20 {
		t.Errorf("after the eviction %d bytes are free, want the container's writes back", f)
	}
	if _, err := d.Runtime.PodSandboxStatus(Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: pod}); status.Code(err) != codes.NotFound {
		t.Errorf("the evicted pod's status: %v, want NotFound", err)
	}
}

// run runs a command and fails the test on error.
func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// rootFiles lists the files under root with their sizes, but the filler
// and what the daemon rewrites on its own (its lock, its logs).
func rootFiles(t *testing.T, root string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return nil // a file removed meanwhile
		}
		rel, _ := filepath.Rel(root, p)
		if strings.HasPrefix(rel, "filler") || rel == "lost+found" || rel == "pinrt.lock" {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		var size int64
		if fi, err := de.Info(); err == nil && !de.IsDir() {
			size = fi.Size()
		}
		out[rel] = size
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fileDiff lists the files that appeared or changed size. An empty
// directory at the top (containers/, made by the first CreateContainer
// ever) is the store's, not a request's.
func fileDiff(before, after map[string]int64) []string {
	var out []string
	for p, size := range after {
		if old, ok := before[p]; !ok {
			if !strings.Contains(p, "/") && !slices.ContainsFunc(slices.Collect(maps.Keys(after)), func(q string) bool { return strings.HasPrefix(q, p+"/") }) {
				continue
			}
			out = append(out, "new "+p)
		} else if old != size && !strings.HasSuffix(p, ".json") {
			out = append(out, "changed "+p)
		}
	}
	slices.Sort(out)
	return out
}
