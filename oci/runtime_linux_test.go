package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	testRunc   = "/usr/local/bin/runc"
	testConmon = "/usr/bin/conmon"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs real containers with runc and conmon")
	}
	for _, b := range []string{testRunc, testConmon, "/bin/busybox"} {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("needs %s (make deps): %v", b, err)
		}
	}
}

func randID(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// testEnv is one private runc root, state dir and cgroup parent.
type testEnv struct {
	t       testing.TB
	dir     string
	rt      *Runtime
	h       Handler
	rootfs  string
	cgroup  string
	exitDir string
}

func newTestEnv(t testing.TB) *testEnv {
	requireRoot(t)
	dir := t.TempDir()
	e := &testEnv{t: t, dir: dir, cgroup: "/pinrt-oci-test-" + randID(t), exitDir: filepath.Join(dir, "exits")}
	e.h = Handler{Name: "runc", Binary: testRunc, Root: filepath.Join(dir, "runc"), Type: "oci", MonitorPath: testConmon}
	rt, err := NewRuntime(e.h, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	e.rt = rt
	e.rootfs = filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "tmp"} {
		if err := os.MkdirAll(filepath.Join(e.rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.rootfs, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"sh", "echo", "sleep", "head", "tr", "cat", "printf", "id", "dd"} {
		if err := os.Symlink("busybox", filepath.Join(e.rootfs, "bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.rootfs, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Parents last; runc removed the container's own cgroups on delete.
		for _, ctl := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer", "blkio", "net_cls", "net_prio", "perf_event", "systemd", "unified", ""} {
			_ = os.Remove(filepath.Join("/sys/fs/cgroup", ctl, e.cgroup))
		}
	})
	return e
}

// create creates (and optionally starts) a container running args.
func (e *testEnv) create(id string, start bool, args ...string) (logPath string) {
	e.t.Helper()
	return e.createLimited(id, start, nil, args...)
}

// createLimited is create with resource limits.
func (e *testEnv) createLimited(id string, start bool, res *Resources, args ...string) (logPath string) {
	t := e.t
	t.Helper()
	ctx := context.Background()
	spec, err := BuildContainerSpec(ctx, &ContainerSpec{
		ID: id, Rootfs: e.rootfs, Command: args,
		Namespaces:   Namespaces{PIDMode: PIDContainer},
		Seccomp:      SecurityProfile{Type: ProfileRuntimeDefault},
		CgroupParent: e.cgroup,
		Resources:    res,
	})
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(e.dir, "bundles", id)
	logPath = filepath.Join(e.dir, "logs", id+".log")
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.rt.Delete(cctx, id, true); err != nil {
			t.Errorf("cleanup delete %s: %v", id, err)
		}
		killConmon(bundle)
	})
	pid, err := e.rt.Create(ctx, CreateOptions{ID: id, Bundle: bundle, Spec: spec, LogPath: logPath, ExitDir: e.exitDir})
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(bundle, "runtime.log"))
		t.Fatalf("create: %v\nruntime.log: %s", err, b)
	}
	if pid <= 0 {
		t.Fatalf("create returned pid %d", pid)
	}
	if start {
		if err := e.rt.Start(ctx, id); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	return logPath
}

