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
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("needs bash to read run.sh")
	}
	script, err := os.ReadFile("run.sh")
	if err != nil {
		t.Fatal(err)
	}
	// run.sh's settings and its exec scenario line, with run_bench
	// printing the tool's arguments instead of running it.
	prog := []string{`run_bench() { shift; printf '%s\n' "$@"; }`}
	found := false
	for _, l := range strings.Split(string(script), "\n") {
		switch {
		case runShDefault.MatchString(l):
			prog = append(prog, l)
		case strings.HasPrefix(l, `run_bench "exec" `):
			prog = append(prog, l)
			found = true
		}
	}
	if !found {
		t.Fatal(`run.sh has no run_bench "exec" line`)
	}
	cmd := exec.Command(bash, "-c", strings.Join(prog, "\n"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // run.sh's defaults, no BENCH_* of the caller
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	args := strings.Split(strings.TrimSpace(string(out)), "\n")
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
