// Package k8snode brings up a Kubernetes node whose runtime is pinrt
// (etcd, kube-apiserver, kube-controller-manager, kubelet) and drives it
// through the API server with client-go, as kubectl does. test/vm runs it
// in a VM with systemd on cgroup v2, under both cgroup drivers
// (test/vm/suites/k8s.sh).
package k8snode

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"
)

const ns = "k8snode"

func TestNode(t *testing.T) {
	n := startNode(t, imageSource(t))
	ctx := t.Context()
	n.cleanupPods()

	// A step's failure ends the test: the steps after it need it. A
	// check's does not.
	run := func(name string, f func(t *testing.T)) bool {
		start := time.Now()
		ok := t.Run(name, f)
		t.Logf("%s: %s", name, time.Since(start).Round(100*time.Millisecond))
		return ok
	}
	step := func(name string, f func(t *testing.T)) {
		if !run(name, f) {
			t.FailNow()
		}
	}
	check := func(name string, f func(t *testing.T)) { run(name, f) }
	var pods []corev1.Pod
	step("Deployment", func(t *testing.T) { pods = n.deploy(t, ctx) })
	p0 := pods[0].Name
	check("UserNamespace", func(t *testing.T) {
		for _, p := range pods {
			out := n.mustExec(t, p.Name, "shell", "cat", "/proc/self/uid_map")
			f := strings.Fields(out)
			if len(f) != 3 || f[0] != "0" || f[1] == "0" || f[2] != "65536" {
				t.Errorf("pod %s: uid_map %q, want 0 <host id other than 0> 65536", p.Name, out)
			}
		}
	})
	check("RuntimeVersion", func(t *testing.T) { n.runtimeVersion(t, ctx) })
	step("Exec", func(t *testing.T) { n.checkExec(t, p0) })
	check("ExecTTY", func(t *testing.T) { n.checkExecTTY(t, p0) })
	check("LogsFollow", func(t *testing.T) { n.checkLogsFollow(t, ctx, p0) })
	check("Attach", func(t *testing.T) { n.checkAttach(t, p0) })
	check("Copy", func(t *testing.T) { n.checkCopy(t, p0) })
	check("PortForward", func(t *testing.T) { n.checkPortForward(t, p0) })
	check("EmptyDir", func(t *testing.T) { n.checkEmptyDir(t, pods) })
	check("WebLog", func(t *testing.T) { n.checkWebLog(t, ctx, p0) })
	check("StatsSummary", func(t *testing.T) { n.checkStats(t, ctx) })
	step("PinrtRestart", func(t *testing.T) { n.checkSurvives(t, ctx, "systemctl restart", n.pinrtSvc.restart) })
	step("PinrtKill", func(t *testing.T) { n.checkSurvives(t, ctx, "SIGKILL", n.pinrtSvc.kill) })
	check("ProbesSteady", func(t *testing.T) { n.checkSteady(t, ctx) })
	step("DeleteWithinGrace", func(t *testing.T) { n.checkDelete(t, ctx, p0) })
	step("NoLeaks", func(t *testing.T) { n.checkNoLeaks(t, ctx) })
}

// imageSource picks the images: the stand-in registry when the suite
// serves one (PINRT_K8S_STANDIN_CONF names its mirror settings), else
// busybox from test/testimage, with no nginx.
func imageSource(t *testing.T) images {
	if conf := os.Getenv("PINRT_K8S_STANDIN_CONF"); conf != "" {
		return standinSource{conf: conf}
	}
	t.Log("PINRT_K8S_STANDIN_CONF is not set: busybox from test/testimage, busybox httpd for nginx")
	return testimageSource{}
}

func ptr[T any](v T) *T { return &v }

// webRoot is where the web container serves files from: the emptyDir the
// shell container writes index.html into.
func (n *node) webRoot() string {
	if n.images.nginx() != "" {
		return "/usr/share/nginx/html"
	}
	return "/www"
}

