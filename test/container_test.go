package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// ctrEnv is one daemon and one registry shared by the container subtests,
// so the suite builds, pushes and pulls each image once.
type ctrEnv struct {
	d       *Daemon
	reg     *testimage.Registry
	busybox string // the pushed digest reference
	bbID    string // its image ID, as PullImage returns it
	fakeRT  string // a runtime whose features lack idmapped mounts
}

// fakeRuntime is runc behind a features command that reports no idmap.
const fakeRuntime = `#!/bin/sh
if [ "$1" = features ]; then
	echo '{"ociVersionMin":"1.0.0","ociVersionMax":"1.2.0"}'
	exit 0
fi
exec /usr/local/bin/runc "$@"
`

func newCtrEnv(t testing.TB) *ctrEnv {
	t.Helper()
	return newCtrEnvWith(t, "")
}

// newCtrEnvWith is newCtrEnv with extra TOML appended to the config and
// the daemon options changed by opts.
func newCtrEnvWith(t testing.TB, extra string, opts ...func(*Options)) *ctrEnv {
	t.Helper()
	RequireRoot(t)
	for _, b := range []string{"/usr/local/bin/runc", "/usr/bin/conmon"} {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("container e2e tests need %s (make deps): %v", b, err)
		}
	}
	binDir := t.TempDir()
	fake := filepath.Join(binDir, "noidmap-runc")
	if err := os.WriteFile(fake, []byte(fakeRuntime), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`[runtime]
conmon = "/usr/bin/conmon"
[runtime.runtimes.runc]
binary = "/usr/local/bin/runc"
[runtime.runtimes.noidmap]
binary = %q
[runtime.runtimes.crun]
binary = "/usr/bin/crun"
[runtime.runtimes.missing]
binary = "/nonexistent/runtime"
`, fake) + extra
	o := Options{Network: true, Config: cfg}
	for _, opt := range opts {
		opt(&o)
	}
	d := StartDaemon(t, o)
	e := &ctrEnv{d: d, reg: testimage.StartRegistry(t), fakeRT: fake}
	e.busybox = e.reg.Push(t, "busybox:1", testimage.Busybox(t))
	e.bbID = e.pull(t, e.busybox)
	return e
}

func (e *ctrEnv) pull(t testing.TB, ref string) string {
	t.Helper()
	resp, err := e.d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ref}})
	if err != nil {
		t.Fatalf("PullImage(%s): %v", ref, err)
	}
	return resp.ImageRef
}

// pod starts a pod with a log directory and removes it at the end.
func (e *ctrEnv) pod(t testing.TB, cfg *runtimeapi.PodSandboxConfig) (string, *runtimeapi.PodSandboxConfig) {
	t.Helper()
	cfg.LogDirectory = filepath.Join(e.d.Dir, "logs", cfg.Metadata.Name)
	id := e.d.RunPod(t, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := e.d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil && e.d.Running() {
			t.Errorf("RemovePodSandbox(%s): %v", id, err)
		}
	})
	return id, cfg
}

// ctr is a container config running cmd in image (busybox when empty).
func (e *ctrEnv) ctr(name string, cmd ...string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: e.busybox},
		Command:  cmd,
		LogPath:  name + ".log",
		Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER},
		}},
	}
}

func (e *ctrEnv) create(t testing.TB, pod string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) string {
	t.Helper()
	resp, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: cfg, SandboxConfig: podCfg})
	if err != nil {
		t.Fatalf("CreateContainer(%s): %v", cfg.Metadata.Name, err)
	}
	return resp.ContainerId
}

func (e *ctrEnv) run(t testing.TB, pod string, podCfg *runtimeapi.PodSandboxConfig, cfg *runtimeapi.ContainerConfig) string {
	t.Helper()
	id := e.create(t, pod, podCfg, cfg)
	if _, err := e.d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("StartContainer(%s): %v", cfg.Metadata.Name, err)
	}
	return id
}

func (e *ctrEnv) status(t testing.TB, id string) *runtimeapi.ContainerStatus {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatalf("ContainerStatus(%s): %v", id, err)
	}
	return resp.Status
}

// ctrInfo is the part of the verbose ContainerStatus info the tests read.
type ctrInfo struct {
	Pid         int   `json:"pid"`
	Privileged  *bool `json:"privileged"`
	Restored    bool  `json:"restored"`
	RuntimeSpec struct {
		Linux struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

func (e *ctrEnv) info(t testing.TB, id string) ctrInfo {
	t.Helper()
	resp, err := e.d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus(%s): %v", id, err)
	}
	var info ctrInfo
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatalf("verbose info: %v (%q)", err, resp.Info["info"])
	}
	return info
}

// waitExit polls until the container has exited, for at most d.
func (e *ctrEnv) waitExit(t testing.TB, id string, d time.Duration) *runtimeapi.ContainerStatus {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := e.status(t, id)
		if st.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still %v after %v", id, st.State, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *ctrEnv) exec(t testing.TB, id string, cmd ...string) (string, int32) {
	t.Helper()
	resp, err := e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 20})
	if err != nil {
		t.Fatalf("ExecSync(%v): %v", cmd, err)
	}
	return string(resp.Stdout) + string(resp.Stderr), resp.ExitCode
}

// mustExec runs cmd and fails unless it exits 0.
func (e *ctrEnv) mustExec(t testing.TB, id string, cmd ...string) string {
	t.Helper()
	out, code := e.exec(t, id, cmd...)
	if code != 0 {
		t.Fatalf("exec %v exited %d: %s", cmd, code, out)
	}
	return out
}

func wantCode(t testing.TB, err error, code codes.Code, sub string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), sub) {
		t.Fatalf("got %v, want %v with %q in the message", err, code, sub)
	}
}

func TestContainers(t *testing.T) {
	e := newCtrEnv(t)
	t.Run("ExitCodesAndLogs", e.testExitCodesAndLogs)
	t.Run("ReopenLog", e.testReopenLog)
	t.Run("UsernsPod", e.testUsernsPod)
	t.Run("ProcMount", e.testProcMount)
	t.Run("IDMappedVolume", e.testIDMappedVolume)
	t.Run("RuntimeWithoutIDMap", e.testRuntimeWithoutIDMap)
	t.Run("RuntimeHandlers", e.testRuntimeHandlers)
	t.Run("OOMKilled", e.testOOM)
	t.Run("Stop", e.testStop)
	t.Run("ExecSync", e.testExecSync)
	t.Run("Security", e.testSecurity)
	t.Run("Seccomp", e.testSeccomp)
	t.Run("SharedPID", e.testSharedPID)
	t.Run("UpdateResources", e.testUpdateResources)
	t.Run("List", e.testList)
	t.Run("StatusImage", e.testStatusImage)
	t.Run("BadInput", e.testBadInput)
	t.Run("MissingHostPath", e.testMissingHostPath)
	t.Run("MonitorKilled", e.testMonitorKilled)
	// Restart kills the shared daemon: keep it last.
	t.Run("Restart", e.testRestart)
}

