package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/cgroups"
	"github.com/pinrt/pinrt/cni/cnitest"
	"github.com/pinrt/pinrt/conf"
	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/image/imagetest"
	"github.com/pinrt/pinrt/nsmgr"
	"github.com/pinrt/pinrt/nsmgr/nsmgrtest"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/oci/ocitest"
	"github.com/pinrt/pinrt/sandbox"
)

// ctrImages mounts a fake rootfs: a directory with /etc/passwd and
// /etc/group, enough for spec generation to resolve users.
type ctrImages struct {
	*imagetest.Fake
	MountErr error
	// group is the rootfs's /etc/group; "" means root's group only.
	group    string
	mounted  map[string]image.MountRequest
	released []string
	// VolumeErr fails MountImageVolume for the volume at VolumeErrIndex;
	// volumes holds the mounted image volumes by container ID, as
	// UnmountRootfs drops them.
	VolumeErr      error
	VolumeErrIndex int
	volumes        map[string][]image.VolumeRequest
	// changes are the rootfs changes a mount was given, by container:
	// the diff's files and the deleted paths.
	changes map[string]fakeChanges
}

type fakeChanges struct {
	files   map[string][]byte
	deleted []string
}

func (f *ctrImages) Root() string { return "/nonexistent" }
func (f *ctrImages) MountRootfs(_ context.Context, req image.MountRequest) (string, error) {
	if f.MountErr != nil {
		return "", f.MountErr
	}
	rootfs := filepath.Join(req.Dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		return "", err
	}
	group := f.group
	if group == "" {
		group = "root:x:0:\n"
	}
	for name, content := range map[string]string{"passwd": "root:x:0:0:root:/root:/bin/sh\n", "group": group} {
		if err := os.WriteFile(filepath.Join(rootfs, "etc", name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if req.Changes != nil {
		if f.changes == nil {
			f.changes = map[string]fakeChanges{}
		}
		c := fakeChanges{deleted: req.Changes.Deleted}
		if req.Changes.Diff != nil {
			b, err := io.ReadAll(req.Changes.Diff)
			if err != nil {
				return "", err
			}
			if c.files, err = tarFiles(bytes.NewReader(b)); err != nil {
				return "", err
			}
		}
		f.changes[req.ContainerID] = c
	}
	f.mounted[req.ContainerID] = req
	return rootfs, nil
}
func (f *ctrImages) MountImageVolume(_ context.Context, req image.VolumeRequest) (string, error) {
	if f.VolumeErr != nil && req.Index == f.VolumeErrIndex {
		return "", f.VolumeErr
	}
	if _, err := f.Get(req.ImageID); err != nil {
		return "", err
	}
	if f.volumes == nil {
		f.volumes = map[string][]image.VolumeRequest{}
	}
	f.volumes[req.ContainerID] = append(f.volumes[req.ContainerID], req)
	return filepath.Join(req.Dir, "volumes", fmt.Sprint(req.Index), "mnt", req.SubPath), nil
}
func (f *ctrImages) UnmountRootfs(_ context.Context, id, _, _ string) error {
	delete(f.mounted, id)
	delete(f.volumes, id)
	return nil
}
func (f *ctrImages) ReleasePod(_ context.Context, id string) error {
	f.released = append(f.released, id)
	return nil
}
func (f *ctrImages) Usage(string) (uint64, uint64, error) { return 0, 0, nil }

type ctrFixture struct {
	srv    *Server
	rt     *ocitest.Runtime
	images *ctrImages
	ns     *nsmgrtest.Manager
	cfg    *conf.Config
	cg     *fakeCgroups
}

const testImageID = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func newCtrFixture(t *testing.T) *ctrFixture {
	t.Helper()
	cfg := conf.Default()
	cfg.Root, cfg.RunRoot = t.TempDir(), t.TempDir()
	ids, err := nsmgr.NewAllocator(cfg.Userns.MinHostID, cfg.Userns.MaxHostID, cfg.Userns.MaxPods)
	if err != nil {
		t.Fatal(err)
	}
	img := image.Image{
		ID: testImageID, RepoTags: []string{"docker.io/library/busybox:latest"},
		RepoDigests: []string{"docker.io/library/busybox@sha256:2222"},
		Config:      v1.Config{Cmd: []string{"sh"}, StopSignal: "SIGUSR1"},
	}
	fake := &imagetest.Fake{Registry: map[string]image.Image{"busybox": img}}
	if _, err := fake.Pull(context.Background(), "busybox", nil); err != nil {
		t.Fatal(err)
	}
	f := &ctrFixture{rt: ocitest.New(), images: &ctrImages{Fake: fake, mounted: map[string]image.MountRequest{}}, ns: nsmgrtest.New(cfg.RunRoot), cfg: cfg,
		cg: &fakeCgroups{groups: map[string]cgroups.Stats{}}}
	f.srv = newTestServer(t, cfg, Deps{
		Network: &cnitest.Fake{}, Namespaces: f.ns, IDs: ids,
		Shm: &fakeShm{mounted: map[string]bool{}}, Images: f.images,
		Runtimes: map[string]ContainerRuntime{"runc": f.rt}, Cgroups: f.cg,
	})
	return f
}

func (f *ctrFixture) pod(t *testing.T, userns bool) (string, *runtimeapi.PodSandboxConfig) {
	t.Helper()
	return f.runPod(t, unitPod("p", userns))
}

// runPod runs the pod of req, with a log directory and a hostname.
func (f *ctrFixture) runPod(t *testing.T, req *runtimeapi.RunPodSandboxRequest) (string, *runtimeapi.PodSandboxConfig) {
	t.Helper()
	req.Config.LogDirectory = filepath.Join(t.TempDir(), "logs")
	req.Config.Hostname = "podhost"
	resp, err := f.srv.RunPodSandbox(context.Background(), req)
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	return resp.PodSandboxId, req.Config
}

func unitCtr(name string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"},
		Command:  []string{"sleep", "1"},
		LogPath:  name + "/0.log",
	}
}

// started creates and starts container name of unitCtr in pod.
func (f *ctrFixture) started(t *testing.T, pod, name string) string {
	t.Helper()
	ctx := context.Background()
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr(name)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	return resp.ContainerId
}

// nothingLeft checks that no container state, mount or runtime container
// remains.
func (f *ctrFixture) nothingLeft(t *testing.T) {
	t.Helper()
	if entries, _ := os.ReadDir(filepath.Join(f.cfg.Root, "containers")); len(entries) > 0 {
		t.Errorf("%d container directories left", len(entries))
	}
	if len(f.images.mounted) > 0 {
		t.Errorf("rootfs still mounted: %v", f.images.mounted)
	}
	if len(f.images.volumes) > 0 {
		t.Errorf("image volumes still mounted: %v", f.images.volumes)
	}
	if len(f.rt.Containers) > 0 {
		t.Errorf("runtime containers left: %v", f.rt.Containers)
	}
	if n := len(f.srv.containers.List()); n > 0 {
		t.Errorf("%d containers still in the store", n)
	}
	if entries, _ := os.ReadDir(f.srv.exitDir()); len(entries) > 0 {
		t.Errorf("%d exit files left, the first %s", len(entries), entries[0].Name())
	}
}

func TestContainerLogPath(t *testing.T) {
	tests := []struct {
		dir, rel, want string
		wantErr        string
	}{
		{"/var/log/pods/p", "c/0.log", "/var/log/pods/p/c/0.log", ""},
		{"/var/log/pods/p", "c/../c/1.log", "/var/log/pods/p/c/1.log", ""},
		{"", "c/0.log", "", ""},
		{"/var/log/pods/p", "", "", ""},
		{"/var/log/pods/p", "../q/0.log", "", `log path "../q/0.log" escapes the pod's log directory "/var/log/pods/p": invalid argument`},
		{"/var/log/pods/p", "..", "", `log path ".." escapes the pod's log directory "/var/log/pods/p": invalid argument`},
		{"/var/log/pods/p", "/etc/passwd", "", `log path "/etc/passwd" must be relative to the pod's log directory: invalid argument`},
		{"/var/log/pods/p", strings.Repeat("x/", 2100) + "0.log", "", "log path is 4221 bytes long, more than the kernel's 4095: invalid argument"},
		{"/var/log/pods/p", strings.Repeat("x", 256), "", "log path has a component of 256 bytes, more than the kernel's 255: invalid argument"},
		{"/var/log/pods/p", "c:d/0.log", "", `log path "/var/log/pods/p/c:d/0.log": the container monitor takes no ':' in a log path: invalid argument`},
		{"/var/log/pods/p:q", "0.log", "", `log path "/var/log/pods/p:q/0.log": the container monitor takes no ':' in a log path: invalid argument`},
	}
	for _, tc := range tests {
		t.Run(tc.dir+"+"+tc.rel, func(t *testing.T) {
			got, err := containerLogPath(tc.dir, tc.rel)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr || !errdefs.IsInvalidArgument(err) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("= %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestStopSignal(t *testing.T) {
	tests := []struct {
		in   string
		want syscall.Signal
		bad  bool
	}{
		{"", syscall.SIGTERM, false},
		{"SIGUSR1", syscall.SIGUSR1, false},
		{"usr1", syscall.SIGUSR1, false},
		{"SIGKILL", syscall.SIGKILL, false},
		{"15", syscall.SIGTERM, false},
		{"64", 64, false},
		{"SIGRTMIN+3", 37, false}, // systemd's, in kind's node image
		{"rtmin", 34, false},
		{"SIGRTMAX-1", 63, false},
		{"SIGRTMAX", 64, false},
		{"SIGIOT", syscall.SIGABRT, false},
		{"cld", syscall.SIGCHLD, false},
		{"SIGNOPE", 0, true},
		{"99", 0, true},
		{"65", 0, true},
		{"SIGRTMIN+31", 0, true},
		{"SIGRTMIN-1", 0, true},
		{"SIGRTMAX+1", 0, true},
		{"SIGRTMIN+03", 0, true},
		{"SIGRTMIN+", 0, true},
	}
	for _, tc := range tests {
		got, err := stopSignal(tc.in)
		if tc.bad != errdefs.IsInvalidArgument(err) || got != tc.want {
			t.Errorf("stopSignal(%q) = %v, %v; want %v (bad=%v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

// Every signal CRI names survives the trip kubelet's lifecycle.stopSignal
// takes: the enum to the recorded name, and back in ContainerStatus.
func TestCRISignalRoundTrip(t *testing.T) {
	for n, enum := range runtimeapi.Signal_name {
		want := runtimeapi.Signal(n)
		name, err := criSignalName(want)
		if err != nil {
			t.Errorf("%s: %v", enum, err)
			continue
		}
		if want == runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
			if name != "" {
				t.Errorf("RUNTIME_DEFAULT recorded as %q, want the image's", name)
			}
			continue
		}
		if got := criSignal(name); got != want {
			t.Errorf("%s recorded as %q reads back as %s", enum, name, got)
		}
	}
	if _, err := criSignalName(999); !errdefs.IsInvalidArgument(err) {
		t.Errorf("signal 999: %v, want InvalidArgument", err)
	}
	// What an image gives is reported by the signal's CRI name.
	for in, want := range map[string]runtimeapi.Signal{
		"":            runtimeapi.Signal_SIGNAL_SIGTERM,
		"10":          runtimeapi.Signal_SIGNAL_SIGUSR1,
		"usr2":        runtimeapi.Signal_SIGNAL_SIGUSR2,
		"SIGRTMIN+3":  runtimeapi.Signal_SIGNAL_SIGRTMINPLUS3,
		"SIGRTMIN+20": runtimeapi.Signal_SIGNAL_SIGRTMAXMINUS10,
		"37":          runtimeapi.Signal_SIGNAL_SIGRTMINPLUS3,
		"SIGNOPE":     runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT,
	} {
		if got := criSignal(in); got != want {
			t.Errorf("criSignal(%q) = %s, want %s", in, got, want)
		}
	}
}

// The pod's stop signal (lifecycle.stopSignal, KEP-4960) wins over the
// image's: it is what StopContainer sends and what ContainerStatus
// reports; without one the image's is both.
func TestContainerStopSignal(t *testing.T) {
	tests := []struct {
		name     string
		signal   runtimeapi.Signal
		want     runtimeapi.Signal
		wantExit int32
	}{
		{"image's", runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT, runtimeapi.Signal_SIGNAL_SIGUSR1, 128 + 10},
		{"pod's", runtimeapi.Signal_SIGNAL_SIGQUIT, runtimeapi.Signal_SIGNAL_SIGQUIT, 128 + 3},
		{"real-time", runtimeapi.Signal_SIGNAL_SIGRTMINPLUS3, runtimeapi.Signal_SIGNAL_SIGRTMINPLUS3, 128 + 37},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			ctx := context.Background()
			pod, podCfg := f.pod(t, false)
			cfg := unitCtr("stopper")
			cfg.StopSignal = tc.signal
			resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			if err != nil {
				t.Fatal(err)
			}
			id := resp.ContainerId
			st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
			if err != nil || st.Status.StopSignal != tc.want {
				t.Fatalf("status stop signal = %v, %v; want %s", st.GetStatus().GetStopSignal(), err, tc.want)
			}
			if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
				t.Fatal(err)
			}
			// The fake runtime exits 128 + the signal it was sent.
			st, _ = f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
			if st.Status.ExitCode != tc.wantExit || st.Status.StopSignal != tc.want {
				t.Errorf("after stop: exit %d, stop signal %s; want %d, %s", st.Status.ExitCode, st.Status.StopSignal, tc.wantExit, tc.want)
			}
		})
	}
	f := newCtrFixture(t)
	pod, podCfg := f.pod(t, false)
	cfg := unitCtr("bad")
	cfg.StopSignal = 999
	_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("stop signal 999: %v, want InvalidArgument", err)
	}
	f.nothingLeft(t)
}

func TestApplyState(t *testing.T) {
	tests := []struct {
		name       string
		st         *oci.State
		err        error
		wantState  sandbox.ContainerState
		wantCode   int32
		wantReason string
	}{
		{"created", &oci.State{Status: oci.StatusCreated, Pid: 7, ExitCode: -1}, nil, sandbox.ContainerCreated, 0, ""},
		{"running", &oci.State{Status: oci.StatusRunning, Pid: 7, ExitCode: -1}, nil, sandbox.ContainerRunning, 0, ""},
		{"completed", &oci.State{Status: oci.StatusStopped, ExitCode: 0}, nil, sandbox.ContainerExited, 0, reasonCompleted},
		{"error", &oci.State{Status: oci.StatusStopped, ExitCode: 3}, nil, sandbox.ContainerExited, 3, reasonError},
		{"oom", &oci.State{Status: oci.StatusStopped, ExitCode: 137, OOMKilled: true}, nil, sandbox.ContainerExited, 137, reasonOOMKilled},
		{"gone", nil, fmt.Errorf("x: %w", errdefs.ErrNotFound), sandbox.ContainerExited, -1, reasonError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st sandbox.ContainerStatus
			applyState(&st, tc.st, tc.err)
			if st.State != tc.wantState || st.ExitCode != tc.wantCode || st.Reason != tc.wantReason {
				t.Fatalf("= %s %d %q, want %s %d %q", st.State, st.ExitCode, st.Reason, tc.wantState, tc.wantCode, tc.wantReason)
			}
			if st.State == sandbox.ContainerExited && st.FinishedAt.IsZero() {
				t.Errorf("exited without a finish time")
			}
			// An exit is final: no later answer changes it.
			done := sandbox.ContainerStatus{State: sandbox.ContainerExited, ExitCode: 7, Reason: reasonError, FinishedAt: time.Unix(1, 0)}
			st = done
			applyState(&st, tc.st, tc.err)
			if st != done {
				t.Errorf("applied to an exited container: %+v, want it unchanged", st)
			}
		})
	}
}

func TestCreateContainerErrors(t *testing.T) {
	tests := []struct {
		name   string
		pod    string // "" means the fixture's pod
		edit   func(c *runtimeapi.ContainerConfig)
		inject func(f *ctrFixture)
		want   error
		msg    string
	}{
		{"unknown sandbox", "ffff", nil, nil, errdefs.ErrNotFound, `sandbox "ffff": not found`},
		{"no metadata", "", func(c *runtimeapi.ContainerConfig) { c.Metadata = nil }, nil, errdefs.ErrInvalidArgument, "container config metadata is missing"},
		{"bad name", "", func(c *runtimeapi.ContainerConfig) { c.Metadata.Name = "a/b" }, nil, errdefs.ErrInvalidArgument, `container name "a/b" must not contain`},
		{"image not present", "", func(c *runtimeapi.ContainerConfig) { c.Image.Image = "alpine" }, nil, errdefs.ErrNotFound, `image "alpine"`},
		{"log escapes", "", func(c *runtimeapi.ContainerConfig) { c.LogPath = "../../x.log" }, nil, errdefs.ErrInvalidArgument, "escapes the pod's log directory"},
		{"relative host path", "", func(c *runtimeapi.ContainerConfig) {
			c.Mounts = []*runtimeapi.Mount{{HostPath: "rel", ContainerPath: "/v"}}
		}, nil, errdefs.ErrInvalidArgument, `mount host path "rel" is not absolute`},
		{"relative container path", "", func(c *runtimeapi.ContainerConfig) {
			c.Mounts = []*runtimeapi.Mount{{HostPath: "/tmp", ContainerPath: "v"}}
		}, nil, errdefs.ErrInvalidArgument, `mount container path "v" is not absolute`},
		{"host path too long", "", func(c *runtimeapi.ContainerConfig) {
			c.Mounts = []*runtimeapi.Mount{{HostPath: "/" + strings.Repeat("a", 256), ContainerPath: "/v"}}
		}, nil, errdefs.ErrInvalidArgument, "mount host path has a component of 256 bytes"},
		{"container path too long", "", func(c *runtimeapi.ContainerConfig) {
			c.Mounts = []*runtimeapi.Mount{{HostPath: "/tmp", ContainerPath: strings.Repeat("/v", 2048)}}
		}, nil, errdefs.ErrInvalidArgument, "mount container path is 4096 bytes long"},
		{"device path too long", "", func(c *runtimeapi.ContainerConfig) {
			c.Devices = []*runtimeapi.Device{{HostPath: "/dev/null", ContainerPath: "/dev/" + strings.Repeat("d", 300)}}
		}, nil, errdefs.ErrInvalidArgument, "device path has a component of 300 bytes"},
		{"env without a name", "", func(c *runtimeapi.ContainerConfig) {
			c.Envs = []*runtimeapi.KeyValue{{Key: "", Value: []byte("x")}}
		}, nil, errdefs.ErrInvalidArgument, `environment variable name "" is empty`},
		{"env name with =", "", func(c *runtimeapi.ContainerConfig) {
			c.Envs = []*runtimeapi.KeyValue{{Key: "A=B", Value: []byte("x")}}
		}, nil, errdefs.ErrInvalidArgument, `environment variable name "A=B" is empty or holds "="`},
		{"mount fails", "", nil, func(f *ctrFixture) { f.images.MountErr = fmt.Errorf("overlay: %w", errdefs.ErrUnavailable) }, errdefs.ErrUnavailable, "mounting the rootfs: overlay"},
		{"runtime create fails", "", nil, func(f *ctrFixture) { f.rt.CreateErr = fmt.Errorf("runc: %w", errdefs.ErrUnknown) }, errdefs.ErrUnknown, `creating container "c": runc`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newCtrFixture(t)
			pod, podCfg := f.pod(t, false)
			if tc.pod != "" {
				pod = tc.pod
			}
			cfg := unitCtr("c")
			if tc.edit != nil {
				tc.edit(cfg)
			}
			if tc.inject != nil {
				tc.inject(f)
			}
			_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.msg)
			}
			f.nothingLeft(t)
			// The name was released: the same request works once the fault is gone.
			if tc.inject != nil {
				f.images.MountErr, f.rt.CreateErr = nil, nil
				if _, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")}); err != nil {
					t.Fatalf("create after the fault: %v", err)
				}
			}
		})
	}
}