// podTemplate is the Deployment's pod: a user namespace, a web server
// with an httpGet readiness probe, a shell with an exec liveness probe
// that ticks on stdout, a cat for attach, and an emptyDir between the
// first two.
func (n *node) podTemplate() corev1.PodTemplateSpec {
	web := corev1.Container{
		Name: "web", Image: n.images.nginx(),
		Ports: []corev1.ContainerPort{{ContainerPort: 80}},
	}
	if web.Image == "" {
		web.Image = n.images.busybox()
		web.Command = []string{"httpd", "-f", "-v", "-p", "80", "-h", "/www"}
	}
	web.VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: n.webRoot()}}
	web.ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}},
		PeriodSeconds: 5, TimeoutSeconds: 5, FailureThreshold: 3,
	}
	shell := corev1.Container{
		Name: "shell", Image: n.images.busybox(),
		Command: []string{"sh", "-c", `trap 'exit 0' TERM
echo "hello from $(hostname)" >/shared/index.html
touch /tmp/healthy
i=0
while true; do echo "tick $i"; i=$((i+1)); sleep 1; done`},
		VolumeMounts: []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}},
		// Every exec is a runc exec: seconds of CPU under TCG, and up to
		// 25s on a loaded host, where a 5s timeout failed the probe and
		// restarted the container.
		LivenessProbe: &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}},
			PeriodSeconds: 30, TimeoutSeconds: 30, FailureThreshold: 3,
		},
	}
	// cat as PID 1 ignores SIGTERM: deleting the pod takes the kill
	// after the grace period.
	echo := corev1.Container{Name: "echo", Image: n.images.busybox(), Command: []string{"cat"}, Stdin: true}
	// A container that fails says why in its status, as kubectl
	// describe shows it.
	for _, c := range []*corev1.Container{&web, &shell, &echo} {
		c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			// No scheduler runs: the pods name the node.
			NodeName:                      nodeName,
			HostUsers:                     ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(10)),
			Containers:                    []corev1.Container{web, shell, echo},
			Volumes:                       []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
}

// deploy creates the namespace and a Deployment of two pods and waits
// until both are Running and Ready.
func (n *node) deploy(t *testing.T, ctx context.Context) []corev1.Pod {
	cs := n.cs
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The service account controller makes the namespace's default
	// account, without which no pod is admitted.
	n.poll(t, "service account default", time.Minute, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: n.podTemplate(),
		},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return n.waitReady(t, ctx, 2, 5*time.Minute)
}

