package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var (
	nriPluginOnce sync.Once
	nriPluginBin  string
	errNRIPlugin  error
)

// nriPluginBinary builds test/nriplugin, a plugin on containerd/nri's
// stub, once per test process; TestMain removes it. PINRT_E2E_NRIPLUGIN
// names a prebuilt one, for a run without a Go toolchain (test/vm).
func nriPluginBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("PINRT_E2E_NRIPLUGIN"); p != "" {
		nriPluginBin = p
		return p
	}
	if !nriPluginUsable() {
		t.Skip("the NRI e2e tests build test/nriplugin: they need the go toolchain or PINRT_E2E_NRIPLUGIN")
	}
	nriPluginOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pinrt-nriplugin-")
		if err != nil {
			errNRIPlugin = err
			return
		}
		nriPluginBin = filepath.Join(dir, "nriplugin")
		cmd := exec.Command("go", "build", "-o", nriPluginBin, "./test/nriplugin")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			errNRIPlugin = fmt.Errorf("go build ./test/nriplugin: %w\n%s", err, out)
		}
	})
	if errNRIPlugin != nil {
		t.Fatal(errNRIPlugin)
	}
	return nriPluginBin
}

// nriPluginUsable says whether the test plugin can be had.
func nriPluginUsable() bool {
	if os.Getenv("PINRT_E2E_NRIPLUGIN") != "" {
		return true
	}
	_, err := exec.LookPath("go")
	return err == nil
}

// nriPlugin is one plugin process connected to a daemon.
type nriPlugin struct {
	cmd    *exec.Cmd
	events string
	done   chan struct{}
}

// startNRIPlugin runs the test plugin against d and waits until it is
// synchronized. It is killed at the end of the test.
func startNRIPlugin(t testing.TB, d *Daemon, name string, args ...string) *nriPlugin {
	t.Helper()
	p := &nriPlugin{events: filepath.Join(t.TempDir(), name+".events"), done: make(chan struct{})}
	args = append([]string{"-socket", d.NRISocket, "-name", name, "-events", p.events}, args...)
	p.cmd = exec.Command(nriPluginBinary(t), args...)
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill)
	p.wait(t, "SYNC ", 15*time.Second)
	return p
}

