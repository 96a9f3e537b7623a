package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Scenario names.
const (
	ScenarioSandbox = "sandbox"
	ScenarioPod     = "pod"
	ScenarioDensity = "density"
	ScenarioRestore = "restore"
	// ScenarioExec times ExecSync and streaming Exec in one running pod.
	ScenarioExec = "exec"
	// ScenarioPortForward times reading through a PortForward stream.
	ScenarioPortForward = "portforward"
	// ScenarioStatus times ContainerStatus and ListContainers with N
	// running pods, and counts the processes the runtime starts meanwhile.
	ScenarioStatus = "status"
)

// Variant names: which namespaces the pods get.
const (
	VariantNetns   = "netns"   // pod netns, host userns
	VariantUserns  = "userns"  // pod netns inside a pod userns
	VariantHostnet = "hostnet" // host network, host userns
)

// Operation names, shared by the table, the JSON and the tests.
const (
	OpRunPodSandbox    = "RunPodSandbox"
	OpPodSandboxStatus = "PodSandboxStatus"
	OpStopPodSandbox   = "StopPodSandbox"
	OpRemovePodSandbox = "RemovePodSandbox"
	OpCreateContainer  = "CreateContainer"
	OpStartContainer   = "StartContainer"
	OpWaitRunning      = "StartContainer→RUNNING"
	OpStopContainer    = "StopContainer"
	OpRemoveContainer  = "RemoveContainer"
	OpPullImage        = "PullImage (setup)"
	OpSandboxE2E       = "sandbox end to end"
	OpPodRunning       = "pod to Running"
	OpPodE2E           = "pod end to end"
	OpRestartCmd       = "restart command"
	OpRestartVersion   = "restart→Version"
	OpRestartReady     = "restart→sandbox Ready, same IPs"
	OpRestartRunning   = "restart→container RUNNING"
	OpRestartAllReady  = "restart→all Ready"
	OpListCtrStats     = "ListContainerStats"
	OpListPodStats     = "ListPodSandboxStats"
	OpContainerStatus  = "ContainerStatus"
	OpContainerStatusV = "ContainerStatus(verbose)"
	OpListContainers   = "ListContainers"
	OpListPodSandbox   = "ListPodSandbox"
)

// Label keys put on every pod and container so that a run's objects can be
// found again (restore, cleanup) on a runtime shared with other workloads.
const (
	LabelRun      = "pinrt-bench.io/run"
	LabelScenario = "pinrt-bench.io/scenario"
)

// Config parameterises a run.
type Config struct {
	N       int    // pods
	P       int    // parallel workers
	Variant string // VariantNetns, VariantUserns or VariantHostnet
	RunID   string // unique per run; NewRunID if empty

	// RPCTimeout bounds every single RPC.
	RPCTimeout time.Duration
	// WaitTimeout bounds waiting for a container to be RUNNING and, in the
	// restore scenario, for the runtime and all sandboxes to come back.
	WaitTimeout time.Duration

	Image   string   // container image (pod, density, restore with containers)
	Command []string // container command
	// Graceful makes the pod scenario stop its containers as kubelet does:
	// the container exits on SIGTERM (GracefulCommand) and StopContainer
	// gives it kubelet's default grace period (StopGrace), where the plain
	// scenario stops with a timeout of 0, a SIGKILL at once.
	Graceful bool
	// Containers is the number of containers in each pod of the density
	// and status scenarios (default 1); kubelet's default node of 110
	// pods with two containers each is status with -n 110 and 2.
	Containers int

	// LogDir, when set, is the parent of every pod's LogDirectory.
	LogDir string

	UsernsBase  uint32 // first host ID handed out to userns pods
	UsernsCount int    // number of 65536-ID blocks available

	Keep bool // density: leave the pods running
	// StatsRounds is how often density lists every container's and pod's
	// stats while its pods run: the cost of kubelet's stats loop at that
	// density. 0 skips it.
	StatsRounds int

	// PID returns the runtime daemon's PID (density RSS). Optional.
	PID func() (int, error)
	// Memory returns the memory of the runtime's processes, the daemon
	// and its monitors (status). Optional.
	Memory func() (RuntimeMemory, error)
	// Settle is waited before the density "after" RSS is read.
	Settle time.Duration

	// Restart restarts the runtime (restore). It returns once the restart
	// has been initiated; the tool measures from its start.
	Restart func(ctx context.Context) error
	// WithContainers adds one running container per pod in restore.
	WithContainers bool

	// CPU, when set, returns the CPU time used so far by the runtime and
	// everything it started (its cgroup); the run reports the difference
	// per pod. Optional.
	CPU func() (time.Duration, error)
	// Streams is the number of streaming execs (exec; default N/10, at
	// least 1, negative: none) or of reads through the port-forward
	// (portforward; default 3).
	Streams int
	// ForwardMB is the size of the file read through the port-forward
	// (default 64).
	ForwardMB int
	// IdleWindow, when set with CPU, makes density measure the CPU used
	// while its pods idle for this long, reported per minute.
	IdleWindow time.Duration

	// DropCaches makes pull drop the kernel's page cache before every
	// pull (root; affects the whole machine).
	DropCaches bool

	// PullSettle makes pull wait this long between removing the image and
	// pulling it again. On ext4 without a journal the inode allocator skips
	// every inode freed in the last 60 s (360 s while its inode table block
	// is dirty), rescanning them for each new file, so a pull of 20 000
	// files right after the removal of the same 20 000 spends seconds of
	// kernel CPU in find_inode_bit: a cost of the remove-then-pull loop,
	// not of a pull onto a node. run.sh avoids it with a journaled root.
	PullSettle time.Duration

	// DaemonLog, when set, is the runtime's log file; the phase timings it
	// logs at debug level during the run are reported per phase.
	DaemonLog string

	// Floor, when set, makes status time its reads again against the
	// runtime's captured replies served by a server that does nothing
	// else (floor.go). Optional.
	Floor StartFloor
}

