package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/testimage"
)

// The chaos test runs pod and container lifecycles concurrently, as
// kubelet and crictl drive them, SIGKILLs the daemon at a random instant,
// starts it again and checks after every restart that the disk claims no
// more than is true. At the end it removes everything over CRI and counts
// what is left: zero is the only pass.
//
// CHAOS_ITERATIONS sets the number of kills (default 30, the short run of
// `make test`; `make chaos` runs 200). CHAOS_SEED replays a run: the seed
// is printed at the start and on failure.

const chaosWorkers = 4

type chaos struct {
	t       *testing.T
	d       *Daemon
	image   string
	cgroup  string // the daemon's cgroup parent, private to the test
	runRoot string // runc's --root
	share   string // the host directory the NRI plugin binds in
	archive string // where the workers' checkpoints go
	rng     *rand.Rand

	mu         sync.Mutex
	violations []string
	failures   []string // every failure, repeated at the very end
	ops, okOps int
	firstErr   error
}

// fail records a failure and reports it. The daemon's log, dumped when a
// test fails, follows the test's own messages and runs to thousands of
// lines; failures are listed again after it, where a truncated CI log
// still shows them.
func (c *chaos) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	c.failures = append(c.failures, msg)
	c.t.Error(msg)
}

func (c *chaos) violate(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	c.violations = append(c.violations, msg)
	c.failures = append(c.failures, "invariant: "+msg)
	c.t.Errorf("invariant: %s", msg)
}

func envInt(name string, def int64) int64 {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return def
}