// killConmon makes sure no monitor survives a failed test.
func killConmon(bundle string) {
	b, err := os.ReadFile(filepath.Join(bundle, "conmon.pid"))
	if err != nil {
		return
	}
	var pid int
	if _, err := fmt.Sscanf(string(b), "%d", &pid); err == nil && pid > 1 {
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(cmdline), bundle) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (e *testEnv) waitStopped(id string) *State {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !waitExitFile(ctx, filepath.Join(e.exitDir, id), 0, nil) {
		e.t.Fatalf("container %s did not stop", id)
	}
	st, err := e.rt.State(ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	// What the exit file alone says must be what runc and conmon say.
	xs, ok := e.rt.ExitState(id)
	if !ok || xs.Status != st.Status || xs.ExitCode != st.ExitCode || xs.OOMKilled != st.OOMKilled || !xs.FinishedAt.Equal(st.FinishedAt) {
		e.t.Errorf("ExitState = %+v, %v; State = %+v", xs, ok, st)
	}
	return st
}

var criLine = regexp.MustCompile(`^(\S+) (stdout|stderr) ([PF]) (.*)$`)

func TestRuntimeLogsAndExitCode(t *testing.T) {
	e := newTestEnv(t)
	id := "logs-" + randID(t)
	logPath := e.create(id, true, "sh", "-c", "echo out; echo err >&2; sleep 0.1; head -c 20000 /dev/zero | tr '\\0' a; exit 3")
	st := e.waitStopped(id)
	if st.Status != StatusStopped || st.ExitCode != 3 || st.OOMKilled {
		t.Fatalf("state = %+v, want stopped, exit 3, no oom", st)
	}
	if st.FinishedAt.IsZero() {
		t.Errorf("FinishedAt not set")
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var full []string
	partialAs := 0
	partials := 0
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		m := criLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("log line %q is not in CRI format", l)
		}
		if _, err := time.Parse(time.RFC3339Nano, m[1]); err != nil {
			t.Errorf("bad timestamp in %q: %v", l, err)
		}
		if strings.Trim(m[4], "a") == "" && m[4] != "" {
			partialAs += len(m[4])
			if m[3] == "P" {
				partials++
			}
			continue
		}
		full = append(full, m[2]+" "+m[3]+" "+m[4])
	}
	want := []string{"stdout F out", "stderr F err"}
	if strings.Join(full, "|") != strings.Join(want, "|") {
		t.Errorf("log lines = %q, want %q", full, want)
	}
	if partialAs != 20000 || partials == 0 {
		t.Errorf("long line: %d a's in %d P lines, want 20000 in >=1", partialAs, partials)
	}

	// A fresh Runtime (a restarted daemon) sees the same state from disk.
	rt2, err := NewRuntime(e.h, filepath.Join(e.dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	st2, err := rt2.State(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Status != StatusStopped || st2.ExitCode != 3 {
		t.Errorf("after restart state = %+v, want stopped/3", st2)
	}
	// Even once runc forgot it, the exit file still answers.
	if _, err := rt2.run(context.Background(), nil, "delete", id); err != nil {
		t.Fatal(err)
	}
	st3, err := rt2.State(context.Background(), id)
	if err != nil || st3.Status != StatusStopped || st3.ExitCode != 3 {
		t.Errorf("after runc delete state = %+v, %v; want stopped/3", st3, err)
	}
	if err := rt2.Delete(context.Background(), id, false); err != nil {
		t.Errorf("delete of runc-deleted container: %v", err)
	}
	if _, err := rt2.State(context.Background(), id); !errdefs.IsNotFound(err) {
		t.Errorf("state after delete: %v, want NotFound", err)
	}
}

// TestRuntimeOOMFile: conmon reports an OOM kill through its oom file in
// the bundle, which State and ExitState read.
func TestRuntimeOOMFile(t *testing.T) {
	e := newTestEnv(t)
	id := "oom-" + randID(t)
	limit := int64(32 << 20)
	e.createLimited(id, true, &Resources{MemoryLimit: limit, MemorySwapLimit: limit}, "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1")
	st := e.waitStopped(id)
	if st.ExitCode != 137 || !st.OOMKilled {
		t.Errorf("state = %+v, want exit 137 and OOMKilled", st)
	}
}

func TestRuntimeStopKillsAfterTimeout(t *testing.T) {
	e := newTestEnv(t)
	id := "stop-" + randID(t)
	e.create(id, true, "sh", "-c", "trap '' TERM; echo ready; sleep 1000")
	ctx := context.Background()
	st, err := e.rt.State(ctx, id)
	if err != nil || st.Status != StatusRunning {
		t.Fatalf("state = %+v, %v; want running", st, err)
	}
	// Let the shell install its trap before the TERM arrives.
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := e.rt.Stop(ctx, id, syscall.SIGTERM, time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second || took > 10*time.Second {
		t.Errorf("stop took %s, want just over the 1s timeout", took)
	}
	st, err = e.rt.State(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != StatusStopped || st.ExitCode != 137 {
		t.Errorf("state = %+v, want stopped with 137 (SIGKILL)", st)
	}
	// Stopping a stopped container is fine.
	if err := e.rt.Stop(ctx, id, syscall.SIGTERM, time.Second); err != nil {
		t.Errorf("second stop: %v", err)
	}
}

func TestRuntimeExecSync(t *testing.T) {
	e := newTestEnv(t)
	id := "exec-" + randID(t)
	e.create(id, true, "sleep", "1000")
	ctx := context.Background()
	out, errOut, code, err := e.rt.ExecSync(ctx, id, []string{"sh", "-c", "echo hi; echo oops >&2; exit 7"}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "hi\n" || string(errOut) != "oops\n" || code != 7 {
		t.Errorf("exec = %q, %q, %d; want hi, oops, 7", out, errOut, code)
	}
	start := time.Now()
	_, _, _, err = e.rt.ExecSync(ctx, id, []string{"sleep", "100"}, 500*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after 500ms") {
		t.Errorf("exec timeout err = %v, want DeadlineExceeded saying it timed out", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("timed-out exec took %s", took)
	}
	// The timed-out process must be gone, not orphaned in the container.
	e.waitOnlyInit(t, id)
	if err := e.rt.Stop(ctx, id, syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
}

// TestRuntimeExecSyncBackgroundChild: a background child holding stdout
// holds ExecSync neither past its timeout nor, without one, past the main
// process; a timed-out exec returns its output so far and loses its children.
func TestRuntimeExecSyncBackgroundChild(t *testing.T) {
	e := newTestEnv(t)
	id := "execbg-" + randID(t)
	e.create(id, true, "sleep", "1000")
	ctx := context.Background()
	tests := []struct {
		name     string
		cmd      string
		timeout  time.Duration
		wantOut  string
		wantCode int32
		wantErr  error
	}{
		// A child held to the timeout would end it with DeadlineExceeded.
		{"exits with child, timeout", "sleep 100 & echo hi", 20 * time.Second, "hi\n", 0, nil},
		{"exits with child, no timeout", "sleep 100 & echo hi; exit 3", 0, "hi\n", 3, nil},
		{"times out with children", "echo before; sleep 100 & sleep 101 >/dev/null & sleep 60", 3 * time.Second, "before\n", -1, context.DeadlineExceeded},
		{"times out while forking", "while :; do sleep 100 & sleep 0.02; done", 500 * time.Millisecond, "", -1, context.DeadlineExceeded},
	}
	// The timeout of the case that checks the output so far leaves runc
	// time to start the command on a loaded machine.
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			out, _, code, err := e.rt.ExecSync(ctx, id, []string{"sh", "-c", tc.cmd}, tc.timeout)
			if took := time.Since(start); took > tc.timeout+execDrain+3*time.Second {
				t.Errorf("took %v, want at most %v", took, tc.timeout+execDrain+3*time.Second)
			}
			if !errors.Is(err, tc.wantErr) || string(out) != tc.wantOut || code != tc.wantCode {
				t.Errorf("= %q %d %v, want %q %d %v", out, code, err, tc.wantOut, tc.wantCode, tc.wantErr)
			}
			// The children holding the output are gone (runc exec reports
			// the exit code only once they are), and so are those of the
			// timed-out exec: only init stays.
			e.waitOnlyInit(t, id)
		})
	}
	if err := e.rt.Stop(ctx, id, syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
}

func TestParseProcStat(t *testing.T) {
	tests := []struct {
		name, in string
		want     procStat
		wantErr  bool
	}{
		{"plain", "42 (sleep) S 7 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 1234 56 rest", procStat{ppid: 7, start: 123456}, false},
		{"comm with spaces and parens", "42 (a) b) (c) R 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0", procStat{ppid: 1, start: 99}, false},
		{"short", "42 (x) S 1 2 3", procStat{}, true},
		{"no comm", "garbage", procStat{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("= %+v, %v; want %+v (err %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestRuntimeReopenLog(t *testing.T) {
	e := newTestEnv(t)
	id := "reopen-" + randID(t)
	logPath := e.create(id, true, "sh", "-c", "echo one; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo two; sleep 1000")
	ctx := context.Background()
	waitFor(t, func() bool { b, _ := os.ReadFile(logPath); return strings.Contains(string(b), " stdout F one") })
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.ReopenLog(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := e.rt.ExecSync(ctx, id, []string{"sh", "-c", "echo > /tmp/go"}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { b, _ := os.ReadFile(logPath); return strings.Contains(string(b), " stdout F two") })
	b, _ := os.ReadFile(logPath)
	if strings.Contains(string(b), "one") {
		t.Errorf("new log %q contains the old line", b)
	}
	old, _ := os.ReadFile(logPath + ".1")
	if !strings.Contains(string(old), " stdout F one") || strings.Contains(string(old), "two") {
		t.Errorf("rotated log = %q, want only the first line", old)
	}
}

// waitOnlyInit waits until container id's init is the only process in
// its cgroup: what an exec started is gone.
func (e *testEnv) waitOnlyInit(t *testing.T, id string) {
	t.Helper()
	procs := filepath.Join("/sys/fs/cgroup/pids", e.cgroup, "pinrt-"+id, "cgroup.procs")
	waitFor(t, func() bool {
		b, err := os.ReadFile(procs)
		return err == nil && len(strings.Fields(string(b))) == 1
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if cond() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatal("condition not met within 5s")
}

func TestRuntimeFeaturesAndCheckIDMap(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	ctx := context.Background()

	rt, err := NewRuntime(Handler{Name: "runc", Binary: testRunc, MonitorPath: testConmon}, filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := rt.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.IDMapMounts || !f.RecursiveReadOnly || f.Raw == nil {
		t.Errorf("runc features = %+v, want idmap and rro", f)
	}
	if err := rt.CheckIDMap(ctx); err != nil {
		t.Errorf("CheckIDMap(runc) = %v", err)
	}

	fake := filepath.Join(dir, "oldrt")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"unknown command $1\" >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	old, err := NewRuntime(Handler{Name: "old", Binary: fake, MonitorPath: testConmon}, filepath.Join(dir, "b"))
	if err != nil {
		t.Fatal(err)
	}
	f, err = old.Features(ctx)
	if err != nil || f.IDMapMounts || f.RecursiveReadOnly || f.Raw != nil {
		t.Errorf("old runtime features = %+v, %v; want none", f, err)
	}
	err = old.CheckIDMap(ctx)
	want := fmt.Sprintf("runtime \"old\" (%s) lacks idmapped mounts (features: linux.mountExtensions.idmap.enabled is not true)", fake)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("CheckIDMap(old) = %v, want FailedPrecondition containing %q", err, want)
	}
	_ = exec.ErrNotFound
}

// BenchmarkContainerLifecycle measures create (conmon + runc create),
// start, wait for exit and delete of a container running `true`.
func BenchmarkContainerLifecycle(b *testing.B) {
	e := newTestEnv(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		id := fmt.Sprintf("bench-%d", i)
		e.create(id, true, "sh", "-c", "exit 0")
		if !waitExitFile(ctx, filepath.Join(e.exitDir, id), 10*time.Second, nil) {
			b.Fatal("container did not exit")
		}
		if err := e.rt.Delete(ctx, id, false); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRuntimeUpdatePersists: the bundle's config.json shows the limits
// `runc update` applied, with the device rules of create kept.
func TestRuntimeUpdatePersists(t *testing.T) {
	e := newTestEnv(t)
	id := "upd-" + randID(t)
	e.create(id, true, "sleep", "1000")
	ctx := context.Background()
	limit := int64(64 << 20)
	if err := e.rt.Update(ctx, id, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(e.dir, "bundles", id, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if r := s.Linux.Resources; r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit != limit || len(r.Devices) == 0 {
		t.Errorf("config.json resources %+v, want memory %d and the device rules", r, limit)
	}
	if err := e.rt.Stop(ctx, id, syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
}

// killInit kills a container with its own PID namespace through its init,
// and the rest of the namespace dies with it; a pid file naming a process
// that is not conmon's child is never signalled.
func TestKillInit(t *testing.T) {
	e := newTestEnv(t)
	id := "killinit-" + randID(t)
	e.create(id, true, "sh", "-c", "trap '' TERM; sleep 1000 & sleep 1000")
	rec, err := e.rt.loadRecord(id)
	if err != nil {
		t.Fatal(err)
	}
	// A stranger in the pid file: our own child, not conmon's.
	stranger := exec.Command("sleep", "1000")
	if err := stranger.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stranger.Process.Kill(); _ = stranger.Wait() }()
	pidfile := filepath.Join(rec.Bundle, "pidfile")
	real, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pidfile, []byte(strconv.Itoa(stranger.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if killInit(rec) {
		t.Error("killInit signalled a process that is not the container's init")
	}
	if signalInit(rec, syscall.SIGTERM) {
		t.Error("signalInit signalled a process that is not the container's init")
	}
	if err := stranger.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the stranger was hit: %v", err)
	}
	if err := os.WriteFile(pidfile, real, 0o600); err != nil {
		t.Fatal(err)
	}
	if !killInit(rec) {
		t.Fatal("killInit did not kill the container's init")
	}
	st := e.waitStopped(id)
	if st.ExitCode != 137 {
		t.Errorf("exit code %d, want 137 (SIGKILL)", st.ExitCode)
	}
	// The whole PID namespace is gone, the background sleep too: the
	// container's cgroup holds no process.
	b, err := os.ReadFile(filepath.Join(rec.Bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		procs, err := os.ReadFile(filepath.Join(root, spec.Linux.CgroupsPath, "cgroup.procs"))
		if err == nil && len(strings.TrimSpace(string(procs))) > 0 {
			t.Errorf("processes left in the container's cgroup %s: %s", spec.Linux.CgroupsPath, procs)
		}
	}
}

// TestStopSignalsInitItself: the stop signal sent before the grace
// period ends reaches the container's init through a pidfd, with no
// runtime process, and the container handles it (its trap exits 42);
// once the container has stopped, a second Stop asks nothing either.
func TestStopSignalsInitItself(t *testing.T) {
	e := newTestEnv(t)
	kills := e.recordRuntimeCalls("kill")
	id := "term-" + randID(t)
	// The stop waits for the shell's trap: give it the time a loaded
	// machine may take.
	widenStartupWindow(t)
	e.create(id, true, "sh", "-c", "trap 'exit 42' TERM; sleep 1000 & wait")
	ctx := context.Background()
	if err := e.rt.Stop(ctx, id, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	st, err := e.rt.State(ctx, id)
	if err != nil || st.Status != StatusStopped || st.ExitCode != 42 {
		t.Errorf("state = %+v, %v; want stopped with 42 (the TERM trap)", st, err)
	}
	if err := e.rt.Stop(ctx, id, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("second stop: %v", err)
	}
	if got := kills(); len(got) != 0 {
		t.Errorf("runc calls of a graceful stop = %q, want none", got)
	}
}

// TestStopRightAfterStart: a stop that comes before the container's
// process has set up its handler (here a shell that sets its trap after
// 200 ms) still ends it gracefully. The kernel drops a signal to a PID
// namespace's init that has no handler for it: sent at once, the TERM
// was lost and the container ran until the grace period's SIGKILL.
func TestStopRightAfterStart(t *testing.T) {
	e := newTestEnv(t)
	widenStartupWindow(t)
	ctx := context.Background()
	id := "early-" + randID(t)
	e.create(id, true, "sh", "-c", "sleep 0.2; trap 'exit 42' TERM; sleep 1000 & wait")
	if err := e.rt.Stop(ctx, id, syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := e.rt.State(ctx, id); err != nil || st.Status != StatusStopped || st.ExitCode != 42 {
		t.Errorf("state = %+v, %v; want stopped with 42 (the TERM trap)", st, err)
	}

	// An init that never handles the signal waits for nothing more than
	// the grace period: the wait for a handler comes out of it.
	never := "never-" + randID(t)
	e.create(never, true, "sleep", "1000")
	const grace = 4 * time.Second
	start := time.Now()
	if err := e.rt.Stop(ctx, never, syscall.SIGTERM, grace); err != nil {
		t.Fatal(err)
	}
	// The wait for a handler is at most half the grace period; had it
	// not come out of the grace period, the stop would take 6 s.
	if took := time.Since(start); took > grace+1500*time.Millisecond {
		t.Errorf("a stop with a %s grace period took %s", grace, took)
	}
	if st, err := e.rt.State(ctx, never); err != nil || st.Status != StatusStopped || st.ExitCode != 137 {
		t.Errorf("state = %+v, %v; want stopped with 137 (the SIGKILL)", st, err)
	}
}

// widenStartupWindow lets a container's init take up to 10 s, not 1 s,
// to set up its stop handler, for the rest of the test.
func widenStartupWindow(t *testing.T) {
	old := startupWindow
	startupWindow = 10 * time.Second
	t.Cleanup(func() { startupWindow = old })
}

// TestStopWithoutMonitor: a container whose conmon is gone (killed, or
// its exit-file write failed) gets no exit file, ever. Stop must not wait
// for one until its caller gives up: it kills the container and takes
// the runtime's word that it stopped.
func TestStopWithoutMonitor(t *testing.T) {
	e := newTestEnv(t)
	id := "orphan-" + randID(t)
	e.create(id, true, "sh", "-c", "trap '' TERM; sleep 1000 & wait")
	bundle := filepath.Join(e.dir, "bundles", id)
	killConmon(bundle)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.rt.Stop(ctx, id, syscall.SIGTERM, 15*time.Second); err != nil {
		t.Fatalf("stop without a monitor: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("stop returned only when its context ended")
	}
	st, err := e.rt.State(ctx, id)
	if err != nil || st.Status != StatusStopped {
		t.Errorf("state = %+v, %v; want stopped", st, err)
	}
}

// TestDeleteForceOfExitedContainer: a forced delete of a container conmon
// saw exit is runc's plain delete, which destroys it at once (the forced
// one sleeps 100 ms first); a live container still gets --force and is
// killed. Both are gone from runc and from pinrt's records afterwards.
func TestDeleteForceOfExitedContainer(t *testing.T) {
	e := newTestEnv(t)
	deletes := e.recordRuntimeCalls("delete")
	ctx := context.Background()

	exited := "exited-" + randID(t)
	e.create(exited, true, "sh", "-c", "exit 0")
	e.waitStopped(exited)
	_ = deletes()
	if err := e.rt.Delete(ctx, exited, true); err != nil {
		t.Fatal(err)
	}
	if got := deletes(); len(got) != 1 || got[0] != "delete "+exited {
		t.Errorf("runc calls for an exited container = %q, want one plain delete", got)
	}

	live := "live-" + randID(t)
	e.create(live, true, "sleep", "1000")
	_ = deletes()
	if err := e.rt.Delete(ctx, live, true); err != nil {
		t.Fatal(err)
	}
	if got := deletes(); len(got) != 1 || got[0] != "delete --force "+live {
		t.Errorf("runc calls for a live container = %q, want one forced delete", got)
	}
	for _, id := range []string{exited, live} {
		if known, err := e.rt.known(ctx, id); err != nil || known {
			t.Errorf("runc still knows %s after Delete (%v)", id, err)
		}
		if _, err := os.Stat(e.rt.recordPath(id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("record of %s after Delete: %v", id, err)
		}
	}
}

// wrapRuntime makes e's runtime the shell script written to path.
func (e *testEnv) wrapRuntime(path, script string) {
	e.t.Helper()
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.h.Binary = path
	rt, err := NewRuntime(e.h, filepath.Join(e.dir, "state"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.rt = rt
}

// recordRuntimeCalls puts the runtime behind a wrapper that records its
// command lines; the returned func gives (and clears) those running
// subcommand sub, from sub on.
func (e *testEnv) recordRuntimeCalls(sub string) func() []string {
	calls := filepath.Join(e.dir, "calls")
	wrapper := filepath.Join(e.dir, "runc-wrapper")
	e.wrapRuntime(wrapper, fmt.Sprintf("#!/bin/sh\necho \"$*\" >>%s\nexec %s \"$@\"\n", calls, testRunc))
	return func() []string {
		b, _ := os.ReadFile(calls)
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); slices.Contains(f, sub) {
				out = append(out, strings.Join(f[slices.Index(f, sub):], " "))
			}
		}
		_ = os.Remove(calls)
		return out
	}
}

// TestReapKeepsState: Reap deletes an exited container from runc at once
// and keeps what State and ExitState say; Delete then needs no runtime
// call. A live container is refused.
func TestReapKeepsState(t *testing.T) {
	e := newTestEnv(t)
	deletes := e.recordRuntimeCalls("delete")
	ctx := context.Background()
	live := "live-" + randID(t)
	e.create(live, true, "sleep", "1000")
	if err := e.rt.Reap(ctx, live); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Reap of a running container: %v, want FailedPrecondition", err)
	}
	id := "reap-" + randID(t)
	e.create(id, true, "sh", "-c", "exit 5")
	e.waitStopped(id)
	_ = deletes()
	if err := e.rt.Reap(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Reap(ctx, id); err != nil {
		t.Errorf("second Reap: %v", err)
	}
	if got := deletes(); len(got) != 1 || got[0] != "delete "+id {
		t.Errorf("runc calls of two Reaps = %q, want one plain delete", got)
	}
	if known, err := e.rt.known(ctx, id); err != nil || known {
		t.Errorf("runc still knows %s after Reap (%v)", id, err)
	}
	st, err := e.rt.State(ctx, id)
	if err != nil || st.Status != StatusStopped || st.ExitCode != 5 {
		t.Errorf("State after Reap = %+v, %v; want stopped, exit 5", st, err)
	}
	if xs, ok := e.rt.ExitState(id); !ok || xs.ExitCode != 5 {
		t.Errorf("ExitState after Reap = %+v, %v; want exit 5", xs, ok)
	}
	if err := e.rt.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	if got := deletes(); len(got) != 0 {
		t.Errorf("runc calls of Delete after Reap = %q, want none", got)
	}
	if _, err := e.rt.State(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("State after Delete: %v, want NotFound", err)
	}
	if err := e.rt.Stop(ctx, live, syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
	// Deleted, record and all (as a failed create leaves it): nothing
	// is left to reap.
	if err := e.rt.Delete(ctx, live, true); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Reap(ctx, live); !errdefs.IsNotFound(err) {
		t.Errorf("Reap of a container the runtime has no record of: %v, want NotFound", err)
	}
}

// TestPrepareThenCreate: a prepared container is only files: runc does
// not know it, an update goes into config.json, a Delete makes no
// runtime call. CreatePrepared creates it from them (with the updated
// limits), and a second CreatePrepared, as after a crash between the
// create and the caller's record of it, adopts the created container
// under its live conmon instead of failing.
func TestPrepareThenCreate(t *testing.T) {
	e := newTestEnv(t)
	calls := e.recordRuntimeCalls("create")
	ctx := context.Background()
	prepare := func(id string) string {
		spec, err := BuildContainerSpec(ctx, &ContainerSpec{
			ID: id, Rootfs: e.rootfs, Command: []string{"sh", "-c", "echo started; sleep 60"},
			Namespaces: Namespaces{PIDMode: PIDContainer}, CgroupParent: e.cgroup,
		})
		if err != nil {
			t.Fatal(err)
		}
		bundle := filepath.Join(e.dir, "bundles", id)
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := e.rt.Delete(cctx, id, true); err != nil {
				t.Errorf("cleanup delete %s: %v", id, err)
			}
			killConmon(bundle)
		})
		if err := e.rt.Prepare(CreateOptions{ID: id, Bundle: bundle, Spec: spec, LogPath: filepath.Join(e.dir, id+".log"), ExitDir: e.exitDir}); err != nil {
			t.Fatal(err)
		}
		return bundle
	}

	id := "prep-" + randID(t)
	bundle := prepare(id)
	if _, err := e.rt.State(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("State of a prepared container = %v, want NotFound", err)
	}
	shares := uint64(321)
	if err := e.rt.Update(ctx, id, &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares}}); err != nil {
		t.Fatalf("Update of a prepared container: %v", err)
	}
	pid, err := e.rt.CreatePrepared(ctx, id)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(bundle, "runtime.log"))
		t.Fatalf("CreatePrepared: %v\n%s", err, b)
	}
	if st, err := e.rt.State(ctx, id); err != nil || st.Status != StatusCreated || st.Pid != pid {
		t.Fatalf("after CreatePrepared: %+v, %v; want created with pid %d", st, err, pid)
	}
	// The crash case: the caller never recorded pid and asks again.
	again, err := e.rt.CreatePrepared(ctx, id)
	if err != nil || again != pid {
		t.Fatalf("CreatePrepared again = %d, %v; want the same container, pid %d", again, err, pid)
	}
	if n := len(calls()); n != 1 {
		t.Fatalf("runc create ran %d times, want once", n)
	}
	// Reset (a restart that found the start cut short) undoes it all:
	// conmon and init killed, runc's container gone, files only again.
	if err := e.rt.Reset(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.State(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("State after Reset = %v, want NotFound", err)
	}
	waitFor(t, func() bool { return syscall.Kill(pid, 0) != nil })
	if pid, err = e.rt.CreatePrepared(ctx, id); err != nil {
		t.Fatalf("CreatePrepared after Reset: %v", err)
	}
	_ = calls() // the record of runtime calls starts afresh
	if err := e.rt.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if res, err := readSpecResources(bundle); err != nil || res.CPU == nil || res.CPU.Shares == nil || *res.CPU.Shares != shares {
		t.Fatalf("config.json resources after the update = %+v, %v", res, err)
	}

	// A prepared container that never starts leaves without runc.
	other := "prep2-" + randID(t)
	prepare(other)
	deletes := e.recordRuntimeCalls("delete")
	if err := e.rt.Delete(ctx, other, true); err != nil {
		t.Fatal(err)
	}
	if d := deletes(); len(d) != 0 {
		t.Fatalf("deleting a prepared container ran %v", d)
	}
	if _, err := os.Stat(e.rt.recordPath(other)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("record of a deleted prepared container: %v", err)
	}
}

// readSpecResources reads linux.resources of a bundle's config.json.
func readSpecResources(bundle string) (*specs.LinuxResources, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	var sp specs.Spec
	if err := json.Unmarshal(b, &sp); err != nil {
		return nil, err
	}
	if sp.Linux == nil || sp.Linux.Resources == nil {
		return &specs.LinuxResources{}, nil
	}
	return sp.Linux.Resources, nil
}

// TestFinishUpdate: an Update cut short between the cgroup and
// config.json is completed from its pending file, whichever step the
// crash came before; without a pending update nothing runs, and a
// stopped container's limits are only recorded.
func TestFinishUpdate(t *testing.T) {
	e := newTestEnv(t)
	ctx := context.Background()
	id := "fin-" + randID(t)
	e.create(id, true, "sleep", "1000")
	bundle := filepath.Join(e.dir, "bundles", id)
	calls := e.recordRuntimeCalls("update")

	// A successful Update leaves no pending file.
	first := int64(64 << 20)
	if err := e.rt.Update(ctx, id, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &first}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bundle, pendingUpdateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pending file after a finished Update: %v", err)
	}
	calls()
	if err := e.rt.FinishUpdate(ctx, id); err != nil {
		t.Fatal(err)
	}
	if c := calls(); len(c) != 0 {
		t.Fatalf("FinishUpdate without a pending update ran %q", c)
	}

	// Killed after the pending file, before runc update.
	second := int64(96 << 20)
	writePending(t, bundle, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &second}})
	if err := e.rt.FinishUpdate(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkLimits(t, e, id, second)

	// Killed after runc update, before config.json.
	third := int64(128 << 20)
	res := &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &third}}
	writePending(t, bundle, res)
	upd := exec.Command(testRunc, "--root", e.h.Root, "update", "--resources", filepath.Join(bundle, pendingUpdateFile), id)
	if out, err := upd.CombinedOutput(); err != nil {
		t.Fatalf("runc update: %v: %s", err, out)
	}
	if err := e.rt.FinishUpdate(ctx, id); err != nil {
		t.Fatal(err)
	}
	checkLimits(t, e, id, third)

	// A stopped container: the limits are recorded, the pending file goes.
	if err := e.rt.Stop(ctx, id, syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
	e.waitStopped(id)
	fourth := int64(160 << 20)
	writePending(t, bundle, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &fourth}})
	if err := e.rt.FinishUpdate(ctx, id); err != nil {
		t.Fatalf("FinishUpdate of a stopped container: %v", err)
	}
	if got := recordedLimit(t, bundle); got != fourth {
		t.Errorf("config.json memory limit %d, want %d", got, fourth)
	}
	if _, err := os.Stat(filepath.Join(bundle, pendingUpdateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pending file after FinishUpdate of a stopped container: %v", err)
	}
}

// TestUpdateOutlivesCancel: an Update whose caller gives up while runc
// update runs still reaches both the cgroup and config.json.
func TestUpdateOutlivesCancel(t *testing.T) {
	e := newTestEnv(t)
	id := "upd-" + randID(t)
	e.create(id, true, "sleep", "1000")
	started := filepath.Join(e.dir, "update-started")
	e.wrapRuntime(filepath.Join(e.dir, "slow-update"),
		fmt.Sprintf("#!/bin/sh\nfor a; do [ \"$a\" = update ] && touch %s && sleep 0.5; done\nexec %s \"$@\"\n", started, testRunc))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer cancel()
		for range 3000 { // 30s: the wrapper may be slow to start
			if _, err := os.Stat(started); err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	limit := int64(80 << 20)
	if err := e.rt.Update(ctx, id, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}); err != nil {
		t.Fatalf("Update canceled while runc ran: %v", err)
	}
	if ctx.Err() == nil {
		t.Fatal("the caller's context was not canceled during the update")
	}
	checkLimits(t, e, id, limit)
}

func writePending(t *testing.T, bundle string, res *specs.LinuxResources) {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, pendingUpdateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkLimits: the cgroup and config.json both hold limit, and no update
// is pending.
func checkLimits(t *testing.T, e *testEnv, id string, limit int64) {
	t.Helper()
	bundle := filepath.Join(e.dir, "bundles", id)
	if got := recordedLimit(t, bundle); got != limit {
		t.Errorf("config.json memory limit %d, want %d", got, limit)
	}
	st, err := e.rt.State(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if got := cgroupMemoryLimit(t, st.Pid); got != limit {
		t.Errorf("cgroup memory limit %d, want %d", got, limit)
	}
	if _, err := os.Stat(filepath.Join(bundle, pendingUpdateFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pending file after FinishUpdate: %v", err)
	}
}

func recordedLimit(t *testing.T, bundle string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if r := s.Linux.Resources; r != nil && r.Memory != nil && r.Memory.Limit != nil {
		return *r.Memory.Limit
	}
	return -1
}

// cgroupMemoryLimit reads the memory limit of pid's cgroup, v1 or v2.
func cgroupMemoryLimit(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var file string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		switch {
		case len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "memory"):
			file = filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.limit_in_bytes")
		case len(f) == 3 && f[0] == "0" && f[1] == "" && file == "":
			file = filepath.Join("/sys/fs/cgroup", f[2], "memory.max")
		}
	}
	v, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return n
}

// TestExecSyncTimeoutFromStart: an exec's timeout runs from the command's
// start in the container, not from runc's: a runtime slow to start (a
// loaded node) fails no quick command, as it failed kubelet's 1 s exec
// probes. A command that hangs still times out, and one that never
// starts is given up execStartGrace past its timeout.
func TestExecSyncTimeoutFromStart(t *testing.T) {
	e := newTestEnv(t)
	id := "execslow-" + randID(t)
	e.create(id, true, "sleep", "1000")
	// The wrapper's sleep is a process outside the container that holds
	// the exec's output pipes, as a stuck runc could: killed by the test
	// only.
	delay, sleeper := filepath.Join(e.dir, "exec-delay"), filepath.Join(e.dir, "exec-sleeper")
	e.wrapRuntime(filepath.Join(e.dir, "slow-exec"), fmt.Sprintf(`#!/bin/sh
for a; do
	if [ "$a" = exec ]; then sleep "$(cat %s)" & echo $! >%s; wait; break; fi
done
exec %s "$@"
`, delay, sleeper, testRunc))
	t.Cleanup(func() {
		if b, err := os.ReadFile(sleeper); err == nil {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	ctx := context.Background()
	setDelay := func(d string) {
		if err := os.WriteFile(delay, []byte(d), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	setDelay("1.5")
	out, _, code, err := e.rt.ExecSync(ctx, id, []string{"sh", "-c", "sleep 0.2; echo hi"}, time.Second)
	if err != nil || code != 0 || string(out) != "hi\n" {
		t.Errorf("a quick command behind a 1.5s runtime start, 1s timeout: %q %d %v; want hi, 0", out, code, err)
	}
	start := time.Now()
	_, _, _, err = e.rt.ExecSync(ctx, id, []string{"sleep", "100"}, time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after 1s") {
		t.Errorf("a hanging command behind a slow start: %v, want DeadlineExceeded saying it timed out", err)
	}
	if took := time.Since(start); took > 1500*time.Millisecond+time.Second+execKillWait+execDrain {
		t.Errorf("a hanging command's exec took %v", took)
	}

	old := execStartGrace
	execStartGrace = time.Second
	t.Cleanup(func() { execStartGrace = old })
	setDelay("1000")
	start = time.Now()
	_, _, _, err = e.rt.ExecSync(ctx, id, []string{"true"}, time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not start within 2s") {
		t.Errorf("a command that never starts: %v, want DeadlineExceeded saying it did not start", err)
	}
	// runc, the wrapper, is killed after execKillWait; the output is not
	// waited for past execDrain, although the sleep still holds it.
	if took := time.Since(start); took > 2*time.Second+execKillWait+2*execDrain+2*time.Second {
		t.Errorf("an exec that never started took %v", took)
	}
	e.waitOnlyInit(t, id)
	if err := e.rt.Stop(ctx, id, syscall.SIGKILL, 0); err != nil {
		t.Fatal(err)
	}
}
