package bench_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinrt/pinrt/test/bench"
	"github.com/pinrt/pinrt/test/bench/benchtest"
)

const testImage = "example.test/busybox:latest"

func startFake(t *testing.T) (*benchtest.Server, *bench.Client) {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir() under a long
	// test name can exceed that, so use a short temp dir.
	dir, err := os.MkdirTemp("", "pb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := benchtest.Start(filepath.Join(dir, "cri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c, err := bench.Dial("unix://"+srv.Socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

func op(t *testing.T, res *bench.Result, name string) bench.OpSummary {
	t.Helper()
	for _, o := range res.Ops {
		if o.Name == name {
			return o
		}
	}
	t.Fatalf("no row %q in %+v", name, res.Ops)
	return bench.OpSummary{}
}

type want struct{ count, errors int }

func TestScenarios(t *testing.T) {
	tests := []struct {
		name     string
		scenario string
		cfg      bench.Config
		setup    func(*benchtest.Server)
		ops      map[string]want
		errors   int
		errMatch string // in the first error sample of some row
		left     int    // sandboxes left on the fake afterwards
	}{
		{
			name: "sandbox ok", scenario: bench.ScenarioSandbox, cfg: bench.Config{N: 20, P: 4},
			ops: map[string]want{
				bench.OpRunPodSandbox: {20, 0}, bench.OpPodSandboxStatus: {20, 0},
				bench.OpStopPodSandbox: {20, 0}, bench.OpRemovePodSandbox: {20, 0}, bench.OpSandboxE2E: {20, 0},
			},
		},
		{
			name: "sandbox run failures", scenario: bench.ScenarioSandbox, cfg: bench.Config{N: 20, P: 4},
			setup: func(s *benchtest.Server) { s.FailNext("RunPodSandbox", 3) },
			ops: map[string]want{
				bench.OpRunPodSandbox: {17, 3}, bench.OpPodSandboxStatus: {17, 0},
				bench.OpStopPodSandbox: {17, 0}, bench.OpRemovePodSandbox: {17, 0}, bench.OpSandboxE2E: {17, 3},
			},
			errors: 3, errMatch: "injected failure in RunPodSandbox",
		},
		{
			name: "sandbox stop failures still remove", scenario: bench.ScenarioSandbox, cfg: bench.Config{N: 10, P: 1},
			setup: func(s *benchtest.Server) { s.FailNext("StopPodSandbox", 2) },
			ops: map[string]want{
				bench.OpRunPodSandbox: {10, 0}, bench.OpStopPodSandbox: {8, 2}, bench.OpRemovePodSandbox: {10, 0}, bench.OpSandboxE2E: {8, 2},
			},
			errors: 2, errMatch: "injected failure in StopPodSandbox",
		},
		{
			name: "sandbox userns", scenario: bench.ScenarioSandbox, cfg: bench.Config{N: 12, P: 3, Variant: bench.VariantUserns, UsernsCount: 3},
			ops: map[string]want{bench.OpRunPodSandbox: {12, 0}, bench.OpSandboxE2E: {12, 0}},
		},
		{
			name: "sandbox hostnet", scenario: bench.ScenarioSandbox, cfg: bench.Config{N: 5, P: 2, Variant: bench.VariantHostnet},
			ops: map[string]want{bench.OpRunPodSandbox: {5, 0}, bench.OpSandboxE2E: {5, 0}},
		},
		{
			name: "pod ok", scenario: bench.ScenarioPod, cfg: bench.Config{N: 10, P: 3, Image: testImage},
			ops: map[string]want{
				bench.OpPullImage: {1, 0}, bench.OpRunPodSandbox: {10, 0}, bench.OpCreateContainer: {10, 0},
				bench.OpStartContainer: {10, 0}, bench.OpWaitRunning: {10, 0}, bench.OpStopContainer: {10, 0},
				bench.OpRemoveContainer: {10, 0}, bench.OpStopPodSandbox: {10, 0}, bench.OpRemovePodSandbox: {10, 0},
				bench.OpPodRunning: {10, 0}, bench.OpPodE2E: {10, 0},
			},
		},
		{
			name: "pod start failure tears down", scenario: bench.ScenarioPod, cfg: bench.Config{N: 6, P: 2, Image: testImage},
			setup: func(s *benchtest.Server) { s.FailNext("StartContainer", 2) },
			ops: map[string]want{
				bench.OpCreateContainer: {6, 0}, bench.OpStartContainer: {4, 2}, bench.OpWaitRunning: {4, 0},
				bench.OpRemoveContainer: {6, 0}, bench.OpRemovePodSandbox: {6, 0}, bench.OpPodRunning: {4, 2}, bench.OpPodE2E: {4, 2},
			},
			errors: 2, errMatch: "injected failure in StartContainer",
		},
		{
			name: "pod on a runtime without containers", scenario: bench.ScenarioPod, cfg: bench.Config{N: 4, P: 2, Image: testImage},
			setup: func(s *benchtest.Server) { s.NoContainers = true },
			ops: map[string]want{
				bench.OpRunPodSandbox: {4, 0}, bench.OpCreateContainer: {0, 4}, bench.OpStartContainer: {0, 0},
				bench.OpRemovePodSandbox: {4, 0}, bench.OpPodRunning: {0, 4},
			},
			errors: 4, errMatch: "Unimplemented",
		},
		{
			name: "pod without image", scenario: bench.ScenarioPod, cfg: bench.Config{N: 2, P: 1},
			ops:    map[string]want{bench.OpPullImage: {0, 1}, bench.OpCreateContainer: {0, 2}, bench.OpRemovePodSandbox: {2, 0}},
			errors: 3, errMatch: "no image given",
		},
		{
			name: "density", scenario: bench.ScenarioDensity, cfg: bench.Config{N: 8, P: 4, Image: testImage, PID: func() (int, error) { return os.Getpid(), nil }},
			ops: map[string]want{bench.OpRunPodSandbox: {8, 0}, bench.OpPodRunning: {8, 0}, bench.OpRemovePodSandbox: {8, 0}, bench.OpRemoveContainer: {8, 0}},
		},
		{
			name: "density keep", scenario: bench.ScenarioDensity, cfg: bench.Config{N: 5, P: 2, Image: testImage, Keep: true},
			ops:  map[string]want{bench.OpPodRunning: {5, 0}},
			left: 5,
		},
		{
			// The fake lists container stats but not pod stats: the rounds
			// are made and counted, failures too.
			name: "density stats rounds", scenario: bench.ScenarioDensity, cfg: bench.Config{N: 2, P: 2, Image: testImage, StatsRounds: 3},
			ops:    map[string]want{bench.OpPodRunning: {2, 0}, bench.OpListCtrStats: {3, 0}, bench.OpListPodStats: {0, 3}},
			errors: 3, errMatch: "Unimplemented",
		},
		{
			name: "density create failures", scenario: bench.ScenarioDensity, cfg: bench.Config{N: 5, P: 2, Image: testImage},
			setup:  func(s *benchtest.Server) { s.FailNext("CreateContainer", 1) },
			ops:    map[string]want{bench.OpCreateContainer: {4, 1}, bench.OpPodRunning: {4, 1}, bench.OpRemovePodSandbox: {5, 0}},
			errors: 1, errMatch: "injected failure in CreateContainer",
		},
		{
			name: "exec sync", scenario: bench.ScenarioExec, cfg: bench.Config{N: 7, Image: testImage, Streams: -1},
			ops: map[string]want{
				bench.OpPodRunning: {1, 0}, bench.OpExecSync: {7, 0},
				bench.OpRemoveContainer: {1, 0}, bench.OpRemovePodSandbox: {1, 0},
			},
		},
		{
			name: "exec sync failures", scenario: bench.ScenarioExec, cfg: bench.Config{N: 5, Image: testImage, Streams: -1},
			setup:  func(s *benchtest.Server) { s.FailNext("ExecSync", 2) },
			ops:    map[string]want{bench.OpExecSync: {3, 2}, bench.OpRemovePodSandbox: {1, 0}},
			errors: 2, errMatch: "injected failure in ExecSync",
		},
		{
			// The fake has no streaming server: Exec is Unimplemented, and
			// counted once per streaming exec (N/10, at least 1).
			name: "exec stream unimplemented", scenario: bench.ScenarioExec, cfg: bench.Config{N: 20, Image: testImage},
			ops:    map[string]want{bench.OpExecSync: {20, 0}, bench.OpExecStream: {0, 2}, bench.OpRemovePodSandbox: {1, 0}},
			errors: 2, errMatch: "Unimplemented",
		},
		{
			name: "exec pod fails", scenario: bench.ScenarioExec, cfg: bench.Config{N: 5, Image: testImage},
			setup:  func(s *benchtest.Server) { s.FailNext("StartContainer", 1) },
			ops:    map[string]want{bench.OpPodRunning: {0, 1}, bench.OpExecSync: {0, 0}, bench.OpRemovePodSandbox: {1, 0}},
			errors: 1, errMatch: "injected failure in StartContainer",
		},
		{
			name: "portforward unimplemented", scenario: bench.ScenarioPortForward, cfg: bench.Config{N: 1, Image: testImage},
			ops:    map[string]want{bench.OpPodRunning: {1, 0}, bench.OpPortForward: {0, 1}, bench.OpForwardRead: {0, 0}, bench.OpRemovePodSandbox: {1, 0}},
			errors: 1, errMatch: "Unimplemented",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, c := startFake(t)
			if tc.setup != nil {
				tc.setup(srv)
			}
			res, err := bench.Run(context.Background(), c, tc.scenario, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for name, w := range tc.ops {
				o := op(t, res, name)
				if o.Count != w.count || o.Errors != w.errors {
					t.Errorf("%s: count %d errors %d, want %d/%d (samples %q)", name, o.Count, o.Errors, w.count, w.errors, o.ErrorSamples)
				}
			}
			if res.Errors != tc.errors {
				t.Errorf("Errors = %d, want %d", res.Errors, tc.errors)
			}
			if tc.errMatch != "" && !hasSample(res, tc.errMatch) {
				t.Errorf("no error sample contains %q: %+v", tc.errMatch, res.Ops)
			}
			if sb, _ := srv.Counts(); sb != tc.left {
				t.Errorf("%d sandboxes left on the runtime, want %d", sb, tc.left)
			}
			if tc.cfg.PID != nil && (res.Metrics["rss_before_kib"] <= 0 || res.Metrics["rss_after_kib"] <= 0 || res.Metrics["pods_running"] != float64(tc.cfg.N)) {
				t.Errorf("density metrics %v", res.Metrics)
			}
			if res.Runtime != "fake 0.0.1" {
				t.Errorf("Runtime = %q", res.Runtime)
			}
		})
	}
}

func hasSample(res *bench.Result, s string) bool {
	for _, o := range res.Ops {
		for _, m := range o.ErrorSamples {
			if strings.Contains(m, s) {
				return true
			}
		}
	}
	return false
}

func TestUsernsMappingsAreDisjointWhileAlive(t *testing.T) {
	srv, c := startFake(t)
	// Keep the pods so every mapping is alive at once: all must differ.
	res, err := bench.Run(context.Background(), c, bench.ScenarioDensity, bench.Config{
		N: 6, P: 3, Variant: bench.VariantUserns, Image: testImage, Keep: true, UsernsBase: 4 << 16, UsernsCount: 6,
	})
	if err != nil || res.Errors != 0 {
		t.Fatalf("run: %v, %d errors", err, res.Errors)
	}
	seen := map[uint32]bool{}
	for _, id := range srv.UsernsHostIDs() {
		if id%65536 != 0 || id < 4<<16 || id >= 10<<16 || seen[id] {
			t.Fatalf("host IDs %v: %d is unaligned, out of range or repeated", srv.UsernsHostIDs(), id)
		}
		seen[id] = true
	}
	if len(seen) != 6 {
		t.Fatalf("got %d mappings, want 6", len(seen))
	}
	// With every block held by a live pod, the next pod cannot get one:
	// that is counted as a RunPodSandbox error, not a crash.
	res, err = bench.Run(context.Background(), c, bench.ScenarioDensity, bench.Config{
		N: 2, P: 1, Variant: bench.VariantUserns, Image: testImage, UsernsBase: 4 << 16, UsernsCount: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if o := op(t, res, bench.OpRunPodSandbox); o.Count != 1 || o.Errors != 1 || !strings.Contains(o.ErrorSamples[0], "no free user namespace ID block") {
		t.Fatalf("RunPodSandbox row %+v, want 1 ok and 1 ErrNoMappings", o)
	}
}

func TestRestore(t *testing.T) {
	tests := []struct {
		name       string
		containers bool
		changeIP   bool
		failStatus int
		ready      want
		errors     int
		errMatch   string
	}{
		{name: "sandboxes", ready: want{5, 0}},
		{name: "with containers", containers: true, ready: want{5, 0}},
		{name: "IPs changed", changeIP: true, ready: want{0, 5}, errors: 5 + 0, errMatch: "after restart"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, c := startFake(t)
			srv.ChangeIPOnRestart = tc.changeIP
			restarts := 0
			cfg := bench.Config{
				N: 5, P: 2, Image: testImage, WithContainers: tc.containers, WaitTimeout: 2 * time.Second,
				Restart: func(context.Context) error { restarts++; return srv.Restart() },
			}
			if tc.changeIP {
				cfg.WaitTimeout = 300 * time.Millisecond
			}
			res, err := bench.Run(context.Background(), c, bench.ScenarioRestore, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if restarts != 1 {
				t.Fatalf("restart ran %d times", restarts)
			}
			if o := op(t, res, bench.OpRestartVersion); o.Count != 1 || o.Errors != 0 {
				t.Errorf("Version row %+v", o)
			}
			if o := op(t, res, bench.OpRestartReady); o.Count != tc.ready.count || o.Errors != tc.ready.errors {
				t.Errorf("Ready row count %d errors %d, want %+v (%q)", o.Count, o.Errors, tc.ready, o.ErrorSamples)
			}
			allReady := op(t, res, bench.OpRestartAllReady)
			if (tc.ready.errors == 0) != (allReady.Count == 1) {
				t.Errorf("all-Ready row %+v", allReady)
			}
			if res.Errors != tc.errors {
				t.Errorf("Errors = %d, want %d", res.Errors, tc.errors)
			}
			if tc.errMatch != "" && !hasSample(res, tc.errMatch) {
				t.Errorf("no error sample contains %q", tc.errMatch)
			}
			if sb, ct := srv.Counts(); sb != 0 || ct != 0 {
				t.Errorf("left %d sandboxes, %d containers", sb, ct)
			}
		})
	}
}

func TestRestoreRuntimeDown(t *testing.T) {
	srv, c := startFake(t)
	res, err := bench.Run(context.Background(), c, bench.ScenarioRestore, bench.Config{
		N: 2, WaitTimeout: 300 * time.Millisecond,
		Restart: func(context.Context) error { srv.Stop(); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if o := op(t, res, bench.OpRestartVersion); o.Count != 0 || o.Errors != 1 {
		t.Fatalf("Version row %+v, want one error", o)
	}
	if o := op(t, res, bench.OpRestartReady); o.Errors != 2 {
		t.Fatalf("Ready row %+v, want 2 errors", o)
	}
	// Teardown fails too (runtime gone): 2 stops + 2 removes.
	if res.Errors != 1+2+4 {
		t.Fatalf("Errors = %d, want 7", res.Errors)
	}
}

func TestCleanup(t *testing.T) {
	srv, c := startFake(t)
	ctx := context.Background()
	keep := func(runID string) {
		res, err := bench.Run(ctx, c, bench.ScenarioDensity, bench.Config{N: 3, Image: testImage, Keep: true, RunID: runID})
		if err != nil || res.Errors != 0 {
			t.Fatalf("density: %v %+v", err, res)
		}
	}
	keep("runa")
	keep("runb")
	st, err := bench.Cleanup(ctx, c, false, "runa")
	if err != nil || st != (bench.CleanupStats{Containers: 3, Sandboxes: 3}) {
		t.Fatalf("Cleanup(runa) = %+v, %v", st, err)
	}
	srv.FailNext("RemovePodSandbox", 1)
	st, err = bench.Cleanup(ctx, c, true, "")
	if err == nil || !strings.Contains(err.Error(), "injected failure in RemovePodSandbox") {
		t.Fatalf("Cleanup(all) error = %v, want the injected failure", err)
	}
	if st != (bench.CleanupStats{Containers: 3, Sandboxes: 2}) {
		t.Fatalf("Cleanup(all) = %+v", st)
	}
	if st, err = bench.Cleanup(ctx, c, true, ""); err != nil || st.Sandboxes != 1 {
		t.Fatalf("second Cleanup = %+v, %v", st, err)
	}
}

func TestUnknownScenarioAndVariant(t *testing.T) {
	_, c := startFake(t)
	if _, err := bench.Run(context.Background(), c, "nope", bench.Config{}); err == nil || !strings.Contains(err.Error(), `unknown scenario "nope"`) {
		t.Fatalf("err = %v", err)
	}
	if _, err := bench.Run(context.Background(), c, bench.ScenarioSandbox, bench.Config{Variant: "x"}); err == nil || !strings.Contains(err.Error(), `unknown variant "x"`) {
		t.Fatalf("err = %v", err)
	}
	if _, err := bench.Run(context.Background(), c, bench.ScenarioRestore, bench.Config{}); err == nil || err.Error() != "restore needs a restart command" {
		t.Fatalf("err = %v", err)
	}
}

// TestPodLogDirs: with a log dir, the tool creates the pod's and the
// container's log directories as kubelet does (a runtime like CRI-O, and
// the fake, fail CreateContainer without the c0/ directory), and removes
// them with the pod.
func TestPodLogDirs(t *testing.T) {
	dir, err := os.MkdirTemp("", "pbl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := benchtest.Start(filepath.Join(dir, "cri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c, err := bench.Dial("unix://"+srv.Socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	logs := filepath.Join(dir, "logs")
	res, err := bench.Run(context.Background(), c, bench.ScenarioPod, bench.Config{N: 4, P: 2, Image: testImage, LogDir: logs})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 {
		t.Fatalf("run had %d errors: %+v", res.Errors, res.Ops)
	}
	if entries, _ := os.ReadDir(logs); len(entries) != 0 {
		t.Errorf("pod log directories left after removal: %d", len(entries))
	}
}

// TestPodGraceful: a graceful pod run stops its containers as kubelet
// does, a SIGTERM with the 30 s grace period, and runs a container that
// exits on it; the plain run stops with a timeout of 0.
func TestPodGraceful(t *testing.T) {
	for _, graceful := range []bool{false, true} {
		srv, c := startFake(t)
		res, err := bench.Run(context.Background(), c, bench.ScenarioPod, bench.Config{N: 3, Image: testImage, Graceful: graceful})
		if err != nil || res.Errors != 0 {
			t.Fatalf("graceful=%v: %v, %d errors", graceful, err, res.Errors)
		}
		wantTimeout, wantCmd := int64(0), "sleep 3600"
		if graceful {
			wantTimeout, wantCmd = bench.StopGrace, strings.Join(bench.GracefulCommand, " ")
		}
		stops := srv.Stops()
		if len(stops) != 3 {
			t.Fatalf("graceful=%v: %d stops of running containers, want 3", graceful, len(stops))
		}
		for _, s := range stops {
			if s.Timeout != wantTimeout || strings.Join(s.Command, " ") != wantCmd {
				t.Errorf("graceful=%v: stop %+v, want timeout %d of %q", graceful, s, wantTimeout, wantCmd)
			}
		}
	}
}

func TestDensityIdleCPU(t *testing.T) {
	_, c := startFake(t)
	// A runtime that uses 1ms of CPU per read: 1ms over the idle window.
	var used time.Duration
	cpu := func() (time.Duration, error) { used += time.Millisecond; return used, nil }
	res, err := bench.Run(context.Background(), c, bench.ScenarioDensity, bench.Config{
		N: 3, P: 3, Image: testImage, CPU: cpu, IdleWindow: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 {
		t.Fatalf("errors: %+v", res.Ops)
	}
	w := res.Metrics["idle_window_s"]
	got := res.Metrics["idle_cpu_ms_per_min"]
	if w < 0.05 {
		t.Fatalf("idle window %vs, want at least 0.05s: %v", w, res.Metrics)
	}
	if want := 60 / w; got < want*0.99 || got > want*1.01 {
		t.Errorf("idle_cpu_ms_per_min = %v, want %v (1ms over %vs)", got, want, w)
	}
}

func TestPerMinuteAndMBPerSec(t *testing.T) {
	if got := bench.PerMinute(500*time.Millisecond, 30*time.Second); got != 1000 {
		t.Errorf("PerMinute(500ms, 30s) = %v, want 1000", got)
	}
	if got := bench.PerMinute(time.Second, 0); got != 0 {
		t.Errorf("PerMinute over 0 = %v", got)
	}
	if got := bench.MBPerSec(64<<20, 2*time.Second); got < 33.5 || got > 33.6 {
		t.Errorf("MBPerSec(64MiB, 2s) = %v, want 33.55", got)
	}
	if got := bench.MBPerSec(1, 0); got != 0 {
		t.Errorf("MBPerSec over 0 = %v", got)
	}
}

func TestForwardServerCommand(t *testing.T) {
	cmd := bench.ForwardServerCommand(16)
	if len(cmd) != 4 || cmd[0] != "/bin/busybox" || cmd[1] != "sh" {
		t.Fatalf("command %q", cmd)
	}
	for _, s := range []string{"count=16", "httpd -f -p 8080 -h /www", "of=/www/big"} {
		if !strings.Contains(cmd[3], s) {
			t.Errorf("script %q lacks %q", cmd[3], s)
		}
	}
}
