package test

import (
	"context"
	"os"
	"path/filepath"
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

// TestContainerSemantics checks CRI semantics that need a real runtime:
// capabilities a privileged container can really get, mount propagation,
// StartContainer's meaning and ExecSync's bounds.
func TestContainerSemantics(t *testing.T) {
	e := newCtrEnv(t)
	t.Run("Privileged", e.testPrivileged)
	t.Run("MountPropagation", e.testMountPropagation)
	t.Run("StartMeansRunning", e.testStartMeansRunning)
	t.Run("StopRightAfterStart", e.testStopRightAfterStart)
	t.Run("ExecSyncBackgroundChild", e.testExecSyncBackgroundChild)
	t.Run("SupplementalGroupsPolicy", e.testSupplementalGroupsPolicy)
	t.Run("Resources", e.testResourcesStatus)
	t.Run("DeclaredVolumes", e.testDeclaredVolumes)
	removeAllAndCheck(t, e.d)
}

// testDeclaredVolumes: an image's VOLUME that its layers lack is there,
// writable by the container's root, in a pod with a user namespace too;
// one the layers have keeps the image's content; one under kubelet's
// mount is kubelet's.
func (e *ctrEnv) testDeclaredVolumes(t *testing.T) {
	img := e.pull(t, e.reg.Push(t, "volumes:1", testimage.Build(t, testimage.Spec{
		Cmd:     []string{"sleep", "1000"},
		Volumes: []string{"/data", "/var/lib/app/", "/etc", "/kube/sub"},
	})))
	kube := t.TempDir()
	for _, userns := range []bool{false, true} {
		t.Run(map[bool]string{false: "host", true: "userns"}[userns], func(t *testing.T) {
			podCfg := PodConfig("volumes")
			if userns {
				podCfg = UsernsPod(podCfg, 0)
			}
			pod, podCfg := e.pod(t, podCfg)
			cfg := e.ctr("vol")
			cfg.Image.Image = img
			cfg.Mounts = []*runtimeapi.Mount{{HostPath: kube, ContainerPath: "/kube"}}
			id := e.run(t, pod, podCfg, cfg)
			script := "echo hi > /data/f && cat /data/f && echo hi > /var/lib/app/f && stat -c %u:%g:%a /data /var/lib/app && test -s /etc/passwd && ! test -e /kube/sub"
			if out := e.mustExec(t, id, "sh", "-c", script); out != "hi\n0:0:755\n0:0:755\n" {
				t.Errorf("declared volumes: %q, want them there, empty, root's and writable", out)
			}
		})
	}
	if entries, err := os.ReadDir(kube); err != nil || len(entries) != 0 {
		t.Errorf("kubelet's volume after the containers: %v %v, want it untouched", entries, err)
	}
}

func (e *ctrEnv) privileged(name string, cmd ...string) *runtimeapi.ContainerConfig {
	cfg := e.ctr(name, cmd...)
	cfg.Linux.SecurityContext.Privileged = true
	return cfg
}

// capBnd is the CapBnd mask of /proc/<pid>/status.
func capBnd(t *testing.T, status string) string {
	t.Helper()
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no CapBnd in %q", status)
	return ""
}

// testPrivileged: a privileged container, and one adding ALL, get the
// daemon's own bounding set. On a host whose daemon lacks a capability
// (CAP_SYS_RESOURCE here) asking runc for every capability the kernel
// knows fails with "unable to apply caps: operation not permitted".
func (e *ctrEnv) testPrivileged(t *testing.T) {
	daemon, err := os.ReadFile("/proc/" + strconv.Itoa(e.d.Pid()) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	want := capBnd(t, string(daemon))
	// Only in a pod whose sandbox config says it runs privileged ones.
	plain, plainCfg := e.pod(t, PodConfig("unprivileged"))
	_, err = e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: plain, Config: e.privileged("priv", "true"), SandboxConfig: plainCfg})
	wantCode(t, err, codes.InvalidArgument, "sandbox config is not")
	pod, podCfg := e.pod(t, PrivilegedPod(PodConfig("privileged")))
	priv := e.run(t, pod, podCfg, e.privileged("priv", "sleep", "1000"))
	if got := capBnd(t, e.mustExec(t, priv, "cat", "/proc/self/status")); got != want {
		t.Errorf("privileged container CapBnd %s, want the daemon's %s", got, want)
	}
	all := e.ctr("all", "sleep", "1000")
	all.Linux.SecurityContext.Capabilities = &runtimeapi.Capability{AddCapabilities: []string{"ALL"}}
	id := e.run(t, pod, podCfg, all)
	if got := capBnd(t, e.mustExec(t, id, "cat", "/proc/self/status")); got != want {
		t.Errorf("add ALL: CapBnd %s, want the daemon's %s", got, want)
	}
	// Falco tells privileged containers by the verbose info's
	// "privileged", CRI-O's key; adding every capability is not it.
	for id, want := range map[string]bool{priv: true, id: false} {
		if p := e.info(t, id).Privileged; p == nil || *p != want {
			t.Errorf("container %s: info privileged = %v, want %v", id, p, want)
		}
	}
}

