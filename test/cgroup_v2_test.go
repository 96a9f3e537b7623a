package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCgroupV2 checks, on a unified-only host (test/vm), that a
// container's resources land in its cgroup v2 files, that the cgroup is
// where the configured driver puts it, and that removing the pod removes
// the pod's cgroup.
func TestCgroupV2(t *testing.T) {
	if !CgroupV2() {
		t.Skip("the host is not on cgroup v2 only; make test-vm runs this in a VM that is")
	}
	e := newCtrEnv(t)
	pod, podCfg := e.pod(t, PodConfig("cgv2"))
	cfg := e.ctr("c", "sleep", "1000")
	cfg.Linux.Resources = &runtimeapi.LinuxContainerResources{
		CpuPeriod: 100000, CpuQuota: 50000, CpuShares: 512,
		MemoryLimitInBytes: 64 << 20,
		Unified:            map[string]string{"memory.high": "50331648"},
	}
	id := e.run(t, pod, podCfg, cfg)
	dir := CgroupDir(t, e.info(t, id).Pid, "")
	for file, want := range map[string]string{
		"cpu.max":     "50000 100000",
		"memory.max":  "67108864",
		"memory.high": "50331648",
	} {
		if got := ReadCgroupFile(t, dir, file); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	// runc maps cpu.shares 512 onto cpu.weight: 20 with the linear
	// mapping of runc < 1.3.2, 59 with the later one that keeps 1024 at
	// the default weight 100. Either way, not the default.
	if got := ReadCgroupFile(t, dir, "cpu.weight"); got != "20" && got != "59" {
		t.Errorf("cpu.weight = %q, want 20 or 59 (runc's mapping of shares 512)", got)
	}
	if !strings.Contains(ReadCgroupFile(t, dir, "memory.events"), "oom_kill 0") {
		t.Errorf("memory.events lacks oom_kill 0")
	}
	var wantTail string
	switch CgroupDriver() {
	case "systemd":
		wantTail = "pinrt-" + pod + ".slice/pinrt-" + id + ".scope"
	default:
		wantTail = pod + "/pinrt-" + id
	}
	if !strings.HasSuffix(dir, "/"+wantTail) {
		t.Errorf("container cgroup %s, want it to end in %s (driver %s)", dir, wantTail, CgroupDriver())
	}
	podDir := filepath.Dir(dir)
	if _, err := e.d.Runtime.StopPodSandbox(Ctx(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.Runtime.RemovePodSandbox(Ctx(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: pod}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(podDir); !os.IsNotExist(err) {
		t.Errorf("pod cgroup %s still there after RemovePodSandbox (%v)", podDir, err)
	}
	resp, err := e.d.Runtime.RuntimeConfig(Ctx(t), &runtimeapi.RuntimeConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetLinux().GetCgroupDriver().String(), strings.ToUpper(CgroupDriver()); got != want {
		t.Errorf("RuntimeConfig cgroup driver %s, want %s", got, want)
	}
}