// waitReady waits until want pods of the namespace are Running and Ready,
// and no other pod is left.
func (n *node) waitReady(t *testing.T, ctx context.Context, want int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	n.poll(t, fmt.Sprintf("%d pods Ready", want), timeout, func() (bool, error) {
		n.checkProcs(t)
		l, err := n.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pods = l.Items
		ready := 0
		var why []string
		for _, p := range pods {
			for _, c := range p.Status.ContainerStatuses {
				if c.RestartCount >= 2 {
					t.Fatalf("crash loop: %s", describePod(&p))
				}
			}
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(&p) {
				ready++
				continue
			}
			why = append(why, describePod(&p))
		}
		return ready == want && len(pods) == want, fmt.Errorf("%d of %d Ready, %d pods: %s", ready, want, len(pods), strings.Join(why, "; "))
	})
	return pods
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describePod says what a pod is waiting for or why its containers ended.
func describePod(p *corev1.Pod) string {
	s := fmt.Sprintf("%s %s", p.Name, p.Status.Phase)
	for _, c := range p.Status.ContainerStatuses {
		s += fmt.Sprintf(" [%s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
		if w := c.State.Waiting; w != nil {
			s += fmt.Sprintf(" waiting %s: %s", w.Reason, w.Message)
		}
		if term := c.LastTerminationState.Terminated; term != nil {
			s += fmt.Sprintf(" last exit %d %s: %s", term.ExitCode, term.Reason, strings.TrimSpace(term.Message))
		}
		s += "]"
	}
	return s
}

// runtimeVersion: kubelet reports the runtime as pinrt://<semver>; it
// parses the version as one and shows pinrt://Unknown when it is not.
func (n *node) runtimeVersion(t *testing.T, ctx context.Context) {
	node, err := n.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := node.Status.NodeInfo.ContainerRuntimeVersion
	semver := regexp.MustCompile(`^pinrt://v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	if !semver.MatchString(v) {
		t.Errorf("node's container runtime version %q, want pinrt://<semantic version>", v)
	}
	t.Logf("node: runtime %s, kubelet %s, kernel %s", v, node.Status.NodeInfo.KubeletVersion, node.Status.NodeInfo.KernelVersion)
}

type execOpts struct {
	stdin  io.Reader
	tty    bool
	stdout io.Writer
	stderr io.Writer
	// timeout bounds the whole exec (default 2 minutes).
	timeout time.Duration
}

// exec runs cmd in a container through the API server, as kubectl exec
// does (SPDY).
func (n *node) exec(pod, container string, cmd []string, o execOpts) error {
	req := n.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container, Command: cmd,
			Stdin: o.stdin != nil, Stdout: o.stdout != nil, Stderr: o.stderr != nil && !o.tty, TTY: o.tty,
		}, scheme.ParameterCodec)
	if o.timeout == 0 {
		o.timeout = 2 * time.Minute
	}
	return n.stream(req.URL(), remotecommand.StreamOptions{Stdin: o.stdin, Stdout: o.stdout, Stderr: o.stderr, Tty: o.tty}, o.timeout)
}

func (n *node) stream(u *url.URL, o remotecommand.StreamOptions, timeout time.Duration) error {
	e, err := remotecommand.NewSPDYExecutor(n.cfg, "POST", u)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), scaled(timeout))
	defer cancel()
	if o.Tty {
		o.Stderr = nil
	}
	return e.StreamWithContext(ctx, o)
}

func (n *node) mustExec(t *testing.T, pod, container string, cmd ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if err := n.exec(pod, container, cmd, execOpts{stdout: &out, stderr: &errb}); err != nil {
		t.Fatalf("exec %s/%s %q: %v\nstdout: %s\nstderr: %s", pod, container, cmd, err, out.String(), errb.String())
	}
	return strings.TrimSpace(out.String())
}

func (n *node) checkExec(t *testing.T, pod string) {
	var out, errb bytes.Buffer
	err := n.exec(pod, "shell", []string{"sh", "-c", "read l; echo out:$l; echo err >&2; exit 3"},
		execOpts{stdin: strings.NewReader("in\n"), stdout: &out, stderr: &errb})
	var exit utilexec.ExitError
	if !errors.As(err, &exit) || exit.ExitStatus() != 3 {
		t.Errorf("exec exit: %v, want exit status 3", err)
	}
	if out.String() != "out:in\n" || errb.String() != "err\n" {
		t.Errorf("exec: stdout %q, stderr %q; want \"out:in\\n\", \"err\\n\"", out.String(), errb.String())
	}
}

func (n *node) checkExecTTY(t *testing.T, pod string) {
	var out bytes.Buffer
	// kubectl exec -it: stdin is the user's terminal, open until the
	// command ends.
	stdin, keep := io.Pipe()
	defer keep.Close()
	if err := n.exec(pod, "shell", []string{"sh", "-c", `tty; echo "TERM=$TERM"`}, execOpts{stdin: stdin, stdout: &out, tty: true}); err != nil {
		t.Fatalf("exec -it: %v\n%s", err, out.String())
	}
	s := strings.ReplaceAll(out.String(), "\r", "")
	if !regexp.MustCompile(`(?m)^/dev/pts/\d+$`).MatchString(s) {
		t.Errorf("exec -t: tty printed %q, want /dev/pts/N", s)
	}
	if m := regexp.MustCompile(`(?m)^TERM=(.*)$`).FindStringSubmatch(s); m == nil || m[1] == "" {
		t.Errorf("exec -t: no TERM in the process (%q); kubectl exec -it gives TERM=xterm under containerd", s)
	}
}

// checkLogsFollow reads the shell container's ticks as they are written.
func (n *node) checkLogsFollow(t *testing.T, ctx context.Context, pod string) {
	ctx, cancel := context.WithTimeout(ctx, scaled(time.Minute))
	defer cancel()
	r, err := n.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "shell", Follow: true, TailLines: ptr(int64(1))}).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var lines []string
	buf := make([]byte, 4096)
	var acc string
	for len(lines) < 4 {
		k, err := r.Read(buf)
		acc += string(buf[:k])
		for {
			i := strings.IndexByte(acc, '\n')
			if i < 0 {
				break
			}
			lines = append(lines, acc[:i])
			acc = acc[i+1:]
		}
		if err != nil {
			t.Fatalf("logs -f: %v after %q", err, lines)
		}
	}
	// Consecutive ticks: the follow streams what is written, in order.
	first := -1
	for i, l := range lines {
		var k int
		if _, err := fmt.Sscanf(l, "tick %d", &k); err != nil {
			t.Fatalf("logs -f: line %q, want tick N (lines %q)", l, lines)
		}
		if i == 0 {
			first = k
		} else if k != first+i {
			t.Fatalf("logs -f: lines %q are not consecutive ticks", lines)
		}
	}
}

// checkAttach writes to the echo container's stdin (cat) and reads it
// back from its stdout, as kubectl attach -i does.
func (n *node) checkAttach(t *testing.T, pod string) {
	req := n.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "echo", Stdin: true, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	token := "ping-" + randHex(t, 6)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- n.stream(req.URL(), remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: io.Discard}, time.Minute)
		outW.Close()
	}()
	got := make(chan string, 1)
	go func() {
		var acc []byte
		buf := make([]byte, 256)
		for {
			k, err := outR.Read(buf)
			acc = append(acc, buf[:k]...)
			if bytes.Contains(acc, []byte(token)) || err != nil {
				got <- string(acc)
				_, _ = io.Copy(io.Discard, outR)
				return
			}
		}
	}()
	// The attach may come up after the first write: write until echoed.
	deadline := time.After(scaled(time.Minute))
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	if _, err := io.WriteString(inW, token+"\n"); err != nil {
		t.Fatal(err)
	}
	for {
		select {
		case s := <-got:
			if !strings.Contains(s, token) {
				t.Fatalf("attach: stdout %q, want %s", s, token)
			}
			inW.Close()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("attach ended with %v", err)
				}
			case <-time.After(scaled(30 * time.Second)):
				t.Errorf("attach did not end %s after stdin closed", scaled(30*time.Second))
			}
			return
		case err := <-done:
			t.Fatalf("attach ended before the echo: %v", err)
		case <-tick.C:
		case <-deadline:
			t.Fatal("attach: no echo within a minute")
		}
	}
}

func randHex(t *testing.T, k int) string {
	b := make([]byte, k)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// checkCopy copies 8 MB (2 MB on a slow node) into a container and back out as kubectl cp
// does: tar through exec.
func (n *node) checkCopy(t *testing.T, pod string) {
	// Well above the socket buffers, whose unsent bytes an exec that
	// ends with a reset would lose: kubelet, the API server and pinrt
	// each hold some. A slow node gets 2 MB: in a one-vCPU guest under
	// TCG, 8 MB took 1.5-3.5 min in and 2.5-4 min out.
	size := 8 << 20
	if timeScale > 1 {
		size = 2 << 20
	}
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	if err := tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var errb bytes.Buffer
	// 20 MB through the API server and kubelet took over 2 minutes
	// under TCG in a 1-vCPU guest.
	const copyTimeout = 3 * time.Minute
	if err := n.exec(pod, "shell", []string{"tar", "-xmf", "-", "-C", "/tmp"}, execOpts{stdin: &in, stderr: &errb, timeout: copyTimeout}); err != nil {
		t.Fatalf("cp in: %v: %s", err, errb.String())
	}
	sum := n.mustExec(t, pod, "shell", "sha256sum", "/tmp/blob")
	if f := strings.Fields(sum); len(f) == 0 || f[0] != hex.EncodeToString(want[:]) {
		t.Fatalf("cp in: sha256 in the container %q, want %x", sum, want)
	}
	in.Reset()
	mid := time.Now()
	// kubectl cp --retries: an interrupted copy resumes with `tail -c
	// +<bytes received + 1>` on the same tar stream. Under TCG the stream
	// through kubelet and the API server ends early now and then with no
	// error (kubernetes/kubernetes#60140 is this on real clusters).
	var out bytes.Buffer
	const retries = 5
	tries := 0
	for ; tries <= retries; tries++ {
		before := out.Len()
		cmd := []string{"tar", "-cf", "-", "-C", "/tmp", "blob"}
		if before > 0 {
			cmd = []string{"sh", "-c", fmt.Sprintf("tar -cf - -C /tmp blob | tail -c +%d", before+1)}
		}
		errb.Reset()
		err := n.exec(pod, "shell", cmd, execOpts{stdout: &out, stderr: &errb, timeout: copyTimeout})
		if err == nil && tarComplete(out.Bytes()) {
			break
		}
		t.Logf("cp out: try %d ended with %d of the tar's bytes (%d this try): %v %s", tries+1, out.Len(), out.Len()-before, err, errb.String())
	}
	if tries > retries {
		t.Fatalf("cp out: %d tries and the tar is still incomplete (%d bytes)", tries, out.Len())
	}
	tr := tar.NewReader(&out)
	h, err := tr.Next()
	if err != nil {
		t.Fatalf("cp out: %v", err)
	}
	got, err := io.ReadAll(tr)
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "blob" || sha256.Sum256(got) != want {
		t.Fatalf("cp out: %s, %d bytes, not what went in", h.Name, len(got))
	}
	if tries > 0 {
		t.Logf("cp out needed %d resumed tries", tries)
	}
	n.mustExec(t, pod, "shell", "rm", "/tmp/blob")
	t.Logf("%d MB in %s, out %s", size>>20, mid.Sub(start).Round(100*time.Millisecond), time.Since(mid).Round(100*time.Millisecond))
}

// tarComplete reports whether b is a whole tar stream: its entries and
// the two zero blocks that end it.
func tarComplete(b []byte) bool {
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		_, err := tr.Next()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return false
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return false
		}
	}
}

// checkPortForward serves 20 requests through one port-forward.
func (n *node) checkPortForward(t *testing.T, pod string) {
	rt, upgrader, err := spdy.RoundTripperFor(n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := n.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, "POST", u)
	stop, ready := make(chan struct{}), make(chan struct{})
	var fwOut, fwErr bytes.Buffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:80"}, stop, ready, &fwOut, &fwErr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	defer func() {
		close(stop)
		<-done
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward: %v: %s", err, fwErr.String())
	case <-time.After(scaled(time.Minute)):
		t.Fatalf("port-forward not ready within %s", scaled(time.Minute))
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: scaled(30 * time.Second)}
	for i := range 20 {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/?n=%d", ports[0].Local, i))
		if err != nil {
			t.Fatalf("request %d: %v (port-forward: %s)", i, err, fwErr.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The shell container wrote it into the emptyDir the web
		// server serves.
		if want := "hello from " + pod + "\n"; resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("request %d: %s %q, want 200 %q", i, resp.Status, body, want)
		}
	}
}

// checkEmptyDir: what one container writes the other reads (the web
// server serving the shell's index.html is the other way, PortForward).
func (n *node) checkEmptyDir(t *testing.T, pods []corev1.Pod) {
	for _, p := range pods {
		token := randHex(t, 8)
		n.mustExec(t, p.Name, "shell", "sh", "-c", "echo "+token+" >/shared/token")
		if got := n.mustExec(t, p.Name, "web", "cat", n.webRoot()+"/token"); got != token {
			t.Errorf("pod %s: web reads %q, want %s", p.Name, got, token)
		}
	}
}

// checkWebLog: the web server's access log is its stdout, and the
// requests of PortForward and of the readiness probe are in it.
func (n *node) checkWebLog(t *testing.T, ctx context.Context, pod string) {
	if n.images.nginx() == "" {
		// busybox httpd logs to syslog, not to stdout.
		t.Skip("no nginx image in this image source")
	}
	b, err := n.cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "web"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, `"GET /?n=19 HTTP/1.1" 200`) || !strings.Contains(s, "kube-probe/") {
		t.Errorf("nginx log has neither the port-forwarded requests nor the probes:\n%s", tail(s, 20))
	}
}

