package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCritest runs critest, cri-tools' CRI conformance suite, in full
// against a daemon on this host, with the checked-in skip list
// (test/critest/skip.txt) and the stand-in images (test/standin) served
// from a registry on 127.0.0.1 that pinrt reaches only through its
// mirror settings, as test/vm/suites/critest.sh does in the VM. It fails
// on any failed spec and on any spec that skipped itself without an entry
// in skip.txt (test/critest/run.sh exits non-zero for both).
//
// critest, its ginkgo CLI and the images are cached by version in
// $PINRT_VM_CACHE (default /var/cache/pinrt-vm), shared with the VM's
// suite: only a cold cache compiles critest (minutes) and needs apt-get
// download for the images' .debs. PINRT_CRITEST_FOCUS,
// PINRT_CRITEST_PARALLEL (default 2 here), PINRT_CRITEST_TIMEOUT and
// PINRT_CRITEST_ARGS reach run.sh.
func TestCritest(t *testing.T) {
	RequireRoot(t)
	if _, err := exec.LookPath("go"); err != nil {
		// The VM runs a prebuilt test binary without a toolchain; its
		// own suite runs critest there.
		t.Skip("critest and the stand-in images are built here: the go toolchain is needed")
	}
	repo := RepoRoot()
	cache := os.Getenv("PINRT_VM_CACHE")
	if cache == "" {
		cache = "/var/cache/pinrt-vm"
	}
	// The tools, the registry's files, critest's report and its
	// TMPDIR: critest -parallel leaves a directory in TMPDIR, and its
	// specs make their volumes' host paths there. 0711, as NewDaemon's
	// base: a user-namespaced container's root must reach its volumes.
	work, err := os.MkdirTemp("", "pinrt-critest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ForceCleanup(work) })
	if err := os.Chmod(work, 0o711); err != nil {
		t.Fatal(err)
	}

	critest := lastLine(t, runTool(t, 20*time.Minute, repo, nil, "bash", filepath.Join(repo, "test/critest/build.sh"), cache))
	standin := filepath.Join(work, "pinrt-standin")
	// Built as suites/critest.sh builds it: the binary is part of the
	// images' cache key, which the VM's suite then shares.
	runTool(t, 10*time.Minute, repo, []string{"CGO_ENABLED=0"},
		"go", "build", "-trimpath", "-buildvcs=false", "-o", standin, "./test/standin/cmd/pinrt-standin")
	images := lastLine(t, runTool(t, 15*time.Minute, repo, nil, standin, "build", "-cache", filepath.Join(cache, "standin")))

	addr := serveStandins(t, standin, images, work)
	mirrors := runTool(t, time.Minute, repo, nil, standin, "mirrors", "-addr", addr)
	// critest's plugin-synchronization spec holds its plugin's
	// Synchronize for 2 s, the default request timeout: the plugin would
	// be dropped and the spec skip itself.
	cfg := "[nri]\nplugin_request_timeout = \"5s\"\n\n" + mirrors
	// critest names no cgroup parent under cgroupfs: its pods go under a
	// parent of this test's own, which must be empty at the end. Its
	// cleanup is registered first, so it runs after the daemon's.
	var cg string
	if CgroupDriver() == "cgroupfs" {
		cg = "/pinrt-critest-" + randHex(4)
		cfg = fmt.Sprintf("[runtime]\ncgroup_parent = %q\n\n", cg) + cfg
		t.Cleanup(func() { removeCgroupTree(cg) })
	}
	// HostPorts: critest reaches a pod's host port on 127.0.0.1.
	d := StartDaemon(t, Options{Config: cfg, Network: true, HostPorts: true})

	out, rc := runCritest(t, repo, critest, d, filepath.Join(work, "out"))
	summary := out
	if i := strings.Index(out, "critest: ===== summary"); i >= 0 {
		summary = out[i:]
	}
	ran := regexp.MustCompile(`Ran ([0-9]+) of [0-9]+ Specs`).FindStringSubmatch(out)
	switch {
	case rc != 0:
		t.Fatalf("critest: run.sh exited with %d (failed specs or unlisted skips):\n%s", rc, out)
	case strings.Contains(out, "UNLISTED SKIP"):
		t.Fatalf("critest: specs skipped themselves without an entry in test/critest/skip.txt:\n%s", summary)
	case ran == nil || ran[1] == "0":
		t.Fatalf("critest ran no spec:\n%s", out)
	}
	t.Logf("%s", summary)
	critestWebSocket(t, repo, critest, d, filepath.Join(work, "out-websocket"))
	if left := critestLeftovers(d, cg); len(left) > 0 {
		t.Errorf("critest's pods and containers are gone, but they left:\n%s", strings.Join(left, "\n"))
	}
}

// critestWebSocket runs critest's streaming specs again with WebSocket
// clients (-websocket-exec, -websocket-attach, -websocket-portforward):
// v5.channel.k8s.io for exec and attach and SPDY tunnelled in a
// WebSocket for port-forward, which pinrt translates (streaming's
// websocket.go). A focus of one's own (PINRT_CRITEST_FOCUS) leaves it out.
func critestWebSocket(t *testing.T, repo, critest string, d *Daemon, outDir string) {
	t.Helper()
	if os.Getenv("PINRT_CRITEST_FOCUS") != "" {
		t.Log("critest over WebSocket: not run, PINRT_CRITEST_FOCUS is set")
		return
	}
	out, rc := runCritest(t, repo, critest, d, outDir,
		"PINRT_CRITEST_FOCUS=Streaming",
		"PINRT_CRITEST_ARGS=-websocket-exec -websocket-attach -websocket-portforward")
	ran := regexp.MustCompile(`Ran ([0-9]+) of [0-9]+ Specs`).FindStringSubmatch(out)
	switch {
	case rc != 0:
		t.Fatalf("critest over WebSocket: run.sh exited with %d:\n%s", rc, out)
	case ran == nil || ran[1] == "0":
		t.Fatalf("critest over WebSocket ran no spec:\n%s", out)
	}
	t.Logf("critest's streaming specs over WebSocket: %s of them passed", ran[1])
}

// critestLeftovers lists what the daemon still holds once critest, which
// removes every pod and container it made, is done: pods, containers,
// pins, sandbox directories, mounts, IP reservations and cgroups under
// cg. runc and conmon may take a moment to exit after the call that
// ended their container, so only what stays for 10 s counts.
func critestLeftovers(d *Daemon, cg string) []string {
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		left = d.Leftovers()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if pods, err := d.Runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err != nil {
			left = append(left, "ListPodSandbox: "+err.Error())
		} else {
			for _, p := range pods.Items {
				left = append(left, "pod "+p.Id+" "+p.GetMetadata().GetName())
			}
		}
		if ctrs, err := d.Runtime.ListContainers(ctx, &runtimeapi.ListContainersRequest{}); err != nil {
			left = append(left, "ListContainers: "+err.Error())
		} else {
			for _, c := range ctrs.Containers {
				left = append(left, "container "+c.Id+" "+c.GetMetadata().GetName())
			}
		}
		cancel()
		for ip := range d.LeasedIPs(d.t) {
			left = append(left, "host-local reservation "+ip)
		}
		if cg != "" {
			for _, h := range cgroupHierarchies() {
				root := filepath.Join(h, cg)
				_ = filepath.WalkDir(root, func(p string, e os.DirEntry, err error) error {
					if err == nil && e.IsDir() && p != root {
						left = append(left, "cgroup "+p)
					}
					return nil
				})
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
	}
}

// runTool runs a build step in dir and returns its standard output; the
// test fails with its standard error if it fails or outlasts timeout.
func runTool(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// lastLine is the last non-empty line of a tool's output: the path
// build.sh and pinrt-standin build print.
func lastLine(t *testing.T, s string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(s), "\n")
	l := strings.TrimSpace(lines[len(lines)-1])
	if l == "" {
		t.Fatal("a build step printed no path")
	}
	return l
}

// serveStandins starts the stand-in registry on a free port of 127.0.0.1
// and returns its address once every image is served. It is stopped when
// the test ends, after the daemon (cleanups run last first).
func serveStandins(t *testing.T, standin, images, work string) string {
	t.Helper()
	ready := filepath.Join(work, "registry.ready")
	logPath := filepath.Join(work, "registry.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// Port 0: the registry writes the address it got into the ready file.
	cmd := exec.Command(standin, "serve", "-addr", "127.0.0.1:0", "-ready", ready, images)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.After(2 * time.Minute)
	for {
		if b, err := os.ReadFile(ready); err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b))
		}
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the stand-in registry exited (%v):\n%s", err, b)
		case <-deadline:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("the stand-in registry did not serve its images within 2 minutes:\n%s", b)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runCritest runs test/critest/run.sh against d and returns its output
// and exit code. critest gets go test's remaining time less a margin for
// the cleanup, so a suite that hangs reports its specs rather than being
// cut off by go test's panic; its whole process group (run.sh, critest,
// ginkgo and ginkgo's critest processes) is killed if it still runs.
func runCritest(t *testing.T, repo, critest string, d *Daemon, outDir string, extraEnv ...string) (string, int) {
	t.Helper()
	budget := 40 * time.Minute
	if dl, ok := t.Deadline(); ok {
		budget = time.Until(dl) - 3*time.Minute
	}
	if budget < 5*time.Minute {
		t.Fatalf("critest needs minutes; %v of go test's -timeout is left", budget)
	}
	env := []string{
		// critest's NRI specs run against the daemon's own NRI socket;
		// without -nri-socket they skip themselves.
		"PINRT_CRITEST_ARGS=-nri-socket " + d.NRISocket + " " + os.Getenv("PINRT_CRITEST_ARGS"),
	}
	if os.Getenv("PINRT_CRITEST_PARALLEL") == "" {
		// Two processes: the specs spend most of their time waiting.
		env = append(env, "PINRT_CRITEST_PARALLEL=2")
	}
	if os.Getenv("PINRT_CRITEST_TIMEOUT") == "" {
		env = append(env, "PINRT_CRITEST_TIMEOUT="+(budget-time.Minute).Round(time.Second).String())
	}
	tmp := filepath.Join(filepath.Dir(outDir), "tmp")
	if err := os.MkdirAll(tmp, 0o711); err != nil {
		t.Fatal(err)
	}
	env = append(env, "TMPDIR="+tmp)
	env = append(env, extraEnv...) // the last of a name wins
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repo, "test/critest/run.sh"), critest, "unix://"+d.Socket, outDir)
	// Any file critest or ginkgo writes beside its report lands in the
	// test's own directory.
	cmd.Dir = filepath.Dir(outDir)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	// Whatever of the group outlived run.sh goes with it.
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case ctx.Err() != nil:
		t.Fatalf("critest did not end within %v:\n%s", time.Since(start).Round(time.Second), out.String())
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	}
	t.Fatalf("run.sh: %v\n%s", err, out.String())
	return "", 0
}
