package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Operation names of the exec and portforward scenarios.
const (
	OpExecSync       = "ExecSync"
	OpExecStream     = "Exec(stream)"
	OpPortForward    = "PortForward"
	OpForwardReady   = "port-forward ready"
	OpForwardRead    = "port-forward read"
	OpForwardWarmup  = "port-forward server up"
	OpServerListens  = "server in the pod listens"
	MetricForwardMBs = "portforward_mb_per_s"
)

// forwardPort is the port the portforward scenario's container serves on.
const forwardPort = 8080

// execCmd is what every exec runs; its output is checked.
var execCmd = []string{"echo", "hi"}

const execOut = "hi\n"

// declareOnePodOps declares the rows of the one pod the exec and
// portforward scenarios run in; the CPU per pod is that pod's and the
// scenario's together.
func (r *runner) declareOnePodOps() {
	r.pods = 1
	r.rec.Declare(OpPullImage, OpRunPodSandbox, OpCreateContainer, OpStartContainer, OpWaitRunning,
		OpStopContainer, OpRemoveContainer, OpStopPodSandbox, OpRemovePodSandbox)
	r.rec.DeclareAggregate(OpPodRunning)
}

// execStreams is how many streaming execs the exec scenario makes: the
// configured number, or N/10 (at least 1) by default; negative: none.
func (c *Config) execStreams() int {
	switch {
	case c.Streams < 0:
		return 0
	case c.Streams > 0:
		return c.Streams
	}
	return max(1, c.N/10)
}

// forwardRounds is how often the portforward scenario reads the file.
func (c *Config) forwardRounds() int {
	if c.Streams > 0 {
		return c.Streams
	}
	return 3
}

// exec starts one pod with a long-running container, then times N ExecSync
// and the streaming execs, one at a time, each running "echo hi".
func (r *runner) exec(ctx context.Context) time.Duration {
	r.declareOnePodOps()
	r.rec.Declare(OpExecSync)
	streams := r.cfg.execStreams()
	if streams > 0 {
		r.rec.Declare(OpExecStream)
	}
	r.ensureImage(ctx)
	start := time.Now()
	p, err := r.startPod(ctx, ScenarioExec, 0, start)
	if err != nil {
		return time.Since(start)
	}
	defer func() { _ = r.teardown(ctx, p) }()
	id := p.containers[0]

	syncStart := time.Now()
	for range r.cfg.N {
		if ctx.Err() != nil {
			break
		}
		_ = r.rec.timed(OpExecSync, func() error { return r.execSync(ctx, id) })
	}
	r.walls[OpExecSync] = time.Since(syncStart)

	streamStart := time.Now()
	for range streams {
		if ctx.Err() != nil {
			break
		}
		_ = r.rec.timed(OpExecStream, func() error { return r.execStream(ctx, id) })
	}
	if streams > 0 {
		r.walls[OpExecStream] = time.Since(streamStart)
	}
	return time.Since(start)
}

func (r *runner) execSync(ctx context.Context, id string) error {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	resp, err := r.c.Runtime.ExecSync(rctx, &runtimeapi.ExecSyncRequest{
		ContainerId: id, Cmd: execCmd, Timeout: int64(r.cfg.RPCTimeout / time.Second),
	})
	if err != nil {
		return err
	}
	return checkExecOutput(resp.GetExitCode(), string(resp.GetStdout()), string(resp.GetStderr()))
}

func checkExecOutput(code int32, stdout, stderr string) error {
	if code != 0 || stdout != execOut {
		return fmt.Errorf("%v: exit code %d, stdout %q, stderr %q; want 0 and %q", execCmd, code, stdout, stderr, execOut)
	}
	return nil
}

// execStream asks for an exec URL as kubelet does and drives it with
// client-go's SPDY executor, as kubectl exec through the API server would.
// The time covers both: the Exec RPC and the whole stream.
func (r *runner) execStream(ctx context.Context, id string) error {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	resp, err := r.c.Runtime.Exec(rctx, &runtimeapi.ExecRequest{ContainerId: id, Cmd: execCmd, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	u, err := streamURL(resp.GetUrl())
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	if err != nil {
		return err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(rctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return fmt.Errorf("exec stream: %w", err)
	}
	return checkExecOutput(0, stdout.String(), stderr.String())
}

// streamURL parses a streaming URL returned by the runtime; it must be
// absolute (kubelet would otherwise resolve it against its own server,
// which the bench has not).
func streamURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("streaming URL %q: %w", s, err)
	}
	if u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("streaming URL %q is not absolute", s)
	}
	return u, nil
}

// ForwardServerCommand is the portforward scenario's container: busybox
// httpd serving a file of mb MiB of zeros on forwardPort.
func ForwardServerCommand(mb int) []string {
	script := fmt.Sprintf("mkdir -p /www && /bin/busybox dd if=/dev/zero of=/www/big bs=1048576 count=%d 2>/dev/null && exec /bin/busybox httpd -f -p %d -h /www",
		mb, forwardPort)
	return []string{"/bin/busybox", "sh", "-c", script}
}

// MBPerSec is the throughput of n bytes in d, in MB/s (10^6 bytes).
func MBPerSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / 1e6 / d.Seconds()
}

