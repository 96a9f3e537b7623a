// Package test holds pinrt's end-to-end tests: they build the real binary,
// start the daemon as root on a private root, run dir and socket, and drive
// it over gRPC with real runc, conmon, CNI and kernel namespaces.
//
// The harness in this file is shared by every e2e test.
package test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var (
	buildOnce sync.Once
	binPath   string
	errBuild  error
)

// Main runs the e2e tests and then removes the binary Binary built. Every
// e2e test package's TestMain calls it.
func Main(m *testing.M) int {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	return code
}

// RequireRoot skips a test that needs root, saying why.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("e2e tests start the daemon, create namespaces and mounts: they need root")
	}
}

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// Binary builds bin/pinrt once per test process and returns its path. It
// is built static, so the pause process can run from a rootfs holding only
// this one file. pinrt-exec, the streaming exec helper, and
// pinrt-sigpolicy, the signature policy helper (a module of its own,
// cmd/pinrt-sigpolicy), are built beside it, where the daemon looks for
// them. PINRT_E2E_BINARY names a prebuilt binary instead, for a
// test binary run where there is no Go toolchain (test/vm); a helper is
// then expected beside it.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("PINRT_E2E_BINARY"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pinrt-bin-")
		if err != nil {
			errBuild = err
			return
		}
		binPath = filepath.Join(dir, "pinrt")
		// The helper's library takes its OpenPGP from Go with this tag,
		// not from gpgme.
		for _, b := range []struct{ out, dir, tags string }{
			{binPath, "cmd/pinrt", ""},
			{filepath.Join(dir, "pinrt-exec"), "cmd/pinrt-exec", ""},
			{filepath.Join(dir, "pinrt-sigpolicy"), "cmd/pinrt-sigpolicy", "containers_image_openpgp"},
		} {
			cmd := exec.Command("go", "build", "-tags", b.tags, "-o", b.out, ".")
			cmd.Dir = filepath.Join(RepoRoot(), b.dir)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				errBuild = fmt.Errorf("go build %s: %w\n%s", b.dir, err, out)
				return
			}
		}
	})
	if errBuild != nil {
		t.Fatal(errBuild)
	}
	return binPath
}

// Options shape a daemon.
type Options struct {
	// Config is TOML written to the config file before the start.
	Config string
	// Network writes a test bridge conflist into the CNI conf dir. Without
	// it the conf dir stays empty (and default_network is off).
	Network bool
	// HostPorts adds the portmap plugin to Network's conflist, so a pod's
	// host ports answer on 127.0.0.1 (critest checks that). The plugin
	// adds iptables rules for each such pod and removes them on CNI DEL;
	// its top-level CNI-HOSTPORT-* chains stay, shared with any other
	// user of portmap on the host.
	HostPorts bool
	// Args are extra command-line flags.
	Args []string
	// Env is added to the daemon's environment.
	Env []string
	// ConfigLogLevel leaves the log level to the config file instead of
	// forcing debug with --log-level.
	ConfigLogLevel bool
	// RunRootLen and RootLen, when set, make the run directory and the
	// root paths of exactly that many bytes under Dir; the CRI socket then
	// goes in Dir, so a runroot of any length can be tested.
	RunRootLen, RootLen int
	// Binary, when set, is the pinrt this daemon runs instead of the one
	// Binary builds (an older build, for an upgrade test).
	Binary string
}

// Daemon is one pinrt process under test.
type Daemon struct {
	t    testing.TB
	opts Options

	Dir        string // private base directory, removed on cleanup
	Root       string
	RunRoot    string
	Socket     string
	ConfigFile string
	ConfigDir  string
	CNIConfDir string
	IPAMDir    string // host-local dataDir of the test network
	Bridge     string // test bridge name, "" without Network
	Subnet     string
	LogPath    string
	// CDIDir is the daemon's only CDI spec dir; NRIDir holds its NRI
	// socket (NRISocket) and empty plugin directories, so no test reads
	// the host's /etc/cdi or /var/run/nri.
	CDIDir    string
	NRIDir    string
	NRISocket string

	cmd     *exec.Cmd
	waitErr chan error
	conn    *grpc.ClientConn

	Runtime runtimeapi.RuntimeServiceClient
	Image   runtimeapi.ImageServiceClient
}