func TestContainerLifecycle(t *testing.T) {
	f := newCtrFixture(t)
	pod, _ := f.pod(t, false)
	ctx := context.Background()
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	_, err = f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("c")})
	if !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create with the same name: %v, want AlreadyExists", err)
	}

	spec := f.rt.Specs[id]
	sb, _ := f.srv.sandboxes.Get(pod)
	// nsmgr names the pod's UTS namespace once; containers join it and
	// do not set the hostname again.
	if spec.Hostname != "" {
		t.Errorf("spec hostname %q, want none (the pod's named UTS namespace is joined)", spec.Hostname)
	}
	named := false
	for _, c := range f.ns.Calls() {
		if c.Method == "Create" && c.ID == pod && c.Request.Hostname == "podhost" {
			named = true
		}
	}
	if !named {
		t.Errorf("nsmgr was not asked to name the pod's UTS namespace podhost: %+v", f.ns.Calls())
	}
	if want := "/pinrt/" + pod + "/pinrt-" + id; spec.Linux.CgroupsPath != want {
		t.Errorf("cgroups path %q, want %q", spec.Linux.CgroupsPath, want)
	}
	var nsTypes []string
	for _, ns := range spec.Linux.Namespaces {
		nsTypes = append(nsTypes, string(ns.Type)+"="+ns.Path)
	}
	sort.Strings(nsTypes)
	wantNS := []string{"ipc=" + sb.Pins["ipc"], "mount=", "network=" + sb.Pins["net"], "pid=", "uts=" + sb.Pins["uts"]}
	if strings.Join(nsTypes, " ") != strings.Join(wantNS, " ") && strings.Join(nsTypes, " ") != strings.Join(append([]string{"cgroup="}, wantNS...), " ") {
		t.Errorf("namespaces %v, want %v (+cgroup)", nsTypes, wantNS)
	}
	if got := f.images.mounted[id]; got.PodID != pod || got.ImageID != testImageID || got.UsernsPath != "" {
		t.Errorf("mount request %+v", got)
	}

	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil || st.Status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
		t.Fatalf("status after create: %v %v", st, err)
	}
	if st.Status.ImageRef != "docker.io/library/busybox@sha256:2222" || st.Status.ImageId != testImageID || st.Status.LogPath != filepath.Join(sb.LogDirectory, "c/0.log") {
		t.Errorf("status image ref %q id %q log %q", st.Status.ImageRef, st.Status.ImageId, st.Status.LogPath)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("second start: %v, want FailedPrecondition", err)
	}
	if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
		t.Fatal(err)
	}
	st, _ = f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	// The fake exits 128+signal: 138 says the image's SIGUSR1 was sent.
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Status.ExitCode != 138 || st.Status.Reason != reasonError {
		t.Errorf("after stop: %v %d %q", st.Status.State, st.Status.ExitCode, st.Status.Reason)
	}
	_, err = f.srv.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"true"}})
	if !errdefs.IsFailedPrecondition(err) {
		t.Errorf("exec in an exited container: %v, want FailedPrecondition", err)
	}

	// Removing the pod removes its containers and releases its image tree.
	if _, err := f.srv.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	f.nothingLeft(t)
	if len(f.images.released) != 1 || f.images.released[0] != pod {
		t.Errorf("released %v, want [%s]", f.images.released, pod)
	}
	if _, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id}); !errdefs.IsNotFound(err) {
		t.Errorf("status after pod removal: %v, want NotFound", err)
	}
}

