package sigpolicy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeEnv carries a fakeHelper, as JSON, to this test binary run as
// pinrt-sigpolicy: TestMain then plays the helper instead of testing.
const fakeEnv = "PINRT_SIGPOLICY_FAKE_HELPER"

// fakeHelper scripts one pinrt-sigpolicy. The zero value accepts with
// no digest.
type fakeHelper struct {
	// Record is a file each run appends a fakeRun line to.
	Record string
	// Digest answers a verify.
	Digest string
	// Error answers a verify instead.
	Error *HelperError
	// BrokenPolicy fails a check naming it, as the real helper does.
	BrokenPolicy string
	// Raw is written to stdout instead of a response.
	Raw string
	// Stderr is written to stderr, then StderrFill bytes of filler.
	Stderr     string
	StderrFill int
	// StdoutFill bytes of filler go to stdout instead of a response.
	StdoutFill int
	// Exit is the exit status after answering.
	Exit int
	// Kill makes the helper die of SIGKILL before answering.
	Kill bool
	// Hang makes it sleep until killed, without answering.
	Hang bool
	// Grandchild makes it start a hanging helper of its own, which
	// holds its stdout and stderr, before it hangs.
	Grandchild bool
}

// fakeRun is what a run of the fake recorded.
type fakeRun struct {
	Pid     int
	Request HelperRequest
}

// useFake makes f the helper of the next runs and returns the path to
// run and the file the runs are recorded in.
func useFake(t *testing.T, f fakeHelper) (helper, record string) {
	t.Helper()
	if f.Record == "" {
		f.Record = t.TempDir() + "/runs"
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeEnv, string(b))
	// A race-enabled binary sleeps a second before exiting 0.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe, f.Record
}

// runs reads what the fake recorded: none if it never ran.
func runs(t *testing.T, record string) []fakeRun {
	t.Helper()
	fh, err := os.Open(record)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var out []fakeRun
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var r fakeRun
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// playHelper is the fake's whole run; it returns the exit status.
func playHelper(script string) int {
	var f fakeHelper
	if err := json.Unmarshal([]byte(script), &f); err != nil {
		fmt.Fprintln(os.Stderr, "fake helper:", err)
		return 100
	}
	var req HelperRequest
	_ = json.NewDecoder(io.LimitReader(os.Stdin, 1<<20)).Decode(&req)
	if err := record(f.Record, fakeRun{Pid: os.Getpid(), Request: req}); err != nil {
		fmt.Fprintln(os.Stderr, "fake helper:", err)
		return 100
	}
	fmt.Fprint(os.Stderr, f.Stderr)
	fmt.Fprint(os.Stderr, strings.Repeat("e", f.StderrFill))
	switch {
	case f.Kill:
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	case f.Grandchild:
		child := exec.Command(os.Args[0])
		b, _ := json.Marshal(fakeHelper{Record: f.Record, Hang: true})
		child.Env = append(os.Environ(), fakeEnv+"="+string(b))
		child.Stdout, child.Stderr = os.Stdout, os.Stderr
		if err := child.Start(); err != nil {
			return 101
		}
		time.Sleep(time.Hour)
	case f.Hang:
		time.Sleep(time.Hour)
	case f.Raw != "" || f.StdoutFill > 0:
		fmt.Print(f.Raw, strings.Repeat("o", f.StdoutFill))
	default:
		resp := HelperResponse{Digest: f.Digest, Error: f.Error}
		if req.Op == OpCheck {
			resp = HelperResponse{}
			for _, p := range req.Policies {
				if p == f.BrokenPolicy {
					resp.Error = &HelperError{Kind: KindFailedPrecondition, Message: "signature policy " + p + " is not a valid containers-policy.json: bad"}
				}
			}
		}
		_ = json.NewEncoder(os.Stdout).Encode(resp)
	}
	return f.Exit
}

func record(path string, r fakeRun) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer fh.Close()
	_, err = fh.Write(append(b, '\n'))
	return err
}

func TestMain(m *testing.M) {
	if script := os.Getenv(fakeEnv); script != "" {
		os.Exit(playHelper(script))
	}
	os.Exit(m.Run())
}