// NewDaemon prepares a daemon's directories and config without starting it.
func NewDaemon(t testing.TB, opts Options) *Daemon {
	t.Helper()
	RequireRoot(t)
	bin := Binary(t)
	_ = bin
	// A short base keeps the socket path under the 107-byte limit.
	dir, err := os.MkdirTemp("/tmp", "pe2e-")
	if err != nil {
		t.Fatal(err)
	}
	// MkdirTemp makes the base 0700; a userns container's mapped root must
	// traverse it to reach its rootfs and the pod files, as under /var/lib.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{
		t: t, opts: opts, Dir: dir,
		Root:       filepath.Join(dir, "root"),
		RunRoot:    filepath.Join(dir, "run"),
		ConfigFile: filepath.Join(dir, "pinrt.toml"),
		ConfigDir:  filepath.Join(dir, "pinrt.d"),
		CNIConfDir: filepath.Join(dir, "net.d"),
		IPAMDir:    filepath.Join(dir, "ipam"),
		LogPath:    filepath.Join(dir, "pinrt.log"),
		CDIDir:     filepath.Join(dir, "cdi"),
		NRIDir:     filepath.Join(dir, "nri"),
	}
	d.NRISocket = filepath.Join(d.NRIDir, "nri.sock")
	d.Socket = filepath.Join(d.RunRoot, "pinrt.sock")
	if opts.RunRootLen > 0 {
		d.RunRoot = padPath(t, filepath.Join(dir, "r"), opts.RunRootLen)
		d.Socket = filepath.Join(dir, "pinrt.sock")
	}
	if opts.RootLen > 0 {
		d.Root = padPath(t, filepath.Join(dir, "s"), opts.RootLen)
	}
	t.Cleanup(d.cleanup)
	for _, p := range []string{d.ConfigDir, d.CNIConfDir, d.CDIDir, d.NRIDir} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The harness's own setting goes in a drop-in, so a test's config may
	// start with top-level keys.
	harness := "[cni]\ndefault_network = false\n" +
		fmt.Sprintf("[cdi]\nspec_dirs = [%q]\n", d.CDIDir) +
		fmt.Sprintf("[nri]\nsocket_path = %q\nplugin_path = %q\nplugin_config_path = %q\n",
			d.NRISocket, filepath.Join(d.NRIDir, "plugins"), filepath.Join(d.NRIDir, "conf.d"))
	// PINRT_E2E_CGROUP_DRIVER runs every test under another cgroup driver
	// (test/vm runs them with both on cgroup v2).
	if drv := CgroupDriver(); drv != "cgroupfs" {
		harness += fmt.Sprintf("[runtime]\ncgroup_driver = %q\n", drv)
	}
	if err := os.WriteFile(filepath.Join(d.ConfigDir, "00-harness.toml"), []byte(harness), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(d.ConfigFile, []byte(opts.Config), 0o644); err != nil {
		t.Fatal(err)
	}
	if opts.Network {
		d.writeNetwork()
	}
	return d
}

// padPath extends base to a path of exactly n bytes, in components of at
// most 100 bytes.
func padPath(t testing.TB, base string, n int) string {
	t.Helper()
	p := base
	for len(p) < n {
		if n-len(p) == 1 {
			p += "p" // no room for a separator and a name
			break
		}
		p = filepath.Join(p, strings.Repeat("p", min(n-len(p)-1, 100)))
	}
	if len(p) != n {
		t.Fatalf("cannot make %q a path of %d bytes", base, n)
	}
	return p
}

// CgroupDriver is the cgroup driver the tests run the daemon with:
// $PINRT_E2E_CGROUP_DRIVER, cgroupfs by default.
func CgroupDriver() string {
	if d := os.Getenv("PINRT_E2E_CGROUP_DRIVER"); d != "" {
		return d
	}
	return "cgroupfs"
}

