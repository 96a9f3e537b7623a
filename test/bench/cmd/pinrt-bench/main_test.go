package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/test/bench"
	"github.com/pinrt/pinrt/test/bench/benchtest"
)

func TestRunExitCodeAndResultLine(t *testing.T) {
	dir, err := os.MkdirTemp("", "pbc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := benchtest.Start(filepath.Join(dir, "cri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	ep := "unix://" + srv.Socket

	tests := []struct {
		name     string
		fail     int
		args     []string
		code     int
		lastLine string
	}{
		{"ok", 0, []string{"sandbox", "--endpoint", ep, "-n", "4", "-p", "2"}, 0, "RESULT: ok"},
		{"errors", 3, []string{"sandbox", "--endpoint", ep, "-n", "4"}, 1, "RESULT: 3 errors"},
		{"bad variant", 0, []string{"sandbox", "--endpoint", ep, "--variant", "x"}, 2, ""},
		{"bad endpoint", 0, []string{"sandbox", "--endpoint", "tcp://x"}, 2, ""},
		{"unknown command", 0, []string{"frobnicate"}, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv.FailNext("RunPodSandbox", tc.fail)
			var out, errOut bytes.Buffer
			if code := run(tc.args, &out, &errOut); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.code, errOut.String())
			}
			if tc.lastLine == "" {
				return
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if got := lines[len(lines)-1]; got != tc.lastLine {
				t.Fatalf("last line %q, want %q\n%s", got, tc.lastLine, out.String())
			}
			if tc.fail > 0 && !strings.Contains(out.String(), "injected failure in RunPodSandbox") {
				t.Fatalf("error messages not shown:\n%s", out.String())
			}
		})
	}
}

func TestRunJSONOut(t *testing.T) {
	dir, err := os.MkdirTemp("", "pbj")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := benchtest.Start(filepath.Join(dir, "cri.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	file := filepath.Join(dir, "out", "r.json")
	var out, errOut bytes.Buffer
	if code := run([]string{"sandbox", "--endpoint", srv.Socket, "-n", "3", "--json", "--out", file, "--run-id", "rjson"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, out.Bytes()) {
		t.Fatalf("--out differs from --json stdout")
	}
	var res bench.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.RunID != "rjson" || res.N != 3 || res.Errors != 0 || res.Ops[0].Name != bench.OpRunPodSandbox || res.Ops[0].Count != 3 {
		t.Fatalf("json result %+v", res)
	}
}

func TestCompareAlternatesAndPrintsRatios(t *testing.T) {
	dir, err := os.MkdirTemp("", "pbc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var srvs []*benchtest.Server
	for _, name := range []string{"a.sock", "b.sock"} {
		srv, err := benchtest.Start(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		srvs = append(srvs, srv)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"sandbox", "--endpoint", "unix://" + srvs[0].Socket, "--compare", "unix://" + srvs[1].Socket,
		"--rounds", "2", "-n", "3"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out.String(), errOut.String())
	}
	for i, srv := range srvs {
		if n := srv.Calls("RunPodSandbox"); n != 6 {
			t.Errorf("endpoint %d got %d RunPodSandbox calls, want 6 (2 rounds of 3)", i, n)
		}
	}
	text := out.String()
	order := []string{"-- round 1, A", "-- round 1, B", "-- round 2, A", "-- round 2, B", "== compare sandbox"}
	last := -1
	for _, s := range order {
		i := strings.Index(text, s)
		if i < last {
			t.Fatalf("%q missing or out of order in:\n%s", s, text)
		}
		last = i
	}
	if !strings.Contains(text, "sandbox end to end") || !strings.Contains(text, "B/A") {
		t.Errorf("no ratio table:\n%s", text)
	}
}

// TestMain lets the test binary stand in for pinrt-bench when it starts
// itself (startFloorProcess runs os.Executable).
func TestMain(m *testing.M) {
	if os.Getenv("PINRT_BENCH_TEST_AS_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func TestFloorServerProcess(t *testing.T) {
	t.Setenv("PINRT_BENCH_TEST_AS_MAIN", "1")
	list := &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: "a"}}}
	b, err := proto.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	ep, stop, err := startFloorProcess(context.Background(), &bench.FloorReplies{ListContainers: b})
	if err != nil {
		t.Fatal(err)
	}
	sock := strings.TrimPrefix(ep, "unix://")
	c, err := bench.Dial(ep, 5*time.Second)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	got, err := c.Runtime.ListContainers(context.Background(), &runtimeapi.ListContainersRequest{})
	c.Close()
	stop()
	if err != nil || !proto.Equal(got, list) {
		t.Errorf("ListContainers from the floor process = %v, %v", got, err)
	}
	if _, err := os.Stat(filepath.Dir(sock)); !os.IsNotExist(err) {
		t.Errorf("the floor's directory is left after the stop: %v", err)
	}

	// Replies it cannot read: it exits, and the start says so.
	if _, _, err := startFloorProcess(context.Background(), &bench.FloorReplies{ListContainers: []byte{0xff}}); err == nil ||
		!strings.Contains(err.Error(), "exited before listening") {
		t.Errorf("start with a broken reply: %v", err)
	}
}
