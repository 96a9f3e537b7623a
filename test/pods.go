package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodConfig is a minimal pod config named name, with its own network.
func PodConfig(name string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "e2e", Uid: "uid-" + name},
		Hostname: name,
		Labels:   map[string]string{"app": "e2e"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER},
		}},
	}
}

// UsernsPod makes cfg a pod with its own user namespace; with mappings
// when hostID is non-zero (as kubelet sends them), else allocated.
func UsernsPod(cfg *runtimeapi.PodSandboxConfig, hostID uint32) *runtimeapi.PodSandboxConfig {
	u := &runtimeapi.UserNamespace{Mode: runtimeapi.NamespaceMode_POD}
	if hostID != 0 {
		m := []*runtimeapi.IDMapping{{HostId: hostID, ContainerId: 0, Length: 65536}}
		u.Uids, u.Gids = m, m
	}
	cfg.Linux.SecurityContext.NamespaceOptions.UsernsOptions = u
	return cfg
}

// PrivilegedPod marks cfg as a pod that runs privileged containers, as
// kubelet does for a pod with one.
func PrivilegedPod(cfg *runtimeapi.PodSandboxConfig) *runtimeapi.PodSandboxConfig {
	cfg.Linux.SecurityContext.Privileged = true
	return cfg
}

// RunPod starts a pod and fails the test on error.
func (d *Daemon) RunPod(t testing.TB, cfg *runtimeapi.PodSandboxConfig) string {
	t.Helper()
	resp, err := d.Runtime.RunPodSandbox(Ctx(t), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatalf("RunPodSandbox(%s): %v", cfg.GetMetadata().GetName(), err)
	}
	return resp.PodSandboxId
}

// PodInfo is the verbose info of PodSandboxStatus.
type PodInfo struct {
	Pins        map[string]string `json:"pins"`
	UIDMappings []struct {
		ContainerID uint32 `json:"containerID"`
		HostID      uint32 `json:"hostID"`
		Size        uint32 `json:"size"`
	} `json:"uidMappings"`
	ConfigPath string          `json:"configPath"`
	CNIResult  json.RawMessage `json:"cniResult"`
	// Pid is the pod's pause process, where it has one.
	Pid int `json:"pid"`
	// RuntimeSpec describes the pod as containerd's and CRI-O's pause
	// container spec does: its namespaces, mappings and cgroup.
	RuntimeSpec *specs.Spec `json:"runtimeSpec"`
}

// PodStatus returns a pod's status and verbose info.
func (d *Daemon) PodStatus(t testing.TB, id string) (*runtimeapi.PodSandboxStatus, *PodInfo) {
	t.Helper()
	resp, err := d.Runtime.PodSandboxStatus(Ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus(%s): %v", id, err)
	}
	var info PodInfo
	if err := json.Unmarshal([]byte(resp.Info["info"]), &info); err != nil {
		t.Fatalf("verbose info of %s: %v (%q)", id, err, resp.Info["info"])
	}
	return resp.Status, &info
}

// LeasedIPs lists the IPs the test network's host-local store holds.
func (d *Daemon) LeasedIPs(t testing.TB) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	entries, err := os.ReadDir(filepath.Join(d.IPAMDir, "pinrt-e2e"))
	if err != nil {
		return out
	}
	for _, e := range entries {
		if n := e.Name(); strings.Count(n, ".") == 3 && !strings.HasPrefix(n, "last_reserved") {
			out[n] = true
		}
	}
	return out
}

// Leftovers lists what a pod could leave behind: pin files, sandbox
// directories and mounts under the daemon's directories.
func (d *Daemon) Leftovers() []string {
	var left []string
	for _, kind := range []string{"user", "net", "ipc", "uts"} {
		entries, _ := os.ReadDir(filepath.Join(d.RunRoot, "ns", kind))
		for _, e := range entries {
			left = append(left, "pin "+kind+"/"+e.Name())
		}
	}
	for _, dir := range []string{filepath.Join(d.Root, "sandboxes"), filepath.Join(d.RunRoot, "sandboxes")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			left = append(left, "dir "+filepath.Join(dir, e.Name()))
		}
	}
	for _, m := range MountsUnder(d.Dir) {
		left = append(left, "mount "+m)
	}
	return left
}
