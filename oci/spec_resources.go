package oci

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// HostInfo is what spec generation needs to know about the host. Tests
// build it by hand; ProbeHost reads the real one.
type HostInfo struct {
	// CgroupV2 is true on a unified-only host.
	CgroupV2 bool
	// Controllers are the cgroup controllers usable by containers.
	Controllers map[string]bool
	// SwapController is true when containers' swap can be limited:
	// memory.memsw.* on v1 (swapaccount), memory.swap.max on v2.
	SwapController bool
	// CgroupNS is true when the kernel has cgroup namespaces.
	CgroupNS bool
	AppArmor bool
	SELinux  bool
	// OOMFloor is the lowest oom_score_adj the daemon may hand out.
	OOMFloor int
	// BoundingCaps is the daemon's capability bounding set (CapBnd of
	// /proc/self/status), the most any container can get: a daemon in a
	// container or under systemd's CapabilityBoundingSet lacks some. nil
	// means unknown: every capability pinrt knows.
	BoundingCaps []string
}

var (
	hostOnce sync.Once
	hostInfo HostInfo
)

// ProbeHost reads the host facts once per process; none of them change
// while the daemon runs.
func ProbeHost() HostInfo {
	hostOnce.Do(func() {
		h := HostInfo{OOMFloor: OOMScoreAdjFloor()}
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			h.CgroupV2 = true
			// The root's cgroup.controllers, not its subtree_control:
			// systemd enables cpu (and others) in subtree_control only
			// once some unit asks for it, and runc (cgroupfs) or systemd
			// (for a scope with limits) enable what a container needs on
			// the way down. A controller the kernel lacks or that is
			// bound to v1 is absent here, and its settings are dropped.
			b, _ := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
			h.Controllers = parseV2Controllers(string(b))
		} else if f, err := os.Open("/proc/cgroups"); err == nil {
			h.Controllers = parseProcCgroups(f)
			f.Close()
		}
		h.SwapController = swapController(h.CgroupV2)
		_, err := os.Stat("/proc/self/ns/cgroup")
		h.CgroupNS = err == nil
		b, _ := os.ReadFile("/sys/module/apparmor/parameters/enabled")
		h.AppArmor = strings.TrimSpace(string(b)) == "Y"
		b, _ = os.ReadFile("/sys/fs/selinux/enforce")
		h.SELinux = len(bytes.TrimSpace(b)) > 0
		if b, err := os.ReadFile("/proc/self/status"); err == nil {
			h.BoundingCaps, _ = ParseCapBnd(b)
		}
		hostInfo = h
	})
	return hostInfo
}

// swapController tells whether the kernel accounts swap per cgroup, as
// kubelet and containerd tell it: memory.memsw.limit_in_bytes in v1's
// memory hierarchy; on v2, memory.swap.max in the daemon's own cgroup or,
// where that has no memory controller (or is the root, which has no such
// file), in any cgroup below the root.
func swapController(v2 bool) bool {
	if !v2 {
		_, err := os.Stat("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
		return err == nil
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if self, ok := v2CgroupPath(b); ok {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", self, "memory.swap.max")); err == nil {
				return true
			}
		}
	}
	m, _ := filepath.Glob("/sys/fs/cgroup/*/memory.swap.max")
	return len(m) > 0
}

// v2CgroupPath is the unified hierarchy's entry ("0::/path") of a
// /proc/<pid>/cgroup file.
func v2CgroupPath(b []byte) (string, bool) {
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, true
		}
	}
	return "", false
}

// parseProcCgroups returns the v1 controllers that are enabled and mounted
// in a hierarchy. A controller with hierarchy 0 on a v1/hybrid host is
// compiled in but not mounted (this is how hugetlb shows up when absent),
// and runc cannot use it.
func parseProcCgroups(r io.Reader) map[string]bool {
	out := map[string]bool{}
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 {
			continue
		}
		if f[1] != "0" && f[3] == "1" {
			out[f[0]] = true
		}
	}
	return out
}

func parseV2Controllers(s string) map[string]bool {
	out := map[string]bool{}
	for _, c := range strings.Fields(s) {
		out[c] = true
	}
	return out
}

var (
	oomOnce  sync.Once
	oomFloor int
)

