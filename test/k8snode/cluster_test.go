package k8snode

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/contrib"
)

const nodeName = "k8snode"

// node is a single-node Kubernetes cluster: etcd, kube-apiserver and
// kube-controller-manager as the test's children, pinrt and kubelet as
// systemd units where systemd is PID 1 (plain children elsewhere).
type node struct {
	t       *testing.T
	dir     string // everything the node writes, removed at the end
	k8s     string // the multicall binary: kubelet, kube-apiserver, ...
	pinrt   string
	driver  string
	systemd bool
	ip      string
	dummy   string // the dummy link made for ip, if any

	pinrtRoot, pinrtRun, pinrtSock string
	kubeletRoot, cniDataDir        string
	podLogDir                      string

	procs    []*proc
	pinrtSvc service
	// kubeletConfig is kubelet's configuration file.
	kubeletConfig string
	// forwarded are the ports forwardPort has forwarded.
	forwarded    map[int]bool
	kubeletSvc   service
	cfg          *rest.Config
	token        string // a system:masters bearer token
	cs           *kubernetes.Clientset
	images       images
	apiPort      int
	kubeletPort  int
	registryConf string
	opts         nodeOpts
}

// nodeOpts are what a suite wants of the node beyond TestNode's needs.
type nodeOpts struct {
	// conformance: a scheduler and every default controller (namespace
	// deletion, garbage collection, service account tokens, ...), which
	// Kubernetes' e2e framework relies on; TestNode creates pods bound to
	// the node and needs neither, which spares a slow VM two processes.
	conformance bool
	// pinrtConf is TOML for pinrt beyond the node's own, written as a
	// drop-in of its config directory.
	pinrtConf string
}

func env(t *testing.T, k string) string {
	v := os.Getenv(k)
	if v == "" {
		t.Fatalf("%s is not set (test/vm/suites/k8s.sh sets it)", k)
	}
	return v
}

// startNode brings the node up: the control plane, pinrt, kubelet, and
// waits until the node is Ready. Everything stops on t.Cleanup.
func startNode(t *testing.T, imgs images) *node {
	return startNodeOpts(t, imgs, nodeOpts{})
}