// summary is the part of kubelet's /stats/summary the test reads.
type summary struct {
	Pods []struct {
		PodRef struct{ Name, Namespace string } `json:"podRef"`
		CPU    *struct {
			UsageNanoCores *uint64 `json:"usageNanoCores"`
		} `json:"cpu"`
		Memory *struct {
			WorkingSetBytes *uint64 `json:"workingSetBytes"`
		} `json:"memory"`
		Network *struct {
			Name    string  `json:"name"`
			RxBytes *uint64 `json:"rxBytes"`
		} `json:"network"`
		Containers []struct {
			Name string `json:"name"`
			CPU  *struct {
				PSI *psiStats `json:"psi"`
			} `json:"cpu"`
			Memory *struct {
				PSI *psiStats `json:"psi"`
			} `json:"memory"`
			IO *struct {
				PSI *psiStats `json:"psi"`
			} `json:"io"`
		} `json:"containers"`
	} `json:"pods"`
}

// psiStats is kubelet's pressure stall information of a resource.
type psiStats struct {
	Some, Full struct {
		Total uint64 `json:"total"`
	}
}

// checkStats reads kubelet's stats summary through the API server's node
// proxy, as kubectl top and metrics-server do: every pod with its CPU
// and memory, and its network (kubelet takes it from pinrt's
// ListPodSandboxStats with the PodAndContainerStatsFromCRI gate), and
// every container with its pressure stall information.
func (n *node) checkStats(t *testing.T, ctx context.Context) {
	l, err := n.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// CPU usage is a rate: kubelet needs two samples of each pod.
	n.poll(t, "every pod in /stats/summary with CPU and memory", 2*time.Minute, func() (bool, error) {
		b, err := n.cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", nodeName, "proxy/stats/summary").DoRaw(ctx)
		if err != nil {
			return false, err
		}
		var s summary
		if err := json.Unmarshal(b, &s); err != nil {
			return false, err
		}
		var missing []string
		for _, p := range l.Items {
			found := false
			for _, sp := range s.Pods {
				if sp.PodRef.Namespace != ns || sp.PodRef.Name != p.Name {
					continue
				}
				found = true
				if sp.CPU == nil || sp.CPU.UsageNanoCores == nil {
					missing = append(missing, p.Name+": no cpu.usageNanoCores")
				}
				if sp.Memory == nil || sp.Memory.WorkingSetBytes == nil || *sp.Memory.WorkingSetBytes == 0 {
					missing = append(missing, p.Name+": no memory.workingSetBytes")
				}
				if sp.Network == nil || sp.Network.Name == "" {
					missing = append(missing, p.Name+": no network block with the pod's interface")
				}
				// KubeletPSI (GA): each container's pressure, from
				// pinrt's stats (a kernel with PSI, as the VM's).
				if len(sp.Containers) == 0 {
					missing = append(missing, p.Name+": no containers")
				}
				for _, c := range sp.Containers {
					if c.CPU == nil || c.CPU.PSI == nil || c.Memory == nil || c.Memory.PSI == nil || c.IO == nil || c.IO.PSI == nil {
						missing = append(missing, p.Name+"/"+c.Name+": no CPU, memory or I/O pressure")
					}
				}
			}
			if !found {
				missing = append(missing, p.Name+": not listed")
			}
		}
		return len(missing) == 0, fmt.Errorf("%s", strings.Join(missing, "; "))
	})
}