// criLine is one parsed CRI log line: "<time> <stream> <P|F> <text>".
type criLine struct{ stream, tag, text string }

func readCRILog(t *testing.T, path string) []criLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading log: %v", err)
	}
	var out []criLine
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		f := strings.SplitN(l, " ", 4)
		if len(f) != 4 {
			t.Fatalf("log line %q is not in CRI format", l)
		}
		if _, err := time.Parse(time.RFC3339Nano, f[0]); err != nil {
			t.Fatalf("log line %q: bad time: %v", l, err)
		}
		out = append(out, criLine{f[1], f[2], f[3]})
	}
	return out
}

func (e *ctrEnv) testExitCodesAndLogs(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("exits"))
	ok := e.run(t, pod, podCfg, e.ctr("ok", "sh", "-c", "echo to-stdout; echo to-stderr >&2"))
	bad := e.run(t, pod, podCfg, e.ctr("bad", "sh", "-c", "exit 3"))
	long := e.run(t, pod, podCfg, e.ctr("long", "awk", `BEGIN { for (i = 0; i < 20000; i++) printf "a"; print "" }`))
	// conmon parses its options with glib, which in the C locale refused
	// a log path that is not ASCII, and the start failed.
	utf8Cfg := e.ctr("utf8", "echo", "hi")
	utf8Cfg.LogPath = "ünï/cöde\u202e.log"
	utf8 := e.run(t, pod, podCfg, utf8Cfg)

	st := e.waitExit(t, ok, 30*time.Second)
	if st.ExitCode != 0 || st.Reason != "Completed" || st.StartedAt == 0 || st.FinishedAt < st.StartedAt {
		t.Errorf("ok: exit %d reason %q started %d finished %d, want 0 Completed with times", st.ExitCode, st.Reason, st.StartedAt, st.FinishedAt)
	}
	if want := filepath.Join(podCfg.LogDirectory, "ok.log"); st.LogPath != want {
		t.Errorf("log path %q, want %q", st.LogPath, want)
	}
	if st.ImageRef != e.busybox || st.Image.Image != e.busybox || st.ImageId != e.bbID {
		t.Errorf("image %q ref %q id %q, want %q %q %q", st.Image.Image, st.ImageRef, st.ImageId, e.busybox, e.busybox, e.bbID)
	}
	lines := readCRILog(t, st.LogPath)
	got := map[string]bool{}
	for _, l := range lines {
		got[l.stream+" "+l.tag+" "+l.text] = true
	}
	if len(lines) != 2 || !got["stdout F to-stdout"] || !got["stderr F to-stderr"] {
		t.Errorf("log lines %+v, want stdout F to-stdout and stderr F to-stderr", lines)
	}

	st = e.waitExit(t, bad, 30*time.Second)
	if st.ExitCode != 3 || st.Reason != "Error" {
		t.Errorf("bad: exit %d reason %q, want 3 Error", st.ExitCode, st.Reason)
	}
	// An exit leaves runc at once, as a task leaves containerd, with no
	// StopContainer (RemoveContainer then has no runtime call to make);
	// the status stays what it was.
	waitFor(t, 10*time.Second, "runc to forget the exited container", func() bool {
		_, err := os.Stat(filepath.Join(e.d.RunRoot, "runtime", "runc", bad))
		return errors.Is(err, os.ErrNotExist)
	})
	if st := e.status(t, bad); st.ExitCode != 3 || st.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Errorf("bad after runc forgot it: %s exit %d, want EXITED 3", st.State, st.ExitCode)
	}

	// A command the image lacks fails StartContainer; the container is
	// then EXITED as containerd reports it (128, StartError) with runc's
	// message on one line, as kubelet shows it in an event.
	missing := e.create(t, pod, podCfg, e.ctr("missing", "/no/such/binary"))
	if _, err := e.d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: missing}); err == nil {
		t.Errorf("StartContainer of a command the image lacks succeeded")
	}
	st = e.status(t, missing)
	if st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 128 || st.Reason != "StartError" ||
		!strings.Contains(st.Message, "/no/such/binary") || strings.ContainsAny(st.Message, "\n\r") {
		t.Errorf("a failed start: %s exit %d reason %q message %q, want EXITED 128 StartError naming the command on one line", st.State, st.ExitCode, st.Reason, st.Message)
	}
	// kubelet stops it as any exited container; the runtime has nothing
	// of it left (the failed create deleted it), which is no fault.
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: missing}); err != nil {
		t.Errorf("StopContainer after a failed start: %v", err)
	}
	for _, l := range strings.Split(e.d.Log(), "\n") {
		if strings.Contains(l, missing) && strings.Contains(l, "deleting the exited container") {
			t.Errorf("a container whose start failed was reaped as if the runtime held it: %s", l)
		}
	}

	st = e.waitExit(t, utf8, 30*time.Second)
	if lines := readCRILog(t, filepath.Join(podCfg.LogDirectory, utf8Cfg.LogPath)); st.ExitCode != 0 || len(lines) != 1 || lines[0].text != "hi" {
		t.Errorf("container with a UTF-8 log path: exit %d, log %+v; want 0 and hi", st.ExitCode, lines)
	}

	st = e.waitExit(t, long, 30*time.Second)
	lines = readCRILog(t, st.LogPath)
	var text strings.Builder
	for i, l := range lines {
		if want := map[bool]string{true: "F", false: "P"}[i == len(lines)-1]; l.tag != want || l.stream != "stdout" {
			t.Errorf("line %d of %d: stream %s tag %s, want stdout %s", i, len(lines), l.stream, l.tag, want)
		}
		text.WriteString(l.text)
	}
	if len(lines) < 2 || text.String() != strings.Repeat("a", 20000) {
		t.Errorf("long line came back as %d lines of %d bytes in all, want >=2 partial lines joining to 20000 a's", len(lines), text.Len())
	}
}

func (e *ctrEnv) testReopenLog(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("reopen"))
	id := e.run(t, pod, podCfg, e.ctr("ticker", "sh", "-c", "while true; do echo tick; sleep 0.1; done"))
	path := e.status(t, id).LogPath
	waitFor(t, 10*time.Second, "first log lines", func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), "stdout F tick")
	})
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.ReopenContainerLog(Ctx(t), &runtimeapi.ReopenContainerLogRequest{ContainerId: id}); err != nil {
		t.Fatalf("ReopenContainerLog: %v", err)
	}
	waitFor(t, 10*time.Second, "lines in the new log", func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), "stdout F tick")
	})
	old1, _ := os.ReadFile(path + ".1")
	time.Sleep(300 * time.Millisecond)
	old2, _ := os.ReadFile(path + ".1")
	if len(old1) != len(old2) {
		t.Errorf("the rotated log still grows (%d -> %d bytes)", len(old1), len(old2))
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fileOwner(t *testing.T, path string) uint32 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid
}