func TestUsernsVolumeNeedsIDMap(t *testing.T) {
	f := newCtrFixture(t)
	pod, _ := f.pod(t, true)
	cfg := unitCtr("c")
	cfg.Mounts = []*runtimeapi.Mount{{HostPath: "/tmp", ContainerPath: "/v"}}
	_, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "lacks idmapped mounts") {
		t.Fatalf("err = %v, want FailedPrecondition naming the missing idmap support", err)
	}
	f.nothingLeft(t)

	f.rt.FeaturesResult = &oci.Features{IDMapMounts: true}
	resp, err := f.srv.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := f.srv.sandboxes.Get(pod)
	spec := f.rt.Specs[resp.ContainerId]
	var vol *oci.Mount
	for _, m := range spec.Mounts {
		if m.Destination == "/v" {
			vol = &oci.Mount{UIDMappings: m.UIDMappings}
		}
	}
	if vol == nil || len(vol.UIDMappings) != 1 || vol.UIDMappings[0] != sb.UIDMappings[0] {
		t.Errorf("volume mappings %+v, want the pod's %+v", vol, sb.UIDMappings)
	}
	if got := f.images.mounted[resp.ContainerId]; got.UsernsPath != sb.Pins["user"] || got.RootUID != sb.UIDMappings[0].HostID {
		t.Errorf("mount request %+v, want the pod's userns and mapped root", got)
	}
}