// podState is what must not change across a restart of the runtime: the
// pods (by UID) and their containers (by ID and restart count).
func (n *node) podState(t *testing.T, ctx context.Context) map[string]string {
	l, err := n.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, p := range l.Items {
		for _, c := range p.Status.ContainerStatuses {
			m[p.Name+"/"+c.Name] = fmt.Sprintf("pod %s container %s restarts %d", p.UID, c.ContainerID, c.RestartCount)
		}
	}
	return m
}

// checkSurvives restarts pinrt with do and checks that kubelet neither
// restarted a container nor recreated a pod, and that the pods still
// serve exec and logs.
func (n *node) checkSurvives(t *testing.T, ctx context.Context, how string, do func()) {
	before := n.podState(t, ctx)
	pid := n.pinrtSvc.mainPID()
	do()
	if n.pinrtSvc.mainPID() == pid {
		t.Fatalf("pinrt still runs as pid %d after %s", pid, how)
	}
	// Give kubelet's relist (every second) and its pod syncs time to
	// see the runtime back, then compare.
	time.Sleep(15 * time.Second)
	pods := n.waitReady(t, ctx, 2, 2*time.Minute)
	after := n.podState(t, ctx)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("after %s of pinrt: %s: %s, was %s", how, k, after[k], v)
		}
	}
	if len(after) != len(before) {
		t.Errorf("after %s of pinrt: %d containers, were %d", how, len(after), len(before))
	}
	for _, p := range pods {
		n.mustExec(t, p.Name, "shell", "true")
	}
}

