package bench

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// runShDefault matches run.sh's `NAME=${...}` settings.
var runShDefault = regexp.MustCompile(`^[A-Z_]+=\$\{`)

// TestRunShExecStreams checks that `make bench` times 100 streaming
// execs, the count the Exec(stream) p50 headline stands for, not the
// tool's default of a tenth of the ExecSync calls.
func TestRunShExecStreams(t *testing.T) {
	args := runShArgs(t, `run_bench "exec" `)
	if len(args) == 0 || args[0] != ScenarioExec {
		t.Fatalf("run.sh's exec line runs %q, want the %s scenario", args, ScenarioExec)
	}
	var c Config
	for i := 1; i+1 < len(args); i++ {
		v, err := strconv.Atoi(args[i+1])
		switch args[i] {
		case "-n":
			c.N = v
		case "--streams":
			c.Streams = v
		default:
			continue
		}
		if err != nil {
			t.Fatalf("%s %q: %v", args[i], args[i+1], err)
		}
	}
	if got := c.execStreams(); got != 100 {
		t.Fatalf("make bench times %d streaming execs (args %q), want 100", got, args)
	}
}

// TestRunShCompareNode checks that `make bench` compares the runtimes on
// kubelet's default node: 110 pods with two containers each.
func TestRunShCompareNode(t *testing.T) {
	args := strings.Join(runShArgs(t, `run_compare compare-node `), " ")
	if !strings.HasPrefix(args, ScenarioStatus+" ") || !strings.Contains(args, " -n 110 ") || !strings.Contains(args, " --containers 2 ") {
		t.Fatalf("run.sh's compare-node line runs %q, want %s with -n 110 --containers 2", args, ScenarioStatus)
	}
}

// runShArgs runs run.sh's settings and its line starting with prefix,
// with run_bench and run_compare printing the tool's arguments instead of
// running it, under run.sh's defaults.
func runShArgs(t *testing.T, prefix string) []string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash to read run.sh")
	}
	script, err := os.ReadFile("run.sh")
	if err != nil {
		t.Fatal(err)
	}
	prog := []string{`run_bench() { shift; printf '%s\n' "$@"; }`, `run_compare() { shift; printf '%s\n' "$@"; }`}
	found := false
	for _, l := range strings.Split(string(script), "\n") {
		switch {
		case runShDefault.MatchString(l):
			prog = append(prog, l)
		case strings.HasPrefix(l, prefix):
			prog = append(prog, l)
			found = true
		}
	}
	if !found {
		t.Fatalf("run.sh has no %q line", prefix)
	}
	cmd := exec.Command(bash, "-c", strings.Join(prog, "\n"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // run.sh's defaults, no BENCH_* of the caller
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