func startNodeOpts(t *testing.T, imgs images, opts nodeOpts) *node {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	n := &node{
		t:       t,
		k8s:     env(t, "PINRT_K8S_BINARY"),
		pinrt:   env(t, "PINRT_K8S_PINRT"),
		driver:  env(t, "PINRT_K8S_CGROUP_DRIVER"),
		images:  imgs,
		systemd: isDir("/run/systemd/system"),
		opts:    opts,
	}
	if n.driver == "systemd" && !n.systemd {
		t.Fatal("cgroup driver systemd needs systemd as PID 1")
	}
	dir, err := os.MkdirTemp("/var/tmp", "k8snode-")
	if err != nil {
		t.Fatal(err)
	}
	n.dir = dir
	// MkdirTemp makes it 0700; a user namespace's root must traverse it
	// to reach the rootfs and volumes, as under /var/lib.
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the directory goes after every
	// process that uses it has stopped.
	t.Cleanup(func() {
		if os.Getenv("PINRT_K8S_KEEP") == "" {
			_ = os.RemoveAll(dir)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			n.dumpLogs()
		}
	})
	n.pinrtRoot = filepath.Join(dir, "pinrt")
	// The runroot holds the pins; kubelet's socket path must stay short.
	n.pinrtRun = filepath.Join("/run", filepath.Base(dir))
	n.pinrtSock = filepath.Join(n.pinrtRun, "pinrt.sock")
	n.kubeletRoot = filepath.Join(dir, "kubelet")
	n.cniDataDir = filepath.Join(dir, "cni-ipam")
	n.podLogDir = filepath.Join(dir, "pod-logs")
	t.Cleanup(func() { _ = os.RemoveAll(n.pinrtRun) })

	n.ip = n.nodeIP()
	n.certs()
	n.registryConf = imgs.start(t)

	start := time.Now()
	n.startControlPlane()
	t.Logf("control plane up in %s", time.Since(start).Round(100*time.Millisecond))
	n.startPinrt()
	// After kubelet has stopped: what a test that failed halfway left.
	t.Cleanup(func() { removeKubepods(n.systemd) })
	t.Cleanup(n.removeSandboxes)
	n.startKubelet()
	n.waitNodeReady(3 * time.Minute)
	t.Logf("node %s Ready %s after start (cgroup driver %s, node IP %s)", nodeName, time.Since(start).Round(100*time.Millisecond), n.driver, n.ip)
	return n
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// nodeIP is the address kubelet reports for the node. kubelet refuses a
// loopback one, and the VM has only lo, so the test then makes a dummy
// link with a private address for the node.
func (n *node) nodeIP() string {
	out, _ := exec.Command("ip", "-4", "-o", "route", "get", "1.1.1.1").CombinedOutput()
	if f := strings.Fields(string(out)); len(f) > 0 {
		for i, w := range f {
			if w == "src" && i+1 < len(f) {
				return f[i+1]
			}
		}
	}
	n.dummy = "k8snode0"
	for _, args := range [][]string{
		{"link", "add", n.dummy, "type", "dummy"},
		{"addr", "add", "10.255.0.1/24", "dev", n.dummy},
		{"link", "set", n.dummy, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			n.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	n.t.Cleanup(func() { _ = exec.Command("ip", "link", "del", n.dummy).Run() })
	return "10.255.0.1"
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// kubeletDefaultPort is kubelet's port of every real node. The e2e specs
// reach kubelet through the API server's node proxy and from pods at
// this port, whatever the node's status says.
const kubeletDefaultPort = 10250

// kubeletListenPort is kubeletDefaultPort when it is free on the node's
// address, else (another kubelet on this host) any free port, which the
// conformance specs cannot work with.
func (n *node) kubeletListenPort() int {
	l, err := net.Listen("tcp", net.JoinHostPort(n.ip, strconv.Itoa(kubeletDefaultPort)))
	if err == nil {
		_ = l.Close()
		return kubeletDefaultPort
	}
	if n.opts.conformance {
		n.t.Fatalf("kubelet's port %d is taken on %s (%v): the e2e specs reach kubelet there", kubeletDefaultPort, n.ip, err)
	}
	n.t.Logf("kubelet's port %d is taken on %s (%v): kubelet listens on another", kubeletDefaultPort, n.ip, err)
	return freePort(n.t)
}

func (n *node) path(name string) string { return filepath.Join(n.dir, name) }

func (n *node) write(name, content string) string {
	p := n.path(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		n.t.Fatal(err)
	}
	return p
}

// certs makes the cluster's CA and every certificate and key the
// components use, ECDSA P-256 (RSA key generation is slow under TCG).
func (n *node) certs() {
	t := n.t
	caKey, caDER := newCert(t, nil, nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "k8snode-ca"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	n.writeCert("ca", caKey, caDER)
	serving := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(n.ip), net.ParseIP("10.96.0.1")},
	}
	k, der := newCert(t, caCert, caKey, serving)
	n.writeCert("apiserver", k, der)
	for _, c := range []struct{ name, cn, org string }{
		{"admin", "k8snode-admin", "system:masters"},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", "system:masters"},
		{"scheduler", "system:kube-scheduler", "system:masters"},
		{"kubelet", "system:node:" + nodeName, "system:nodes"},
	} {
		k, der := newCert(t, caCert, caKey, &x509.Certificate{
			Subject:     pkix.Name{CommonName: c.cn, Organization: []string{c.org}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			KeyUsage:    x509.KeyUsageDigitalSignature,
		})
		n.writeCert(c.name, k, der)
	}
	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	n.write("pki/sa.key", pemKey(t, sa))
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	n.write("pki/sa.pub", string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})))
	// Kubernetes' node e2e suite reaches the API server with a bearer
	// token (--bearer-token), not a kubeconfig.
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		t.Fatal(err)
	}
	n.token = hex.EncodeToString(tok)
	n.write("pki/tokens.csv", n.token+",k8snode-e2e-node,k8snode-e2e-node,system:masters\n")
}

var serial int64