// StartDaemon prepares and starts a daemon, and connects the CRI clients.
func StartDaemon(t testing.TB, opts Options) *Daemon {
	t.Helper()
	d := NewDaemon(t, opts)
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	return d
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeNetwork writes a bridge network private to this test: its own
// bridge name, subnet and IPAM store, no masquerading and, unless
// HostPorts asks for them, no port maps, so the host firewall is never
// touched.
func (d *Daemon) writeNetwork() {
	d.Bridge = "pt" + randHex(4)
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	d.Subnet = fmt.Sprintf("10.%d.%d.0/24", 200+int(b[0])%50, int(b[0]))
	portmap := ""
	if d.opts.HostPorts {
		portmap = `, {"type": "portmap", "capabilities": {"portMappings": true}}`
	}
	conf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "pinrt-e2e",
  "plugins": [{
    "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]]}
  }%s]
}`, d.Bridge, d.IPAMDir, d.Subnet, portmap)
	if err := os.WriteFile(filepath.Join(d.CNIConfDir, "10-e2e.conflist"), []byte(conf), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// Args are the daemon's command-line flags.
func (d *Daemon) Args() []string {
	args := []string{
		"--config", d.ConfigFile, "--config-dir", d.ConfigDir,
		"--root", d.Root, "--runroot", d.RunRoot, "--listen", d.Socket,
		"--cni-config-dir", d.CNIConfDir, "--cni-plugin-dir", "/opt/cni/bin",
	}
	if !d.opts.ConfigLogLevel {
		args = append(args, "--log-level", "debug")
	}
	return append(args, d.opts.Args...)
}

// Start runs the daemon and waits until it answers Version.
func (d *Daemon) Start() error {
	d.t.Helper()
	if err := d.spawn(); err != nil {
		return err
	}
	return d.connect()
}

// KillDuringStart runs the daemon and SIGKILLs it after delay, whatever
// it is doing by then: most often restoring what the last run left.
func (d *Daemon) KillDuringStart(delay time.Duration) error {
	d.t.Helper()
	if err := d.spawn(); err != nil {
		return err
	}
	select {
	case err := <-d.waitErr:
		d.waitErr <- err // for Kill's Wait
	case <-time.After(delay):
	}
	d.Kill()
	return nil
}

// spawn starts the daemon's process.
func (d *Daemon) spawn() error {
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== start %s\n", time.Now().Format(time.RFC3339Nano))
	bin := d.opts.Binary
	if bin == "" {
		bin = Binary(d.t)
	}
	cmd := exec.Command(bin, d.Args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), d.opts.Env...)
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd = cmd
	d.waitErr = make(chan error, 1)
	go func() { d.waitErr <- cmd.Wait() }()
	return nil
}

// startTimeout bounds a daemon's start. On the host pinrt answers within
// a second; in the VM under TCG, with a second guest sharing the host's
// two cores, a restart with two pods took 31 s.
const startTimeout = 2 * time.Minute

func (d *Daemon) connect() error {
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case err := <-d.waitErr:
			d.waitErr <- err
			return fmt.Errorf("pinrt exited during start (%w):\n%s", err, d.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := d.dial(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pinrt did not answer within %s:\n%s", startTimeout, d.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dial connects the CRI clients once Version answers on the socket.
func (d *Daemon) dial(ctx context.Context) error {
	if _, err := os.Stat(d.Socket); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	if _, err := rt.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
		conn.Close()
		return err
	}
	d.conn, d.Runtime, d.Image = conn, rt, runtimeapi.NewImageServiceClient(conn)
	return nil
}

// Pid is the daemon's process ID.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Signal sends sig to the daemon.
func (d *Daemon) Signal(sig syscall.Signal) error { return d.cmd.Process.Signal(sig) }

// Wait waits for the daemon to exit, at most timeout.
func (d *Daemon) Wait(timeout time.Duration) (*os.ProcessState, error) {
	select {
	case err := <-d.waitErr:
		d.waitErr <- err
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			return nil, err
		}
		return d.cmd.ProcessState, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("pinrt still running after %v", timeout)
	}
}

// Running reports whether the daemon process has not exited.
func (d *Daemon) Running() bool {
	if d.cmd == nil {
		return false
	}
	select {
	case err := <-d.waitErr:
		d.waitErr <- err
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits for a clean exit.
func (d *Daemon) Stop() error {
	if !d.Running() {
		return nil
	}
	d.closeConn()
	if err := d.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	st, err := d.Wait(30 * time.Second)
	if err != nil {
		_ = d.Signal(syscall.SIGKILL)
		_, _ = d.Wait(10 * time.Second)
		return err
	}
	if st.ExitCode() != 0 {
		return fmt.Errorf("pinrt exited with %d", st.ExitCode())
	}
	return nil
}

// Kill stops the daemon with SIGKILL, as a crash would.
func (d *Daemon) Kill() {
	d.closeConn()
	if d.Running() {
		_ = d.Signal(syscall.SIGKILL)
		_, _ = d.Wait(10 * time.Second)
	}
}

// Restart kills the daemon with SIGKILL and starts it again.
func (d *Daemon) Restart() error {
	d.Kill()
	return d.Start()
}

func (d *Daemon) closeConn() {
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
}

// Log is the daemon's output so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.LogPath)
	return string(b)
}

// Ctx is a bounded context for one call.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// cleanup removes every pod the test left, stops the daemon, and fails the
// test if anything the daemon created is still mounted. It then removes
// whatever is left, so a failing test still leaves the host clean.
func (d *Daemon) cleanup() {
	t := d.t
	if d.conn != nil && d.Running() {
		d.removeAllPods()
	}
	if err := d.Stop(); err != nil {
		t.Errorf("stopping pinrt: %v", err)
	}
	if t.Failed() {
		t.Logf("pinrt log (%s):\n%s", d.LogPath, d.Log())
	}
	if left := MountsUnder(d.Dir); len(left) > 0 {
		t.Errorf("mounts left under %s after the daemon stopped:\n%s", d.Dir, strings.Join(left, "\n"))
	}
	ForceCleanup(d.Dir)
	if d.Bridge != "" {
		_ = exec.Command("ip", "link", "del", d.Bridge).Run()
	}
}

// removeAllPods stops and removes every pod, each with its own minute:
// under qemu TCG (test/vm) one CNI DEL alone takes over ten seconds, and a
// shared budget ran out halfway through a test's pods.
func (d *Daemon) removeAllPods() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	pods, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	cancel()
	if err != nil {
		return // Unimplemented before the sandbox issue.
	}
	for _, p := range pods.Items {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, err := d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			d.t.Errorf("cleanup: stop pod %s: %v", p.Id, err)
		}
		if _, err := d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			d.t.Errorf("cleanup: remove pod %s: %v", p.Id, err)
		}
		cancel()
	}
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ForceCleanup lazily unmounts everything under dir and removes it.
func ForceCleanup(dir string) {
	for _, mp := range MountsUnder(dir) {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
	_ = os.RemoveAll(dir)
}