// checkSteady: no container restarted, and no probe failed, since the
// pods started.
func (n *node) checkSteady(t *testing.T, ctx context.Context) {
	l, err := n.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 || !c.Ready {
				t.Errorf("%s: %s", p.Name, describePod(&p))
				break
			}
		}
	}
	ev, err := n.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ev.Items {
		// A probe kubelet could not run while pinrt restarted (the
		// socket gone or refusing) errs to "unknown", which is no
		// failure; kubelet says "probe failed" for one.
		if strings.Contains(e.Message, "probe errored") && strings.Contains(e.Message, "pinrt.sock") {
			continue
		}
		if e.Reason == "Unhealthy" || e.Reason == "BackOff" || e.Reason == "Failed" {
			t.Errorf("event %s %s: %s (%d times)", e.InvolvedObject.Name, e.Reason, e.Message, e.Count)
		}
	}
}

// checkDelete deletes a pod and checks that it is gone within its grace
// period (10s; its cat ignores SIGTERM, so the runtime must kill it then)
// and some time for kubelet's status round trip.
func (n *node) checkDelete(t *testing.T, ctx context.Context, pod string) {
	p, err := n.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	grace := time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	start := time.Now()
	if err := n.cs.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// kubelet's round trip after the kill (the sandbox's stop, CNI DEL,
	// the status update) took 30s under TCG on a loaded host. In a
	// 1-vCPU guest, pinrt had stopped all of the pod 25s after the
	// delete, and then kubelet's status patch timed out in the API
	// server (60s); with the waits tripled there, a deletion took 178s.
	slack := 2 * time.Minute
	n.poll(t, "pod "+pod+" deleted", grace+slack, func() (bool, error) {
		_, err := n.cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	took := time.Since(start)
	t.Logf("pod deleted in %s (grace period %s)", took.Round(100*time.Millisecond), grace)
	if took < grace-2*time.Second {
		// cat ignores SIGTERM: a pod gone before the grace period was
		// killed early.
		t.Errorf("pod gone after %s, before its grace period %s ended", took, grace)
	}
}

// cleanupPods deletes the test's pods at the end of a test that failed
// halfway, so that kubelet stops them before it stops.
func (n *node) cleanupPods() {
	n.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		_, _ = n.cs.AppsV1().Deployments(ns).Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{})
		_ = n.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{})
		for ctx.Err() == nil {
			l, err := n.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) == 0 {
				return
			}
			time.Sleep(time.Second)
		}
	})
}

