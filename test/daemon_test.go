package test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestVersionAndStatus(t *testing.T) {
	d := StartDaemon(t, Options{})
	ctx := Ctx(t)
	v, err := d.Runtime.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if v.RuntimeName != "pinrt" || v.RuntimeApiVersion != "v1" || v.RuntimeVersion == "" {
		t.Errorf("Version = %+v, want name pinrt, API v1 and a version", v)
	}
	// kubelet shows a node's runtime as "pinrt://Unknown" unless its
	// ParseSemantic takes the version (pkg/kubelet/kuberuntime).
	if _, err := utilversion.ParseSemantic(v.RuntimeVersion); err != nil {
		t.Errorf("RuntimeVersion %q is not semver: %v", v.RuntimeVersion, err)
	}
	st, err := d.Runtime.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conds := map[string]*runtimeapi.RuntimeCondition{}
	for _, c := range st.Status.Conditions {
		conds[c.Type] = c
	}
	if c := conds[runtimeapi.RuntimeReady]; c == nil || !c.Status {
		t.Errorf("RuntimeReady = %+v, want true (runc and conmon are installed by make deps)", c)
	}
	// The conf dir is empty and default_network is off: the network is
	// not ready, and the reason says so.
	if c := conds[runtimeapi.NetworkReady]; c == nil || c.Status || c.Reason == "" || c.Message == "" {
		t.Errorf("NetworkReady = %+v, want false with a reason and message", c)
	}
	rc, err := d.Runtime.RuntimeConfig(ctx, &runtimeapi.RuntimeConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rc.GetLinux().GetCgroupDriver().String(), strings.ToUpper(CgroupDriver()); got != want {
		t.Errorf("cgroup driver = %v, want %s", got, want)
	}
}

func TestSocketMode(t *testing.T) {
	d := StartDaemon(t, Options{})
	fi, err := os.Stat(d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode = %v, want a socket with 0660", fi.Mode())
	}
}

// The socket a SIGKILLed daemon left is replaced; a file that is no
// socket (a mistyped listen path) is refused and kept.
func TestStaleSocketReplaced(t *testing.T) {
	d := NewDaemon(t, Options{})
	if err := os.MkdirAll(d.RunRoot, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.Socket, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("start with a regular file at the socket path: %v, want a refusal", err)
	}
	if b, err := os.ReadFile(d.Socket); err != nil || string(b) != "kept" {
		t.Fatalf("the file at the socket path after the refusal: %q, %v", b, err)
	}
	if err := os.Remove(d.Socket); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: d.Socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if err := d.Start(); err != nil {
		t.Fatalf("a stale socket file must be replaced: %v", err)
	}
}

func TestSecondDaemonRefused(t *testing.T) {
	d := StartDaemon(t, Options{})
	// Same run dir, another socket path: the lock must refuse it before it
	// touches anything.
	args := d.Args()
	for i, a := range args {
		if a == "--listen" {
			args[i+1] = filepath.Join(d.Dir, "second.sock")
		}
	}
	cmd := exec.Command(Binary(t), args...)
	out, err := runWithTimeout(cmd, 20*time.Second)
	if err == nil {
		t.Fatalf("second pinrt started on the same run dir:\n%s", out)
	}
	if !strings.Contains(out, "already running on run dir "+d.RunRoot) {
		t.Errorf("second pinrt's message = %q, want it to say another pinrt is running on %s", out, d.RunRoot)
	}
	if _, err := d.Runtime.Version(Ctx(t), &runtimeapi.VersionRequest{}); err != nil {
		t.Errorf("first pinrt stopped answering: %v", err)
	}
}

func TestSIGTERMRemovesSocket(t *testing.T) {
	d := StartDaemon(t, Options{})
	if err := d.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, err := d.Wait(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitCode() != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", st.ExitCode())
	}
	if _, err := os.Stat(d.Socket); !os.IsNotExist(err) {
		t.Errorf("socket still present after SIGTERM: %v", err)
	}
}

func TestBadConfigStopsStart(t *testing.T) {
	d := NewDaemon(t, Options{Config: "[runtime]\ncgroup_drivr = \"cgroupfs\"\n"})
	cmd := exec.Command(Binary(t), d.Args()...)
	out, err := runWithTimeout(cmd, 20*time.Second)
	if err == nil {
		t.Fatalf("pinrt started with a bad config:\n%s", out)
	}
	for _, want := range []string{d.ConfigFile, "runtime.cgroup_drivr"} {
		if !strings.Contains(out, want) {
			t.Errorf("message %q does not name %q", out, want)
		}
	}
	if _, err := os.Stat(d.Socket); !os.IsNotExist(err) {
		t.Errorf("a socket exists after a failed start: %v", err)
	}
}

// TestUnimplementedHasMessage: the pod checkpoint and restore RPCs
// (CRI v0.37) answer Unimplemented saying what is missing.
func TestUnimplementedHasMessage(t *testing.T) {
	d := StartDaemon(t, Options{})
	for _, tc := range []struct {
		name, want string
		call       func() error
	}{
		{"CheckpointPod", "pinrt checkpoints containers", func() error {
			_, err := d.Runtime.CheckpointPod(Ctx(t), &runtimeapi.CheckpointPodRequest{PodSandboxId: "x", OutputPath: "/tmp/ckpt", ContainerIds: []string{"c"}})
			return err
		}},
		{"RestorePod", "pinrt has no checkpoint restore", func() error {
			_, err := d.Runtime.RestorePod(Ctx(t), &runtimeapi.RestorePodRequest{CheckpointPath: "/tmp/ckpt", Config: PodConfig("restored")})
			return err
		}},
	} {
		if err := tc.call(); status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s = %v, want Unimplemented saying %q", tc.name, err, tc.want)
		}
	}
}

// TestSIGHUPReloadsLogLevel raises the level in the config file and sends
// SIGHUP: a NotFound answer, logged only at debug, then shows in the log.
func TestSIGHUPReloadsLogLevel(t *testing.T) {
	d := StartDaemon(t, Options{Config: "log_level = \"info\"\n", ConfigLogLevel: true})
	probe := func(id string) {
		_, err := d.Runtime.PodSandboxStatus(Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("status of an unknown pod = %v, want NotFound", err)
		}
	}
	probe("before-hup")
	if strings.Contains(d.Log(), "before-hup") {
		t.Fatalf("debug line logged at level info:\n%s", d.Log())
	}
	// log_level is a top-level key: it goes before any table.
	cfg := "log_level = \"debug\"\n"
	if err := os.WriteFile(d.ConfigFile, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.Log(), "log level is now debug") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload after SIGHUP:\n%s", d.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	probe("after-hup")
	if !strings.Contains(d.Log(), "after-hup") {
		t.Errorf("NotFound not logged at debug after SIGHUP:\n%s", d.Log())
	}
}

func runWithTimeout(cmd *exec.Cmd, timeout time.Duration) (string, error) {
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return b.String(), err
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return b.String(), nil
	}
}
