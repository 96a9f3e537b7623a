// Package cgroups reads the statistics of pod and container cgroups on
// cgroup v1 (legacy and hybrid) and v2 (unified) hosts, and updates their
// limits through github.com/containerd/cgroups/v3.
//
// Stat does not use that library: kubelet asks for every container and
// pod every 10 seconds, and the library's v1 memory, cpuacct and pids
// controllers read some 20 files for the six numbers CRI reports, each
// through os.Open, which also registers the file with the runtime's poller.
// That was ~500 µs per cgroup on a 2-core v1 host (a syscall costs ~2 µs
// there), and ListPodSandboxStats of 100 pods reads 200 cgroups. Stat
// opens only the six files it reports from, with plain syscalls into a
// pooled buffer (~100 µs), and keeps them open for the next poll, which
// then costs one pread per file (~35 µs). BenchmarkStat measures both.
// StatAll, for the cAdvisor metrics of ListPodSandboxMetrics, reads the
// rest the same way: the CPU split and throttling, limits, memory detail,
// OOM kills, block I/O and the processes' descriptors, each file once per
// call, while the stats RPCs keep to Stat's six.
//
// The hierarchy is detected from the files under the mount root, never
// assumed: a hybrid host mounts a controller-less cgroup2 tree under
// "unified" next to the v1 controllers, and the v1 controllers are what
// runc used there. A controller the host lacks (pids on old kernels,
// memsw without swap accounting) leaves its numbers at zero instead of
// failing the whole read.
package cgroups

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// DefaultRoot is where the cgroup hierarchies are mounted.
const DefaultRoot = "/sys/fs/cgroup"

// Mode is how the host mounts its cgroup hierarchies.
type Mode int

// The hierarchies. Hybrid hosts have their controllers on v1, so they are
// read as Legacy; only the log tells them apart.
const (
	// Legacy is cgroup v1 only: every controller in its own hierarchy.
	Legacy Mode = iota + 1
	// Hybrid is v1 controllers with a controller-less v2 hierarchy on
	// <root>/unified, systemd's old default.
	Hybrid
	// Unified is cgroup v2 only, what kubelet expects today.
	Unified
)

func (m Mode) String() string {
	switch m {
	case Unified:
		return "unified (v2)"
	case Hybrid:
		return "hybrid (v1 + v2)"
	default:
		return "legacy (v1)"
	}
}

// Detect tells the hierarchy mounted at root. Only a v2 mount has
// cgroup.controllers; a v1 or hybrid root is a tmpfs of controller mounts,
// and a hybrid one has a v2 mount at unified.
func Detect(root string) Mode {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return Unified
	}
	if _, err := os.Stat(filepath.Join(root, "unified", "cgroup.controllers")); err == nil {
		return Hybrid
	}
	return Legacy
}

// Stats are one sample of a cgroup. Stat fills in Timestamp,
// CPUUsageNanos and the Memory fields up to HasSwap, StatPod those and
// Pids, StatAll all of it.
type Stats struct {
	// Timestamp is when the sample was read.
	Timestamp time.Time
	// CPUUsageNanos is the cumulative CPU time of every task, ever.
	CPUUsageNanos uint64
	Memory        Memory
	// Pids is the number of tasks now in the cgroup (0 without the pids
	// controller).
	Pids uint64

	CPU CPU
	// PidsLimit is pids.max, 0 when unlimited.
	PidsLimit uint64
	// OOMKills counts the processes the OOM killer killed in the cgroup
	// and below (v1 kernels before 4.13 do not count them).
	OOMKills uint64
	// IO is the block I/O per device, none where the host does not
	// account it (no io controller enabled, or v1 blk-throttle idle).
	IO        []DeviceIO
	Processes Processes
	// Hugetlb is the use of each huge page size, where the host has the
	// hugetlb controller and the cgroup its files.
	Hugetlb []Hugetlb

	// CPUPressure, MemoryPressure and IOPressure are the cgroup's pressure
	// stall information, nil where the kernel keeps none for it: v1
	// without a v2 hierarchy beside it, or PSI off (psi=0).
	CPUPressure, MemoryPressure, IOPressure *Pressure
}

// Pressure is one resource's pressure stall information: the share of
// time some task of the cgroup waited for it, and the share all did.
type Pressure struct {
	Some, Full PressureData
}

// PressureData are the kernel's running averages, in percent of the
// last 10, 60 and 300 seconds, and the total stall time in nanoseconds.
type PressureData struct {
	Avg10, Avg60, Avg300 float64
	TotalNanos           uint64
}