func TestStatusRuntimeHandlers(t *testing.T) {
	f := newCtrFixture(t)
	f.rt.FeaturesResult = &oci.Features{IDMapMounts: true, RecursiveReadOnly: true}
	resp, err := f.srv.Status(context.Background(), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range resp.RuntimeHandlers {
		got = append(got, fmt.Sprintf("%q:%v/%v", h.Name, h.Features.UserNamespaces, h.Features.RecursiveReadOnlyMounts))
	}
	// Only runc is configured by default.
	want := `"runc":true/true "":true/true`
	if strings.Join(got, " ") != want {
		t.Errorf("handlers %s, want %s", strings.Join(got, " "), want)
	}
}

func TestListContainersFilters(t *testing.T) {
	f := newCtrFixture(t)
	pod, _ := f.pod(t, false)
	ctx := context.Background()
	mk := func(name string, labels map[string]string) string {
		c := unitCtr(name)
		c.Labels = labels
		resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: c})
		if err != nil {
			t.Fatal(err)
		}
		return resp.ContainerId
	}
	a, b := mk("a", map[string]string{"x": "1"}), mk("b", nil)
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: b}); err != nil {
		t.Fatal(err)
	}
	running := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	tests := []struct {
		name string
		f    *runtimeapi.ContainerFilter
		want []string
	}{
		{"all", nil, []string{a, b}},
		{"label", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"x": "1"}}, []string{a}},
		{"state", &runtimeapi.ContainerFilter{State: running}, []string{b}},
		{"id prefix", &runtimeapi.ContainerFilter{Id: a[:8]}, []string{a}},
		{"other pod", &runtimeapi.ContainerFilter{PodSandboxId: "ffff"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := f.srv.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: tc.f})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range resp.Containers {
				got = append(got, c.Id)
			}
			want := append([]string(nil), tc.want...)
			sort.Strings(want)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("= %v, want %v", got, want)
			}
		})
	}
}