// checkNoLeaks scales the Deployment to 0 and waits until the node holds
// nothing of the pods: no sandbox or container in pinrt's state, no pin,
// no mount, no IP, no pod cgroup, no conmon.
func (n *node) checkNoLeaks(t *testing.T, ctx context.Context) {
	if _, err := n.cs.AppsV1().Deployments(ns).Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	n.poll(t, "every pod deleted", 2*time.Minute, func() (bool, error) {
		l, err := n.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(l.Items) == 0, fmt.Errorf("%d pods left", len(l.Items))
	})
	start := time.Now()
	// kubelet removes the stopped sandboxes of deleted pods in its
	// container GC, once a minute.
	n.poll(t, "nothing left of the pods on the node", 3*time.Minute, func() (bool, error) {
		left := n.leftovers()
		return len(left) == 0, fmt.Errorf("left: %s", strings.Join(left, "; "))
	})
	t.Logf("node clean %s after the last pod was deleted", time.Since(start).Round(time.Second))
}

// leftovers lists what the node still holds of pods.
func (n *node) leftovers() []string {
	var left []string
	for _, d := range []string{
		filepath.Join(n.pinrtRoot, "sandboxes"), filepath.Join(n.pinrtRoot, "containers"),
		filepath.Join(n.pinrtRun, "ns", "net"), filepath.Join(n.pinrtRun, "ns", "user"),
		filepath.Join(n.pinrtRun, "ns", "ipc"), filepath.Join(n.pinrtRun, "ns", "uts"),
		filepath.Join(n.kubeletRoot, "pods"),
	} {
		if e, _ := os.ReadDir(d); len(e) > 0 {
			left = append(left, fmt.Sprintf("%d entries in %s", len(e), d))
		}
	}
	for _, d := range []string{n.pinrtRoot, n.pinrtRun, n.kubeletRoot} {
		if m := mountsUnder(d); len(m) > 0 {
			left = append(left, fmt.Sprintf("mounts %q", m))
		}
	}
	ips, _ := filepath.Glob(filepath.Join(n.cniDataDir, "*", "*"))
	for _, ip := range ips {
		if b := filepath.Base(ip); b != "lock" && !strings.HasPrefix(b, "last_reserved_ip") {
			left = append(left, "IP "+b+" allocated")
		}
	}
	left = append(left, podCgroups()...)
	if procs := conmons(n.pinrtRoot); len(procs) > 0 {
		left = append(left, fmt.Sprintf("conmon pids %v", procs))
	}
	return left
}

var podCgroup = regexp.MustCompile(`pod[0-9a-f]{8}[-_][0-9a-f]{4}`)

// podCgroups lists kubelet's pod cgroups (kubepods/.../pod<uid> or
// kubepods-...-pod<uid>.slice) still there.
func podCgroups() []string {
	var left []string
	for _, root := range []string{"/sys/fs/cgroup/kubepods.slice", "/sys/fs/cgroup/kubepods", "/sys/fs/cgroup/memory/kubepods", "/sys/fs/cgroup/memory/kubepods.slice"} {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && podCgroup.MatchString(d.Name()) {
				left = append(left, "cgroup "+p)
				return filepath.SkipDir
			}
			return nil
		})
	}
	return left
}

// conmons lists the conmon processes whose command line names root.
func conmons(root string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if strings.HasSuffix(args[0], "conmon") && strings.Contains(string(b), root) {
			pids = append(pids, pid)
		}
	}
	return pids
}