func newCert(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, tmpl *x509.Certificate) (*ecdsa.PrivateKey, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func pemKey(t *testing.T, k *ecdsa.PrivateKey) string {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
}

func (n *node) writeCert(name string, key *ecdsa.PrivateKey, der []byte) {
	n.write("pki/"+name+".key", pemKey(n.t, key))
	n.write("pki/"+name+".crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
}

// kubeconfig writes a kubeconfig for the client certificate name.
func (n *node) kubeconfig(name string) string {
	return n.write(name+".kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8snode
  cluster:
    server: https://127.0.0.1:%d
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: k8snode
  context: {cluster: k8snode, user: %s}
current-context: k8snode
`, n.apiPort, n.path("pki/ca.crt"), name, n.path("pki/"+name+".crt"), n.path("pki/"+name+".key"), name))
}

// proc is a control-plane process, a child of the test.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func (n *node) startProc(name string, args ...string) *proc {
	p := &proc{name: name, log: n.path("logs/" + name + ".log"), done: make(chan struct{})}
	if err := os.MkdirAll(filepath.Dir(p.log), 0o755); err != nil {
		n.t.Fatal(err)
	}
	f, err := os.Create(p.log)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(n.k8s, append([]string{name}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		n.t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	n.procs = append(n.procs, p)
	n.t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// exited fails the test if a control-plane process is gone.
func (n *node) checkProcs(t testing.TB) {
	for _, p := range n.procs {
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, tail(readFile(p.log), 60))
		default:
		}
	}
}

func readFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(b)
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func (n *node) startControlPlane() {
	t := n.t
	etcdPort, peerPort := freePort(t), freePort(t)
	n.apiPort = freePort(t)
	n.startProc("etcd", "--data-dir="+n.path("etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", etcdPort),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peerPort))
	pki := func(f string) string { return n.path("pki/" + f) }
	n.startProc("kube-apiserver",
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdPort),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", n.apiPort),
		"--advertise-address="+n.ip,
		"--tls-cert-file="+pki("apiserver.crt"), "--tls-private-key-file="+pki("apiserver.key"),
		"--client-ca-file="+pki("ca.crt"), "--token-auth-file="+pki("tokens.csv"),
		"--kubelet-client-certificate="+pki("apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+pki("apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+pki("sa.pub"),
		"--service-account-signing-key-file="+pki("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		// As clusters made by kubeadm: the e2e specs run privileged pods.
		"--allow-privileged=true",
		"--enable-admission-plugins=NodeRestriction",
		// Less work for two emulated CPUs; nothing here is about them.
		"--enable-priority-and-fairness=false", "--profiling=false",
		"--endpoint-reconciler-type=none",
	)
	cfg := &rest.Config{
		Host: fmt.Sprintf("https://127.0.0.1:%d", n.apiPort),
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: pki("ca.crt"), CertFile: pki("admin.crt"), KeyFile: pki("admin.key"),
		},
		QPS: 50, Burst: 100,
	}
	n.cfg = cfg
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.cs = cs
	n.poll(n.t, "kube-apiserver /readyz", 4*time.Minute, func() (bool, error) {
		n.checkProcs(n.t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return false, fmt.Errorf("%w: %s", err, body)
		}
		return true, nil
	})
	controllers := "deployment-controller,replicaset-controller,serviceaccount-controller,root-ca-certificate-publisher-controller"
	if n.opts.conformance {
		controllers = "*"
		n.startProc("kube-scheduler",
			"--kubeconfig="+n.kubeconfig("scheduler"),
			"--leader-elect=false", "--secure-port=0", "--profiling=false",
		)
	}
	n.startProc("kube-controller-manager",
		"--kubeconfig="+n.kubeconfig("controller-manager"),
		"--controllers="+controllers,
		"--root-ca-file="+pki("ca.crt"),
		"--service-account-private-key-file="+pki("sa.key"),
		"--leader-elect=false", "--secure-port=0", "--profiling=false",
	)
}

// service is a node daemon (pinrt, kubelet): a systemd unit, or a child
// of the test where systemd is not PID 1 (a host smoke run).
type service interface {
	start()
	restart()
	kill() // SIGKILL the main process; systemd restarts it (Restart=always)
	stop()
	logs() string
	mainPID() int
}

type unitService struct {
	t    *testing.T
	name string
}

// newUnit installs unit (its file content) as name with a drop-in that
// replaces ExecStart only.
func newUnit(t *testing.T, name, unit, execStart string) *unitService {
	file := filepath.Join("/run/systemd/system", name)
	dropIn := file + ".d"
	if err := os.WriteFile(file, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dropIn, 0o755); err != nil {
		t.Fatal(err)
	}
	override := "[Service]\nExecStart=\nExecStart=" + execStart + "\n"
	if err := os.WriteFile(filepath.Join(dropIn, "k8snode.conf"), []byte(override), 0o644); err != nil {
		t.Fatal(err)
	}
	u := &unitService{t: t, name: name}
	u.systemctl("daemon-reload")
	t.Cleanup(func() {
		_ = exec.Command("systemctl", "stop", name).Run()
		_ = os.RemoveAll(dropIn)
		_ = os.Remove(file)
		_ = exec.Command("systemctl", "daemon-reload").Run()
		_ = exec.Command("systemctl", "reset-failed", name).Run()
	})
	return u
}

func (u *unitService) systemctl(args ...string) string {
	u.t.Helper()
	out, err := exec.Command("systemctl", args...).CombinedOutput()
	if err != nil {
		u.t.Fatalf("systemctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func (u *unitService) start()   { u.systemctl("start", u.name) }
func (u *unitService) restart() { u.systemctl("restart", u.name) }
func (u *unitService) stop()    { u.systemctl("stop", u.name) }

func (u *unitService) mainPID() int {
	pid, _ := strconv.Atoi(u.systemctl("show", "-P", "MainPID", u.name))
	return pid
}

func (u *unitService) kill() {
	before := u.systemctl("show", "-P", "NRestarts", u.name)
	u.systemctl("kill", "--signal=SIGKILL", "--kill-whom=main", u.name)
	deadline := time.Now().Add(scaled(time.Minute))
	for {
		now := u.systemctl("show", "-P", "NRestarts", u.name)
		state := u.systemctl("show", "-P", "ActiveState", u.name)
		if now != before && state == "active" {
			return
		}
		if time.Now().After(deadline) {
			u.t.Fatalf("%s not restarted by systemd a minute after SIGKILL (NRestarts %s, %s)", u.name, now, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (u *unitService) logs() string {
	out, _ := exec.Command("journalctl", "-u", u.name, "--no-pager", "-o", "short-precise", "-n", "300").CombinedOutput()
	return string(out)
}

// procService runs a daemon as a child of the test (no systemd).
type procService struct {
	t    *testing.T
	name string
	argv []string
	log  string
	// respawn starts the process again a second after it exited on its
	// own, as Restart=always does under systemd (pinrt's unit has it);
	// pidFile, when set, then names its current pid.
	respawn bool
	pidFile string
	// oomScoreAdj is the unit's OOMScoreAdjust, given to each process;
	// oomRefused says the kernel refused it once (logged once).
	oomScoreAdj string
	oomRefused  bool
	// giveUp reports a service given up on; nil: the test's Errorf.
	giveUp func(format string, args ...any)

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	done     chan struct{} // closed when the supervisor gives up
}

// spawn starts the process; the caller holds mu or is the only user.
func (p *procService) spawn() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own session: a SIGKILL of pinrt must not reach conmon, as
	// KillMode=process has it under systemd.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd = cmd
	if p.oomScoreAdj != "" {
		// As systemd sets it; the kernel refuses a lower one without
		// CAP_SYS_RESOURCE, and the process then keeps its own.
		f := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "oom_score_adj")
		if err := os.WriteFile(f, []byte(p.oomScoreAdj), 0o644); err != nil && !p.oomRefused {
			p.oomRefused = true
			p.t.Logf("%s: OOMScoreAdjust=%s: %v", p.name, p.oomScoreAdj, err)
		}
	}
	if p.pidFile != "" {
		// No newline: the e2e specs read it with strconv.Atoi.
		return os.WriteFile(p.pidFile, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	}
	return nil
}

// unitSetting is the value of a unit file's Key= line, or "".
func unitSetting(unit, key string) string {
	for _, l := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func (p *procService) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = false
	if err := p.spawn(); err != nil {
		p.t.Fatal(err)
	}
	done := make(chan struct{})
	p.done = done
	go p.supervise(p.cmd, done)
}

func (p *procService) errorf(format string, args ...any) {
	if p.giveUp != nil {
		p.giveUp(format, args...)
		return
	}
	p.t.Errorf(format, args...)
}

// systemd's defaults (DefaultStartLimitIntervalSec, DefaultStartLimitBurst).
const (
	startLimitInterval = 10 * time.Second
	startLimitBurst    = 5
)

// supervise waits for cmd and, with respawn, for each process that
// follows it, until stop or a failed start.
func (p *procService) supervise(cmd *exec.Cmd, done chan struct{}) {
	defer close(done)
	starts := []time.Time{time.Now()}
	for {
		werr := cmd.Wait()
		p.mu.Lock()
		again := p.respawn && !p.stopping
		p.mu.Unlock()
		if !again {
			return
		}
		// systemd's default start limit: a service that keeps failing
		// is given up on, with its cause, not restarted until the test
		// ends while the specs fail on what it did not do.
		starts = slices.DeleteFunc(starts, func(s time.Time) bool { return time.Since(s) > startLimitInterval })
		if len(starts) >= startLimitBurst {
			p.errorf("%s exited (%v): started %d times within %s, not again (systemd's start limit); its log:\n%s",
				p.name, werr, len(starts), startLimitInterval, p.logs())
			return
		}
		time.Sleep(time.Second)
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return
		}
		err := p.spawn()
		cmd = p.cmd
		p.mu.Unlock()
		starts = append(starts, time.Now())
		if err != nil {
			p.t.Logf("%s: respawn: %v", p.name, err)
			return
		}
		p.t.Logf("%s exited (%v); started again as pid %d", p.name, werr, cmd.Process.Pid)
	}
}

func (p *procService) stop() {
	p.mu.Lock()
	if p.cmd == nil {
		p.mu.Unlock()
		return
	}
	p.stopping = true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.mu.Lock()
		_ = p.cmd.Process.Kill()
		p.mu.Unlock()
		<-done
	}
	p.mu.Lock()
	p.cmd = nil
	p.mu.Unlock()
}

func (p *procService) restart() { p.stop(); p.start() }

// kill SIGKILLs the process and returns once it runs again: respawned,
// or started here.
func (p *procService) kill() {
	p.mu.Lock()
	cmd, done, respawn := p.cmd, p.done, p.respawn
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	if !respawn {
		<-done
		p.start()
		return
	}
	deadline := time.Now().Add(time.Minute)
	for p.mainPID() == cmd.Process.Pid {
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not respawned a minute after SIGKILL", p.name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (p *procService) mainPID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}
func (p *procService) logs() string { return tail(readFile(p.log), 300) }

// pidFile is where a service run without systemd has its pid.
func (n *node) pidFile(name string) string { return n.path("logs/" + name + ".pid") }

func (n *node) newService(name, unit string, argv []string) service {
	if n.systemd {
		return newUnit(n.t, name, unit, strings.Join(argv, " "))
	}
	// As systemd would: restarted when the unit says so, its pid in a
	// file (the node e2e runtime restart spec reads pinrt's).
	p := &procService{t: n.t, name: name, argv: argv, log: n.path("logs/" + name + ".log"),
		respawn: unitSetting(unit, "Restart") == "always", pidFile: n.pidFile(name),
		oomScoreAdj: unitSetting(unit, "OOMScoreAdjust")}
	if err := os.MkdirAll(filepath.Dir(p.log), 0o755); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(p.stop)
	return p
}

// pinrtService is pinrt's unit, or its name without systemd.
const pinrtService = "k8snode-pinrt.service"

// startPinrt runs pinrt from contrib/pinrt.service with its state under
// the test's directories and its config naming the cgroup driver, the
// test's CNI network and the image registries' mirrors. The network
// has portmap, as a real node's has, for the pods' host ports: it adds
// iptables rules per pod and removes them at CNI DEL; its top-level
// CNI-HOSTPORT-* chains stay, shared with any other user of portmap on
// the host, as after critest.
func (n *node) startPinrt() {
	t := n.t
	cniConf := n.path("cni")
	n.write("cni/10-k8snode.conflist", fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "k8snode",
  "plugins": [{
    "type": "bridge", "bridge": "k8snbr0", "isGateway": true, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.254.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}
  }, {"type": "portmap", "capabilities": {"portMappings": true}}]
}
`, n.cniDataDir))
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "k8snbr0").Run() })
	config := n.write("pinrt.toml", fmt.Sprintf(`log_level = "debug"
[runtime]
cgroup_driver = %q
%s`, n.driver, n.registryConf))
	if err := os.MkdirAll(n.path("pinrt.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if n.opts.pinrtConf != "" {
		n.write("pinrt.d/50-test.toml", n.opts.pinrtConf)
	}
	argv := []string{n.pinrt, "--config", config, "--config-dir", n.path("pinrt.d"),
		"--root", n.pinrtRoot, "--runroot", n.pinrtRun, "--listen", n.pinrtSock,
		"--cni-config-dir", cniConf, "--cni-plugin-dir", "/opt/cni/bin"}
	n.pinrtSvc = n.newService(pinrtService, contrib.SystemdUnit, argv)
	n.pinrtSvc.start()
	if !n.systemd {
		n.poll(n.t, "pinrt socket", 30*time.Second, func() (bool, error) {
			_, err := os.Stat(n.pinrtSock)
			return err == nil, err
		})
	}
}

