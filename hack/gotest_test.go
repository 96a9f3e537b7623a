package hack

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGotestSummary runs gotest.sh, as make test-e2e does, on a scratch
// module whose failing test is followed by a flood of output: the
// failure must come again at the very end, where CI's tail shows it, and
// the exit status must stay go test's. A failed test runs once more: one
// that then passes is named as flaked and the run passes; one that fails
// again, or a run a panic cut short, fails.
func TestGotestSummary(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs go")
	}
	script, err := filepath.Abs("gotest.sh")
	if err != nil {
		t.Fatal(err)
	}
	src := `package scratch

import (
	"fmt"
	"os"
	"testing"
)

func TestFails(t *testing.T) {
	t.Run("inner", func(t *testing.T) { t.Log("the reason"); t.Fatal("boom") })
}

func TestPasses(t *testing.T) {}

func TestNoisyAfter(t *testing.T) {
	for i := 0; i < 500; i++ {
		fmt.Fprintln(os.Stderr, "daemon log line", i)
	}
}
`
	runIn := func(t *testing.T, dir string, files map[string]string, args ...string) (string, int) {
		t.Helper()
		files["go.mod"] = "module scratch\n\ngo 1.22\n"
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("bash", append([]string{script, "-count=1"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GO="+goBin, "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	run := func(t *testing.T, files map[string]string, args ...string) (string, int) {
		t.Helper()
		return runIn(t, t.TempDir(), files, args...)
	}

	t.Run("failure", func(t *testing.T) {
		out, code := run(t, map[string]string{"a_test.go": src}, ".")
		if code != 1 {
			t.Fatalf("exit %d, want go test's 1:\n%s", code, out)
		}
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		tail := strings.Join(lines[max(0, len(lines)-16):], "\n")
		for _, want := range []string{"--- FAIL: TestFails/inner", "the reason", "boom", "  TestFails (", "failed again on a retry: TestFails"} {
			if !strings.Contains(tail, want) {
				t.Errorf("the last lines lack %q:\n%s", want, tail)
			}
		}
		if strings.Contains(tail, "daemon log line") || strings.Contains(tail, "TestPasses") {
			t.Errorf("the summary repeats what did not fail:\n%s", tail)
		}
	})
	t.Run("build failure", func(t *testing.T) {
		out, code := run(t, map[string]string{"a_test.go": "package scratch\n\nfunc broken( {}\n"}, ".")
		if code == 0 {
			t.Fatalf("exit 0 on a build failure:\n%s", out)
		}
		if i := strings.LastIndex(out, "=== gotest.sh: failed tests:"); i < 0 || !strings.Contains(out[i:], "FAIL\tscratch") {
			t.Errorf("the summary does not name the package that did not build:\n%s", out)
		}
	})
	t.Run("flake", func(t *testing.T) {
		dir := t.TempDir()
		flaked := filepath.Join(t.TempDir(), "flaked")
		t.Setenv("GOTEST_FLAKED", flaked)
		// Fails while the marker is absent, and makes it.
		flaky := "package scratch\n\nimport (\n\t\"os\"\n\t\"testing\"\n)\n\n" +
			"func TestFlaky(t *testing.T) {\n\tif _, err := os.Stat(\"marker\"); err != nil {\n" +
			"\t\tos.WriteFile(\"marker\", nil, 0o644)\n\t\tt.Fatal(\"first run\")\n\t}\n}\n\n" +
			"func TestOther(t *testing.T) {}\n"
		out, code := runIn(t, dir, map[string]string{"a_test.go": flaky}, ".")
		if code != 0 {
			t.Fatalf("exit %d for a test that passed on its retry:\n%s", code, out)
		}
		if !strings.Contains(out, "FLAKED (failed, then passed on a retry): TestFlaky") || !strings.Contains(out, "once more: ^(TestFlaky)$") {
			t.Errorf("the flake is not named, or more than it was retried:\n%s", out)
		}
		if got, err := os.ReadFile(flaked); err != nil || !strings.HasPrefix(string(got), "TestFlaky ") {
			t.Errorf("GOTEST_FLAKED holds %q (%v), want TestFlaky", got, err)
		}
	})
	t.Run("panic is not retried", func(t *testing.T) {
		src := "package scratch\n\nimport \"testing\"\n\nfunc TestPanics(t *testing.T) { panic(\"boom\") }\n\nfunc TestAfter(t *testing.T) {}\n"
		out, code := run(t, map[string]string{"a_test.go": src}, ".")
		if code == 0 || !strings.Contains(out, "not retried") {
			t.Errorf("exit %d, or a retry after a panic (which keeps later tests from running):\n%s", code, out)
		}
	})
	t.Run("success", func(t *testing.T) {
		out, code := run(t, map[string]string{"a_test.go": "package scratch\n\nimport \"testing\"\n\nfunc TestPasses(t *testing.T) {}\n"}, ".")
		if code != 0 || strings.Contains(out, "gotest.sh") {
			t.Errorf("exit %d, or a summary on success:\n%s", code, out)
		}
	})
}