func TestChaos(t *testing.T) {
	RequireRoot(t)
	for _, b := range []string{"/usr/local/bin/runc", "/usr/bin/conmon"} {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("the chaos test needs %s (make deps): %v", b, err)
		}
	}
	iterations := int(envInt("CHAOS_ITERATIONS", 30))
	seed := envInt("CHAOS_SEED", time.Now().UnixNano())
	t.Logf("CHAOS_SEED=%d CHAOS_ITERATIONS=%d", seed, iterations)
	c := &chaos{t: t, rng: rand.New(rand.NewSource(seed))}
	// Registered first, so it runs last: after the daemon's log dump.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		t.Logf("chaos failed (replay with CHAOS_SEED=%d CHAOS_ITERATIONS=%d); failures:\n%s", seed, iterations, strings.Join(c.failures, "\n"))
	})

	cg := "/pinrt-chaos-" + randHex(4)
	cfg := fmt.Sprintf(`[runtime]
conmon = "/usr/bin/conmon"
cgroup_parent = %q
[runtime.runtimes.runc]
binary = "/usr/local/bin/runc"
`, cg)
	d := StartDaemon(t, Options{Network: true, Config: cfg})
	reg := testimage.StartRegistry(t)
	c.d, c.cgroup, c.runRoot = d, cg, filepath.Join(d.RunRoot, "runtime", "runc")
	// Every container asks for a CDI device; the NRI plugin binds this
	// directory into every container it adjusts.
	if err := os.WriteFile(filepath.Join(d.CDIDir, "chaos.json"), []byte(chaosCDISpec), 0o644); err != nil {
		t.Fatal(err)
	}
	c.share, c.archive = filepath.Join(d.Dir, "chaos-share"), filepath.Join(d.Dir, "chaos-checkpoints")
	if err := os.MkdirAll(c.archive, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(c.share, 0o755); err != nil {
		t.Fatal(err)
	}
	c.image = reg.Push(t, "busybox:1", testimage.Busybox(t))
	if _, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: c.image}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupTree(cg) })

	for i := 0; i < iterations; i++ {
		c.round(i, seed)
		if len(c.violations) > 20 {
			c.fail("stopping after %d violations", len(c.violations))
			t.FailNow()
		}
	}
	c.removeAll(true)
	c.checkArchives()
	// A conmon or runc process can take a moment to exit after the call
	// that ended its container returned; only what stays is a leak.
	leaks := c.leaks()
	if len(leaks) > 0 {
		t.Logf("%d leftovers right after the cleanup, waiting for them to go:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
	for deadline := time.Now().Add(10 * time.Second); len(leaks) > 0 && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		leaks = c.leaks()
	}
	t.Logf("chaos: seed %d, %d kills, %d operations (%d succeeded), %d invariant violations, %d leaks", seed, iterations, c.ops, c.okOps, len(c.violations), len(leaks))
	if c.firstErr != nil {
		t.Logf("first failed operation while the daemon ran: %v", c.firstErr)
	}
	if len(leaks) > 0 {
		c.fail("%d leaks:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
}

// round lets the workers run, kills the daemon at a random instant,
// restarts it and checks the invariants.
func (c *chaos) round(i int, seed int64) {
	t := c.t
	// An NRI plugin adjusting every container is connected while the
	// daemon is killed: crash consistency must hold with plugins too. It
	// exits with the daemon's connection, and a new one syncs with what
	// the restart restored. (Without a way to build it, as in test/vm
	// without PINRT_E2E_NRIPLUGIN, the rounds run without.)
	// In one round of three the plugin hangs on a container creation
	// (pinrt disconnects it after plugin_request_timeout), in another it
	// crashes in the middle of one of its first creations; the workers
	// go on meanwhile.
	if nriPluginUsable() {
		args := []string{"-env", "CHAOS_NRI=1", "-annotation", "chaos.example.com/nri=1",
			"-mount", c.share + ":/chaos-share", "-device", "/dev/chaos-null:1:3"}
		switch i % 3 {
		case 1:
			args = append(args, "-hang", "c")
		case 2:
			args = append(args, "-crash-after", strconv.Itoa(1+c.rng.Intn(4)))
		}
		startNRIPlugin(t, c.d, fmt.Sprintf("chaos-%d", i), args...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := c.d.Runtime
	var wg sync.WaitGroup
	for w := 0; w < chaosWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c.worker(ctx, rt, w, i, rand.New(rand.NewSource(seed+int64(i*chaosWorkers+w))))
		}(w)
	}
	time.Sleep(time.Duration(50+c.rng.Intn(2500)) * time.Millisecond)
	cancel()
	c.d.Kill()
	wg.Wait()
	// In one round of three the first start is killed too, most often in
	// the middle of restoring (tearing down, finishing stops and
	// updates) what the kill left: the next start must finish that.
	if c.rng.Intn(3) == 0 {
		delay := time.Duration(c.rng.Intn(600)) * time.Millisecond
		if err := c.d.KillDuringStart(delay); err != nil {
			c.fail("round %d: start killed after %v: %v", i, delay, err)
			t.FailNow()
		}
		t.Logf("round %d: killed the next start after %v", i, delay)
	}
	start := time.Now()
	if err := c.restart(); err != nil {
		c.fail("round %d: restart: %v", i, err)
		t.FailNow()
	}
	t.Logf("round %d: restarted in %v", i, time.Since(start).Round(time.Millisecond))
	c.checkInvariants(i)
	// Some pods survive several restarts; too many would only load the
	// machine.
	pods, _ := c.d.Runtime.ListPodSandbox(context.Background(), &runtimeapi.ListPodSandboxRequest{})
	if c.rng.Intn(2) == 0 || len(pods.GetItems()) > 8 {
		c.removeAll(false)
	}
}

// restart starts the daemon again, once: a start refused is a failure.
// A killed daemon's run-dir lock can outlive it for a moment (a child
// between fork and exec still holds the descriptor); the daemon waits
// for such a lock itself, so no retry here hides a refusal.
func (c *chaos) restart() error {
	if err := c.d.Start(); err != nil {
		return fmt.Errorf("%w\nlock holders: %s", err, lockHolders(filepath.Join(c.d.RunRoot, "pinrt.lock")))
	}
	return nil
}

// lockHolders describes the processes holding a flock on path.
func lockHolders(path string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return err.Error()
	}
	locks, _ := os.ReadFile("/proc/locks")
	var out []string
	for _, l := range strings.Split(string(locks), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 || !strings.HasSuffix(f[5], ":"+strconv.FormatUint(st.Ino, 10)) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", f[4], "cmdline"))
		status, _ := os.ReadFile(filepath.Join("/proc", f[4], "status"))
		state := ""
		for _, sl := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(sl, "State:") || strings.HasPrefix(sl, "PPid:") {
				state += strings.TrimSpace(sl) + " "
			}
		}
		out = append(out, fmt.Sprintf("pid %s %s(%s)", f[4], state, bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
	}
	return strings.Join(out, "; ")
}

// worker runs whole lifecycles until ctx ends. Errors are expected once
// the daemon is killed; the invariants judge the outcome.
func (c *chaos) worker(ctx context.Context, rt runtimeapi.RuntimeServiceClient, w, round int, rng *rand.Rand) {
	for n := 0; ctx.Err() == nil; n++ {
		name := fmt.Sprintf("chaos-w%d-r%d-%d", w, round, n)
		pod := PodConfig(name)
		if w%2 == 0 {
			pod = UsernsPod(pod, 0)
		}
		pod.LogDirectory = filepath.Join(c.d.Dir, "logs", name)
		call := func(f func(context.Context) error) bool {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			err := f(cctx)
			c.mu.Lock()
			c.ops++
			if err == nil {
				c.okOps++
			} else if c.firstErr == nil && ctx.Err() == nil {
				c.firstErr = err
			}
			c.mu.Unlock()
			return err == nil
		}
		var podID, ctrID string
		ok := call(func(ctx context.Context) error {
			r, err := rt.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: pod})
			if err == nil {
				podID = r.PodSandboxId
			}
			return err
		})
		ok = ok && call(func(ctx context.Context) error {
			r, err := rt.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: podID, SandboxConfig: pod, Config: &runtimeapi.ContainerConfig{
				Metadata:   &runtimeapi.ContainerMetadata{Name: "c"},
				Image:      &runtimeapi.ImageSpec{Image: c.image},
				Command:    []string{"sleep", "1000"},
				LogPath:    "c.log",
				CDIDevices: []*runtimeapi.CDIDevice{{Name: "example.com/chaos=dev"}},
			}})
			if err == nil {
				ctrID = r.ContainerId
			}
			return err
		})
		ok = ok && call(func(ctx context.Context) error {
			_, err := rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctrID})
			return err
		})
		ok = ok && call(func(ctx context.Context) error {
			_, err := rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctrID, Cmd: []string{"true"}, Timeout: 10})
			return err
		})
		// kubelet's forensic checkpoint: a kill in the middle must leave
		// the container running (not frozen: checkFrozen), at the
		// location a whole archive or none (checkArchives), and no dump
		// behind (leaks).
		if rng.Intn(3) == 0 {
			ok = ok && call(func(ctx context.Context) error {
				_, err := rt.CheckpointContainer(ctx, &runtimeapi.CheckpointContainerRequest{ContainerId: ctrID, Location: filepath.Join(c.archive, name+".tar")})
				return err
			})
		}
		// kubelet resizes running containers in place; a kill in the
		// middle of one must not leave ContainerStatus reporting limits
		// the cgroup does not have (checkLimits).
		if rng.Intn(2) == 0 {
			limit := int64(64+rng.Intn(64)) << 20
			ok = ok && call(func(ctx context.Context) error {
				_, err := rt.UpdateContainerResources(ctx, &runtimeapi.UpdateContainerResourcesRequest{
					ContainerId: ctrID, Linux: &runtimeapi.LinuxContainerResources{MemoryLimitInBytes: limit},
				})
				return err
			})
		}
		// Some lifecycles stop early, so kills also land on pods whose
		// containers are still running.
		if rng.Intn(4) == 0 {
			continue
		}
		ok = ok && call(func(ctx context.Context) error {
			_, err := rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: ctrID, Timeout: 0})
			return err
		})
		ok = ok && call(func(ctx context.Context) error {
			_, err := rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ctrID})
			return err
		})
		ok = ok && call(func(ctx context.Context) error {
			_, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: podID})
			return err
		})
		_ = ok && call(func(ctx context.Context) error {
			_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: podID})
			return err
		})
	}
}