// hostKubeletDir is kubelet's default root directory on a host.
const hostKubeletDir = "/var/lib/kubelet"

// kubeletUnit is kubelet's unit as kubeadm's packages ship it, less the
// restart loop: a kubelet that exits fails the test.
const kubeletUnit = `[Unit]
Description=kubelet (k8snode test)
Wants=k8snode-pinrt.service
After=k8snode-pinrt.service

[Service]
ExecStart=/usr/bin/kubelet
Restart=no

[Install]
WantedBy=multi-user.target
`

// startKubelet runs kubelet with a KubeletConfiguration of its defaults
// but for what a node must say: the runtime endpoint, the cgroup driver,
// how the API server authenticates to it, its ports.
func (n *node) startKubelet() {
	t := n.t
	n.kubeletPort = n.kubeletListenPort()
	var extra string
	if fs := cgroupFS(); fs != "cgroup2fs" {
		// Only on a cgroup v1 host (a smoke run outside the VM): the VM
		// runs kubelet's defaults.
		t.Logf("cgroup v1 host (%s): kubelet runs with failCgroupV1: false", fs)
		extra += "failCgroupV1: false\nfailSwapOn: false\n"
	}
	healthz := "healthzPort: 0\n"
	if n.opts.conformance {
		// On the node IP only; the e2e_node metrics spec reads it on
		// localhost, and its serial specs wait for kubelet's health there
		// after they restart it: through forwardPort.
		extra += fmt.Sprintf("readOnlyPort: %d\n", kubeletReadOnlyPort)
		healthz = fmt.Sprintf("healthzBindAddress: %s\nhealthzPort: %d\n", n.ip, kubeletHealthzPort)
	}
	n.kubeletConfig = n.write("kubelet/config.yaml", fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%s
cgroupDriver: %s
address: %s
port: %d
%spodLogsDir: %s
# Static pods, as kubeadm's control plane runs (the e2e_node mirror pod
# specs write theirs here).
staticPodPath: %s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
# As contrib/kubelet-config.yaml has it: pod stats, with their network,
# from pinrt's ListPodSandboxStats.
featureGates:
  PodAndContainerStatsFromCRI: true
# The VM's disk is small; the default eviction thresholds on it would
# evict the test's pods, which is not what this test is about.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
%s`, n.pinrtSock, n.driver, n.ip, n.kubeletPort, healthz, n.podLogDir, n.path("manifests"), n.path("pki/ca.crt"), extra))
	if err := os.MkdirAll(n.path("manifests"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Named kubelet, as the node e2e specs look for it by its name.
	kubelet := n.path("bin/kubelet")
	if err := os.MkdirAll(filepath.Dir(kubelet), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(kubelet)
	if err := os.Symlink(n.k8s, kubelet); err != nil {
		t.Fatal(err)
	}
	// Whatever its root dir, kubelet makes /var/lib/kubelet/device-plugins
	// (the device plugin API's compiled-in path): removed after it stops
	// when the host had no /var/lib/kubelet.
	if _, err := os.Stat(hostKubeletDir); os.IsNotExist(err) {
		t.Cleanup(func() { _ = os.RemoveAll(hostKubeletDir) })
	}
	argv := []string{kubelet, "--config=" + n.kubeletConfig,
		"--kubeconfig=" + n.kubeconfig("kubelet"),
		"--root-dir=" + n.kubeletRoot,
		// Its serving certificate, else in /var/lib/kubelet/pki.
		"--cert-dir=" + filepath.Join(n.kubeletRoot, "pki"),
		"--hostname-override=" + nodeName, "--node-ip=" + n.ip, "--v=2"}
	n.kubeletSvc = n.newService("k8snode-kubelet.service", kubeletUnit, argv)
	n.kubeletSvc.start()
	t.Cleanup(func() {
		// kubelet makes its root dir a mount point, and leaves its pods'
		// volume mounts under it when it stops with pods (the test
		// deletes every pod first; this is for one that failed halfway);
		// and it leaves its QoS cgroups (removed after the pods).
		unmountUnder(n.kubeletRoot)
		_ = syscall.Unmount(n.kubeletRoot, syscall.MNT_DETACH)
	})
}

// removeSandboxes removes every pod sandbox pinrt still has, through the
// CRI, once kubelet has stopped: what a test that failed halfway left.
func (n *node) removeSandboxes() {
	conn, err := grpc.NewClient("unix://"+n.pinrtSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		n.t.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		n.t.Logf("cleanup: %v", err)
		return
	}
	for _, p := range l.Items {
		n.t.Logf("cleanup: removing pod sandbox %s (%s)", p.Id, p.Metadata.GetName())
		if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			n.t.Logf("cleanup: %v", err)
		}
		if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			n.t.Logf("cleanup: %v", err)
		}
	}
}

func cgroupFS() string {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup", &st); err != nil {
		return "unknown"
	}
	if st.Type == 0x63677270 {
		return "cgroup2fs"
	}
	return "tmpfs"
}

// removeKubepods removes kubelet's cgroup tree once kubelet has stopped
// and no pod is left in it.
func removeKubepods(systemd bool) {
	if systemd {
		_ = exec.Command("systemctl", "stop", "kubepods.slice").Run()
	}
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	roots = append(roots, "/sys/fs/cgroup/kubepods")
	for _, r := range roots {
		var dirs []string
		_ = filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// unmountUnder unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) {
	for _, m := range mountsUnder(dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append([]string{f[4]}, out...)
		}
	}
	return out
}

func (n *node) waitNodeReady(timeout time.Duration) {
	n.poll(n.t, "node Ready", timeout, func() (bool, error) {
		n.checkProcs(n.t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		node, err := n.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
			}
		}
		return false, fmt.Errorf("no Ready condition")
	})
}

// poll calls f until it returns true, failing the test after timeout
// with f's last error.
func (n *node) poll(t testing.TB, what string, timeout time.Duration, f func() (bool, error)) {
	t.Helper()
	timeout = scaled(timeout)
	deadline := time.Now().Add(timeout)
	for {
		ok, err := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// timeScale stretches every wait of the test (poll, exec, attach,
// port-forward) on a slow node: PINRT_K8S_TIME_SCALE, a whole number,
// default 1. test/vm/suites/k8s.sh sets it for a guest of one vCPU under
// TCG, where the API server answered kubelet's status patches minutes
// late (a Deployment whose pods kubelet had running at 3.5 min still
// showed them Pending at 5).
var timeScale = func() time.Duration {
	v, err := strconv.Atoi(os.Getenv("PINRT_K8S_TIME_SCALE"))
	if err != nil || v < 1 {
		return 1
	}
	return time.Duration(v)
}()

func scaled(d time.Duration) time.Duration { return d * timeScale }

// dumpLogs shows kubelet's and pinrt's logs (and the control plane's
// tails) when the test failed.
func (n *node) dumpLogs() {
	var b bytes.Buffer
	for _, s := range []struct {
		name string
		svc  service
	}{{"kubelet", n.kubeletSvc}, {"pinrt", n.pinrtSvc}} {
		if s.svc != nil {
			fmt.Fprintf(&b, "===== %s log (last 300 lines)\n%s\n", s.name, s.svc.logs())
		}
	}
	for _, p := range n.procs {
		fmt.Fprintf(&b, "===== %s log (last 40 lines)\n%s\n", p.name, tail(readFile(p.log), 40))
	}
	n.t.Log("\n" + b.String())
}

// kubeletReadOnlyPort is kubelet's unauthenticated read-only port, where
// the e2e_node specs read /metrics/cadvisor ("localhost:10255").
const kubeletReadOnlyPort = 10255

// kubeletHealthzPort is kubelet's health port, where the e2e_node serial
// specs wait for a restarted kubelet ("127.0.0.1:10248").
const kubeletHealthzPort = 10248

// forwardPort forwards localhost's port to kubelet's on the node IP,
// until the test ends: kubelet serves on the node IP only, so that
// nothing of the test listens on the host's own addresses. Each suite
// that needs a port asks; the first asking sets it up.
func (n *node) forwardPort(t *testing.T, port int) {
	if n.forwarded[port] {
		return
	}
	if n.forwarded == nil {
		n.forwarded = map[int]bool{}
	}
	n.forwarded[port] = true
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Errorf("kubelet's port %d on localhost, for the node e2e specs: %v", port, err)
		return
	}
	t.Cleanup(func() { _ = l.Close() })
	target := net.JoinHostPort(n.ip, strconv.Itoa(port))
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", target, 10*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
}
