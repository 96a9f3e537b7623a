package test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// TestImageVolume mounts an image as a volume (KEP-4639) in a pod with
// its own user namespace: read-only even when asked read-write, owned
// by the container's root inside, a sub path, its image ID in
// ContainerStatus, and nothing left behind by a refused or removed one.
func TestImageVolume(t *testing.T) {
	e := newCtrEnv(t)
	// One layer on purpose: overlayfs refuses a single lower dir without
	// an upper one, which the store must handle.
	tools := testimage.Build(t, testimage.Spec{NoBusybox: true, Layers: [][]testimage.File{{
		{Path: "tools/", Mode: 0o755}, {Path: "tools/hello", Content: []byte("hello\n")},
		{Path: "tools/www", Content: []byte("w\n"), UID: 33, GID: 33},
		{Path: "etc/", Mode: 0o755}, {Path: "etc/tool.conf", Content: []byte("level=3\n")},
	}}})
	toolsRef := e.reg.Push(t, "tools:1", tools)
	toolsID := e.pull(t, toolsRef)

	pod, podCfg := e.pod(t, UsernsPod(PodConfig("imgvol"), 0))
	_, info := e.d.PodStatus(t, pod)
	hostRoot := info.UIDMappings[0].HostID

	cfg := e.ctr("vol", "sleep", "1000")
	cfg.Mounts = []*runtimeapi.Mount{
		{ContainerPath: "/tools", Image: &runtimeapi.ImageSpec{Image: toolsRef}, Readonly: true},
		{ContainerPath: "/conf", Image: &runtimeapi.ImageSpec{Image: toolsRef}, ImageSubPath: "etc", Readonly: true},
	}
	id := e.run(t, pod, podCfg, cfg)

	if out := e.mustExec(t, id, "cat", "/tools/tools/hello"); out != "hello\n" {
		t.Errorf("/tools/tools/hello = %q", out)
	}
	for file, want := range map[string]string{"/tools/tools/hello": "0:0", "/tools/tools/www": "33:33", "/tools": "0:0"} {
		if out := e.mustExec(t, id, "stat", "-c", "%u:%g", file); strings.TrimSpace(out) != want {
			t.Errorf("inside, %s is owned by %q, want %s", file, strings.TrimSpace(out), want)
		}
	}
	out, code := e.exec(t, id, "touch", "/tools/tools/new")
	if code == 0 || !strings.Contains(out, "Read-only file system") {
		t.Errorf("write into the image volume: exit %d %q, want EROFS", code, out)
	}
	if out, code := e.exec(t, id, "sh", "-c", "echo x > /conf/tool.conf"); code == 0 || !strings.Contains(out, "Read-only file system") {
		t.Errorf("write into the sub path volume: exit %d %q, want EROFS", code, out)
	}
	if out := e.mustExec(t, id, "cat", "/conf/tool.conf"); out != "level=3\n" {
		t.Errorf("/conf/tool.conf = %q, want the image's etc/tool.conf", out)
	}
	if out := e.mustExec(t, id, "ls", "/conf"); strings.TrimSpace(out) != "tool.conf" {
		t.Errorf("/conf holds %q, want only the sub path's tool.conf", out)
	}
	if out := e.mustExec(t, id, "grep", " /tools ", "/proc/self/mountinfo"); !strings.Contains(out, " ro,") {
		t.Errorf("/tools mount %q, want ro", out)
	}
	hostView := filepath.Join(e.d.Root, "containers", id, "volumes", "0", "mnt", "tools", "hello")
	if got := fileOwner(t, hostView); got != hostRoot {
		t.Errorf("host view of the volume's file: uid %d, want the pod's mapped root %d", got, hostRoot)
	}

	var got []string
	for _, m := range e.status(t, id).Mounts {
		if m.Image != nil {
			got = append(got, m.ContainerPath+" "+m.Image.Image+" "+m.Image.ImageRef+" "+m.ImageSubPath+" "+boolStr(m.Readonly))
		}
	}
	want := []string{"/tools " + toolsRef + " " + toolsID + "  ro", "/conf " + toolsRef + " " + toolsID + " etc ro"}
	if !slices.Equal(got, want) {
		t.Errorf("ContainerStatus image mounts %q, want %q", got, want)
	}

	// Refused volumes leave no container, directory or mount behind.
	before, beforeMounts := dirNames(t, filepath.Join(e.d.Root, "containers")), MountsUnder(e.d.Dir)
	for name, m := range map[string]*runtimeapi.Mount{
		"not pulled":       {ContainerPath: "/x", Image: &runtimeapi.ImageSpec{Image: e.reg.Ref("absent:1")}, Readonly: true},
		"missing sub path": {ContainerPath: "/x", Image: &runtimeapi.ImageSpec{Image: toolsRef}, ImageSubPath: "nope", Readonly: true},
		"escaping path":    {ContainerPath: "/x", Image: &runtimeapi.ImageSpec{Image: toolsRef}, ImageSubPath: "../../etc", Readonly: true},
		"writable":         {ContainerPath: "/x", Image: &runtimeapi.ImageSpec{Image: toolsRef}},
	} {
		bad := e.ctr("bad", "true")
		bad.Mounts = []*runtimeapi.Mount{cfg.Mounts[0], m}
		_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: bad, SandboxConfig: podCfg})
		wantC := codes.NotFound
		if name == "escaping path" || name == "writable" {
			wantC = codes.InvalidArgument
		}
		wantCode(t, err, wantC, "image volume /x")
		if after := dirNames(t, filepath.Join(e.d.Root, "containers")); !slices.Equal(after, before) {
			t.Errorf("%s: container dirs %v, want %v", name, after, before)
		}
		if after := MountsUnder(e.d.Dir); !slices.Equal(after, beforeMounts) {
			t.Errorf("%s: mounts %v, want %v", name, after, beforeMounts)
		}
	}

	// Removing the image in use behaves as for a container's image: it
	// goes from the list, the volume keeps working until the container
	// goes.
	imgRemove(t, e.d, toolsRef)
	if out := e.mustExec(t, id, "cat", "/tools/tools/hello"); out != "hello\n" {
		t.Errorf("volume after RemoveImage: %q", out)
	}
	if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if left := MountsUnder(filepath.Join(e.d.Root, "containers")); len(left) != 0 {
		t.Errorf("mounts left after RemoveContainer: %v", left)
	}
	if _, err := os.Stat(filepath.Join(e.d.Root, "containers", id)); !os.IsNotExist(err) {
		t.Errorf("container dir left: %v", err)
	}
}