// sharedDir is a host directory that is its own shared mount, as kubelet
// makes its pods directory: propagation needs a peer group on the host.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatalf("make %s shared: %v", dir, err)
	}
	return dir
}

// testMountPropagation: Bidirectional (rshared) and HostToContainer
// (rslave) volumes in a privileged container. A mount the container makes
// under the rshared volume shows on the host; one the host makes under
// the rslave volume's source shows inside.
func (e *ctrEnv) testMountPropagation(t *testing.T) {
	bidi, h2c := sharedDir(t), sharedDir(t)
	pod, podCfg := e.pod(t, PrivilegedPod(PodConfig("propagation")))
	cfg := e.privileged("prop", "sleep", "1000")
	cfg.Mounts = []*runtimeapi.Mount{
		{HostPath: bidi, ContainerPath: "/bidi", Propagation: runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL},
		{HostPath: h2c, ContainerPath: "/h2c", Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
	}
	id := e.run(t, pod, podCfg, cfg)

	// Host to container.
	sub := filepath.Join(h2c, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount on the host: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(sub, "from-host"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := e.mustExec(t, id, "cat", "/h2c/sub/from-host"); out != "hi" {
		t.Errorf("host mount seen through the rslave volume: %q, want hi", out)
	}

	// Container to host.
	e.mustExec(t, id, "sh", "-c", "mkdir -p /bidi/sub && mount -t tmpfs tmpfs /bidi/sub && echo yo > /bidi/sub/from-ctr")
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(bidi, "sub"), unix.MNT_DETACH) })
	waitFor(t, 5*time.Second, "the container's mount on the host", func() bool {
		b, err := os.ReadFile(filepath.Join(bidi, "sub", "from-ctr"))
		return err == nil && string(b) == "yo\n"
	})
}

// testStartMeansRunning: once StartContainer returned, ContainerStatus says
// RUNNING; runc's state lags `runc start` by tens of milliseconds.
func (e *ctrEnv) testStartMeansRunning(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("startrunning"))
	for i := 0; i < 5; i++ {
		id := e.run(t, pod, podCfg, e.ctr("c"+strconv.Itoa(i), "sleep", "1000"))
		if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || st.StartedAt == 0 {
			t.Errorf("container %d right after StartContainer: %v started at %d, want RUNNING with a start time", i, st.State, st.StartedAt)
		}
	}
}

