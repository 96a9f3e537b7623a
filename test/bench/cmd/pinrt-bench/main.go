// Command pinrt-bench drives any CRI v1 runtime endpoint through the bench
// scenarios (sandbox, pod, density, restore) and prints latency tables; it
// also serves the test image (registry) and removes leftovers (cleanup).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pinrt/pinrt/test/bench"
)

const usage = `usage: pinrt-bench <command> [flags]

commands:
  sandbox    RunPodSandbox → PodSandboxStatus → Stop → Remove
             (any scenario: --compare ENDPOINT_B runs it on both, A B A B, and prints B/A)
  pod        sandbox + one container to RUNNING and back
  density    start N pods with a sleeping container, report runtime RSS
  exec       one running pod: N ExecSync and N/10 streaming Exec of "echo hi"
  portforward one pod serving a file: read it through PortForward (MB/s)
  restore    N pods, restart the runtime, time until all are Ready again
  pull       generate issue 22's image (3 gzip layers, 345 MB), serve it from a local
             registry and time N pulls (removing it before each) against the raw download
  status     N running pods: ContainerStatus (plain, verbose) of each and ListContainers,
             --stats-rounds times; counts the processes the runtime starts meanwhile;
             then the same reads of the runtime's captured replies from a floor server
  cleanup    remove pods and containers (bench-labelled, or --all)
  registry   serve a busybox test image from an in-process registry
  floor-server serve captured replies (JSON on stdin) on --socket (started by status)

run "pinrt-bench <command> -h" for the flags of a command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run returns the exit code: 0 ok, 1 a run with errors, 2 bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		_, _ = fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, args := args[0], args[1:]
	switch cmd {
	case bench.ScenarioSandbox, bench.ScenarioPod, bench.ScenarioDensity, bench.ScenarioRestore,
		bench.ScenarioExec, bench.ScenarioPortForward, bench.ScenarioStatus, bench.ScenarioPull:
		return runScenario(ctx, cmd, args, stdout, stderr)
	case "cleanup":
		return runCleanup(ctx, args, stdout, stderr)
	case "registry":
		return runRegistry(ctx, args, stdout, stderr)
	case "floor-server":
		return runFloorServer(ctx, args, stderr)
	}
	_, _ = fmt.Fprintf(stderr, "unknown command %q\n%s", cmd, usage)
	return 2
}

// runScenario runs one scenario (or, with --compare, alternates it
// between two runtimes) and prints its result.
func runScenario(ctx context.Context, scenario string, args []string, stdout, stderr io.Writer) int {
	var cfg bench.Config
	f, ok := parseScenarioFlags(scenario, args, &cfg, stderr)
	if !ok {
		return 2
	}
	if err := f.apply(&cfg); err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 2
	}

	if scenario == bench.ScenarioPull {
		reg, err := startPullRegistry(ctx, *f.genDir, *f.scale, *f.limitMBps)
		if err != nil {
			_, _ = fmt.Fprintln(stderr, err)
			return 2
		}
		defer func() { _ = reg.Close() }()
		cfg.Image = reg.Image
	}
	if *f.compare != "" {
		cfgB := cfg
		cfgB.CPU, cfgB.Memory, cfgB.PID, cfgB.DaemonLog = nil, nil, nil, ""
		if *f.cgroupB != "" {
			cpu, err := bench.NewCgroupCPU(*f.cgroupB)
			if err != nil {
				_, _ = fmt.Fprintln(stderr, err)
				return 2
			}
			cfgB.CPU, cfgB.Memory = cpu.Usage, cgroupMemory(*f.cgroupB)
		}
		if *f.pidFileB != "" {
			cfgB.PID = bench.PIDFromFile(*f.pidFileB)
		}
		return runCompare(ctx, scenario, []string{*f.endpoint, *f.compare}, []bench.Config{cfg, cfgB}, *f.rounds, stdout, stderr)
	}
	c, err := bench.Dial(*f.endpoint, cfg.RPCTimeout)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 2
	}
	defer func() { _ = c.Close() }()
	res, err := bench.Run(ctx, c, scenario, cfg)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 2
	}
	return printResult(res, *f.asJSON, *f.out, stdout, stderr)
}

// scenarioFlags are runScenario's flags that are not fields of
// bench.Config as they are.
type scenarioFlags struct {
	endpoint, command, pidFile, restartCmd, cgroup, compare, cgroupB, pidFileB, genDir, out *string
	usernsBase                                                                              *uint
	pid, rounds                                                                             *int
	asJSON                                                                                  *bool
	scale, limitMBps                                                                        *float64
}

// parseScenarioFlags parses args into cfg and the returned flags; false
// when they are bad (the flag package has said why on stderr).
func parseScenarioFlags(scenario string, args []string, cfg *bench.Config, stderr io.Writer) (*scenarioFlags, bool) {
	f := &scenarioFlags{}
	fs := flag.NewFlagSet(scenario, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.endpoint = fs.String("endpoint", "unix:///run/pinrt/pinrt.sock", "CRI endpoint (unix:///path or /path)")
	fs.IntVar(&cfg.N, "n", 10, "number of pods (exec: ExecSync calls)")
	fs.IntVar(&cfg.P, "p", 1, "parallel workers")
	fs.StringVar(&cfg.Variant, "variant", bench.VariantNetns, "netns, userns or hostnet")
	fs.StringVar(&cfg.RunID, "run-id", "", "run ID used in pod names and labels (random if empty)")
	fs.DurationVar(&cfg.RPCTimeout, "timeout", 30*time.Second, "timeout of every RPC")
	fs.DurationVar(&cfg.WaitTimeout, "wait-timeout", time.Minute, "timeout for RUNNING / restore waits")
	fs.StringVar(&cfg.Image, "image", "", "container image (pod, density, restore --with-containers)")
	f.command = fs.String("cmd", "", "container command, split on spaces (empty: sleep 3600, or with --graceful a shell that exits on SIGTERM)")
	fs.BoolVar(&cfg.Graceful, "graceful", false, "pod: stop containers as kubelet does, with SIGTERM and a 30 s grace period, a container that exits on SIGTERM")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "parent of pod log directories (empty: none)")
	f.usernsBase = fs.Uint("userns-base", bench.UsernsBlock, "first host ID for userns pods (multiple of 65536, not 0)")
	fs.IntVar(&cfg.UsernsCount, "userns-count", 1024, "number of 65536-ID blocks for userns pods")
	fs.BoolVar(&cfg.Keep, "keep", false, "density: leave the pods running")
	fs.IntVar(&cfg.StatsRounds, "stats-rounds", 0, "density: list container and pod stats this many times while the pods run; status: rounds of reads (0: 5)")
	fs.IntVar(&cfg.Streams, "streams", 0, "exec: streaming execs (0: N/10, at least 1; negative: none); portforward: reads (0: 3)")
	fs.IntVar(&cfg.ForwardMB, "forward-mb", 64, "portforward: MiB read through the port-forward per read")
	fs.DurationVar(&cfg.IdleWindow, "idle", 0, "density: with --cgroup, measure the runtime's CPU while the pods idle this long (0: skip)")
	f.pid = fs.Int("pid", 0, "runtime daemon PID for RSS (density)")
	f.pidFile = fs.String("pid-file", "", "file holding the runtime daemon PID (density)")
	fs.DurationVar(&cfg.Settle, "settle", time.Second, "density: wait this long before reading RSS after start")
	f.restartCmd = fs.String("restart-cmd", "", "restore: shell command that restarts the runtime")
	fs.BoolVar(&cfg.WithContainers, "with-containers", false, "restore: one running container per pod")
	f.cgroup = fs.String("cgroup", "", "cgroup directory holding the runtime (v1 cpuacct or v2): report CPU per pod")
	fs.StringVar(&cfg.DaemonLog, "daemon-log", "", "runtime log file with debug phase timings (phase=, duration_ms=)")
	f.compare = fs.String("compare", "", "second CRI endpoint B: run the scenario against --endpoint (A) and B alternately and print B/A ratios")
	f.rounds = fs.Int("rounds", 2, "compare: rounds of A then B")
	f.cgroupB = fs.String("cgroup-b", "", "compare: cgroup directory holding runtime B, for its CPU per pod and its memory")
	f.pidFileB = fs.String("pid-file-b", "", "compare: file holding runtime B's daemon PID")
	fs.IntVar(&cfg.Containers, "containers", 1, "density, status: containers per pod")
	f.asJSON = fs.Bool("json", false, "print JSON instead of the table")
	f.genDir = fs.String("gen-dir", "/var/tmp/pinrt-bench-pull", "pull: where the generated layers are kept between runs")
	f.scale = fs.Float64("scale", 1, "pull: size of the generated image relative to issue 22's 345 MB")
	f.limitMBps = fs.Float64("limit-mbps", 0, "pull: the registry serves blobs at this many MB/s in all (0: as fast as it can)")
	fs.BoolVar(&cfg.DropCaches, "drop-caches", false, "pull: drop the page cache before every pull (whole machine)")
	fs.DurationVar(&cfg.PullSettle, "pull-settle", 0, "pull: wait this long after removing the image before each pull (on a journal-less ext4, 360s outlasts its recently-deleted inode window)")
	f.out = fs.String("out", "", "also write the JSON result to this file")
	if err := fs.Parse(args); err != nil {
		return nil, false
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "unexpected arguments: %q\n", fs.Args())
		return nil, false
	}
	return f, true
}

// apply sets the fields of cfg that f's flags give.
func (f *scenarioFlags) apply(cfg *bench.Config) error {
	if *f.usernsBase > 1<<32-1 {
		return fmt.Errorf("--userns-base %d out of range", *f.usernsBase)
	}
	cfg.UsernsBase = uint32(*f.usernsBase)
	cfg.Command = strings.Fields(*f.command)
	switch {
	case *f.pid > 0:
		p := *f.pid
		cfg.PID = func() (int, error) { return p, nil }
	case *f.pidFile != "":
		cfg.PID = bench.PIDFromFile(*f.pidFile)
	}
	if *f.cgroup != "" {
		cpu, err := bench.NewCgroupCPU(*f.cgroup)
		if err != nil {
			return err
		}
		cfg.CPU, cfg.Memory = cpu.Usage, cgroupMemory(*f.cgroup)
	}
	if *f.restartCmd != "" {
		cfg.Restart = restartFunc(*f.restartCmd)
	}
	cfg.Floor = startFloorProcess
	return nil
}

// startFloorProcess starts this binary's floor-server in a process of its
// own, as a runtime is, and waits until it listens.
func startFloorProcess(ctx context.Context, rep *bench.FloorReplies) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	body, err := json.Marshal(rep)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "pinrt-bench-floor-")
	if err != nil {
		return "", nil, err
	}
	sock := filepath.Join(dir, "floor.sock")
	cmd := exec.Command(exe, "floor-server", "--socket", sock)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(body), os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	// waitErr is read only after exited is closed.
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	stop := sync.OnceFunc(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = os.RemoveAll(dir)
	})
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(sock); err == nil {
			return "unix://" + sock, stop, nil
		}
		select {
		case <-exited:
			stop()
			return "", nil, fmt.Errorf("floor server exited before listening: %w", waitErr)
		case <-deadline.C:
			stop()
			return "", nil, errors.New("floor server did not listen within 10s")
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// runFloorServer serves the replies read from stdin until it is stopped.
func runFloorServer(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("floor-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "unix socket to serve on")
	if err := fs.Parse(args); err != nil || *socket == "" {
		_, _ = fmt.Fprintln(stderr, "floor-server needs --socket")
		return 2
	}
	if err := bench.ServeFloor(ctx, *socket, os.Stdin); err != nil {
		_, _ = fmt.Fprintln(stderr, "floor-server:", err)
		return 1
	}
	return 0
}

// cgroupMemory reads the memory of the processes in cgroup dir.
func cgroupMemory(dir string) func() (bench.RuntimeMemory, error) {
	return func() (bench.RuntimeMemory, error) { return bench.CgroupMemory(dir) }
}

// restartFunc runs the shell command rc to restart the runtime.
func restartFunc(rc string) func(context.Context) error {
	return func(ctx context.Context) error {
		c := exec.CommandContext(ctx, "sh", "-c", rc)
		// Files, not pipes: a daemon started in the background by the
		// command inherits them, and Wait would block on a pipe until
		// that daemon exits.
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := c.Run(); err != nil {
			return fmt.Errorf("restart command %q: %w", rc, err)
		}
		return nil
	}
}

// printResult prints res as a table or JSON, and to the file out too
// when it is set; 1 when that fails or res counts errors.
func printResult(res *bench.Result, asJSON bool, out string, stdout, stderr io.Writer) int {
	var err error
	if asJSON {
		err = res.WriteJSON(stdout)
	} else {
		err = res.WriteTable(stdout)
	}
	if err == nil && out != "" {
		err = writeJSONFile(out, res)
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 1
	}
	if res.Errors > 0 {
		return 1
	}
	return 0
}

// startPullRegistry generates the pull scenario's image (or reuses the
// one in genDir) and serves it from a local registry.
func startPullRegistry(ctx context.Context, genDir string, scale, mbps float64) (*bench.Registry, error) {
	layers, err := bench.GeneratePullImage(ctx, genDir, scale)
	if err != nil {
		return nil, err
	}
	img, err := bench.PullImage(layers)
	if err != nil {
		return nil, err
	}
	return bench.StartPullRegistry(ctx, "127.0.0.1:0", img, mbps)
}

// runCompare runs scenario against endpoints A and B alternately, A, B,
// A, B, so that a change of the host's load hits both alike, prints every
// run's table and then the B/A ratios.
func runCompare(ctx context.Context, scenario string, endpoints []string, cfgs []bench.Config, rounds int, stdout, stderr io.Writer) int {
	if rounds < 1 {
		_, _ = fmt.Fprintln(stderr, "--rounds must be at least 1")
		return 2
	}
	clients := make([]*bench.Client, len(endpoints))
	for i, ep := range endpoints {
		c, err := bench.Dial(ep, cfgs[i].RPCTimeout)
		if err != nil {
			_, _ = fmt.Fprintln(stderr, err)
			return 2
		}
		defer func() { _ = c.Close() }()
		clients[i] = c
	}
	results := make([][]*bench.Result, len(endpoints))
	code := 0
	for round := range rounds {
		for i, c := range clients {
			res, err := bench.Run(ctx, c, scenario, cfgs[i])
			if err != nil {
				_, _ = fmt.Fprintln(stderr, err)
				return 2
			}
			_, _ = fmt.Fprintf(stdout, "-- round %d, %s (%s)\n", round+1, string(rune('A'+i)), endpoints[i])
			if err := res.WriteTable(stdout); err != nil {
				_, _ = fmt.Fprintln(stderr, err)
				return 1
			}
			if res.Errors > 0 {
				code = 1
			}
			results[i] = append(results[i], res)
		}
	}
	if err := bench.WriteComparison(stdout, results[0], results[1]); err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 1
	}
	return code
}

func writeJSONFile(path string, res *bench.Result) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(res.WriteJSON(f), f.Close())
}

func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", "unix:///run/pinrt/pinrt.sock", "CRI endpoint")
	all := fs.Bool("all", false, "remove every pod and container, not only bench-labelled ones")
	runID := fs.String("run-id", "", "only this run's objects (without --all)")
	timeout := fs.Duration("timeout", 30*time.Second, "timeout of every RPC")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c, err := bench.Dial(*endpoint, *timeout)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 2
	}
	defer func() { _ = c.Close() }()
	st, err := bench.Cleanup(ctx, c, *all, *runID)
	_, _ = fmt.Fprintf(stdout, "cleanup: removed %d containers, %d sandboxes\n", st.Containers, st.Sandboxes)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "cleanup errors:\n%v\n", err)
		return 1
	}
	return 0
}

func runRegistry(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("registry", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	addrFile := fs.String("addr-file", "", "write host:port here once the image is pushed")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox binary to put in the image")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	reg, err := bench.StartRegistry(ctx, *listen, *busybox)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 1
	}
	if *addrFile != "" {
		// Written atomically and only after the push, so a script polling
		// for the file never sees a partial address or a missing image.
		tmp := *addrFile + ".tmp." + strconv.Itoa(os.Getpid())
		err := os.WriteFile(tmp, []byte(reg.Addr+"\n"), 0o644)
		if err == nil {
			err = os.Rename(tmp, *addrFile)
		}
		if err != nil {
			_, _ = fmt.Fprintln(stderr, err)
			_ = reg.Close()
			return 1
		}
	}
	_, _ = fmt.Fprintf(stdout, "serving %s\n", reg.Image)
	<-ctx.Done()
	if err := reg.Close(); err != nil {
		_, _ = fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