func boolStr(ro bool) string {
	if ro {
		return "ro"
	}
	return "rw"
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// An image volume outlives a daemon restart, keeps its image's layers
// in use (a RemoveImage after the restart must not delete them), and goes
// with its pod.
func TestImageVolumeRestart(t *testing.T) {
	e := newCtrEnv(t)
	tools := testimage.Build(t, testimage.Spec{NoBusybox: true, Layers: [][]testimage.File{
		{{Path: "a/", Mode: 0o755}, {Path: "a/one", Content: []byte("1\n")}},
		{{Path: "a/two", Content: []byte("2\n")}},
	}})
	toolsRef := e.reg.Push(t, "tools:2", tools)
	e.pull(t, toolsRef)
	pod, podCfg := e.pod(t, UsernsPod(PodConfig("imgvol-restart"), 0))
	cfg := e.ctr("vol", "sleep", "1000")
	cfg.Mounts = []*runtimeapi.Mount{{ContainerPath: "/v", Image: &runtimeapi.ImageSpec{Image: toolsRef}, ImageSubPath: "a", Readonly: true}}
	id := e.run(t, pod, podCfg, cfg)
	if err := e.d.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	layers := filepath.Join(e.d.Root, "images", "layers")
	before := dirNames(t, layers)
	if len(before) == 0 {
		t.Fatalf("no layers under %s", layers)
	}
	imgRemove(t, e.d, toolsRef)
	if after := dirNames(t, layers); !slices.Equal(after, before) {
		t.Errorf("layers %v after RemoveImage, want the volume's kept: %v", after, before)
	}
	if out := e.mustExec(t, id, "cat", "/v/one", "/v/two"); out != "1\n2\n" {
		t.Errorf("volume after restart and RemoveImage: %q", out)
	}
	if m := e.status(t, id).Mounts; len(m) != 1 || m[0].GetImage().GetImage() != toolsRef || m[0].ImageSubPath != "a" {
		t.Errorf("status mounts after restart: %v", m)
	}
	if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if left := append(e.d.Leftovers(), e.containerLeftovers()...); len(left) > 0 {
		t.Errorf("left after removing the pod: %v", left)
	}
}