func (e *ctrEnv) testUsernsPod(t *testing.T) {
	pod, podCfg := e.pod(t, UsernsPod(PodConfig("userns"), 0))
	pst, info := e.d.PodStatus(t, pod)
	if len(info.UIDMappings) != 1 || info.UIDMappings[0].HostID == 0 {
		t.Fatalf("pod mappings %+v, want one allocated range", info.UIDMappings)
	}
	hostRoot := info.UIDMappings[0].HostID
	id := e.run(t, pod, podCfg, e.ctr("c", "sleep", "1000"))

	if out := e.mustExec(t, id, "stat", "-c", "%u", "/"); strings.TrimSpace(out) != "0" {
		t.Errorf("owner of / inside = %q, want 0", out)
	}
	e.mustExec(t, id, "touch", "/created-inside")
	upper := filepath.Join(e.d.Root, "containers", id, "upper", "created-inside")
	if got := fileOwner(t, upper); got != hostRoot {
		t.Errorf("host owner of a file root created = %d, want the mapped root %d", got, hostRoot)
	}
	if out := e.mustExec(t, id, "grep", " /sys ", "/proc/self/mountinfo"); !strings.Contains(out, " - sysfs ") {
		t.Errorf("/sys is not a fresh sysfs: %q", out)
	}
	if out := e.mustExec(t, id, "ls", "/sys/class/net"); !strings.Contains(out, "eth0") {
		t.Errorf("/sys/class/net = %q, want eth0", out)
	}
	ip := pst.GetNetwork().GetIp()
	if out := e.mustExec(t, id, "ip", "-4", "addr", "show", "eth0"); ip == "" || !strings.Contains(out, "inet "+ip+"/") {
		t.Errorf("eth0 = %q, want the pod IP %q", out, ip)
	}
	if out := e.mustExec(t, id, "hostname"); strings.TrimSpace(out) != "userns" {
		t.Errorf("hostname = %q, want userns", out)
	}
	if out := e.mustExec(t, id, "cat", "/proc/self/uid_map"); !strings.Contains(strings.Join(strings.Fields(out), " "), fmt.Sprintf("0 %d 65536", hostRoot)) {
		t.Errorf("uid_map = %q, want 0 %d 65536", out, hostRoot)
	}

	// A device kubelet puts at another path than the host's: runc binds
	// a device node into a user namespace from the host path equal to its
	// container path, which failed the start (/dev/x: no such file).
	devCfg := e.ctr("dev", "sleep", "1000")
	devCfg.Devices = []*runtimeapi.Device{{HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "rw"}}
	dev := e.run(t, pod, podCfg, devCfg)
	if out := e.mustExec(t, dev, "sh", "-c", "echo hi >/dev/x && stat -c %t:%T /dev/x"); strings.TrimSpace(out) != "1:3" {
		t.Errorf("/dev/x in the pod with a user namespace: %q, want the host's /dev/null (1:3), writable", out)
	}

	// The image's files: owned by root in the layer store, by the mapped
	// root through the container's rootfs, and one idmapped mount serves
	// every container of the pod.
	second := e.run(t, pod, podCfg, e.ctr("c2", "sleep", "1000"))
	for _, c := range []string{id, second} {
		if got := fileOwner(t, filepath.Join(e.d.Root, "containers", c, "rootfs", "bin", "busybox")); got != hostRoot {
			t.Errorf("host view of /bin/busybox in %s = uid %d, want the mapped root %d", c, got, hostRoot)
		}
	}
	if out := e.mustExec(t, second, "stat", "-c", "%u", "/bin/busybox"); strings.TrimSpace(out) != "0" {
		t.Errorf("owner of /bin/busybox inside = %q, want 0", out)
	}
	idmapped := 0
	for _, line := range strings.Split(readFile(t, "/proc/self/mountinfo"), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && strings.Contains(f[4], "/idmapped/"+pod) && strings.Contains(f[5], "idmapped") {
			idmapped++
		}
	}
	if idmapped != 1 {
		t.Errorf("%d idmapped mounts for pod %s with two containers, want exactly 1", idmapped, pod)
	}
}