func TestCheckStatic(t *testing.T) {
	tests := []struct {
		bin  string
		want error
	}{
		{"/bin/busybox", nil},                      // busybox-static
		{"/bin/ls", errdefs.ErrFailedPrecondition}, // coreutils, linked to libc
	}
	for _, tc := range tests {
		if _, err := os.Stat(tc.bin); err != nil {
			t.Skipf("%s is not installed", tc.bin)
		}
		err := checkStatic(tc.bin)
		if tc.want == nil && err != nil || tc.want != nil && (!errors.Is(err, tc.want) || !strings.Contains(err.Error(), "CGO_ENABLED=0")) {
			t.Errorf("checkStatic(%s) = %v, want %v", tc.bin, err, tc.want)
		}
	}
}

// TestPauseRootfs: the pause rootfs holds a copy of Deps.Pause (the small
// pinrt-exec), which must be static like any binary run from it.
func TestPauseRootfs(t *testing.T) {
	for _, tc := range []struct {
		pause, want string
	}{
		{"/bin/busybox", ""},
		{"/bin/ls", "runs /bin/ls from a rootfs without libc, but it is dynamically linked"},
	} {
		cfg := conf.Default()
		cfg.Root = t.TempDir()
		s := New(cfg, Deps{Pause: tc.pause})
		root, err := s.pauseRootfsDir()
		_ = s.Close(context.Background())
		if tc.want != "" {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("pause %s: %v, want an error with %q", tc.pause, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("pause %s: %v", tc.pause, err)
		}
		got, err := os.ReadFile(filepath.Join(root, "pause"))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(tc.pause)
		if !bytes.Equal(got, want) {
			t.Errorf("pause rootfs holds %d bytes, want a copy of %s (%d)", len(got), tc.pause, len(want))
		}
	}
}

// ContainerStatus (verbose or not) and ListContainers answer from memory:
// no runtime call while nothing happened. An exit conmon recorded is seen
// by the next read, whether or not the exit watcher got to it first.
func TestContainerStatusFromMemory(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("mem"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	read := func(want runtimeapi.ContainerState) *runtimeapi.ContainerStatus {
		t.Helper()
		var st *runtimeapi.ContainerStatusResponse
		for _, verbose := range []bool{false, true} {
			st, err = f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
			if err != nil {
				t.Fatal(err)
			}
			if st.Status.State != want {
				t.Errorf("ContainerStatus(verbose=%v) = %v, want %v", verbose, st.Status.State, want)
			}
			if verbose && st.Info["info"] == "" {
				t.Error("verbose ContainerStatus has no info")
			}
		}
		list, err := f.srv.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Containers) != 1 || list.Containers[0].State != want {
			t.Errorf("ListContainers = %v, want one container %v", list.Containers, want)
		}
		return st.Status
	}
	states := func() int {
		time.Sleep(50 * time.Millisecond) // let the exit watcher act, if it would
		return f.rt.StateCalls()
	}

	before := states()
	read(runtimeapi.ContainerState_CONTAINER_CREATED)
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	read(runtimeapi.ContainerState_CONTAINER_RUNNING)
	if n := states() - before; n != 0 {
		t.Errorf("create, start and status reads asked the runtime for its state %d times, want 0", n)
	}
	if err := f.rt.Exit(id, 3); err != nil {
		t.Fatal(err)
	}
	st := read(runtimeapi.ContainerState_CONTAINER_EXITED)
	if st.ExitCode != 3 || st.Reason != reasonError {
		t.Errorf("exited container: code %d reason %q, want 3 %q", st.ExitCode, st.Reason, reasonError)
	}
	before = states()
	read(runtimeapi.ContainerState_CONTAINER_EXITED)
	if n := states() - before; n != 0 {
		t.Errorf("reading an exited container asked the runtime %d times, want 0", n)
	}
}

// A container's whole lifecycle (create, start, stop, remove) asks the
// runtime for no state: the operations know their outcome, and the exit
// is read from conmon's exit file.
func TestLifecycleAsksNoState(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	before := f.rt.StateCalls()
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("life"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.ContainerId
	if _, err := f.srv.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.Status.ExitCode != 138 {
		t.Errorf("stopped container = %v exit %d, want EXITED 138 (the image stops with SIGUSR1)", st.Status.State, st.Status.ExitCode)
	}
	if _, err := f.srv.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the exit watcher's turn
	if n := f.rt.StateCalls() - before; n != 0 {
		t.Errorf("the lifecycle asked the runtime for its state %d times, want 0", n)
	}
}

// newTestServer is New, closed when t ends: each server's exit watcher is
// an inotify instance, and a user has 128 of them (fs.inotify
// max_user_instances), which a -count=3 run of this package outgrew.
//
// A server without runtimes gets a fake one for the default handler:
// RunPodSandbox refuses a pod whose handler cannot run containers.
func newTestServer(t testing.TB, cfg *conf.Config, deps Deps) *Server {
	t.Helper()
	if deps.Runtimes == nil {
		deps.Runtimes = map[string]ContainerRuntime{cfg.Runtime.DefaultRuntime: ocitest.New()}
	}
	s := New(cfg, deps)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// The verbose info carries config.json as written, compacted: the same
// bytes that decoding it and encoding it again gave, and null for a spec
// that is gone or broken.
func TestContainerInfoSpec(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("info"), SandboxConfig: podCfg})
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.srv.containers.Get(resp.ContainerId)
	if err != nil {
		t.Fatal(err)
	}
	info := func() string {
		t.Helper()
		st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.ID, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		return st.Info["info"]
	}
	// What the info was when the spec was decoded and encoded again.
	roundTrip := func(spec *specs.Spec) string {
		t.Helper()
		st := c.Status()
		b, err := json.Marshal(map[string]any{
			"pid": st.Pid, "privileged": false, "sandboxID": c.SandboxID, "runtimeHandler": c.Handler,
			"runtimeSpec": spec, "status": st,
		})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	path := filepath.Join(c.Dir, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if got, want := info(), roundTrip(&spec); got != want {
		t.Errorf("info =\n%s\nwant\n%s", got, want)
	}
	// Indented, and with what JSON escapes for HTML: compacted and
	// escaped as encoding it gives.
	spec.Annotations = map[string]string{"note": "<a & b>"}
	indented, err := json.MarshalIndent(&spec, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, indented, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := info(), roundTrip(&spec); got != want {
		t.Errorf("info of an indented spec =\n%s\nwant\n%s", got, want)
	}
	for name, content := range map[string]string{"broken": `{"ociVersion":`, "empty": ""} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, want := info(), roundTrip(nil); got != want {
			t.Errorf("%s spec: info =\n%s\nwant\n%s", name, got, want)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got, want := info(), roundTrip(nil); got != want {
		t.Errorf("no spec: info =\n%s\nwant\n%s", got, want)
	}
}

// api.proto: a privileged container needs a sandbox config that says the
// pod runs privileged containers (containerd refuses it too), and the
// refusal leaves nothing behind. The request's config decides: kubelet
// sends one that says so with the privileged ephemeral container of
// kubectl debug --profile=sysadmin, in a pod created unprivileged.
func TestPrivilegedNeedsPrivilegedSandboxConfig(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	pod, podCfg := f.pod(t, false)
	priv := unitCtr("priv")
	priv.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: true}}
	_, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: priv, SandboxConfig: podCfg})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "sandbox config is not") {
		t.Fatalf("privileged container, unprivileged sandbox config: %v, want InvalidArgument", err)
	}
	f.nothingLeft(t)
	if _, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: unitCtr("plain"), SandboxConfig: podCfg}); err != nil {
		t.Fatalf("unprivileged container: %v", err)
	}
	debugCfg := proto.Clone(podCfg).(*runtimeapi.PodSandboxConfig)
	debugCfg.Linux.SecurityContext.Privileged = true
	if _, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: priv, SandboxConfig: debugCfg}); err != nil {
		t.Errorf("privileged container with a privileged sandbox config: %v", err)
	}
	priv.Metadata.Name = "priv-noconfig"
	if _, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: priv}); err != nil {
		t.Errorf("privileged container without a sandbox config: %v", err)
	}
}