// CPU is a cgroup's CPU time split and CFS bandwidth throttling, in
// nanoseconds unless named otherwise, and its limits.
type CPU struct {
	UserNanos, SystemNanos uint64
	// Periods and ThrottledPeriods count CFS enforcement periods.
	Periods, ThrottledPeriods uint64
	ThrottledNanos            uint64
	Spec                      CPUSpec
}

// CPUSpec are a cgroup's CPU limits.
type CPUSpec struct {
	// Period and Quota are the CFS bandwidth in microseconds, Quota 0
	// without one.
	Period, Quota uint64
	// Shares is cpu.shares, or on v2 cpu.weight converted back to them.
	Shares uint64
	// Known says the cgroup has the cpu controller.
	Known bool
}

// Memory is a cgroup's memory, in bytes unless named otherwise.
type Memory struct {
	Usage uint64
	// WorkingSet is what kubelet evicts on: usage minus the inactive file
	// cache, which the kernel reclaims first.
	WorkingSet uint64
	RSS        uint64
	// PageFaults and MajorPageFaults are counts, of the cgroup and those
	// below it.
	PageFaults      uint64
	MajorPageFaults uint64
	// Limit is 0 when the cgroup is unlimited.
	Limit uint64
	// Swap is the swap in use; HasSwap says the kernel accounts it.
	Swap    uint64
	HasSwap bool

	// Cache is the page cache, MappedFile the part of it mapped, Kernel
	// the kernel's own allocations charged to the cgroup.
	Cache, MappedFile, Kernel uint64
	// MaxUsage is the peak usage (0 on v2 kernels before 5.19).
	MaxUsage uint64
	// Failcnt counts how often usage hit the limit.
	Failcnt uint64
	// SwapLimit is v1's memory+swap limit or v2's swap limit, 0 when
	// unlimited or not accounted.
	SwapLimit uint64
	// Reservation is v1's soft limit or v2's memory.min, cAdvisor's
	// reservation; 0 when unlimited.
	Reservation uint64
	// LocalPageFaults and LocalMajorPageFaults are the cgroup's own,
	// without those below it; v2 does not tell them apart.
	LocalPageFaults, LocalMajorPageFaults uint64
}

// Available is the memory left before the limit, 0 when unlimited (CRI
// leaves available_bytes unset then, as cAdvisor does).
func (m Memory) Available() uint64 {
	if m.Limit == 0 || m.WorkingSet >= m.Limit {
		return 0
	}
	return m.Limit - m.WorkingSet
}

// unlimited: v1 reports "no limit" as the largest page-aligned int64, v2
// as "max" (which readUint turns into MaxUint64).
const unlimited = math.MaxInt64 / 2

// Reader reads cgroup statistics under one mount root.
type Reader struct {
	root string
	mode Mode
	// files are the files Stat reads in this mode. memsw and pids say
	// that a v1 host has swap accounting and the pids controller, so that
	// no cgroup tries files that cannot exist.
	files       *[numFiles]cgroupFile
	memsw, pids bool
	// proc, sysBlock and hugepages are /proc, /sys/dev/block and
	// /sys/kernel/mm/hugepages; tests move them.
	proc, sysBlock, hugepages string
	// hugeSizes are the host's huge page sizes where it has the hugetlb
	// controller, listed at the first StatAll.
	hugeOnce  sync.Once
	hugeSizes []string

	devMu    sync.Mutex
	devNames map[string]string // "major:minor" -> /dev/<name>

	mu    sync.Mutex
	open  map[string]*openGroup // by cgroup
	swept time.Time             // when idle cgroups were last closed
}

// NewReader returns a reader for the hierarchy mounted at root.
func NewReader(root string) *Reader {
	r := &Reader{
		root: root, mode: Detect(root), files: &v1Files, open: map[string]*openGroup{},
		proc: "/proc", sysBlock: "/sys/dev/block", hugepages: "/sys/kernel/mm/hugepages", devNames: map[string]string{},
	}
	if r.mode == Unified {
		r.files = &v2Files
	} else {
		r.memsw = exists(filepath.Join(root, "memory", "memory.memsw.usage_in_bytes"))
		r.pids = exists(filepath.Join(root, "pids"))
	}
	return r
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// validGroup keeps a cgroup name inside the hierarchy.
func validGroup(group string) bool {
	return strings.HasPrefix(group, "/") && !strings.Contains(group, "..")
}

// Mode is the detected hierarchy.
func (r *Reader) Mode() Mode { return r.mode }

// workingSet is usage minus inactive file pages, as kubelet's eviction
// manager and cAdvisor compute it; never negative.
func workingSet(usage, inactiveFile uint64) uint64 {
	if inactiveFile >= usage {
		return 0
	}
	return usage - inactiveFile
}

func notFound(group string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup %s: %w", group, errdefs.ErrNotFound)
	}
	return fmt.Errorf("cgroup %s: %w", group, err)
}