// OOMScoreAdjFloor is the daemon's own oom_score_adj, read once. Without
// CAP_SYS_RESOURCE a process may not set a child's value below its own, so
// requests below it are raised to it (containerd's restrict_oom_score_adj).
// The sandbox code uses the same floor.
func OOMScoreAdjFloor() int {
	oomOnce.Do(func() {
		b, err := os.ReadFile("/proc/self/oom_score_adj")
		if err == nil {
			oomFloor, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	})
	return oomFloor
}

// ClampOOMScoreAdj raises v to floor and caps it at the kernel's 1000.
func ClampOOMScoreAdj(v, floor int) int {
	if v < floor {
		v = floor
	}
	if v > 1000 {
		v = 1000
	}
	return v
}

// WithOOMScoreAdj sets the clamped oom_score_adj.
func WithOOMScoreAdj(v, floor int) SpecOpt {
	return func(g *Generator) error {
		adj := ClampOOMScoreAdj(v, floor)
		g.Config.Process.OOMScoreAdj = &adj
		return nil
	}
}

// WithResources sets cgroup limits, dropping (with a debug log, never an
// error) settings for controllers the host lacks: kubelet sends hugepage
// limits for every container whether or not hugetlb exists.
func WithResources(res *Resources, host *HostInfo) SpecOpt {
	return func(g *Generator) error {
		if res == nil {
			return nil
		}
		has := func(c string) bool {
			if host == nil || host.Controllers == nil {
				return true
			}
			return host.Controllers[c]
		}
		r := g.resources()
		cpuCtl := "cpu"
		if res.CPUShares != 0 || res.CPUQuota != 0 || res.CPUPeriod != 0 {
			if has(cpuCtl) {
				r.CPU = cpuOf(r)
				if res.CPUShares != 0 {
					r.CPU.Shares = u64p(res.CPUShares)
				}
				if res.CPUQuota != 0 {
					r.CPU.Quota = i64(res.CPUQuota)
				}
				if res.CPUPeriod != 0 {
					r.CPU.Period = u64p(res.CPUPeriod)
				}
			} else {
				g.logDrop("dropping cpu limits: cgroup controller cpu not available")
			}
		}
		if res.CpusetCpus != "" || res.CpusetMems != "" {
			if has("cpuset") {
				r.CPU = cpuOf(r)
				r.CPU.Cpus, r.CPU.Mems = res.CpusetCpus, res.CpusetMems
			} else {
				g.logDrop("dropping cpuset: cgroup controller cpuset not available")
			}
		}
		if res.MemoryLimit != 0 || res.MemorySwapLimit != 0 {
			if has("memory") {
				r.Memory = memoryLimits(res, host)
			} else {
				g.logDrop("dropping memory limits: cgroup controller memory not available")
			}
		}
		if res.PidsLimit != 0 {
			if has("pids") {
				r.Pids = &specs.LinuxPids{Limit: i64(res.PidsLimit)}
			} else {
				g.logDrop("dropping pids limit: cgroup controller pids not available")
			}
		}
		if len(res.Hugepages) > 0 {
			if has("hugetlb") {
				r.HugepageLimits = nil
				for _, h := range res.Hugepages {
					r.HugepageLimits = append(r.HugepageLimits, specs.LinuxHugepageLimit{Pagesize: h.PageSize, Limit: h.Limit})
				}
			} else {
				g.logDrop("dropping %d hugepage limits: cgroup controller hugetlb not available", len(res.Hugepages))
			}
		}
		if len(res.Unified) > 0 {
			if host == nil || host.CgroupV2 {
				r.Unified = map[string]string{}
				for k, v := range res.Unified {
					r.Unified[k] = v
				}
			} else {
				g.logDrop("dropping %d unified cgroup settings: host is not cgroup v2", len(res.Unified))
			}
		}
		return nil
	}
}

// memoryLimits are res's memory limits, with DefaultSwap's.
func memoryLimits(res *Resources, host *HostInfo) *specs.LinuxMemory {
	m := &specs.LinuxMemory{}
	if res.MemoryLimit != 0 {
		m.Limit = i64(res.MemoryLimit)
	}
	if res.MemorySwapLimit != 0 {
		m.Swap = i64(res.MemorySwapLimit)
	}
	DefaultSwap(m, host)
	return m
}

// DefaultSwap gives a memory limit without a swap limit one equal to it
// where the kernel accounts swap, so the container does not swap unless
// asked to, as in containerd and CRI-O: memory plus swap equal to the
// memory (v1), memory.swap.max 0 (v2, runc's translation).
func DefaultSwap(m *specs.LinuxMemory, host *HostInfo) {
	if m == nil || m.Limit == nil || *m.Limit <= 0 || m.Swap != nil || host == nil || !host.SwapController {
		return
	}
	m.Swap = i64(*m.Limit)
}

func cpuOf(r *specs.LinuxResources) *specs.LinuxCPU {
	if r.CPU == nil {
		return &specs.LinuxCPU{}
	}
	return r.CPU
}

func u64p(v uint64) *uint64 { return &v }