// checkInvariants: every Ready pod has live pins and its IP reserved for
// it; no IP belongs to two live pods; every container's CRI state is
// runc's.
func (c *chaos) checkInvariants(round int) {
	ctx := context.Background()
	pods, err := c.d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		c.violate("round %d: ListPodSandbox: %v", round, err)
		return
	}
	mounts := map[string]bool{}
	for _, m := range MountsUnder(c.d.RunRoot) {
		mounts[m] = true
	}
	owner := map[string]string{}
	podNames := map[string]string{}
	for _, p := range pods.Items {
		podNames[p.Id] = p.GetMetadata().GetName()
	}
	for _, p := range pods.Items {
		if p.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			continue
		}
		st, err := c.d.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.Id, Verbose: true})
		if err != nil {
			c.violate("round %d: status of Ready pod %s: %v", round, p.Id, err)
			continue
		}
		var info PodInfo
		_ = json.Unmarshal([]byte(st.Info["info"]), &info)
		for kind, pin := range info.Pins {
			if !mounts[pin] {
				c.violate("round %d: Ready pod %s: %s pin %s is not mounted", round, p.Id, kind, pin)
			}
		}
		ip := st.Status.GetNetwork().GetIp()
		if ip == "" {
			c.violate("round %d: Ready pod %s has no IP", round, p.Id)
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.d.IPAMDir, "pinrt-e2e", ip))
		if err != nil || !strings.HasPrefix(string(b), p.Id) {
			c.violate("round %d: Ready pod %s: IP %s is not reserved for it (%q, %v)", round, p.Id, ip, b, err)
		}
		if o, dup := owner[ip]; dup {
			c.violate("round %d: IP %s held by pods %s and %s", round, ip, o, p.Id)
		}
		owner[ip] = p.Id
	}
	ctrs, err := c.d.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		c.violate("round %d: ListContainers: %v", round, err)
		return
	}
	for _, ct := range ctrs.Containers {
		st, err := c.d.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ct.Id})
		if err != nil {
			c.violate("round %d: ContainerStatus(%s): %v", round, ct.Id, err)
			continue
		}
		got, want := st.Status.State, c.runcState(ct.Id)
		// The two reads are not atomic: a container whose kill was sent
		// before the daemon died can exit between them. A disagreement
		// that persists is a lie; one that settles within seconds is not.
		for deadline := time.Now().Add(3 * time.Second); !agrees(got, want) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			st, err = c.d.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ct.Id})
			if err != nil {
				break
			}
			got, want = st.Status.State, c.runcState(ct.Id)
		}
		if err != nil {
			c.violate("round %d: ContainerStatus(%s): %v", round, ct.Id, err)
		} else if !agrees(got, want) {
			c.violate("round %d: container %s is %v (%s), runc says %v", round, ct.Id, got, st.Status.Reason, want)
		}
		c.checkFrozen(round, ct.Id)
		c.checkAdjusted(round, ct, podNames[ct.PodSandboxId])
		if got == runtimeapi.ContainerState_CONTAINER_RUNNING {
			c.checkLimits(round, ct.Id)
		}
	}
}