// testProcMount asks for /proc as kubelet does in a user namespace pod:
// procMount Default sends kubelet's lists, Unmasked sends empty ones,
// which must mean no masked path (the e2e_node spec "will unmask proc
// mounts if requested" counts the /proc mounts as this does).
func (e *ctrEnv) testProcMount(t *testing.T) {
	pod, podCfg := e.pod(t, UsernsPod(PodConfig("procmount"), 0))
	def := e.ctr("default", "sleep", "1000")
	def.Linux.SecurityContext.MaskedPaths = []string{"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"}
	def.Linux.SecurityContext.ReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
	unmasked := e.ctr("unmasked", "sleep", "1000")
	for _, tc := range []struct {
		cfg           *runtimeapi.ContainerConfig
		masked, alone bool
	}{{def, true, false}, {unmasked, false, true}} {
		id := e.run(t, pod, podCfg, tc.cfg)
		out := strings.TrimSpace(e.mustExec(t, id, "sh", "-ec", "mount | grep /proc"))
		lines, ro := len(strings.Split(out, "\n")), strings.Count(out, "(ro")
		if tc.alone != (lines == 1) || tc.masked != (ro > 0) {
			t.Errorf("%s: /proc mounts\n%s\nwant masked %v, /proc alone %v", tc.cfg.Metadata.Name, out, tc.masked, tc.alone)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (e *ctrEnv) testIDMappedVolume(t *testing.T) {
	pod, podCfg := e.pod(t, UsernsPod(PodConfig("idmap"), 0))
	_, info := e.d.PodStatus(t, pod)
	hostRoot := info.UIDMappings[0].HostID

	// pod0 is owned by host root; explicit by host uid 1000. Under an
	// idmapped mount the kernel refuses writes to an inode whose owner the
	// mapping does not cover, so each volume's owner must be mapped.
	pod0, explicit := t.TempDir(), t.TempDir()
	for _, d := range []string{pod0, explicit} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(explicit, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	cfg := e.ctr("vol", "sleep", "1000")
	// The explicit mapping puts container root (host hostRoot) at ID 1000
	// on disk, where the pod's own mapping puts it at 0.
	m := []*runtimeapi.IDMapping{{ContainerId: 1000, HostId: hostRoot, Length: 65536}}
	cfg.Mounts = []*runtimeapi.Mount{
		{HostPath: pod0, ContainerPath: "/podmap"},
		{HostPath: explicit, ContainerPath: "/explicit", UidMappings: m, GidMappings: m},
	}
	id := e.run(t, pod, podCfg, cfg)
	for _, v := range []string{"/podmap", "/explicit"} {
		if out := e.mustExec(t, id, "stat", "-c", "%u", v); strings.TrimSpace(out) != "0" {
			t.Errorf("inside, %s is owned by %q, want the container's root 0", v, out)
		}
	}
	e.mustExec(t, id, "touch", "/podmap/f")
	if out, code := e.exec(t, id, "touch", "/explicit/f"); code != 0 {
		dbg, _ := e.exec(t, id, "sh", "-c", "id; stat -c '%u %g %a' /explicit; grep explicit /proc/self/mountinfo")
		t.Fatalf("touch /explicit/f: %d %s\n%s", code, out, dbg)
	}
	if got := fileOwner(t, filepath.Join(pod0, "f")); got != 0 {
		t.Errorf("pod-mapped volume: host owner %d, want 0", got)
	}
	if got := fileOwner(t, filepath.Join(explicit, "f")); got != 1000 {
		t.Errorf("explicitly mapped volume: host owner %d, want 1000", got)
	}
	st := e.status(t, id)
	if len(st.Mounts) != 2 || len(st.Mounts[1].UidMappings) != 1 || st.Mounts[1].UidMappings[0].ContainerId != 1000 {
		t.Errorf("status mounts %+v, want both volumes with the explicit mapping kept", st.Mounts)
	}
}

func (e *ctrEnv) testRuntimeWithoutIDMap(t *testing.T) {
	handlers := map[string]string{"noidmap": e.fakeRT}
	if _, err := os.Stat("/usr/bin/crun"); err == nil {
		handlers["crun"] = "/usr/bin/crun"
	}
	for handler, bin := range handlers {
		t.Run(handler, func(t *testing.T) {
			cfg := UsernsPod(PodConfig("rt-"+handler), 0)
			cfg.LogDirectory = filepath.Join(e.d.Dir, "logs", "rt-"+handler)
			resp, err := e.d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
			if err != nil {
				// A handler that cannot run containers at all (crun 1.8.1
				// cannot run pinrt's specs) is refused with the pod.
				wantCode(t, err, codes.FailedPrecondition, bin)
				if left := e.d.Leftovers(); len(left) > 0 {
					t.Errorf("left behind: %v", left)
				}
				return
			}
			t.Cleanup(func() {
				_, _ = e.d.Runtime.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId})
			})
			c := e.ctr("vol", "true")
			c.Mounts = []*runtimeapi.Mount{{HostPath: t.TempDir(), ContainerPath: "/vol"}}
			_, err = e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: resp.PodSandboxId, Config: c, SandboxConfig: cfg})
			wantCode(t, err, codes.FailedPrecondition, bin)
			if left := e.containerLeftovers(); len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

func (e *ctrEnv) testRuntimeHandlers(t *testing.T) {
	resp, err := e.d.Runtime.Status(Ctx(t), &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range resp.RuntimeHandlers {
		got[h.Name] = fmt.Sprintf("userns=%v rro=%v", h.Features.GetUserNamespaces(), h.Features.GetRecursiveReadOnlyMounts())
	}
	want := map[string]string{
		"":        "userns=true rro=true",
		"runc":    "userns=true rro=true",
		"noidmap": "userns=false rro=false",
	}
	// crun 1.8.1 cannot run pinrt's specs and "missing" has no binary:
	// neither is advertised.
	if len(got) != len(want) {
		t.Errorf("handlers %v, want exactly %v", got, want)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("handler %q: %q, want %q (all: %v)", name, got[name], w, got)
		}
	}
}

func (e *ctrEnv) testOOM(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("oom"))
	cfg := e.ctr("hog", "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1")
	limit := int64(32 << 20)
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: limit, MemorySwapLimitInBytes: limit}
	id := e.run(t, pod, podCfg, cfg)
	st := e.waitExit(t, id, 30*time.Second)
	if st.Reason != "OOMKilled" || st.ExitCode != 137 {
		t.Errorf("memory hog: reason %q exit %d, want OOMKilled 137", st.Reason, st.ExitCode)
	}
}

// stopOnUSR1 exits 42 on SIGUSR1, 44 on SIGRTMIN+3 (signal 37, systemd's
// stop signal) and ignores SIGTERM.
const stopOnUSR1 = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGUSR1, syscall.Signal(37), syscall.SIGTERM)
	os.Stdout.WriteString("ready\n")
	for s := range c {
		switch s {
		case syscall.SIGUSR1:
			os.Exit(42)
		case syscall.Signal(37):
			os.Exit(44)
		}
	}
}
`

func (e *ctrEnv) testStop(t *testing.T) {
	img := e.pull(t, e.reg.Push(t, "stopsig:1", testimage.Build(t, testimage.Spec{
		Programs:   map[string]string{"/stopper": stopOnUSR1},
		Entrypoint: []string{"/stopper"}, StopSignal: "SIGUSR1",
	})))
	pod, podCfg := e.pod(t, PodConfig("stop"))

	stubborn := e.run(t, pod, podCfg, e.ctr("stubborn", "sleep", "1000"))
	cfg := e.ctr("usr1")
	cfg.Image.Image = img
	usr1 := e.run(t, pod, podCfg, cfg)
	// The pod's stop signal (lifecycle.stopSignal) wins over the image's.
	cfg = e.ctr("rtmin3")
	cfg.Image.Image, cfg.StopSignal = img, runtimeapi.Signal_SIGNAL_SIGRTMINPLUS3
	rtmin3 := e.run(t, pod, podCfg, cfg)
	// The Go runtime drops a signal that comes before signal.Notify: wait
	// until both programs say they have their handlers.
	for _, name := range []string{"usr1", "rtmin3"} {
		log := filepath.Join(podCfg.LogDirectory, name+".log")
		waitFor(t, 30*time.Second, name+"'s handlers", func() bool {
			b, _ := os.ReadFile(log)
			return strings.Contains(string(b), " stdout F ready")
		})
	}
	for id, want := range map[string]runtimeapi.Signal{
		stubborn: runtimeapi.Signal_SIGNAL_SIGTERM, usr1: runtimeapi.Signal_SIGNAL_SIGUSR1, rtmin3: runtimeapi.Signal_SIGNAL_SIGRTMINPLUS3,
	} {
		if got := e.status(t, id).StopSignal; got != want {
			t.Errorf("container %s reports stop signal %s, want %s", id, got, want)
		}
	}

	start := time.Now()
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: stubborn, Timeout: 2}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if took := time.Since(start); took < 2*time.Second || took > 10*time.Second {
		t.Errorf("stopping a container that ignores SIGTERM took %v, want the 2s timeout then SIGKILL", took)
	}
	if st := e.status(t, stubborn); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 {
		t.Errorf("stubborn: %v exit %d, want EXITED 137", st.State, st.ExitCode)
	}
	start = time.Now()
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: usr1, Timeout: 20}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if st := e.status(t, usr1); st.ExitCode != 42 || time.Since(start) > 10*time.Second {
		t.Errorf("STOPSIGNAL SIGUSR1: exit %d after %v, want 42 at once", st.ExitCode, time.Since(start))
	}
	start = time.Now()
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: rtmin3, Timeout: 20}); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if st := e.status(t, rtmin3); st.ExitCode != 44 || time.Since(start) > 10*time.Second {
		t.Errorf("the pod's stop signal SIGRTMIN+3: exit %d after %v, want 44 at once", st.ExitCode, time.Since(start))
	}
	// Stopping again is fine.
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: usr1, Timeout: 1}); err != nil {
		t.Errorf("second StopContainer: %v", err)
	}
	// A negative timeout is none: SIGKILL at once. It used to put the
	// stop's deadline in the past: DeadlineExceeded, the container alive.
	neg := e.run(t, pod, podCfg, e.ctr("negative", "sleep", "1000"))
	if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: neg, Timeout: -100}); err != nil {
		t.Fatalf("StopContainer with a negative timeout: %v", err)
	}
	if st := e.status(t, neg); st.State != runtimeapi.ContainerState_CONTAINER_EXITED || st.ExitCode != 137 {
		t.Errorf("after a stop with a negative timeout: %v exit %d, want EXITED 137", st.State, st.ExitCode)
	}
}

func (e *ctrEnv) testExecSync(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("exec"))
	id := e.run(t, pod, podCfg, e.ctr("c", "sleep", "1000"))
	resp, err := e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", "echo out; echo err >&2; exit 5"}, Timeout: 10})
	if err != nil {
		t.Fatalf("ExecSync: %v", err)
	}
	if string(resp.Stdout) != "out\n" || string(resp.Stderr) != "err\n" || resp.ExitCode != 5 {
		t.Errorf("ExecSync = %q %q %d, want out err 5", resp.Stdout, resp.Stderr, resp.ExitCode)
	}
	start := time.Now()
	_, err = e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sleep", "60"}, Timeout: 1})
	wantCode(t, err, codes.DeadlineExceeded, "timed out after 1s")
	if took := time.Since(start); took > 8*time.Second {
		t.Errorf("timed-out exec returned after %v", took)
	}
	if out := e.mustExec(t, id, "ps"); strings.Contains(out, "sleep 60") {
		t.Errorf("the timed-out exec is still running:\n%s", out)
	}
	// A process tree left by an exec ends with it (issue 31): its
	// background children, after a timeout and after a normal exit alike,
	// and after a client that gave up (a cancelled call).
	for _, tc := range []struct {
		name, cmd string
		timeout   int64
		code      codes.Code
	}{
		{"timeout", "sleep 101 & sleep 102 & echo hi; sleep 60", 1, codes.DeadlineExceeded},
		// A child held to the timeout would end it with DeadlineExceeded.
		{"exit with children", "sleep 103 & echo hi", 10, codes.OK},
	} {
		_, err := e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", tc.cmd}, Timeout: tc.timeout})
		if status.Code(err) != tc.code {
			t.Errorf("%s: ExecSync = %v, want %s", tc.name, err, tc.code)
		}
	}
	cctx, cancel := context.WithTimeout(Ctx(t), time.Second)
	_, err = e.d.Runtime.ExecSync(cctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"sh", "-c", "sleep 104 & sleep 60"}})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded, "")
	// Killed children become zombies of the container's init (sleep
	// does not reap, as a pod's pause would): only live ones count.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var live []string
		for _, l := range strings.Split(e.mustExec(t, id, "sh", "-c", "cat /proc/[0-9]*/stat"), "\n") {
			f := strings.Fields(l)
			if len(f) > 2 && f[0] != "1" && f[1] == "(sleep)" && f[2] != "Z" {
				live = append(live, l)
			}
		}
		if len(live) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of finished execs still run after 10s:\n%s", strings.Join(live, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *ctrEnv) testSecurity(t *testing.T) {
	img := e.pull(t, e.reg.Push(t, "user1002:1", testimage.Build(t, testimage.Spec{User: "1002", Cmd: []string{"sleep", "1000"}})))
	pod, podCfg := e.pod(t, PodConfig("security"))

	cfg := e.ctr("ro", "sleep", "1000")
	cfg.Linux.SecurityContext.ReadonlyRootfs = true
	cfg.Linux.SecurityContext.Capabilities = &runtimeapi.Capability{DropCapabilities: []string{"ALL"}}
	cfg.Linux.SecurityContext.SupplementalGroups = []int64{1234, 5678}
	// This host has no SELinux: the label is ignored, as containerd and
	// CRI-O ignore it (Kubernetes' e2e_node log path specs set one).
	cfg.Linux.SecurityContext.SelinuxOptions = &runtimeapi.SELinuxOption{Type: "container_logreader_t"}
	ro := e.run(t, pod, podCfg, cfg)
	if out, code := e.exec(t, ro, "touch", "/x"); code == 0 || !strings.Contains(out, "Read-only file system") {
		t.Errorf("touch on a read-only rootfs: %d %q", code, out)
	}
	if out := e.mustExec(t, ro, "grep", "CapEff", "/proc/self/status"); strings.Join(strings.Fields(out), " ") != "CapEff: 0000000000000000" {
		t.Errorf("capabilities after dropping ALL: %q", out)
	}
	if out := e.mustExec(t, ro, "id", "-G"); strings.Join(strings.Fields(out), " ") != "0 1234 5678" {
		t.Errorf("id -G = %q, want 0 1234 5678", out)
	}
	st := e.status(t, ro)
	if g := st.GetUser().GetLinux().GetSupplementalGroups(); len(g) != 3 || g[0] != 0 || g[1] != 1234 || g[2] != 5678 {
		t.Errorf("status supplemental groups %v, want [0 1234 5678]", g)
	}

	cfg = e.ctr("user")
	cfg.Image.Image = img
	user := e.run(t, pod, podCfg, cfg)
	if out := e.mustExec(t, user, "id", "-u"); strings.TrimSpace(out) != "1002" {
		t.Errorf("id -u = %q, want the image's USER 1002", out)
	}
	if uid := e.status(t, user).GetUser().GetLinux().GetUid(); uid != 1002 {
		t.Errorf("status uid %d, want 1002", uid)
	}
}

// addKey calls add_key(2) with null arguments: the kernel answers EFAULT,
// moby's default seccomp profile EPERM before the kernel sees it.
const addKey = `package main

