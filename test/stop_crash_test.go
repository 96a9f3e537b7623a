package test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

var (
	cniGateOnce sync.Once
	cniGateDir  string
	errCNIGate  error
)

// cniGatePlugin builds test/cnigate into a plugin directory of its own.
func cniGatePlugin(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("builds test/cnigate: needs the go toolchain")
	}
	cniGateOnce.Do(func() {
		cniGateDir, errCNIGate = os.MkdirTemp("", "pinrt-cnigate-")
		if errCNIGate != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(cniGateDir, "gate"), "./test/cnigate")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			errCNIGate = errors.New("go build ./test/cnigate: " + err.Error() + "\n" + string(out))
		}
	})
	if errCNIGate != nil {
		t.Fatal(errCNIGate)
	}
	return cniGateDir
}

// TestStopFinishedAfterCrash: a daemon killed in the middle of a
// StopPodSandbox (here, in the pod's CNI DEL) finishes that stop when it
// starts again, before it answers: the pod comes back NotReady with its
// IP released, its veth, pins and shm gone, and kubelet's next
// StopPodSandbox and RemovePodSandbox succeed.
func TestStopFinishedAfterCrash(t *testing.T) {
	pluginDir := cniGatePlugin(t)
	d := NewDaemon(t, Options{Network: true, Args: []string{"--cni-plugin-dir", pluginDir}})
	gate := filepath.Join(d.Dir, "gate")
	// The gate is the chain's last plugin, so the first one DEL calls:
	// the stop is caught before the bridge plugin released anything.
	confPath := filepath.Join(d.CNIConfDir, "10-e2e.conflist")
	conf, err := os.ReadFile(confPath)
	if err != nil {
		t.Fatal(err)
	}
	withGate := strings.Replace(string(conf), "\n  }]\n}", "\n  }, {\"type\": \"gate\", \"gate\": \""+gate+"\"}]\n}", 1)
	if withGate == string(conf) {
		t.Fatalf("cannot add the gate plugin to %s:\n%s", confPath, conf)
	}
	if err := os.WriteFile(confPath, []byte(withGate), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	pods := []string{d.RunPod(t, PodConfig("stopcrash-a")), d.RunPod(t, UsernsPod(PodConfig("stopcrash-b"), 0))}
	if n := len(d.LeasedIPs(t)); n != 2 {
		t.Fatalf("%d leased IPs after two pods, want 2", n)
	}
	bridgePorts := func() string {
		out, _ := exec.Command("ip", "-o", "link", "show", "master", d.Bridge).Output()
		return strings.TrimSpace(string(out))
	}
	if bridgePorts() == "" {
		t.Fatal("no veth on the test bridge with two pods")
	}

	// Both stops enter CNI DEL and wait at the gate; the daemon dies there.
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, id := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = d.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
		}()
	}
	waitFor(t, 30*time.Second, "a StopPodSandbox to reach the gate plugin", func() bool {
		_, err := os.Stat(gate + ".entered")
		return err == nil
	})
	// Both stops are under way: each has recorded NotReady, which is
	// what a restart finishes. On a loaded machine the second may not
	// have got there when the first reached the gate.
	waitFor(t, 30*time.Second, "both pods NotReady", func() bool {
		for _, id := range pods {
			if st, _ := d.PodStatus(t, id); st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
				return false
			}
		}
		return true
	})
	d.Kill()
	wg.Wait()
	// The plugin the killed daemon started returns; the restarted daemon's
	// DEL passes the gate.
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}

	// Before any call of kubelet's: stopped for real.
	for _, id := range pods {
		if st, _ := d.PodStatus(t, id); st.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY {
			t.Errorf("pod %s after the restart: %s, want NOTREADY", id, st.State)
		}
	}
	if ips := d.LeasedIPs(t); len(ips) != 0 {
		t.Errorf("IPs still leased after the restart: %v", ips)
	}
	if p := bridgePorts(); p != "" {
		t.Errorf("veths still on the bridge after the restart:\n%s", p)
	}
	var pins []string
	for _, l := range d.Leftovers() {
		if strings.HasPrefix(l, "pin ") || (strings.HasPrefix(l, "mount ") && strings.Contains(l, "shm")) {
			pins = append(pins, l)
		}
	}
	if len(pins) > 0 {
		t.Errorf("pins and shm mounts after the restart:\n%s", strings.Join(pins, "\n"))
	}
	if !strings.Contains(d.Log(), "finished 2 interrupted pod stops") {
		t.Errorf("the daemon's log does not tell of the two stops it finished")
	}

	for _, id := range pods {
		if _, err := d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("StopPodSandbox(%s) after the restart: %v", id, err)
		}
		if _, err := d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
			t.Errorf("RemovePodSandbox(%s): %v", id, err)
		}
	}
	if left := d.Leftovers(); len(left) > 0 {
		t.Errorf("left after removal:\n%s", strings.Join(left, "\n"))
	}
}