// checkFrozen: pinrt never pauses a container, and CRIU thaws the one
// it dumps within seconds, even when pinrt dies meanwhile; a container
// frozen for longer was left so.
func (c *chaos) checkFrozen(round int, id string) {
	for deadline := time.Now().Add(30 * time.Second); c.runcStatus(id) == "paused"; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.violate("round %d: container %s stays frozen", round, id)
			return
		}
	}
}

// checkArchives: every checkpoint archive the workers' calls left is
// whole: it reads to its end and holds the dump and the container's
// record (a kill mid-write must leave none, not half of one).
func (c *chaos) checkArchives() {
	entries, _ := os.ReadDir(c.archive)
	for _, e := range entries {
		files := testimage.TarFileAt(c.t, filepath.Join(c.archive, e.Name()))
		if files["checkpoint/pstree.img"] == nil || files["config.dump"] == nil || files["rootfs-diff.tar"] == nil {
			c.violate("checkpoint archive %s is not whole", e.Name())
		}
	}
	c.t.Logf("chaos: %d checkpoint archives, each whole", len(entries))
}

// checkLimits: the memory limit ContainerStatus reports for a running
// container is its cgroup's.
func (c *chaos) checkLimits(round int, id string) {
	st, err := c.d.Runtime.ContainerStatus(context.Background(), &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		c.violate("round %d: ContainerStatus(%s): %v", round, id, err)
		return
	}
	var info struct {
		Pid int `json:"pid"`
	}
	_ = json.Unmarshal([]byte(st.Info["info"]), &info)
	cg, err := MemoryLimit(info.Pid)
	if err != nil {
		return // exited since
	}
	want := "max"
	if l := st.Status.GetResources().GetLinux().GetMemoryLimitInBytes(); l > 0 {
		want = strconv.FormatInt(l, 10)
	}
	if cg != want && (want != "max" || CgroupV2()) {
		c.violate("round %d: container %s: ContainerStatus says memory limit %s, its cgroup has %s", round, id, want, cg)
	}
}