func (c *Config) defaults() {
	if c.N <= 0 {
		c.N = 1
	}
	if c.P <= 0 {
		c.P = 1
	}
	if c.Variant == "" {
		c.Variant = VariantNetns
	}
	if c.RunID == "" {
		c.RunID = NewRunID()
	}
	if c.RPCTimeout <= 0 {
		c.RPCTimeout = 30 * time.Second
	}
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = time.Minute
	}
	if c.Containers <= 0 {
		c.Containers = 1
	}
	if len(c.Command) == 0 {
		c.Command = []string{"sleep", "3600"}
		if c.Graceful {
			c.Command = GracefulCommand
		}
	}
	if c.UsernsBase == 0 {
		c.UsernsBase = UsernsBlock
	}
	if c.UsernsCount <= 0 {
		c.UsernsCount = 1024
	}
}

// GracefulCommand is the container of a graceful run: a shell, the
// container's init, which exits on SIGTERM (an init without a handler
// ignores it), waiting for a sleep as a server waits for requests.
var GracefulCommand = []string{"sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"}

// StopGrace is the StopContainer timeout of a graceful run, in seconds:
// kubelet's default terminationGracePeriodSeconds.
const StopGrace = 30

// NewRunID returns a short random ID that makes pod names unique per run.
func NewRunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "r" + hex.EncodeToString(b)
}

func newUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40 // version 4, as kubelet's UIDs
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Result is the outcome of one scenario run.
type Result struct {
	Scenario string             `json:"scenario"`
	Variant  string             `json:"variant"`
	N        int                `json:"n"`
	P        int                `json:"p"`
	RunID    string             `json:"run_id"`
	Runtime  string             `json:"runtime,omitempty"`
	Started  time.Time          `json:"started"`
	WallMs   float64            `json:"wall_ms"`
	Ops      []OpSummary        `json:"ops"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	Errors   int                `json:"errors"`
}

type runner struct {
	cfg Config
	c   *Client
	rec *Recorder
	ids *IDAllocator
	// walls overrides the wall time used for throughput of some rows,
	// e.g. the teardown phase of density.
	mu      sync.Mutex
	walls   map[string]time.Duration
	metrics map[string]float64
	// pods is the number of pods the per-pod metrics divide by when it
	// is not cfg.N (exec, portforward: one pod).
	pods int
	// procs counts the processes the daemon starts; nil when it cannot
	// (no PID, not root).
	procs *ProcWatch
}

// Run executes scenario against c. RPC failures are counted in the result;
// the error is only for a run that could not start (bad configuration).
func Run(ctx context.Context, c *Client, scenario string, cfg Config) (*Result, error) {
	cfg.defaults()
	switch cfg.Variant {
	case VariantNetns, VariantUserns, VariantHostnet:
	default:
		return nil, fmt.Errorf("unknown variant %q (want %s, %s or %s)", cfg.Variant, VariantNetns, VariantUserns, VariantHostnet)
	}
	ids, err := NewIDAllocator(cfg.UsernsBase, cfg.UsernsCount)
	if err != nil {
		return nil, err
	}
	if cfg.Variant == VariantUserns && cfg.UsernsCount < min(cfg.N, cfg.P) {
		return nil, fmt.Errorf("userns count %d is below the parallelism %d", cfg.UsernsCount, cfg.P)
	}
	r := &runner{cfg: cfg, c: c, rec: NewRecorder(), ids: ids, walls: map[string]time.Duration{}, metrics: map[string]float64{}}
	res := &Result{Scenario: scenario, Variant: cfg.Variant, N: cfg.N, P: cfg.P, RunID: cfg.RunID, Started: time.Now()}
	res.Runtime = r.version(ctx)

	var cpuBefore time.Duration
	if cfg.CPU != nil {
		if cpuBefore, err = cfg.CPU(); err != nil {
			return nil, fmt.Errorf("read runtime CPU usage: %w", err)
		}
	}
	daemonBefore, daemonPID := time.Duration(-1), 0
	if cfg.PID != nil && cfg.CPU != nil {
		if pid, err := cfg.PID(); err == nil {
			if d, err := ProcessCPU(pid); err == nil {
				daemonBefore, daemonPID = d, pid
			}
		}
	}
	var tail *LogTail
	if cfg.DaemonLog != "" {
		tail = NewLogTail(cfg.DaemonLog)
	}
	procsBefore := r.watchProcs(scenario)
	if r.procs != nil {
		defer r.procs.Close()
	}

	wall, err := r.run(ctx, scenario)
	if err != nil {
		return nil, err
	}
	res.WallMs = ms(wall)
	r.resourceMetrics(cpuBefore, daemonBefore, daemonPID, tail)
	if r.procs != nil {
		r.procMetrics(r.procs.Counts().Sub(procsBefore))
	}
	res.Ops = r.rec.Summaries(wall)
	for i := range res.Ops {
		if w, ok := r.walls[res.Ops[i].Name]; ok {
			res.Ops[i].PerSec = Throughput(res.Ops[i].Count, w)
		}
	}
	res.Errors = r.rec.Errors()
	if len(r.metrics) > 0 {
		res.Metrics = r.metrics
	}
	return res, nil
}

// version asks the runtime for its name and version. A failure is not an
// error of the run: the scenario's first RPCs will fail and be counted.
func (r *runner) version(ctx context.Context) string {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	v, err := r.c.Runtime.Version(rctx, &runtimeapi.VersionRequest{Version: "v1"})
	if err != nil {
		return ""
	}
	return v.GetRuntimeName() + " " + v.GetRuntimeVersion()
}

// resourceMetrics adds the CPU time per pod and the daemon's phase timings.
// The CPU covers the whole run: setup and teardown of every pod, so for the
// sandbox scenario it is the CPU cost of one full pod lifecycle.
func (r *runner) resourceMetrics(cpuBefore, daemonBefore time.Duration, daemonPID int, tail *LogTail) {
	pods := r.cfg.N
	if r.pods > 0 {
		pods = r.pods
	}
	if r.cfg.CPU != nil {
		if after, err := r.cfg.CPU(); err == nil {
			cpu := after - cpuBefore
			r.setMetric("cpu_total_ms", ms(cpu))
			r.setMetric("cpu_ms_per_pod", ms(cpu)/float64(pods))
		}
	}
	// The daemon's own share (same PID before and after: no restart).
	if daemonBefore >= 0 {
		if pid, err := r.cfg.PID(); err == nil && pid == daemonPID {
			if after, err := ProcessCPU(pid); err == nil {
				r.setMetric("cpu_daemon_ms_per_pod", ms(after-daemonBefore)/float64(pods))
			}
		}
	}
	if tail != nil {
		if phases, err := tail.Phases(); err == nil {
			phaseMetrics(phases, r.setMetric)
		}
	}
}

func (r *runner) setMetric(k string, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.metrics[k] = v
}

// forEach runs f(i) for i in [0,n) on p workers and returns the wall time.
// Workers stop picking up new indexes once ctx is done.
func forEach(ctx context.Context, n, p int, f func(i int)) time.Duration {
	start := time.Now()
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(p, n) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return time.Since(start)
}

// benchPod is one pod created by the tool.
type benchPod struct {
	idx        int
	id         string
	hostID     uint32 // userns block, 0 without userns
	config     *runtimeapi.PodSandboxConfig
	containers []string
	ips        []string
}

func (r *runner) nsOptions(hostID uint32) *runtimeapi.NamespaceOption {
	ns := &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD}
	switch r.cfg.Variant {
	case VariantHostnet:
		ns.Network = runtimeapi.NamespaceMode_NODE
	case VariantUserns:
		ns.UsernsOptions = UsernsOption(hostID)
	}
	if ns.UsernsOptions == nil {
		ns.UsernsOptions = &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_NODE}
	}
	return ns
}

func (r *runner) podConfig(scenario string, i int, hostID uint32) *runtimeapi.PodSandboxConfig {
	name := fmt.Sprintf("%s-%s-%d", scenario, r.cfg.RunID, i)
	md := &runtimeapi.PodSandboxMetadata{Name: name, Uid: newUID(), Namespace: "bench-" + r.cfg.RunID}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: md,
		Labels:   map[string]string{LabelRun: r.cfg.RunID, LabelScenario: scenario},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: r.nsOptions(hostID)},
		},
	}
	if r.cfg.Variant != VariantHostnet {
		cfg.Hostname = name
	}
	if r.cfg.LogDir != "" {
		// kubelet's layout: /var/log/pods/<namespace>_<name>_<uid>.
		cfg.LogDirectory = fmt.Sprintf("%s/%s_%s_%s", r.cfg.LogDir, md.Namespace, md.Name, md.Uid)
	}
	return cfg
}

// cleanupCtx detaches teardown from a cancelled run so an interrupted run
// still removes what it created; each RPC keeps its own timeout.
func cleanupCtx(ctx context.Context) context.Context {
	return context.WithoutCancel(ctx)
}

func (r *runner) runSandbox(ctx context.Context, scenario string, i int) (*benchPod, error) {
	p := &benchPod{idx: i}
	if r.cfg.Variant == VariantUserns {
		id, err := r.ids.Acquire()
		if err != nil {
			r.rec.Fail(OpRunPodSandbox, err)
			return nil, err
		}
		p.hostID = id
	}
	p.config = r.podConfig(scenario, i, p.hostID)
	err := r.rec.timed(OpRunPodSandbox, func() error {
		// kubelet creates the pod's log directory before RunPodSandbox.
		if d := p.config.LogDirectory; d != "" {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("pod log directory: %w", err)
			}
		}
		rctx, cancel := r.c.rpc(ctx)
		defer cancel()
		resp, err := r.c.Runtime.RunPodSandbox(rctx, &runtimeapi.RunPodSandboxRequest{Config: p.config})
		if err != nil {
			return err
		}
		p.id = resp.GetPodSandboxId()
		return nil
	})
	if err != nil {
		r.ids.Release(p.hostID)
		return nil, err
	}
	return p, nil
}

// sandboxStatus returns the sandbox's IPs; a sandbox that is not READY is
// an error.
func (r *runner) sandboxStatus(ctx context.Context, p *benchPod) ([]string, error) {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	resp, err := r.c.Runtime.PodSandboxStatus(rctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		return nil, err
	}
	st := resp.GetStatus()
	if st.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil, fmt.Errorf("sandbox %s is %s, want SANDBOX_READY", p.id, st.GetState())
	}
	var ips []string
	if ip := st.GetNetwork().GetIp(); ip != "" {
		ips = append(ips, ip)
	}
	for _, a := range st.GetNetwork().GetAdditionalIps() {
		ips = append(ips, a.GetIp())
	}
	return ips, nil
}

// removeSandbox stops and removes a sandbox, timing both; both are tried
// even if the stop fails, because a remove should still clean up.
func (r *runner) removeSandbox(ctx context.Context, p *benchPod) error {
	ctx = cleanupCtx(ctx)
	errStop := r.rec.timed(OpStopPodSandbox, func() error {
		rctx, cancel := r.c.rpc(ctx)
		defer cancel()
		_, err := r.c.Runtime.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.id})
		return err
	})
	errRm := r.rec.timed(OpRemovePodSandbox, func() error {
		rctx, cancel := r.c.rpc(ctx)
		defer cancel()
		_, err := r.c.Runtime.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.id})
		return err
	})
	if errRm == nil && p.config.LogDirectory != "" {
		// kubelet removes a deleted pod's logs too.
		_ = os.RemoveAll(p.config.LogDirectory)
	}
	if errRm == nil {
		// Only a removed sandbox gives its ID range back; reusing the range
		// of a sandbox that still exists would be rejected as overlapping.
		r.ids.Release(p.hostID)
	}
	return errors.Join(errStop, errRm)
}

// startContainer creates and starts container number k of p and waits
// until the runtime reports it RUNNING.
func (r *runner) startContainer(ctx context.Context, p *benchPod, k int) error {
	ns := p.config.GetLinux().GetSecurityContext().GetNamespaceOptions()
	name := fmt.Sprintf("c%d", k)
	cc := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: r.cfg.Image, UserSpecifiedImage: r.cfg.Image},
		Command:  r.cfg.Command,
		Labels:   p.config.Labels,
		Linux: &runtimeapi.LinuxContainerConfig{
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{NamespaceOptions: ns},
		},
	}
	if p.config.LogDirectory != "" {
		// kubelet's layout, <pod log dir>/<container name>/<restart>.log;
		// kubelet creates the container's directory, the runtime only the
		// file (CRI-O's CreateContainer fails without the directory).
		cc.LogPath = name + "/0.log"
		if err := os.MkdirAll(filepath.Join(p.config.LogDirectory, name), 0o755); err != nil {
			r.rec.Fail(OpCreateContainer, err)
			return err
		}
	}
	var id string
	err := r.rec.timed(OpCreateContainer, func() error {
		rctx, cancel := r.c.rpc(ctx)
		defer cancel()
		resp, err := r.c.Runtime.CreateContainer(rctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, Config: cc, SandboxConfig: p.config})
		if err != nil {
			return err
		}
		id = resp.GetContainerId()
		return nil
	})
	if err != nil {
		return err
	}
	p.containers = append(p.containers, id)
	err = r.rec.timed(OpStartContainer, func() error {
		rctx, cancel := r.c.rpc(ctx)
		defer cancel()
		_, err := r.c.Runtime.StartContainer(rctx, &runtimeapi.StartContainerRequest{ContainerId: id})
		return err
	})
	if err != nil {
		return err
	}
	return r.rec.timed(OpWaitRunning, func() error { return r.waitRunning(ctx, id) })
}

// pollInterval is how often state is polled while waiting; short enough not
// to dominate a container start of a few tens of milliseconds.
const pollInterval = 5 * time.Millisecond

func (r *runner) waitRunning(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.WaitTimeout)
	defer cancel()
	for {
		st, err := r.containerState(ctx, id)
		if err != nil {
			return err
		}
		switch st {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			return nil
		case runtimeapi.ContainerState_CONTAINER_EXITED, runtimeapi.ContainerState_CONTAINER_UNKNOWN:
			return fmt.Errorf("container %s is %s, want CONTAINER_RUNNING", id, st)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container %s still %s after %s: %w", id, st, r.cfg.WaitTimeout, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

func (r *runner) containerState(ctx context.Context, id string) (runtimeapi.ContainerState, error) {
	rctx, cancel := r.c.rpc(ctx)
	defer cancel()
	resp, err := r.c.Runtime.ContainerStatus(rctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return 0, err
	}
	return resp.GetStatus().GetState(), nil
}

// removeContainers stops and removes every container of p.
func (r *runner) removeContainers(ctx context.Context, p *benchPod) error {
	ctx = cleanupCtx(ctx)
	var errs []error
	for _, id := range p.containers {
		errs = append(errs, r.rec.timed(OpStopContainer, func() error {
			rctx, cancel := r.c.rpc(ctx)
			defer cancel()
			req := &runtimeapi.StopContainerRequest{ContainerId: id}
			if r.cfg.Graceful {
				req.Timeout = StopGrace
			}
			_, err := r.c.Runtime.StopContainer(rctx, req)
			return err
		}))
		errs = append(errs, r.rec.timed(OpRemoveContainer, func() error {
			rctx, cancel := r.c.rpc(ctx)
			defer cancel()
			_, err := r.c.Runtime.RemoveContainer(rctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
			return err
		}))
	}
	p.containers = nil
	return errors.Join(errs...)
}

// teardown removes the containers and then the sandbox of p.
func (r *runner) teardown(ctx context.Context, p *benchPod) error {
	return errors.Join(r.removeContainers(ctx, p), r.removeSandbox(ctx, p))
}

// ensureImage pulls the image once, before any timing, if the runtime does
// not have it. A failure is counted; the container operations that follow
// will fail and be counted too, which makes the cause obvious in the table.
func (r *runner) ensureImage(ctx context.Context) {
	spec := &runtimeapi.ImageSpec{Image: r.cfg.Image}
	err := r.rec.timed(OpPullImage, func() error {
		if r.cfg.Image == "" {
			return errors.New("no image given (--image)")
		}
		rctx, cancel := r.c.rpc(ctx)
		st, err := r.c.Image.ImageStatus(rctx, &runtimeapi.ImageStatusRequest{Image: spec})
		cancel()
		if err == nil && st.GetImage() != nil {
			return nil
		}
		// A pull may legitimately take longer than one ordinary RPC.
		pctx, cancel := context.WithTimeout(ctx, max(r.cfg.RPCTimeout, 5*time.Minute))
		defer cancel()
		_, err = r.c.Image.PullImage(pctx, &runtimeapi.PullImageRequest{Image: spec})
		return err
	})
	_ = err
}

func (r *runner) sandbox(ctx context.Context) time.Duration {
	r.rec.Declare(OpRunPodSandbox, OpPodSandboxStatus, OpStopPodSandbox, OpRemovePodSandbox)
	r.rec.DeclareAggregate(OpSandboxE2E)
	return forEach(ctx, r.cfg.N, r.cfg.P, func(i int) {
		start := time.Now()
		p, err := r.runSandbox(ctx, ScenarioSandbox, i)
		if err != nil {
			r.rec.Fail(OpSandboxE2E, err)
			return
		}
		errSt := r.rec.timed(OpPodSandboxStatus, func() error {
			_, err := r.sandboxStatus(ctx, p)
			return err
		})
		if err := errors.Join(errSt, r.removeSandbox(ctx, p)); err != nil {
			r.rec.Fail(OpSandboxE2E, err)
			return
		}
		r.rec.Observe(OpSandboxE2E, time.Since(start))
	})
}

func (r *runner) declarePodOps() {
	r.rec.Declare(OpPullImage, OpRunPodSandbox, OpCreateContainer, OpStartContainer, OpWaitRunning,
		OpStopContainer, OpRemoveContainer, OpStopPodSandbox, OpRemovePodSandbox)
	r.rec.DeclareAggregate(OpPodRunning, OpPodE2E)
}

// startPod runs a sandbox with cfg.Containers running containers and
// records "pod to Running". On failure, whatever was created is torn down.
func (r *runner) startPod(ctx context.Context, scenario string, i int, start time.Time) (*benchPod, error) {
	p, err := r.runSandbox(ctx, scenario, i)
	if err != nil {
		r.rec.Fail(OpPodRunning, err)
		return nil, err
	}
	for k := range r.cfg.Containers {
		if err := r.startContainer(ctx, p, k); err != nil {
			r.rec.Fail(OpPodRunning, err)
			return nil, errors.Join(err, r.teardown(ctx, p))
		}
	}
	r.rec.Observe(OpPodRunning, time.Since(start))
	return p, nil
}

func (r *runner) pod(ctx context.Context) time.Duration {
	r.declarePodOps()
	r.ensureImage(ctx)
	return forEach(ctx, r.cfg.N, r.cfg.P, func(i int) {
		start := time.Now()
		p, err := r.startPod(ctx, ScenarioPod, i, start)
		if err != nil {
			r.rec.Fail(OpPodE2E, err)
			return
		}
		if err := r.teardown(ctx, p); err != nil {
			r.rec.Fail(OpPodE2E, err)
			return
		}
		r.rec.Observe(OpPodE2E, time.Since(start))
	})
}

// startPods starts cfg.N pods (with containers if withContainers) and
// returns the ones that came up, ordered by index.
func (r *runner) startPods(ctx context.Context, scenario string, withContainers bool) ([]*benchPod, time.Duration) {
	var mu sync.Mutex
	var pods []*benchPod
	wall := forEach(ctx, r.cfg.N, r.cfg.P, func(i int) {
		start := time.Now()
		var p *benchPod
		var err error
		if withContainers {
			p, err = r.startPod(ctx, scenario, i, start)
		} else {
			p, err = r.runSandbox(ctx, scenario, i)
		}
		if err != nil {
			return
		}
		mu.Lock()
		pods = append(pods, p)
		mu.Unlock()
	})
	slices.SortFunc(pods, func(a, b *benchPod) int { return a.idx - b.idx })
	return pods, wall
}

// teardownAll removes pods in parallel and returns the wall time.
func (r *runner) teardownAll(ctx context.Context, pods []*benchPod) time.Duration {
	wall := forEach(cleanupCtx(ctx), len(pods), r.cfg.P, func(i int) {
		_ = r.teardown(ctx, pods[i])
	})
	r.walls[OpStopContainer] = wall
	r.walls[OpRemoveContainer] = wall
	r.walls[OpStopPodSandbox] = wall
	r.walls[OpRemovePodSandbox] = wall
	r.setMetric("teardown_wall_ms", ms(wall))
	return wall
}

func (r *runner) density(ctx context.Context) time.Duration {
	r.rec.Declare(OpPullImage, OpRunPodSandbox, OpCreateContainer, OpStartContainer, OpWaitRunning)
	r.rec.DeclareAggregate(OpPodRunning)
	r.ensureImage(ctx)
	before, errBefore := r.rss()
	pods, wall := r.startPods(ctx, ScenarioDensity, true)
	r.setMetric("pods_running", float64(len(pods)))
	if r.cfg.Settle > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.Settle):
		}
	}
	after, errAfter := r.rss()
	r.idleCPU(ctx)
	r.listStats(ctx)
	switch {
	case r.cfg.PID == nil:
	case errBefore != nil || errAfter != nil:
		r.rec.Fail("runtime RSS", errors.Join(errBefore, errAfter))
	default:
		r.setMetric("rss_before_kib", float64(before))
		r.setMetric("rss_after_kib", float64(after))
		if len(pods) > 0 {
			r.setMetric("rss_per_pod_kib", float64(after-before)/float64(len(pods)))
		}
	}
	if !r.cfg.Keep {
		r.teardownAll(ctx, pods)
	}
	return wall
}

// listStats times ListContainerStats and ListPodSandboxStats over all the
// running pods, one call at a time as kubelet makes them.
func (r *runner) listStats(ctx context.Context) {
	if r.cfg.StatsRounds <= 0 {
		return
	}
	r.rec.Declare(OpListCtrStats, OpListPodStats)
	start := time.Now()
	for range r.cfg.StatsRounds {
		_ = r.rec.timed(OpListCtrStats, func() error {
			rctx, cancel := r.c.rpc(ctx)
			defer cancel()
			_, err := r.c.Runtime.ListContainerStats(rctx, &runtimeapi.ListContainerStatsRequest{})
			return err
		})
		_ = r.rec.timed(OpListPodStats, func() error {
			rctx, cancel := r.c.rpc(ctx)
			defer cancel()
			_, err := r.c.Runtime.ListPodSandboxStats(rctx, &runtimeapi.ListPodSandboxStatsRequest{})
			return err
		})
	}
	wall := time.Since(start)
	r.mu.Lock()
	r.walls[OpListCtrStats], r.walls[OpListPodStats] = wall, wall
	r.mu.Unlock()
}

func (r *runner) rss() (int64, error) {
	if r.cfg.PID == nil {
		return 0, nil
	}
	pid, err := r.cfg.PID()
	if err != nil {
		return 0, err
	}
	return ReadRSS(pid)
}

// idleCPU measures the CPU the runtime uses over cfg.IdleWindow while the
// density pods are up and nothing is asked of it: the cgroup's (the daemon
// and all it left there, e.g. conmon) and, with a PID, the daemon's own,
// both scaled to one minute.
func (r *runner) idleCPU(ctx context.Context) {
	if r.cfg.IdleWindow <= 0 || r.cfg.CPU == nil {
		return
	}
	cgBefore, err := r.cfg.CPU()
	if err != nil {
		r.rec.Fail("idle CPU", err)
		return
	}
	pid, daemonBefore := 0, time.Duration(-1)
	if r.cfg.PID != nil {
		if p, err := r.cfg.PID(); err == nil {
			if d, err := ProcessCPU(p); err == nil {
				pid, daemonBefore = p, d
			}
		}
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(r.cfg.IdleWindow):
	}
	window := time.Since(start)
	cgAfter, err := r.cfg.CPU()
	if err != nil {
		r.rec.Fail("idle CPU", err)
		return
	}
	r.setMetric("idle_window_s", window.Seconds())
	r.setMetric("idle_cpu_ms_per_min", PerMinute(cgAfter-cgBefore, window))
	if daemonBefore >= 0 {
		if after, err := ProcessCPU(pid); err == nil {
			r.setMetric("idle_daemon_cpu_ms_per_min", PerMinute(after-daemonBefore, window))
		}
	}
}

// PerMinute scales the CPU time used over window to milliseconds per
// minute.
func PerMinute(cpu, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return ms(cpu) * float64(time.Minute) / float64(window)
}

// run runs scenario and returns its wall time.
func (r *runner) run(ctx context.Context, scenario string) (time.Duration, error) {
	switch scenario {
	case ScenarioSandbox:
		return r.sandbox(ctx), nil
	case ScenarioPod:
		return r.pod(ctx), nil
	case ScenarioDensity:
		return r.density(ctx), nil
	case ScenarioRestore:
		if r.cfg.Restart == nil {
			return 0, errors.New("restore needs a restart command")
		}
		return r.restore(ctx), nil
	case ScenarioExec:
		return r.exec(ctx), nil
	case ScenarioPortForward:
		return r.portforward(ctx), nil
	case ScenarioStatus:
		return r.status(ctx), nil
	case ScenarioPull:
		return r.pull(ctx), nil
	}
	return 0, fmt.Errorf("unknown scenario %q", scenario)
}

// watchProcs starts counting the daemon's processes when its PID is
// known and the process events connector is there (root), and returns
// the counts before the scenario. The restore scenario restarts the
// daemon, whose successor would not be watched: it is not counted.
func (r *runner) watchProcs(scenario string) ProcCounts {
	if r.cfg.PID == nil || scenario == ScenarioRestore {
		return ProcCounts{}
	}
	pid, err := r.cfg.PID()
	if err != nil {
		return ProcCounts{}
	}
	w, err := WatchProcs(pid)
	if err != nil {
		return ProcCounts{}
	}
	r.procs = w
	return w.Counts()
}

// procMetrics reports the processes the daemon started per pod (forks,
// threads not counted) and the commands it ran per pod, as
// execs_per_pod.<command>, e.g. execs_per_pod.runc_state; with
// taskstats, also the CPU time of those that exited, per pod, as
// exec_cpu_ms_per_pod.<command> (a container's own process is there too,
// under its command, when it exited during the run).
func (r *runner) procMetrics(d ProcCounts) {
	pods := r.cfg.N
	if r.pods > 0 {
		pods = r.pods
	}
	r.setMetric("procs_per_pod", float64(d.Forks)/float64(pods))
	for k, v := range d.Execs {
		r.setMetric("execs_per_pod."+strings.ReplaceAll(k, " ", "_"), float64(v)/float64(pods))
	}
	for k, v := range d.CPU {
		r.setMetric("exec_cpu_ms_per_pod."+strings.ReplaceAll(k, " ", "_"), ms(v)/float64(pods))
	}
	if d.Lost > 0 {
		r.setMetric("procs_events_lost", float64(d.Lost))
	}
}

// status starts N pods with a running container, then, one call at a
// time as kubelet's pod workers make them, reads every container's
// status (plain and verbose) and lists all containers, cfg.StatsRounds
// times (default 5). status_procs_started counts the processes the runtime
// started during the reads: a status read should start none.
func (r *runner) status(ctx context.Context) time.Duration {
	r.rec.Declare(OpPullImage, OpRunPodSandbox, OpCreateContainer, OpStartContainer, OpWaitRunning,
		OpContainerStatus, OpContainerStatusV, OpListContainers, OpListPodSandbox, OpListCtrStats,
		OpStopContainer, OpRemoveContainer, OpStopPodSandbox, OpRemovePodSandbox)
	if r.cfg.Floor != nil {
		r.rec.Declare(OpContainerStatusFloor, OpContainerStatusVFloor, OpListContainersFloor, OpListPodSandboxFloor, OpListCtrStatsFloor)
	}
	r.rec.DeclareAggregate(OpPodRunning)
	r.ensureImage(ctx)
	pods, _ := r.startPods(ctx, ScenarioStatus, true)
	r.setMetric("pods_running", float64(len(pods)))
	rounds := r.cfg.StatsRounds
	if rounds <= 0 {
		rounds = 5
	}
	// The floor's rounds alternate with the runtime's, so that the host's
	// load, settling after the start of every pod, weighs on both alike.
	floor, stopFloor := r.startFloor(ctx, pods)
	defer stopFloor()
	var before ProcCounts
	if r.procs != nil {
		before = r.procs.Counts()
	}
	var wall, floorWall time.Duration
	for range rounds {
		start := time.Now()
		r.readRound(ctx, r.c, pods, "", true)
		wall += time.Since(start)
		if floor != nil {
			start = time.Now()
			r.readRound(ctx, floor, pods, floorSuffix, true)
			floorWall += time.Since(start)
		}
	}
	r.memoryMetrics(len(pods) * r.cfg.Containers)
	if r.procs != nil {
		d := r.procs.Counts().Sub(before)
		r.setMetric("status_procs_started", float64(d.Forks))
	}
	r.setWalls(wall, OpContainerStatus, OpContainerStatusV, OpListContainers, OpListPodSandbox, OpListCtrStats)
	r.setWalls(floorWall, OpContainerStatusFloor, OpContainerStatusVFloor, OpListContainersFloor, OpListPodSandboxFloor, OpListCtrStatsFloor)
	stopFloor()
	r.teardownAll(ctx, pods)
	return wall
}

// readRound times one round of the reads kubelet makes of a node through
// c: every container's status, plain and verbose, then ListContainers,
// ListPodSandbox and, with stats, ListContainerStats. suffix is added to
// the op names.
func (r *runner) readRound(ctx context.Context, c *Client, pods []*benchPod, suffix string, stats bool) {
	status := func(op, id string, verbose bool) {
		_ = r.rec.timed(op, func() error {
			rctx, cancel := c.rpc(ctx)
			defer cancel()
			resp, err := c.Runtime.ContainerStatus(rctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
			if err == nil && resp.GetStatus().GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
				err = fmt.Errorf("container %s is %s, want CONTAINER_RUNNING", id, resp.GetStatus().GetState())
			}
			return err
		})
	}
	for _, p := range pods {
		for _, id := range p.containers {
			status(OpContainerStatus+suffix, id, false)
			status(OpContainerStatusV+suffix, id, true)
		}
	}
	_ = r.rec.timed(OpListContainers+suffix, func() error {
		rctx, cancel := c.rpc(ctx)
		defer cancel()
		resp, err := c.Runtime.ListContainers(rctx, &runtimeapi.ListContainersRequest{})
		if want := len(pods) * r.cfg.Containers; err == nil && len(resp.GetContainers()) < want {
			err = fmt.Errorf("ListContainers listed %d containers, want at least %d", len(resp.GetContainers()), want)
		}
		return err
	})
	// kubelet's PLEG relists the pods every second, and its stats
	// loop lists every container's stats.
	_ = r.rec.timed(OpListPodSandbox+suffix, func() error {
		rctx, cancel := c.rpc(ctx)
		defer cancel()
		resp, err := c.Runtime.ListPodSandbox(rctx, &runtimeapi.ListPodSandboxRequest{})
		if err == nil && len(resp.GetItems()) < len(pods) {
			err = fmt.Errorf("ListPodSandbox listed %d pods, want at least %d", len(resp.GetItems()), len(pods))
		}
		return err
	})
	if !stats {
		return
	}
	_ = r.rec.timed(OpListCtrStats+suffix, func() error {
		rctx, cancel := c.rpc(ctx)
		defer cancel()
		_, err := c.Runtime.ListContainerStats(rctx, &runtimeapi.ListContainerStatsRequest{})
		return err
	})
}

// startFloor captures the runtime's replies to the reads, starts a floor
// server for them (see floor.go) and returns a client of it; nil without
// cfg.Floor or when that fails (counted as an error of the floor). The
// stop function may be called more than once.
func (r *runner) startFloor(ctx context.Context, pods []*benchPod) (*Client, func()) {
	if r.cfg.Floor == nil {
		return nil, func() {}
	}
	var ids []string
	for _, p := range pods {
		ids = append(ids, p.containers...)
	}
	rep, err := CaptureFloor(ctx, r.c, ids)
	if err != nil {
		r.rec.Fail(OpListContainersFloor, fmt.Errorf("capturing the replies: %w", err))
		return nil, func() {}
	}
	r.setMetric("list_containers_reply_bytes", float64(len(rep.ListContainers)))
	r.setMetric("list_container_stats_reply_bytes", float64(len(rep.ListCtrStats)))
	if b, ok := rep.Status[firstOf(ids)]; ok {
		r.setMetric("container_status_reply_bytes", float64(len(b)))
	}
	endpoint, stop, err := r.cfg.Floor(ctx, rep)
	if err != nil {
		r.rec.Fail(OpListContainersFloor, fmt.Errorf("starting the floor server: %w", err))
		return nil, func() {}
	}
	c, err := Dial(endpoint, r.cfg.RPCTimeout)
	if err != nil {
		stop()
		r.rec.Fail(OpListContainersFloor, err)
		return nil, func() {}
	}
	var once sync.Once
	return c, func() {
		once.Do(func() {
			_ = c.Close()
			stop()
		})
	}
}

func firstOf(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// setWalls makes wall the time the throughput of ops is computed over.
func (r *runner) setWalls(wall time.Duration, ops ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, op := range ops {
		r.walls[op] = wall
	}
}

// memoryMetrics reports the daemon's RSS and the PSS of the runtime's
// processes (the daemon and its monitors) while the pods run.
func (r *runner) memoryMetrics(containers int) {
	if rss, err := r.rss(); err != nil {
		r.rec.Fail("runtime RSS", err)
	} else if rss > 0 {
		r.setMetric("daemon_rss_kib", float64(rss))
	}
	if r.cfg.Memory == nil {
		return
	}
	m, err := r.cfg.Memory()
	if err != nil {
		r.rec.Fail("runtime memory", err)
		return
	}
	r.setMetric("runtime_procs", float64(m.Procs))
	r.setMetric("runtime_pss_kib", float64(m.PSSKiB))
	r.setMetric("runtime_rss_kib", float64(m.RSSKiB))
	if containers > 0 {
		r.setMetric("runtime_pss_per_container_kib", float64(m.PSSKiB)/float64(containers))
	}
}