// v1Error keeps a cgroup removed between two reads NotFound.
func v1Error(group, controller string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup %s (%s): %w", group, controller, errdefs.ErrNotFound)
	}
	return fmt.Errorf("cgroup %s (%s): %w", group, controller, err)
}

// CPURates turns cumulative CPU usage into a rate per key (a container or
// pod ID), remembering the previous sample of each. kubelet reads
// usage_nano_cores from CRI as is, so the runtime has to keep the history.
type CPURates struct {
	mu   sync.Mutex
	prev map[string]cpuSample
}

type cpuSample struct {
	at    time.Time
	usage uint64
	// rate is the nano-cores over the window that ended at at, when
	// there was one (hasRate).
	rate    uint64
	hasRate bool
}

// NewCPURates returns an empty tracker.
func NewCPURates() *CPURates { return &CPURates{prev: map[string]cpuSample{}} }

// minRateWindow is the shortest interval a rate is computed over. kubelet
// asks for the same container through ListPodSandboxStats and
// ListContainerStats within milliseconds, and the summary API on demand
// in between; a rate over such a gap is mostly scheduler noise (and 0 for
// a container that slept through it, which the summary API spec catches),
// so a sample closer than this to the stored one gets the stored window's
// rate, as cAdvisor's rates are those between its housekeeping samples.
const minRateWindow = time.Second

// Rate records usage at at for key and returns the nano-cores used over
// the last window of at least minRateWindow, and false for a key's first
// sample or a counter that went backwards (a new cgroup under an old
// key). A sample within the window of the stored one, or not newer,
// gets the stored window's rate; the first sample's window, until there
// is a full one, is whatever time has passed.
func (c *CPURates) Rate(key string, at time.Time, usage uint64) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.prev[key]
	switch {
	case ok && !at.After(p.at):
		return p.rate, p.hasRate
	case !ok || usage < p.usage:
		c.prev[key] = cpuSample{at: at, usage: usage}
		return 0, false
	}
	dt := at.Sub(p.at)
	rate := uint64(float64(usage-p.usage) / dt.Seconds())
	if dt >= minRateWindow {
		c.prev[key] = cpuSample{at: at, usage: usage, rate: rate, hasRate: true}
		return rate, true
	}
	if p.hasRate {
		return p.rate, true
	}
	return rate, true
}

// Forget drops key's history (the container or pod was removed).
func (c *CPURates) Forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.prev, key)
}

// Retain drops the history of every key not in live.
func (c *CPURates) Retain(live map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.prev {
		if !live[k] {
			delete(c.prev, k)
		}
	}
}

// Update applies the CPU and memory limits of res to the existing cgroup
// group; other controllers are left alone. A missing cgroup is
// ErrNotFound: Update never creates one.
func (r *Reader) Update(group string, res *specs.LinuxResources) error {
	if !validGroup(group) {
		return fmt.Errorf("cgroup %q: must be absolute without '..': %w", group, errdefs.ErrInvalidArgument)
	}
	only := &specs.LinuxResources{CPU: res.CPU, Memory: res.Memory}
	if r.mode == Unified {
		if _, err := os.Stat(filepath.Join(r.root, group)); err != nil {
			return notFound(group, err)
		}
		m, err := cgroup2.Load(group, cgroup2.WithMountpoint(r.root))
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", group, err)
		}
		if err := m.Update(cgroup2.ToResources(only)); err != nil {
			return fmt.Errorf("updating cgroup %s: %w", group, err)
		}
		return nil
	}
	if only.Memory != nil {
		if _, err := os.Stat(filepath.Join(r.root, "memory", group)); err != nil {
			return notFound(group, err)
		}
		if err := cgroup1.NewMemory(r.root).Update(group, only); err != nil {
			return v1Error(group, "memory", err)
		}
	}
	if only.CPU != nil {
		if _, err := os.Stat(filepath.Join(r.root, "cpu", group)); err != nil {
			return notFound(group, err)
		}
		if err := cgroup1.NewCpu(r.root).Update(group, only); err != nil {
			return v1Error(group, "cpu", err)
		}
	}
	return nil
}