// chaosCDISpec is the CDI device every chaos container asks for.
const chaosCDISpec = `{"cdiVersion": "0.6.0", "kind": "example.com/chaos", "devices": [{"name": "dev", "containerEdits": {"env": ["CHAOS_CDI=1"]}}]}`

// chaosRound is the round a chaos pod was made in, from its name.
var chaosRound = regexp.MustCompile(`^chaos-w\d+-r(\d+)-\d+$`)

// checkAdjusted checks that a container made while the round's NRI
// plugin was connected, in a round whose plugin neither hangs nor
// crashes, still has the plugin's adjustment in its bundle after every
// restart.
func (c *chaos) checkAdjusted(round int, ct *runtimeapi.Container, podName string) {
	m := chaosRound.FindStringSubmatch(podName)
	if m == nil {
		return
	}
	b, err := os.ReadFile(filepath.Join(c.d.Root, "containers", ct.Id, "config.json"))
	if err != nil {
		return // being removed
	}
	var spec struct {
		Process struct {
			Env []string `json:"env"`
		} `json:"process"`
		Annotations map[string]string `json:"annotations"`
		Mounts      []struct {
			Destination string `json:"destination"`
		} `json:"mounts"`
		Linux struct {
			Devices []struct {
				Path string `json:"path"`
			} `json:"devices"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		c.violate("round %d: container %s: config.json: %v", round, ct.Id, err)
		return
	}
	if !slices.Contains(spec.Process.Env, "CHAOS_CDI=1") {
		c.violate("round %d: container %s of %s lost its CDI device's edits (env %q)", round, ct.Id, podName, spec.Process.Env)
	}
	if r, _ := strconv.Atoi(m[1]); r%3 != 0 || !nriPluginUsable() {
		return // the plugin hung or crashed in that round; later containers lack it
	}
	var lost []string
	if !slices.Contains(spec.Process.Env, "CHAOS_NRI=1") {
		lost = append(lost, "env")
	}
	if spec.Annotations["chaos.example.com/nri"] != "1" {
		lost = append(lost, "annotation")
	}
	if !slices.ContainsFunc(spec.Mounts, func(m struct {
		Destination string `json:"destination"`
	}) bool {
		return m.Destination == "/chaos-share"
	}) {
		lost = append(lost, "mount")
	}
	if !slices.ContainsFunc(spec.Linux.Devices, func(d struct {
		Path string `json:"path"`
	}) bool {
		return d.Path == "/dev/chaos-null"
	}) {
		// In a user namespace pinrt binds the host's /dev/null there
		// instead of a device node: a mount then.
		if !slices.ContainsFunc(spec.Mounts, func(m struct {
			Destination string `json:"destination"`
		}) bool {
			return m.Destination == "/dev/chaos-null"
		}) {
			lost = append(lost, "device")
		}
	}
	if len(lost) > 0 {
		c.violate("round %d: container %s of %s lost the NRI plugin's adjustments: %s", round, ct.Id, podName, strings.Join(lost, ", "))
	}
}

// neverCreated is what runcState says of a container whose bundle no
// conmon was ever started for: pinrt creates a container in runc at its
// start, so one never started is created (or, once stopped, exited)
// without runc knowing it; both are true.
const neverCreated runtimeapi.ContainerState = -1

// agrees says whether pinrt's state got is the truth runc (want) tells.
func agrees(got, want runtimeapi.ContainerState) bool {
	if want == neverCreated {
		return got == runtimeapi.ContainerState_CONTAINER_CREATED || got == runtimeapi.ContainerState_CONTAINER_EXITED
	}
	return got == want
}

// runcState maps `runc state` to the CRI state pinrt must report; a
// container runc does not know has exited, unless it is neverCreated.
func (c *chaos) runcState(id string) runtimeapi.ContainerState {
	status := c.runcStatus(id)
	if status == "" {
		dir := filepath.Join(c.d.Root, "containers", id)
		if _, serr := os.Stat(filepath.Join(dir, "conmon.pid")); errors.Is(serr, os.ErrNotExist) {
			if _, derr := os.Stat(dir); derr == nil {
				return neverCreated
			}
		}
		return runtimeapi.ContainerState_CONTAINER_EXITED
	}
	switch status {
	case "created", "creating":
		return runtimeapi.ContainerState_CONTAINER_CREATED
	case "running", "paused":
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return runtimeapi.ContainerState_CONTAINER_EXITED
}

// runcStatus is `runc state`'s status of id, "" when runc does not know
// it.
func (c *chaos) runcStatus(id string) string {
	out, err := exec.Command("/usr/local/bin/runc", "--root", c.runRoot, "state", id).Output()
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(out, &st)
	return st.Status
}

// removeAll removes every pod and container over CRI, as kubelet would.
func (c *chaos) removeAll(strict bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	report := func(what string, err error) {
		if err != nil && strict {
			c.fail("final cleanup: %s: %v", what, err)
		}
	}
	ctrs, err := c.d.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	report("ListContainers", err)
	for _, ct := range ctrs.GetContainers() {
		_, err := c.d.Runtime.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: ct.Id})
		report("RemoveContainer "+ct.Id, err)
	}
	pods, err := c.d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	report("ListPodSandbox", err)
	for _, p := range pods.GetItems() {
		_, err := c.d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id})
		report("StopPodSandbox "+p.Id, err)
		_, err = c.d.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id})
		report("RemovePodSandbox "+p.Id, err)
	}
}

// leaks lists everything the test's pods and containers could have left.
func (c *chaos) leaks() []string {
	d := c.d
	left := d.Leftovers() // pins, sandbox dirs (root and run), mounts
	for _, dir := range []string{
		filepath.Join(d.Root, "containers"),
		c.runRoot,
		filepath.Join(d.RunRoot, "oci", "runc", "containers"),
		filepath.Join(d.Root, "cni", "cache", "results"),
		filepath.Join(d.Root, "checkpoints"),
	} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			left = append(left, "file "+filepath.Join(dir, e.Name()))
		}
	}
	for ip := range d.LeasedIPs(c.t) {
		left = append(left, "host-local reservation "+ip)
	}
	if out, err := exec.Command("ip", "-o", "link", "show", "master", d.Bridge).Output(); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				left = append(left, "veth "+l)
			}
		}
	}
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, c.cgroup), func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() && p != filepath.Join(h, c.cgroup) {
				left = append(left, "cgroup "+p)
			}
			return nil
		})
	}
	left = append(left, c.processes()...)
	return left
}

// processes lists conmon, runc and container processes of this test: a
// command line naming the test's directory, or a cgroup under its parent.
func (c *chaos) processes() []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if reapedByInit(pid) {
			// An orphan of a killed conmon or runc that died: init
			// reaps it (on this host's init, lazily); nothing of pinrt's
			// is held by it.
			continue
		}
		if bytes.Contains(cg, []byte(c.cgroup+"/")) || (bytes.Contains(cmd, []byte(c.d.Dir)) && !bytes.Contains(cmd, []byte("--listen"))) {
			out = append(out, fmt.Sprintf("process %d (%s): %s", pid, describeProcess(pid), bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
		}
	}
	return out
}

// reapedByInit reports whether pid is a zombie waiting for PID 1.
func reapedByInit(pid int) bool {
	status, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	return strings.Contains(string(status), "\nState:\tZ") && strings.Contains(string(status), "\nPPid:\t1\n")
}

// describeProcess names a process's state, its command and its parent's,
// so a leaked zombie says who failed to reap it.
func describeProcess(pid int) string {
	status, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	var name, state, ppid string
	for _, l := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch k {
		case "Name":
			name = strings.TrimSpace(v)
		case "State":
			state = strings.TrimSpace(v)
		case "PPid":
			ppid = strings.TrimSpace(v)
		}
	}
	parent, _ := os.ReadFile(filepath.Join("/proc", ppid, "cmdline"))
	return fmt.Sprintf("%s, %s, parent %s %s", name, state, ppid, bytes.ReplaceAll(parent, []byte{0}, []byte{' '}))
}

func cgroupHierarchies() []string {
	out := []string{"/sys/fs/cgroup"}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

// removeCgroupTree removes the test's cgroup parent, deepest first.
func removeCgroupTree(rel string) {
	for _, h := range cgroupHierarchies() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, rel), func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// TestSimulatedReboot stops the daemon, then does what a reboot does: every
// process of the test dies, every mount goes, the run directory (tmpfs)
// is wiped and the cgroups are gone, while the persistent root and the
// host-local IPAM store stay. After the start, pods are NotReady,
// containers Exited, and removing them all over CRI releases every IP and
// leaves nothing.
func TestSimulatedReboot(t *testing.T) {
	RequireRoot(t)
	for _, b := range []string{"/usr/local/bin/runc", "/usr/bin/conmon"} {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("the reboot test needs %s (make deps): %v", b, err)
		}
	}
	cg := "/pinrt-reboot-" + randHex(4)
	d := StartDaemon(t, Options{Network: true, Config: fmt.Sprintf(`[runtime]
conmon = "/usr/bin/conmon"
cgroup_parent = %q
[runtime.runtimes.runc]
binary = "/usr/local/bin/runc"
`, cg)})
	reg := testimage.StartRegistry(t)
	c := &chaos{t: t, d: d, cgroup: cg, runRoot: filepath.Join(d.RunRoot, "runtime", "runc")}
	c.image = reg.Push(t, "busybox:1", testimage.Busybox(t))
	if _, err := d.Image.PullImage(Ctx(t), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: c.image}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupTree(cg) })
	var pods, ctrs []string
	for i, userns := range []bool{false, true} {
		cfg := PodConfig(fmt.Sprintf("reboot-%d", i))
		if userns {
			cfg = UsernsPod(cfg, 0)
		}
		cfg.LogDirectory = filepath.Join(d.Dir, "logs", cfg.Metadata.Name)
		pod := d.RunPod(t, cfg)
		resp, err := d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg, Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: c.image},
			Command: []string{"sleep", "1000"}, LogPath: "c.log",
		}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Runtime.StartContainer(Ctx(t), &runtimeapi.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatal(err)
		}
		pods, ctrs = append(pods, pod), append(ctrs, resp.ContainerId)
	}
	if len(d.LeasedIPs(t)) != 2 {
		t.Fatalf("leased IPs before the reboot: %v", d.LeasedIPs(t))
	}

	d.Kill()
	reboot(t, c)
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	for _, id := range pods {
		if st, _ := d.PodStatus(t, id); st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			t.Errorf("pod %s after the reboot is %v, want NOTREADY", id, st.State)
		}
	}
	for _, id := range ctrs {
		resp, err := d.Runtime.ContainerStatus(Ctx(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status.State != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Errorf("container %s after the reboot is %v, want EXITED", id, resp.Status.State)
		}
	}
	c.removeAll(true)
	if left := c.leaks(); len(left) > 0 {
		t.Errorf("left after removing everything:\n%s", strings.Join(left, "\n"))
	}
}

// reboot kills the test's processes, drops its mounts, wipes the run dir
// and the cgroups; the root and the IPAM store stay.
func reboot(t *testing.T, c *chaos) {
	t.Helper()
	for i := 0; i < 50 && len(c.processes()) > 0; i++ {
		for _, p := range c.processes() {
			var pid int
			if _, err := fmt.Sscanf(p, "process %d ", &pid); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range MountsUnder(c.d.Dir) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s: %v", m, err)
		}
	}
	if err := os.RemoveAll(c.d.RunRoot); err != nil {
		t.Fatal(err)
	}
	removeCgroupTree(c.cgroup)
}