func (p *nriPlugin) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *nriPlugin) lines() []string {
	b, _ := os.ReadFile(p.events)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// wait polls the event file for a line starting with prefix.
func (p *nriPlugin) wait(t testing.TB, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, l := range p.lines() {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("plugin %s saw no %q in %v; it saw:\n%s", filepath.Base(p.events), prefix, timeout, strings.Join(p.lines(), "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNRI(t *testing.T) {
	e := newCtrEnvWith(t, "[nri]\nplugin_request_timeout = \"1s\"\n")
	nriPluginBinary(t)

	t.Run("adjustments and events", func(t *testing.T) {
		p := startNRIPlugin(t, e.d, "adjuster", "-only", "c", "-env", "NRI_E2E=adjusted", "-nofile", "4242", "-oom", "345", "-annotation", "nri.e2e/adjusted=yes")
		for _, userns := range []bool{false, true} {
			name := fmt.Sprintf("nri-adj-%v", userns)
			cfg := PodConfig(name)
			if userns {
				cfg = UsernsPod(cfg, 0)
			}
			pod, podCfg := e.pod(t, cfg)
			id := e.run(t, pod, podCfg, e.ctr("c", "sleep", "300"))
			if env := e.mustExec(t, id, "env"); !strings.Contains(env, "NRI_E2E=adjusted") {
				t.Errorf("%s: env lacks the plugin's NRI_E2E=adjusted:\n%s", name, env)
			}
			if out := e.mustExec(t, id, "sh", "-c", "ulimit -n"); strings.TrimSpace(out) != "4242" {
				t.Errorf("%s: ulimit -n = %q, want the plugin's 4242", name, out)
			}
			if out := e.mustExec(t, id, "cat", "/proc/self/oom_score_adj"); strings.TrimSpace(out) != "345" {
				t.Errorf("%s: oom_score_adj = %q, want the plugin's 345", name, out)
			}
			if _, err := e.d.Runtime.UpdateContainerResources(Ctx(t), &runtimeapi.UpdateContainerResourcesRequest{
				ContainerId: id, Linux: &runtimeapi.LinuxContainerResources{CpuShares: 512},
			}); err != nil {
				t.Fatalf("UpdateContainerResources: %v", err)
			}
			if _, err := e.d.Runtime.UpdatePodSandboxResources(Ctx(t), &runtimeapi.UpdatePodSandboxResourcesRequest{
				PodSandboxId: pod, Resources: &runtimeapi.LinuxContainerResources{CpuShares: 512},
			}); err != nil {
				t.Fatalf("UpdatePodSandboxResources: %v", err)
			}
			if _, err := e.d.Runtime.StopContainer(Ctx(t), &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.d.Runtime.RemoveContainer(Ctx(t), &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
				t.Fatal(err)
			}
			p.wait(t, "RemovePodSandbox "+name, 5*time.Second)
			want := []string{
				"RunPodSandbox " + name, "CreateContainer " + name + "/c", "PostCreateContainer " + name + "/c",
				"StartContainer " + name + "/c", "PostStartContainer " + name + "/c",
				"UpdateContainer " + name + "/c", "PostUpdateContainer " + name + "/c",
				"UpdatePodSandbox " + name + " shares=512", "PostUpdatePodSandbox " + name,
				"StopContainer " + name + "/c", "RemoveContainer " + name + "/c",
				"StopPodSandbox " + name, "RemovePodSandbox " + name,
			}
			var got []string
			for _, l := range p.lines() {
				if strings.Contains(l, " "+name) {
					got = append(got, l)
				}
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s: the plugin saw\n%s\nwant\n%s", name, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	})

	// What NRI's device-injector and hook-injector samples do: a device
	// node, a mount and an OCI hook.
	t.Run("device, mount and hook injection", func(t *testing.T) {
		share := filepath.Join(e.d.Dir, "nri-share")
		if err := os.MkdirAll(share, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(share, "f"), []byte("from nri\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// A CDI device too, as NRI's device injector can ask for.
		cdiShare := filepath.Join(e.d.Dir, "nri-cdi-share")
		if err := os.MkdirAll(cdiShare, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(e.d.CDIDir, "e2e.yaml"), []byte(e2eCDISpec(cdiShare)), 0o644); err != nil {
			t.Fatal(err)
		}
		hooked := filepath.Join(t.TempDir(), "hooked")
		startNRIPlugin(t, e.d, "injector", "-only", "inj", "-device", "/dev/nri-null:1:3", "-mount", share+":/nri-share", "-hook", hooked, "-cdi", "example.com/e2e=null")
		for _, userns := range []bool{false, true} {
			name := fmt.Sprintf("nri-inj-%v", userns)
			cfg := PodConfig(name)
			if userns {
				// runc binds device nodes into a user namespace from the
				// host path of the same name, and there is no
				// /dev/nri-null on the host: pinrt binds /dev/null.
				cfg = UsernsPod(cfg, 0)
			}
			pod, podCfg := e.pod(t, cfg)
			id := e.run(t, pod, podCfg, e.ctr("inj", "sleep", "300"))
			if out := e.mustExec(t, id, "stat", "-c", "%F %t:%T", "/dev/nri-null"); strings.TrimSpace(out) != "character special file 1:3" {
				t.Errorf("%s: /dev/nri-null is %q", name, out)
			}
			e.mustExec(t, id, "sh", "-c", "echo x > /dev/nri-null")
			if out := e.mustExec(t, id, "cat", "/nri-share/f"); out != "from nri\n" {
				t.Errorf("%s: /nri-share/f = %q", name, out)
			}
			// Host root's files show as the container's root: in a userns
			// pod only through idmapped mounts (else 65534).
			for _, f := range []string{"/nri-share/f", "/cdi-share"} {
				if out := e.mustExec(t, id, "stat", "-c", "%u:%g", f); strings.TrimSpace(out) != "0:0" {
					t.Errorf("%s: %s owner = %q, want 0:0", name, f, out)
				}
			}
			// The CDI device: the host's /dev/null under another name.
			if out := e.mustExec(t, id, "stat", "-c", "%F %t:%T", "/dev/cdi-null"); strings.TrimSpace(out) != "character special file 1:3" {
				t.Errorf("%s: /dev/cdi-null is %q", name, out)
			}
			e.mustExec(t, id, "sh", "-c", "echo x > /dev/cdi-null")
			if b, err := os.ReadFile(hooked); err != nil || strings.TrimSpace(string(b)) != id {
				t.Errorf("%s: the plugin's createRuntime hook wrote %q (%v), want the container ID %s", name, b, err, id)
			}
		}
	})

	// A plugin moving the container's cgroup: it runs there, and its
	// stats are read from there.
	t.Run("cgroups path", func(t *testing.T) {
		if CgroupDriver() != "cgroupfs" {
			t.Skip("the plugin names a cgroupfs path")
		}
		parent := fmt.Sprintf("/pinrt-e2e-nri-%d", os.Getpid())
		t.Cleanup(func() {
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
			for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", parent)) {
				_ = os.Remove(d)
			}
		})
		startNRIPlugin(t, e.d, "mover", "-only", "moved", "-cgroup", parent)
		pod, podCfg := e.pod(t, PodConfig("nri-cg"))
		id := e.run(t, pod, podCfg, e.ctr("moved", "sleep", "300"))
		if dir := CgroupDir(t, e.info(t, id).Pid, "memory"); !strings.HasSuffix(dir, parent+"/"+id) {
			t.Errorf("the container runs in %s, want the plugin's %s/%s", dir, parent, id)
		}
		resp, err := e.d.Runtime.ContainerStats(Ctx(t), &runtimeapi.ContainerStatsRequest{ContainerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if ws := resp.GetStats().GetMemory().GetWorkingSetBytes().GetValue(); ws == 0 {
			t.Errorf("no memory stats from the moved cgroup: %v", resp.GetStats())
		}
	})

	// What critest's "container created during the Synchronize call"
	// checks: a creation while a plugin synchronizes waits for the sync
	// (nri.BlockSync) and reaches the plugin as an event, not lost
	// between the snapshot and the plugin's registration.
	t.Run("container created while a plugin synchronizes", func(t *testing.T) {
		pod, podCfg := e.pod(t, PodConfig("nri-late"))
		p := startNRIPlugin(t, e.d, "slowsync", "-sync-delay", "600ms")
		if slices.Contains(p.lines(), "SYNCED") {
			t.Fatal("the plugin finished synchronizing before the creation: the test raced")
		}
		e.create(t, pod, podCfg, e.ctr("late", "sleep", "300"))
		p.wait(t, "CreateContainer nri-late/late", 5*time.Second)
	})

	t.Run("namespace move refused", func(t *testing.T) {
		p := startNRIPlugin(t, e.d, "nsmover", "-only", "nsmove", "-netns", "/proc/1/ns/net")
		pod, podCfg := e.pod(t, UsernsPod(PodConfig("nri-ns"), 0))
		before := e.containerDirs(t)
		_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: e.ctr("nsmove", "sleep", "300"), SandboxConfig: podCfg})
		if err == nil || !strings.Contains(err.Error(), "nsmover") || !strings.Contains(err.Error(), "namespace") {
			t.Fatalf("CreateContainer with a namespace move = %v (%v), want a refusal naming the plugin", err, status.Code(err))
		}
		t.Logf("refused: %v", err)
		if after := e.containerDirs(t); after != before {
			t.Errorf("container dirs %d -> %d", before, after)
		}
		// Others' containers are untouched by the plugin.
		e.run(t, pod, podCfg, e.ctr("other", "sleep", "300"))
		p.kill()
		e.run(t, pod, podCfg, e.ctr("nsmove", "sleep", "300"))
	})

	t.Run("invalid adjustment refused naming the plugin", func(t *testing.T) {
		startNRIPlugin(t, e.d, "bogus", "-only", "bogus", "-rlimit", "RLIMIT_BOGUS")
		pod, podCfg := e.pod(t, PodConfig("nri-bogus"))
		before := e.containerDirs(t)
		_, err := e.d.Runtime.CreateContainer(Ctx(t), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: e.ctr("bogus", "sleep", "300"), SandboxConfig: podCfg})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"50-bogus"`) || !strings.Contains(err.Error(), "RLIMIT_BOGUS") {
			t.Fatalf("CreateContainer with a bad rlimit = %v, want FailedPrecondition naming 50-bogus and the rlimit", err)
		}
		t.Logf("refused: %v", err)
		if after := e.containerDirs(t); after != before {
			t.Errorf("container dirs %d -> %d", before, after)
		}
		e.run(t, pod, podCfg, e.ctr("fine", "sleep", "300"))
	})

	t.Run("plugin killed mid-creation", func(t *testing.T) {
		p := startNRIPlugin(t, e.d, "killed", "-hang", "hangme")
		pod, podCfg := e.pod(t, PodConfig("nri-kill"))
		type result struct {
			err error
			d   time.Duration
		}
		res := make(chan result, 1)
		go func() {
			start := time.Now()
			_, err := e.d.Runtime.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{PodSandboxId: pod, Config: e.ctr("hangme", "sleep", "300"), SandboxConfig: podCfg})
			res <- result{err, time.Since(start)}
		}()
		p.wait(t, "CreateContainer nri-kill/hangme", 10*time.Second)
		p.kill()
		select {
		case r := <-res:
			// The kill ends the plugin's connection: the creation goes on
			// without it, long before the request timeout.
			if r.err != nil {
				t.Logf("the creation the plugin held failed: %v", r.err)
			}
			t.Logf("creation returned %v after it started", r.d)
		case <-time.After(10 * time.Second):
			t.Fatal("CreateContainer still waits 10s after its plugin was killed")
		}
		// Nothing else fails.
		id := e.run(t, pod, podCfg, e.ctr("after", "sleep", "300"))
		e.mustExec(t, id, "true")
	})

	t.Run("hung plugin bounded by the request timeout", func(t *testing.T) {
		p := startNRIPlugin(t, e.d, "hung", "-hang", "slow")
		pod, podCfg := e.pod(t, PodConfig("nri-hung"))
		start := time.Now()
		id := e.run(t, pod, podCfg, e.ctr("slow", "sleep", "300"))
		took := time.Since(start)
		t.Logf("CreateContainer+Start with a hung plugin: %v (request timeout 1s)", took)
		// A plugin that never answers would hold it for ever; the bound
		// leaves a loaded machine time for the rest of the two calls.
		if took > 15*time.Second {
			t.Errorf("a hung plugin held the creation %v, the request timeout is 1s", took)
		}
		e.mustExec(t, id, "true")
		// The plugin was disconnected: it no longer holds anything up.
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			t.Error("the hung plugin is still connected")
		}
	})

	t.Run("sync sees every pod, also after a restart", func(t *testing.T) {
		const n = 20
		var names []string
		for i := range n {
			name := fmt.Sprintf("nri-sync-%02d", i)
			names = append(names, name)
			e.pod(t, PodConfig(name))
		}
		check := func(p *nriPlugin) {
			t.Helper()
			line := p.wait(t, "SYNC ", time.Second)
			_, list, _ := strings.Cut(line, "names=")
			seen := map[string]bool{}
			for _, s := range strings.Split(list, ",") {
				seen[s] = true
			}
			for _, name := range names {
				if !seen[name] {
					t.Errorf("plugin sync lacks pod %s: %s", name, line)
				}
			}
		}
		start := time.Now()
		check(startNRIPlugin(t, e.d, "syncer"))
		t.Logf("plugin registered and synchronized with %d pods in %v", n, time.Since(start))
		if err := e.d.Restart(); err != nil {
			t.Fatal(err)
		}
		check(startNRIPlugin(t, e.d, "syncer-after-restart"))
	})
}