// testStopRightAfterStart: kubelet deleting a pod it has just started
// stops its container with SIGTERM right after StartContainer. A process
// that sets up its handler a moment later (a shell whose trap comes after
// 50 ms) must still get the signal: the kernel drops a signal to a PID
// namespace's init that has no handler for it, and the container ran
// until the grace period's SIGKILL. pinrt waits for the handler up to
// 1 s after the start; the short sleep leaves a loaded machine most of
// that second to start the shell.
func (e *ctrEnv) testStopRightAfterStart(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("stopearly"))
	for i := range 3 {
		id := e.run(t, pod, podCfg, e.ctr("c"+strconv.Itoa(i), "sh", "-c", "sleep 0.05; trap 'exit 42' TERM; sleep 1000 & wait"))
		if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: 20}); err != nil {
			t.Fatalf("StopContainer: %v", err)
		}
		if st := e.status(t, id); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 42 {
			t.Errorf("container %d stopped right after its start: %v with exit code %d, want EXITED with 42 (its TERM trap)", i, st.State, st.ExitCode)
		}
	}
}

// execWithin runs ExecSync and fails the test unless it returns within d.
func (e *ctrEnv) execWithin(t *testing.T, d time.Duration, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(Ctx(t), 30*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := e.d.Runtime.ExecSync(ctx, req)
	if took := time.Since(start); took > d {
		t.Errorf("ExecSync(%v, timeout %ds) took %v, want at most %v", req.Cmd, req.Timeout, took, d)
	}
	return resp, err
}

// testExecSyncBackgroundChild: a background child holding stdout must not
// hold ExecSync past its timeout, nor forever without one; the output
// written before is returned, and a timed-out exec's children are killed.
func (e *ctrEnv) testExecSyncBackgroundChild(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("execbg"))
	id := e.run(t, pod, podCfg, e.ctr("c", "sleep", "1000"))
	// The bounds leave a loaded machine time to start runc; a child held
	// to the timeout would take 10 s, or for ever without one.
	for _, timeout := range []int64{10, 0} {
		resp, err := e.execWithin(t, 8*time.Second, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", "sleep 101 & echo hi"}, Timeout: timeout})
		if err != nil || string(resp.Stdout) != "hi\n" || resp.ExitCode != 0 {
			t.Errorf("timeout %d: ExecSync = %v, %v; want hi and exit 0", timeout, resp, err)
		}
	}
	_, err := e.execWithin(t, 10*time.Second, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", "sleep 102 & sleep 103 >/dev/null & echo started; sleep 60"}, Timeout: 3})
	wantCode(t, err, codes.DeadlineExceeded, "timed out after 3s")
	if !strings.Contains(status.Convert(err).Message(), `stdout "started\n"`) {
		t.Errorf("timed-out ExecSync %v does not return what the command wrote before the timeout", err)
	}
	out := e.mustExec(t, id, "ps", "-o", "args")
	for _, left := range []string{"sleep 60", "sleep 102", "sleep 103"} {
		if strings.Contains(out, left) {
			t.Errorf("%q of the timed-out exec still runs:\n%s", left, out)
		}
	}
}

// testSupplementalGroupsPolicy: Merge keeps the image's /etc/group
// memberships of the user, Strict only the requested groups, and
// ContainerStatus.user reports what the process really has.
func (e *ctrEnv) testSupplementalGroupsPolicy(t *testing.T) {
	group := testimage.Group + "extra:x:4242:user1002\n"
	img := e.pull(t, e.reg.Push(t, "groups:1", testimage.Build(t, testimage.Spec{
		Cmd:    []string{"sleep", "1000"},
		Layers: [][]testimage.File{{{Path: "etc/group", Content: []byte(group), Mode: 0o644}}},
	})))
	pod, podCfg := e.pod(t, PodConfig("groups"))
	for _, tc := range []struct {
		policy runtimeapi.SupplementalGroupsPolicy
		want   string
	}{
		{runtimeapi.SupplementalGroupsPolicy_Merge, "1002 4242 5555"},
		{runtimeapi.SupplementalGroupsPolicy_Strict, "1002 5555"},
	} {
		cfg := e.ctr("g-"+strings.ToLower(tc.policy.String()), "sleep", "1000")
		cfg.Image.Image = img
		sc := cfg.Linux.SecurityContext
		sc.RunAsUser, sc.RunAsGroup = &runtimeapi.Int64Value{Value: 1002}, &runtimeapi.Int64Value{Value: 1002}
		sc.SupplementalGroups, sc.SupplementalGroupsPolicy = []int64{5555}, tc.policy
		id := e.run(t, pod, podCfg, cfg)
		if got := strings.Join(strings.Fields(e.mustExec(t, id, "id", "-G")), " "); got != tc.want {
			t.Errorf("%v: id -G = %q, want %q", tc.policy, got, tc.want)
		}
		u := e.status(t, id).GetUser().GetLinux()
		var groups []string
		for _, g := range u.GetSupplementalGroups() {
			groups = append(groups, strconv.FormatInt(g, 10))
		}
		// The primary group is a supplementary group too, under both
		// policies (the CRI conformance suite checks it); id -G would
		// print it either way, the kernel's list does not.
		if u.GetUid() != 1002 || u.GetGid() != 1002 || strings.Join(groups, " ") != tc.want {
			t.Errorf("%v: status user %d:%d %v, want 1002:1002 and groups %q", tc.policy, u.GetUid(), u.GetGid(), groups, tc.want)
		}
		if got := strings.Fields(e.mustExec(t, id, "grep", "^Groups:", "/proc/self/status")); strings.Join(got[1:], " ") != tc.want {
			t.Errorf("%v: the process's groups are %v, want %q", tc.policy, got[1:], tc.want)
		}
	}
	resp, err := e.d.Runtime.Status(Ctx(t), &runtimeapi.StatusRequest{})
	if err != nil || !resp.GetFeatures().GetSupplementalGroupsPolicy() {
		t.Errorf("Status features %v, %v; want supplemental_groups_policy", resp.GetFeatures(), err)
	}
}

// testResourcesStatus: ContainerStatus.resources and the spec on disk show
// the limits in force after an update, and a value runc would refuse is
// InvalidArgument with a reason before runc sees it.
func (e *ctrEnv) testResourcesStatus(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("resources"))
	cfg := e.ctr("c", "sleep", "1000")
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20, CpuShares: 512}
	id := e.run(t, pod, podCfg, cfg)
	if r := e.status(t, id).GetResources().GetLinux(); r.GetMemoryLimitInBytes() != 64<<20 || r.GetCpuShares() != 512 {
		t.Errorf("resources after create: %v", r)
	}
	if _, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20, CpuShares: 1024},
	}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	if r := e.status(t, id).GetResources().GetLinux(); r.GetMemoryLimitInBytes() != 96<<20 || r.GetCpuShares() != 1024 {
		t.Errorf("resources after update: %v, want memory 96 MiB and 1024 shares", r)
	}
	resp, err := e.d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(resp.Info["info"], `"limit":100663296`) {
		t.Errorf("verbose info's runtimeSpec lacks the updated memory limit 100663296")
	}
	// crictl update --cpu-shares sends the shares alone: runc keeps the
	// memory limit, and so must the record.
	if _, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{CpuShares: 768},
	}); err != nil {
		t.Fatalf("UpdateContainerResources of the shares alone: %v", err)
	}
	if r := e.status(t, id).GetResources().GetLinux(); r.GetMemoryLimitInBytes() != 96<<20 || r.GetCpuShares() != 768 {
		t.Errorf("resources after a shares-only update: %v, want memory still 96 MiB and 768 shares", r)
	}
	for _, bad := range []struct {
		res *runtimeapi.LinuxContainerResources
		msg string
	}{
		{&runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 1 << 20}, "below the minimum"},
		{&runtimeapi.LinuxContainerResources{CpuShares: -5}, "cpu_shares -5 is outside"},
		{&runtimeapi.LinuxContainerResources{CpuQuota: -7}, "cpu_quota -7 must be"},
	} {
		_, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{ContainerId: id, Linux: bad.res})
		wantCode(t, err, codes.InvalidArgument, bad.msg)
	}
}