// portforward starts one pod whose container serves a file over HTTP,
// forwards a local port to it through the runtime's PortForward URL with
// client-go's SPDY port-forwarder, and times reading the file through it.
func (r *runner) portforward(ctx context.Context) time.Duration {
	r.declareOnePodOps()
	r.rec.Declare(OpServerListens, OpPortForward, OpForwardReady, OpForwardWarmup, OpForwardRead)
	r.ensureImage(ctx)
	size := r.cfg.ForwardMB
	if size <= 0 {
		size = 64
	}
	r.cfg.Command = ForwardServerCommand(size)
	start := time.Now()
	p, err := r.startPod(ctx, ScenarioPortForward, 0, start)
	if err != nil {
		return time.Since(start)
	}
	defer func() { _ = r.teardown(ctx, p) }()
	// client-go's port-forwarder ends at the first connection the pod
	// refuses: the server must listen before the forward starts.
	if err := r.rec.timed(OpServerListens, func() error { return r.waitListening(ctx, p.containers[0]) }); err != nil {
		return time.Since(start)
	}

	var local int
	var stop func()
	err = r.rec.timed(OpPortForward, func() error {
		var err error
		local, stop, err = r.forward(ctx, p.id)
		return err
	})
	if err != nil {
		return time.Since(start)
	}
	defer stop()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	fileURL := "http://127.0.0.1:" + strconv.Itoa(local) + "/big"
	want := int64(size) << 20
	if err := r.rec.timed(OpForwardWarmup, func() error { return r.waitServing(ctx, client, fileURL, want) }); err != nil {
		return time.Since(start)
	}
	var total int64
	var took time.Duration
	for range r.cfg.forwardRounds() {
		if ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		err := r.rec.timed(OpForwardRead, func() error {
			n, err := readAll(ctx, client, fileURL)
			if err == nil && n != want {
				err = fmt.Errorf("read %d bytes through the port-forward, want %d", n, want)
			}
			return err
		})
		if err == nil {
			total += want
			took += time.Since(t0)
		}
	}
	if total > 0 {
		r.setMetric(MetricForwardMBs, MBPerSec(total, took))
		r.setMetric("portforward_read_mb", float64(size))
	}
	return time.Since(start)
}

// forward asks for a PortForward URL for forwardPort and starts client-go's
// port-forwarder on a free local port; stop ends it.
func (r *runner) forward(ctx context.Context, sandbox string) (int, func(), error) {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	resp, err := r.c.Runtime.PortForward(rctx, &runtimeapi.PortForwardRequest{PodSandboxId: sandbox, Port: []int32{forwardPort}})
	if err != nil {
		return 0, nil, err
	}
	u, err := streamURL(resp.GetUrl())
	if err != nil {
		return 0, nil, err
	}
	transport, upgrader, err := spdy.RoundTripperFor(&rest.Config{})
	if err != nil {
		return 0, nil, err
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", u)
	stopCh, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(forwardPort)}, stopCh, ready, io.Discard, io.Discard)
	if err != nil {
		return 0, nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	stop := func() {
		close(stopCh)
		select {
		case err := <-errc:
			_ = err // the forwarder's end after a stop is no failure
		case <-time.After(10 * time.Second):
		}
	}
	t0 := time.Now()
	select {
	case <-ready:
	case err := <-errc:
		return 0, nil, fmt.Errorf("port-forward: %w", err)
	case <-rctx.Done():
		stop()
		return 0, nil, fmt.Errorf("port-forward not ready: %w", rctx.Err())
	}
	r.rec.Observe(OpForwardReady, time.Since(t0))
	ports, err := fw.GetPorts()
	if err == nil && len(ports) == 0 {
		err = errors.New("no port forwarded")
	}
	if err != nil {
		stop()
		return 0, nil, fmt.Errorf("port-forward ports: %w", err)
	}
	return int(ports[0].Local), stop, nil
}

// waitServing polls until the server in the container answers with the
// whole file's length: it first writes the file, then starts listening.
func (r *runner) waitServing(ctx context.Context, client *http.Client, u string, want int64) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.WaitTimeout)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodHead, u, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK && resp.ContentLength == want {
				return nil
			}
			err = fmt.Errorf("HEAD %s: %s, length %d", u, resp.Status, resp.ContentLength)
		}
		last = err
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("server in the pod not up after %s", r.cfg.WaitTimeout), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitListening polls, inside the container, until its server answers
// on forwardPort.
func (r *runner) waitListening(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.WaitTimeout)
	defer cancel()
	probe := []string{"/bin/busybox", "wget", "-q", "--spider", "http://127.0.0.1:" + strconv.Itoa(forwardPort) + "/big"}
	for {
		rctx, rcancel := r.c.rpc(ctx)
		resp, err := r.c.Runtime.ExecSync(rctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: probe, Timeout: 5})
		rcancel()
		if err == nil && resp.GetExitCode() == 0 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%q exited %d: %s", probe, resp.GetExitCode(), resp.GetStderr())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server in the pod not listening after %s: %w", r.cfg.WaitTimeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readAll GETs u and counts the body's bytes.
func readAll(ctx context.Context, client *http.Client, u string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return io.Copy(io.Discard, resp.Body)
}