// The verbose info says whether a container is privileged under CRI-O's
// key, where Falco looks for it, and the record keeps it across a restart.
func TestContainerInfoPrivileged(t *testing.T) {
	f := newCtrFixture(t)
	ctx := context.Background()
	req := unitPod("p", false)
	req.Config.Linux.SecurityContext.Privileged = true
	pod, podCfg := f.runPod(t, req)
	for _, privileged := range []bool{false, true} {
		cfg := unitCtr(fmt.Sprint("priv-", privileged))
		cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{Privileged: privileged}}
		resp, err := f.srv.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.srv.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: resp.ContainerId, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			Privileged *bool `json:"privileged"`
		}
		if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
			t.Fatal(err)
		}
		if info.Privileged == nil || *info.Privileged != privileged {
			t.Errorf("privileged container %v: info says %v", privileged, info.Privileged)
		}
		c, err := f.srv.containers.Get(resp.ContainerId)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(c.Dir, "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Metadata struct {
				Privileged bool `json:"privileged"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(b, &rec); err != nil || rec.Metadata.Privileged != privileged {
			t.Errorf("privileged container %v: record %s (%v)", privileged, b, err)
		}
	}
}

// mkdirAllRecorded makes the missing directories and names them, parents
// first; what exists is left out, and a file in the way is an error.
func TestMkdirAllRecorded(t *testing.T) {
	base := t.TempDir()
	made, err := mkdirAllRecorded(filepath.Join(base, "a", "b", "c"))
	want := []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), filepath.Join(base, "a", "b", "c")}
	if err != nil || !slices.Equal(made, want) {
		t.Fatalf("made %q, %v; want %q", made, err, want)
	}
	if made, err := mkdirAllRecorded(filepath.Join(base, "a", "b") + "/"); err != nil || len(made) != 0 {
		t.Errorf("existing path: made %q, %v; want nothing", made, err)
	}
	if made, err := mkdirAllRecorded(filepath.Join(base, "a", "d")); err != nil || !slices.Equal(made, []string{filepath.Join(base, "a", "d")}) {
		t.Errorf("one missing level: made %q, %v", made, err)
	}
	file := filepath.Join(base, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if made, err := mkdirAllRecorded(filepath.Join(file, "x")); err == nil || len(made) != 0 {
		t.Errorf("below a file: made %q, %v; want an error", made, err)
	}
}

// A CRI timeout is never negative nor wrapped into the past, even with
// the stop's own bound added to it.
func TestTimeoutSeconds(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want time.Duration
	}{{-100, 0}, {0, 0}, {5, 5 * time.Second}} {
		if got := timeoutSeconds(tc.in); got != tc.want {
			t.Errorf("timeoutSeconds(%d) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := timeoutSeconds(math.MaxInt64); got < 100*365*24*time.Hour || got+stopKillTimeout < got {
		t.Errorf("timeoutSeconds(MaxInt64) = %v: not the longest, or wraps with the kill's bound", got)
	}
}

// Masked and read-only paths are absolute container paths, taken as they
// are: kubelet's procMount Unmasked sends empty lists, which mean none.
func TestSecurityContextPaths(t *testing.T) {
	for _, tc := range []struct {
		masked, readonly []string
		ok               bool
	}{
		{[]string{"/proc/kcore"}, []string{"/proc/sys"}, true},
		{nil, nil, true},
		{[]string{"proc/kcore"}, nil, false},
		{nil, []string{"/proc/\x00sys"}, false},
	} {
		var c oci.ContainerSpec
		err := securityContext(&c, &runtimeapi.LinuxContainerSecurityContext{MaskedPaths: tc.masked, ReadonlyPaths: tc.readonly})
		if tc.ok != (err == nil) || (err != nil && !errdefs.IsInvalidArgument(err)) {
			t.Errorf("masked %q read-only %q: %v, want ok %v (InvalidArgument otherwise)", tc.masked, tc.readonly, err, tc.ok)
		}
		if tc.ok && (c.MaskedPaths == nil || c.ReadonlyPaths == nil || !slices.Equal(c.MaskedPaths, tc.masked) || !slices.Equal(c.ReadonlyPaths, tc.readonly)) {
			t.Errorf("masked %q read-only %q became %#v %#v: want the same, never nil (oci's defaults)", tc.masked, tc.readonly, c.MaskedPaths, c.ReadonlyPaths)
		}
	}
	// No security context at all: oci's defaults.
	var c oci.ContainerSpec
	if err := securityContext(&c, nil); err != nil || c.MaskedPaths != nil || c.ReadonlyPaths != nil {
		t.Errorf("no security context: %v, masked %#v read-only %#v, want nil (the defaults)", err, c.MaskedPaths, c.ReadonlyPaths)
	}
}

// A volume's ID mappings that runc would refuse only at the start are
// refused at create.
func TestCheckMountMappings(t *testing.T) {
	userns := sandbox.New(sandbox.Metadata{ID: "p", Modes: sandbox.NamespaceModes{User: sandbox.ModePod}}, "")
	host := sandbox.New(sandbox.Metadata{ID: "p"}, "")
	m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 100000, Size: 65536}}
	for _, tc := range []struct {
		name       string
		sb         *sandbox.Sandbox
		uids, gids []specs.LinuxIDMapping
		want       string
	}{
		{"none", host, nil, nil, ""},
		{"both", userns, m, m, ""},
		{"pod without userns", host, m, m, "has no user namespace"},
		{"uids only", userns, m, nil, "1 UID and 0 GID mappings"},
		{"gids only", userns, nil, m, "0 UID and 1 GID mappings"},
		{"empty", userns, m, []specs.LinuxIDMapping{{HostID: 100000}}, "0:100000:0 is empty"},
		{"past 32 bits", userns, []specs.LinuxIDMapping{{HostID: math.MaxUint32, Size: 2}}, m, "runs past the 32-bit IDs"},
		{"container IDs past 32 bits", userns, m, []specs.LinuxIDMapping{{ContainerID: math.MaxUint32, HostID: 1, Size: 2}}, "runs past the 32-bit IDs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkMountMappings(tc.sb, []sandbox.ContainerMount{{ContainerPath: "/v", UIDMappings: tc.uids, GIDMappings: tc.gids}})
			if tc.want == "" {
				if err != nil {
					t.Fatalf("= %v, want nil", err)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("= %v, want InvalidArgument with %q", err, tc.want)
			}
		})
	}
}

// A container's status names its image as the pod does: kubelet asks
// for the image by ID, and the pod's status shows this name.
func TestStatusImage(t *testing.T) {
	img := &image.Image{ID: "sha256:" + strings.Repeat("ab", 32), RepoTags: []string{"registry.k8s.io/pause:3.10", "example.com/p:1"}}
	untagged := &image.Image{ID: img.ID}
	for _, tc := range []struct {
		user, requested string
		img             *image.Image
		want            string
	}{
		{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", img.ID, img, "registry.k8s.io/e2e-test-images/agnhost:2.66.1"},
		{"", img.ID, img, "registry.k8s.io/pause:3.10"},
		{"", strings.TrimPrefix(img.ID, "sha256:"), img, "registry.k8s.io/pause:3.10"},
		{"", "busybox", img, "busybox"},
		{"", img.ID, untagged, img.ID},
	} {
		if got := statusImage(tc.user, tc.requested, tc.img); got != tc.want {
			t.Errorf("statusImage(%q, %q) = %q, want %q", tc.user, tc.requested, got, tc.want)
		}
	}
	for _, bad := range []string{"a\x00b", strings.Repeat("x", maxImageName+1)} {
		if err := validImageName("user-specified image", bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("validImageName(%.20q...) = %v, want InvalidArgument", bad, err)
		}
	}
}
