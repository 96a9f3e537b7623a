package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// crictlEnv runs the crictl of the pinned cri-tools against a daemon, as
// an operator does.
type crictlEnv struct {
	*ctrEnv
	bin string
}

// run runs crictl with args and returns its stdout; a failure fails t.
func (c *crictlEnv) run(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := c.try(args...)
	if err != nil {
		t.Fatalf("crictl %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func (c *crictlEnv) try(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append([]string{
		"--runtime-endpoint", "unix://" + c.d.Socket, "--image-endpoint", "unix://" + c.d.Socket, "--timeout", "60s",
	}, args...)...)
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// json runs crictl with args (which ask for JSON output) and decodes it.
func (c *crictlEnv) json(t *testing.T, v any, args ...string) {
	t.Helper()
	out := c.run(t, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("crictl %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCrictl drives a pod's whole life with crictl, the CLI operators
// use, the way README tells them to: its own clients for every call
// (among them the streaming exec), its decoding of the verbose info
// (inspect), and its JSON and table output. Each step checks what crictl
// printed, not only that it exited 0.
func TestCrictl(t *testing.T) {
	e := newCtrEnv(t)
	c := &crictlEnv{ctrEnv: e, bin: crictlBinary(t)}
	dir := t.TempDir()

	version := c.run(t, "version")
	if !strings.Contains(version, "RuntimeName:  pinrt") || !strings.Contains(version, "RuntimeApiVersion:  v1") {
		t.Errorf("crictl version:\n%s", version)
	}
	var info struct {
		Status struct {
			Conditions []struct {
				Type   string `json:"type"`
				Status bool   `json:"status"`
			} `json:"conditions"`
		} `json:"status"`
	}
	c.json(t, &info, "info", "-o", "json")
	ready := map[string]bool{}
	for _, cond := range info.Status.Conditions {
		ready[cond.Type] = cond.Status
	}
	if !ready["RuntimeReady"] || !ready["NetworkReady"] {
		t.Errorf("crictl info conditions: %+v, want RuntimeReady and NetworkReady true", info.Status.Conditions)
	}

	if out := c.run(t, "pull", e.busybox); !strings.Contains(out, "Image is up to date for "+e.bbID) {
		t.Errorf("crictl pull: %q, want the image ID %s", out, e.bbID)
	}
	if out := c.run(t, "images", "-q", "--no-trunc"); !strings.Contains(out, e.bbID) {
		t.Errorf("crictl images -q lacks %s:\n%s", e.bbID, out)
	}

	podJSON, ctrJSON := filepath.Join(dir, "pod.json"), filepath.Join(dir, "ctr.json")
	logDir := filepath.Join(e.d.Dir, "logs", "crictl")
	writeJSON(t, podJSON, map[string]any{
		"metadata":      map[string]any{"name": "crictl-pod", "namespace": "default", "uid": "crictl-uid", "attempt": 1},
		"log_directory": logDir,
		"linux":         map[string]any{},
	})
	writeJSON(t, ctrJSON, map[string]any{
		"metadata": map[string]any{"name": "c"},
		"image":    map[string]any{"image": e.busybox},
		"command":  []string{"sh", "-c", "echo hello-crictl; exec sleep 1000"},
		"log_path": "c.log",
		"linux":    map[string]any{},
	})
	pod := strings.TrimSpace(c.run(t, "runp", podJSON))
	t.Cleanup(func() { _, _, _ = c.try("rmp", "-f", "--all") })
	ctr := strings.TrimSpace(c.run(t, "create", pod, ctrJSON, podJSON))
	if out := strings.TrimSpace(c.run(t, "start", ctr)); out != ctr {
		t.Errorf("crictl start printed %q, want the ID %s", out, ctr)
	}

	var ps struct {
		Containers []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"containers"`
	}
	c.json(t, &ps, "ps", "-o", "json", "--pod", pod)
	if len(ps.Containers) != 1 || ps.Containers[0].ID != ctr || ps.Containers[0].State != "CONTAINER_RUNNING" {
		t.Errorf("crictl ps --pod: %+v, want %s running", ps.Containers, ctr)
	}
	if out := c.run(t, "pods", "-q", "--name", "crictl-pod"); strings.TrimSpace(out) != pod {
		t.Errorf("crictl pods --name: %q, want %s", out, pod)
	}

	// crictl prints an ExecSync's stdout and then its stderr, each with a
	// newline of its own.
	if out := c.run(t, "exec", "-s", ctr, "sh", "-c", "echo synced; echo oops >&2"); out != "synced\n\noops\n\n" {
		t.Errorf("crictl exec -s: %q", out)
	}
	// The streaming exec over SPDY, as kubelet's, and over WebSocket,
	// which asks for v5.channel.k8s.io only: k8s.io/cri-streaming speaks
	// up to v4, and pinrt translates.
	if out := c.run(t, "exec", ctr, "sh", "-c", "echo streamed-$((6*7))"); out != "streamed-42\n" {
		t.Errorf("crictl exec: %q", out)
	}
	if out := c.run(t, "exec", "--transport", "websocket", ctr, "sh", "-c", "echo over-ws-$((6*7))"); out != "over-ws-42\n" {
		t.Errorf("crictl exec --transport websocket: %q", out)
	}
	if _, _, err := c.try("exec", "--transport", "websocket", ctr, "sh", "-c", "exit 3"); err == nil {
		t.Errorf("crictl exec --transport websocket of a failing command exited 0")
	}
	if _, _, err := c.try("exec", "-s", ctr, "sh", "-c", "exit 3"); err == nil {
		t.Errorf("crictl exec -s of a failing command exited 0")
	}

	waitFor(t, 10*time.Second, "the container's output in crictl logs", func() bool {
		out, _, err := c.try("logs", ctr)
		return err == nil && out == "hello-crictl\n"
	})

	var inspect struct {
		Status struct {
			State   string `json:"state"`
			LogPath string `json:"logPath"`
		} `json:"status"`
		Info struct {
			Pid         int             `json:"pid"`
			RuntimeSpec json.RawMessage `json:"runtimeSpec"`
		} `json:"info"`
	}
	c.json(t, &inspect, "inspect", "-o", "json", ctr)
	if inspect.Status.State != "CONTAINER_RUNNING" || inspect.Info.Pid <= 0 || len(inspect.Info.RuntimeSpec) < 100 ||
		inspect.Status.LogPath != filepath.Join(logDir, "c.log") {
		t.Errorf("crictl inspect: state %q, pid %d, %d bytes of spec, log %q", inspect.Status.State, inspect.Info.Pid, len(inspect.Info.RuntimeSpec), inspect.Status.LogPath)
	}
	var inspectp struct {
		Status struct {
			State   string `json:"state"`
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
	}
	c.json(t, &inspectp, "inspectp", "-o", "json", pod)
	if inspectp.Status.State != "SANDBOX_READY" || inspectp.Status.Network.IP == "" {
		t.Errorf("crictl inspectp: state %q ip %q", inspectp.Status.State, inspectp.Status.Network.IP)
	}
	// The pod's network namespace where node tools look for it in
	// containerd's and CRI-O's verbose status (Multus reads it so): the
	// netns the pod's container runs in.
	netns := strings.TrimSpace(c.run(t, "inspectp", "-o", "go-template", "--template",
		`{{range .info.runtimeSpec.linux.namespaces}}{{if eq .type "network"}}{{.path}}{{end}}{{end}}`, pod))
	if !sameFile(netns, fmt.Sprintf("/proc/%d/ns/net", inspect.Info.Pid)) {
		t.Errorf("crictl inspectp's runtimeSpec network namespace %q is not the one container %s runs in", netns, ctr)
	}

	var stats struct {
		Stats []struct {
			Attributes struct {
				ID string `json:"id"`
			} `json:"attributes"`
			Memory struct {
				WorkingSetBytes struct {
					Value string `json:"value"`
				} `json:"workingSetBytes"`
			} `json:"memory"`
		} `json:"stats"`
	}
	c.json(t, &stats, "stats", "-o", "json", "--id", ctr)
	if len(stats.Stats) != 1 || stats.Stats[0].Attributes.ID != ctr || stats.Stats[0].Memory.WorkingSetBytes.Value == "" {
		t.Errorf("crictl stats: %+v", stats.Stats)
	}

	// The other read-only commands of a node operator: each output names
	// what it is about.
	for _, probe := range []struct {
		args []string
		want []string
	}{
		{[]string{"statsp", "-o", "json", "--id", pod}, []string{pod, "workingSetBytes", "usageCoreNanoSeconds"}},
		{[]string{"metricsp"}, []string{pod, "container_cpu_usage_seconds_total"}},
		{[]string{"metricdescs"}, []string{"container_cpu_usage_seconds_total", "labelKeys"}},
		{[]string{"imagefsinfo", "-o", "json"}, []string{"imageFilesystems", "containerFilesystems", "usedBytes"}},
		{[]string{"inspecti", "-o", "json", e.busybox}, []string{e.bbID, "imageSpec"}},
	} {
		out := c.run(t, probe.args...)
		for _, w := range probe.want {
			if !strings.Contains(out, w) {
				t.Errorf("crictl %s lacks %q:\n%s", strings.Join(probe.args, " "), w, out)
			}
		}
	}

	const limit = 96 << 20
	c.run(t, "update", "--memory", fmt.Sprint(limit), ctr)
	var updated struct {
		Status struct {
			Resources struct {
				Linux struct {
					MemoryLimitInBytes string `json:"memoryLimitInBytes"`
				} `json:"linux"`
			} `json:"resources"`
		} `json:"status"`
	}
	c.json(t, &updated, "inspect", "-o", "json", ctr)
	if got := updated.Status.Resources.Linux.MemoryLimitInBytes; got != fmt.Sprint(limit) {
		t.Errorf("after crictl update --memory %d, inspect says %q", limit, got)
	}

	// A pod in a user namespace, its ID range from pinrt's allocator:
	// crictl sends the mode and no mappings.
	usernsJSON := filepath.Join(dir, "userns-pod.json")
	writeJSON(t, usernsJSON, map[string]any{
		"metadata": map[string]any{"name": "crictl-userns", "namespace": "default", "uid": "crictl-userns-uid"},
		"linux": map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{
			"userns_options": map[string]any{"mode": 0},
		}}},
	})
	userns := strings.TrimSpace(c.run(t, "run", ctrJSON, usernsJSON))
	uidMap := strings.Fields(c.run(t, "exec", "-s", userns, "cat", "/proc/self/uid_map"))
	if len(uidMap) != 3 || uidMap[0] != "0" || uidMap[1] == "0" {
		t.Errorf("uid_map in the userns pod's container: %q, want 0 mapped to a host ID other than 0", uidMap)
	}
	var uPods struct {
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	c.json(t, &uPods, "pods", "-o", "json", "--name", "crictl-userns")
	if len(uPods.Items) != 1 {
		t.Fatalf("crictl pods --name crictl-userns: %+v", uPods.Items)
	}
	c.run(t, "rmp", "-f", uPods.Items[0].ID)

	c.run(t, "stop", "--timeout", "1", ctr)
	c.json(t, &inspect, "inspect", "-o", "json", ctr)
	if inspect.Status.State != "CONTAINER_EXITED" {
		t.Errorf("after crictl stop: %s", inspect.Status.State)
	}
	c.run(t, "rm", ctr)
	c.run(t, "stopp", pod)
	c.run(t, "rmp", pod)
	if out := c.run(t, "pods", "-q"); strings.TrimSpace(out) != "" {
		t.Errorf("pods left after crictl rmp: %q", out)
	}
	c.run(t, "rmi", e.busybox)
	if out := c.run(t, "images", "-q", "--no-trunc"); strings.Contains(out, e.bbID) {
		t.Errorf("crictl rmi left the image:\n%s", out)
	}
	if left := e.d.Leftovers(); len(left) > 0 {
		t.Errorf("left after the crictl session:\n%s", strings.Join(left, "\n"))
	}
}

// sameFile reports whether a and b both exist and are the same file (for
// namespaces: the same namespace).
func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}