import (
	"fmt"
	"syscall"
)

func main() {
	_, _, errno := syscall.Syscall6(syscall.SYS_ADD_KEY, 0, 0, 0, 0, 0, 0)
	fmt.Println(errno.Error())
}
`

func (e *ctrEnv) testSeccomp(t *testing.T) {
	img := e.pull(t, e.reg.Push(t, "addkey:1", testimage.Build(t, testimage.Spec{
		Programs: map[string]string{"/addkey": addKey}, Cmd: []string{"sleep", "1000"},
	})))
	pod, podCfg := e.pod(t, PodConfig("seccomp"))
	for _, tc := range []struct {
		name    string
		profile runtimeapi.SecurityProfile_ProfileType
		want    string
	}{
		{"default", runtimeapi.SecurityProfile_RuntimeDefault, "operation not permitted"},
		{"unconfined", runtimeapi.SecurityProfile_Unconfined, "bad address"},
	} {
		cfg := e.ctr(tc.name)
		cfg.Image.Image = img
		cfg.Linux.SecurityContext.Seccomp = &runtimeapi.SecurityProfile{ProfileType: tc.profile}
		id := e.run(t, pod, podCfg, cfg)
		if out := e.mustExec(t, id, "/addkey"); strings.TrimSpace(out) != tc.want {
			t.Errorf("%s: add_key -> %q, want %q", tc.name, out, tc.want)
		}
	}
}

func (e *ctrEnv) testSharedPID(t *testing.T) {
	cfg := PodConfig("sharedpid")
	cfg.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
	pod, podCfg := e.pod(t, UsernsPod(cfg, 0))
	a := e.ctr("a", "sleep", "1001")
	a.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
	b := e.ctr("b", "sleep", "1002")
	b.Linux.SecurityContext.NamespaceOptions.Pid = runtimeapi.NamespaceMode_POD
	aID := e.run(t, pod, podCfg, a)
	e.run(t, pod, podCfg, b)
	out := e.mustExec(t, aID, "ps", "-o", "pid,args")
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			lines[strings.Join(f[1:], " ")] = f[0]
		}
	}
	if lines["/pause pause"] != "1" || lines["sleep 1002"] == "" || lines["sleep 1001"] == "" {
		t.Errorf("ps in container a:\n%s\nwant /pause as PID 1 and both sleeps", out)
	}
	if out := e.mustExec(t, aID, "hostname"); strings.TrimSpace(out) != "sharedpid" {
		t.Errorf("hostname = %q", out)
	}
	// The verbose status names the pause process as the pod's pid, and
	// its runtimeSpec has the containers' PID namespace, as containerd's.
	_, info := e.d.PodStatus(t, pod)
	aPidNS := fmt.Sprintf("/proc/%d/ns/pid", e.info(t, aID).Pid)
	var pidNS string
	if info.RuntimeSpec != nil && info.RuntimeSpec.Linux != nil {
		for _, ns := range info.RuntimeSpec.Linux.Namespaces {
			if ns.Type == specs.PIDNamespace {
				pidNS = ns.Path
			}
		}
	}
	if !sameFile(fmt.Sprintf("/proc/%d/ns/pid", info.Pid), aPidNS) || !sameFile(pidNS, aPidNS) {
		t.Errorf("pod info pid %d, runtimeSpec pid namespace %q: want the pause process and container a's namespace", info.Pid, pidNS)
	}
	// The pause process reaps what is orphaned in the pod: a background
	// sleep whose shell exited is re-parented to it.
	e.mustExec(t, aID, "sh", "-c", "(sleep 0.3 &)")
	waitFor(t, 10*time.Second, "the orphaned sleep reaped by the pause process", func() bool {
		out := e.mustExec(t, aID, "ps", "-o", "stat,args")
		for _, l := range strings.Split(out, "\n") {
			// A zombie shows as "Z [sleep]".
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[0], "Z") || strings.Contains(l, "sleep 0.3") {
				return false
			}
		}
		return true
	})
	// The pause process is the small pinrt-exec, not the daemon's binary.
	got, err := os.ReadFile(filepath.Join(e.d.Root, "pause", "rootfs", "pause"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(filepath.Dir(Binary(t)), "pinrt-exec"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the pause rootfs holds a %d-byte binary, not pinrt-exec (%d bytes)", len(got), len(want))
	}
	// A container's `kill 1` ends the pause process, and the kernel every
	// process of the namespace with it: the pod is NotReady, as with
	// containerd's or CRI-O's pause, for kubelet to make a new one.
	_, _ = e.d.Runtime.ExecSync(Ctx(t), &runtimeapi.ExecSyncRequest{ContainerId: aID, Cmd: []string{"kill", "1"}, Timeout: 10})
	waitFor(t, 10*time.Second, "the pod NotReady once its pause process exited", func() bool {
		st, _ := e.d.PodStatus(t, pod)
		return st.State == runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	})
	if st := e.waitExit(t, aID, 10*time.Second); st.ExitCode == 0 {
		t.Errorf("container a exited 0 with its PID namespace's init")
	}
	_, err = e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: e.ctr("late", "sleep", "1"), SandboxConfig: podCfg})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("CreateContainer in the pod whose pause exited: %v, want FailedPrecondition", err)
	}
}

func (e *ctrEnv) testUpdateResources(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("update"))
	cfg := e.ctr("c", "sleep", "1000")
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 64 << 20}
	id := e.run(t, pod, podCfg, cfg)
	dir := CgroupDir(t, e.info(t, id).Pid, "memory")
	limitFile, swapFile := "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
	if CgroupV2() {
		limitFile, swapFile = "memory.max", "memory.swap.max"
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	// A memory limit alone allows no swap where the kernel accounts it,
	// as in containerd and CRI-O: memory plus swap is the memory (v1),
	// memory.swap.max is 0 (v2), and the status says so.
	_, err := os.Stat(filepath.Join(dir, swapFile))
	swapAccounted := err == nil
	if !swapAccounted {
		t.Logf("no %s: this kernel does not account swap, and the swap limit goes unchecked", swapFile)
	}
	checkLimits := func(when string, mem int64) {
		t.Helper()
		if got := read(limitFile); got != strconv.FormatInt(mem, 10) {
			t.Errorf("%s: memory limit %s, want %d", when, got, mem)
		}
		if !swapAccounted {
			return
		}
		want := strconv.FormatInt(mem, 10)
		if CgroupV2() {
			want = "0"
		}
		if got := read(swapFile); got != want {
			t.Errorf("%s: %s %s, want %s", when, swapFile, got, want)
		}
		st := e.status(t, id)
		if got := st.GetResources().GetLinux().GetMemorySwapLimitInBytes(); got != mem {
			t.Errorf("%s: status swap limit %d, want %d", when, got, mem)
		}
	}
	checkLimits("created", 64<<20)
	if _, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20},
	}); err != nil {
		t.Fatalf("UpdateContainerResources: %v", err)
	}
	checkLimits("updated", 96<<20)
	if CgroupV2() || !swapAccounted {
		return
	}
	// cgroup v1 keeps memory plus swap at or above memory: a swap limit
	// below the memory is refused (runc's write would fail, Unknown), and
	// the limits stay. A memory limit alone brings its swap limit along,
	// whatever swap limit was in force, so it cannot go past it.
	if _, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 96 << 20, MemorySwapLimitInBytes: 128 << 20},
	}); err != nil {
		t.Fatalf("UpdateContainerResources with swap: %v", err)
	}
	if got := read(swapFile); got != strconv.Itoa(128<<20) {
		t.Errorf("memory plus swap after the update %s, want %d", got, 128<<20)
	}
	_, err = e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 256 << 20, MemorySwapLimitInBytes: 128 << 20},
	})
	wantCode(t, err, codes.InvalidArgument, "is below memory_limit_in_bytes")
	if got, want := read(limitFile)+" "+read(swapFile), fmt.Sprintf("%d %d", 96<<20, 128<<20); got != want {
		t.Errorf("limits after the refused update %s, want %s", got, want)
	}
	if _, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: 256 << 20},
	}); err != nil {
		t.Fatalf("UpdateContainerResources of the memory alone, above the swap limit in force: %v", err)
	}
	checkLimits("memory alone above the swap limit", 256<<20)
}

func (e *ctrEnv) testList(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("list"))
	cfg := e.ctr("running", "sleep", "1000")
	cfg.Labels = map[string]string{"tier": "x"}
	running := e.run(t, pod, podCfg, cfg)
	created := e.create(t, pod, podCfg, e.ctr("created", "true"))
	list := func(f *runtimeapi.ContainerFilter) []string {
		resp, err := e.d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{Filter: f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range resp.Containers {
			ids = append(ids, c.Id)
		}
		return ids
	}
	for _, tc := range []struct {
		name string
		f    *runtimeapi.ContainerFilter
		want []string
	}{
		{"pod", &runtimeapi.ContainerFilter{PodSandboxId: pod}, sortedIDs(running, created)},
		{"running", &runtimeapi.ContainerFilter{PodSandboxId: pod, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}, []string{running}},
		{"created", &runtimeapi.ContainerFilter{PodSandboxId: pod, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_CREATED}}, []string{created}},
		{"label", &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"tier": "x"}}, []string{running}},
		{"id prefix", &runtimeapi.ContainerFilter{Id: created[:12]}, []string{created}},
	} {
		if got := list(tc.f); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// A duplicate name and attempt is refused.
	_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: e.ctr("created", "true"), SandboxConfig: podCfg})
	wantCode(t, err, codes.AlreadyExists, "created")
	if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: running}); err != nil {
		t.Fatalf("RemoveContainer of a running container: %v", err)
	}
	_, err = e.d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: running})
	wantCode(t, err, codes.NotFound, running[:12])
	// api.proto: removing a container that no longer exists succeeds.
	if _, err = e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: running}); err != nil {
		t.Errorf("RemoveContainer of a removed container: %v, want success", err)
	}
}

// testStatusImage creates containers as kubelet does, by image ID with
// the pod's name for the image beside it: the status and the list name
// the pod's (kubelet shows it as the pod's containerStatuses[].image, and
// the e2e_node sidecar specs wait for it to change), never the ID.
func (e *ctrEnv) testStatusImage(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("statusimage"))
	const named = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	byPod := e.ctr("kubelet", "true")
	byPod.Image = &runtimeapi.ImageSpec{Image: e.bbID, UserSpecifiedImage: named}
	byRef := e.ctr("crictl", "true")
	byID := e.ctr("id", "true")
	byID.Image = &runtimeapi.ImageSpec{Image: e.bbID}
	// By ID alone: the image's first tag, as containerd shows it.
	e.pull(t, e.reg.Ref("busybox:1"))
	tags := e.imageTags(t, e.bbID)
	if len(tags) == 0 {
		t.Fatalf("busybox pulled by tag has no tags")
	}
	byIDWant := tags[0]
	want := map[string]string{
		e.create(t, pod, podCfg, byPod): named,
		e.create(t, pod, podCfg, byRef): e.busybox,
		e.create(t, pod, podCfg, byID):  byIDWant,
	}
	resp, err := e.d.Runtime.ListContainers(Ctx(t), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: pod}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range resp.Containers {
		if st := e.status(t, c.Id); st.GetImage().GetImage() != want[c.Id] || c.GetImage().GetImage() != want[c.Id] || st.ImageId != e.bbID {
			t.Errorf("%s: status image %q, list image %q, image ID %q; want %q and %q", c.Metadata.Name, st.GetImage().GetImage(), c.GetImage().GetImage(), st.ImageId, want[c.Id], e.bbID)
		}
	}
	bad := e.ctr("bad", "true")
	bad.Image.UserSpecifiedImage = "a\x00b"
	_, err = e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: bad, SandboxConfig: podCfg})
	wantCode(t, err, codes.InvalidArgument, "user-specified image")
}

func (e *ctrEnv) imageTags(t *testing.T, id string) []string {
	resp, err := e.d.Image.ImageStatus(Ctx(t), &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: id}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetImage().GetRepoTags()
}

func sortedIDs(ids ...string) []string {
	if ids[0] > ids[1] {
		ids[0], ids[1] = ids[1], ids[0]
	}
	return ids
}

// containerLeftovers lists container state the daemon could leave behind:
// container directories, runc state and mounts under the daemon's dirs.
func (e *ctrEnv) containerLeftovers() []string {
	var left []string
	ids := map[string]bool{}
	resp, err := e.d.Runtime.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	if err == nil {
		for _, c := range resp.Containers {
			ids[c.Id] = true
		}
	}
	for _, dir := range []string{filepath.Join(e.d.Root, "containers"), filepath.Join(e.d.RunRoot, "runtime", "runc")} {
		entries, _ := os.ReadDir(dir)
		for _, en := range entries {
			if !ids[en.Name()] && !strings.HasPrefix(en.Name(), ".") && !e.isPod(en.Name()) {
				left = append(left, filepath.Join(dir, en.Name()))
			}
		}
	}
	for _, m := range MountsUnder(filepath.Join(e.d.Root, "containers")) {
		left = append(left, "mount "+m)
	}
	return left
}

// isPod says whether id is a pod's (its infra process has the pod's ID).
func (e *ctrEnv) isPod(id string) bool {
	_, err := e.d.Runtime.PodSandboxStatus(context.Background(), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	return err == nil
}

func (e *ctrEnv) testBadInput(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("bad"))
	withMount := e.ctr("relmount", "true")
	withMount.Mounts = []*runtimeapi.Mount{{HostPath: "relative/dir", ContainerPath: "/vol"}}
	escaping := e.ctr("escape", "true")
	escaping.LogPath = "../../escape.log"
	noImage := e.ctr("noimage", "true")
	noImage.Image.Image = e.reg.Ref("never-pushed:1")
	with := func(name string, f func(c *runtimeapi.ContainerConfig)) *runtimeapi.ContainerConfig {
		c := e.ctr(name, "true")
		f(c)
		return c
	}
	vol := func(m *runtimeapi.Mount) func(c *runtimeapi.ContainerConfig) {
		return func(c *runtimeapi.ContainerConfig) { c.Mounts = []*runtimeapi.Mount{m} }
	}
	for _, tc := range []struct {
		name string
		pod  string
		cfg  *runtimeapi.ContainerConfig
		code codes.Code
		msg  string
	}{
		{"unknown sandbox", "0123456789abcdef", e.ctr("x", "true"), codes.NotFound, "0123456789abcdef"},
		{"image not present", pod, noImage, codes.NotFound, "never-pushed"},
		{"log path escapes", pod, escaping, codes.InvalidArgument, "escapes the pod's log directory"},
		{"relative mount", pod, withMount, codes.InvalidArgument, `mount host path "relative/dir" is not absolute`},
		// What runc would refuse only at the start, as a runtime error.
		{"mount on the root", pod, with("onroot", vol(&runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/./"})), codes.InvalidArgument, `"/./" is the container's root`},
		{"NUL in a host path", pod, with("nulhost", vol(&runtimeapi.Mount{HostPath: "/tmp/a\x00b", ContainerPath: "/vol"})), codes.InvalidArgument, "contains a NUL byte"},
		{"NUL in a container path", pod, with("nulctr", vol(&runtimeapi.Mount{HostPath: "/tmp", ContainerPath: "/v\x00l"})), codes.InvalidArgument, "contains a NUL byte"},
		{"NUL in the command", pod, with("nulcmd", func(c *runtimeapi.ContainerConfig) { c.Command = []string{"tr\x00ue"} }), codes.InvalidArgument, `command "tr\x00ue" contains a NUL byte`},
		{"NUL in an argument", pod, with("nularg", func(c *runtimeapi.ContainerConfig) { c.Args = []string{"a\x00"} }), codes.InvalidArgument, "argument"},
		{"NUL in the environment", pod, with("nulenv", func(c *runtimeapi.ContainerConfig) {
			c.Envs = []*runtimeapi.KeyValue{{Key: "A", Value: []byte("b\x00c")}}
		}), codes.InvalidArgument, "environment variable"},
		{"NUL in the working dir", pod, with("nulwd", func(c *runtimeapi.ContainerConfig) { c.WorkingDir = "/tmp\x00" }), codes.InvalidArgument, "working dir"},
		{"ID mappings without a user namespace", pod, with("idmap", vol(&runtimeapi.Mount{
			HostPath: "/tmp", ContainerPath: "/vol",
			UidMappings: []*runtimeapi.IDMapping{{HostId: 0, ContainerId: 0, Length: 1}},
		})), codes.InvalidArgument, "has no user namespace"},
		{"relative masked path", pod, with("masked", func(c *runtimeapi.ContainerConfig) {
			c.Linux.SecurityContext.MaskedPaths = []string{"proc/kcore"}
		}), codes.InvalidArgument, `masked or read-only path "proc/kcore" is not absolute`},
		{"hugepage size a path", pod, with("hugepage", func(c *runtimeapi.ContainerConfig) {
			c.Linux.Resources = &runtimeapi.LinuxContainerResources{HugepageLimits: []*runtimeapi.HugepageLimit{{PageSize: "2MB/../x", Limit: 1 << 21}}}
		}), codes.InvalidArgument, "is not a size like 2MB"},
		{"unknown pid mode", pod, with("pidmode", func(c *runtimeapi.ContainerConfig) {
			c.Linux.SecurityContext.NamespaceOptions.Pid = 9
		}), codes.InvalidArgument, "unknown pid namespace mode 9"},
	} {
		_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: tc.pod, Config: tc.cfg, SandboxConfig: podCfg})
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.code, tc.msg)
		}
	}
	cfg := PodConfig("badhandler")
	_, err := e.d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "nope"})
	wantCode(t, err, codes.InvalidArgument, `unknown runtime handler "nope"`)
	if left := e.containerLeftovers(); len(left) > 0 {
		t.Errorf("bad requests left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(e.d.Dir, "escape.log")); err == nil {
		t.Errorf("the escaping log file was created")
	}
}

// testMissingHostPath: a volume whose host path does not exist gets it
// made as a directory, as containerd and CRI-O do (kubelet checks nothing
// for a hostPath volume of no type); a create that fails afterwards
// removes what it made.
func (e *ctrEnv) testMissingHostPath(t *testing.T) {
	pod, podCfg := e.pod(t, PodConfig("hostpath"))
	base := t.TempDir()
	host := filepath.Join(base, "a", "b")
	cfg := e.ctr("c", "sh", "-c", "echo hi >/vol/f && sleep 1000")
	cfg.Mounts = []*runtimeapi.Mount{{HostPath: host, ContainerPath: "/vol"}}
	e.run(t, pod, podCfg, cfg)
	waitFor(t, 10*time.Second, "the container's file in the made host path", func() bool {
		b, err := os.ReadFile(filepath.Join(host, "f"))
		return err == nil && string(b) == "hi\n"
	})
	if st, err := os.Stat(host); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("made host path: %v, mode %v; want a 0755 directory", err, st.Mode())
	}

	// The user is resolved in the image after the host path was made.
	gone := filepath.Join(base, "x", "y")
	bad := e.ctr("bad", "true")
	bad.Mounts = []*runtimeapi.Mount{{HostPath: gone, ContainerPath: "/vol"}}
	bad.Linux.SecurityContext.RunAsUsername = "nosuchuser"
	_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: bad, SandboxConfig: podCfg})
	wantCode(t, err, codes.InvalidArgument, "nosuchuser")
	if _, err := os.Stat(filepath.Join(base, "x")); !os.IsNotExist(err) {
		t.Errorf("the failed create left the host path it made: %v", err)
	}

	// Something in the way that is not a directory fails the create.
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	blocked := e.ctr("blocked", "true")
	blocked.Mounts = []*runtimeapi.Mount{{HostPath: filepath.Join(file, "sub"), ContainerPath: "/vol"}}
	_, err = e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: blocked, SandboxConfig: podCfg})
	if err == nil || !strings.Contains(status.Convert(err).Message(), "creating mount host path") {
		t.Errorf("host path below a file: %v, want the failure to make it", err)
	}
}

func (e *ctrEnv) testRestart(t *testing.T) {
	pod, podCfg := e.pod(t, UsernsPod(PodConfig("restart"), 0))
	long := e.run(t, pod, podCfg, e.ctr("long", "sleep", "1000"))
	short := e.run(t, pod, podCfg, e.ctr("short", "sh", "-c", "sleep 3; exit 7"))
	pid := e.info(t, long).Pid
	if err := e.d.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	st := e.status(t, long)
	if st.State != runtimeapi.ContainerState_CONTAINER_RUNNING || e.info(t, long).Pid != pid {
		t.Errorf("after restart: %v pid %d, want RUNNING with pid %d", st.State, e.info(t, long).Pid, pid)
	}
	if out := e.mustExec(t, long, "echo", "alive"); out != "alive\n" {
		t.Errorf("exec after restart: %q", out)
	}
	st = e.waitExit(t, short, 30*time.Second)
	if st.ExitCode != 7 || st.Reason != "Error" {
		t.Errorf("exit after restart: %d %q, want 7 Error", st.ExitCode, st.Reason)
	}
	if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if left := append(e.d.Leftovers(), e.containerLeftovers()...); len(left) > 0 {
		t.Errorf("left after removing the pod: %v", left)
	}
}
