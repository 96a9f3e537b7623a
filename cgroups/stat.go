package cgroups

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// The files Stat and StatAll read, by index into a cgroup's open files.
// v1 names the controller's hierarchy under the root; v2 has the one
// hierarchy.
type cgroupFile struct {
	controller, name string
	optional         bool
}

// Stat reads the files before the pids one of its mode, StatPod those and
// the pids one, StatAll all of them.
const (
	v1Usage = iota
	v1Limit
	v1MemStat
	v1CPU
	v1Pids

	v1CPUAcctStat
	v1CPUStat
	v1CFSPeriod
	v1CFSQuota
	v1Shares
	v1MaxUsage
	v1Failcnt
	v1Kmem
	v1MemswLimit
	v1OOMControl
	v1IOBytes
	v1IOServiced
	v1PidsMax
	v1Procs

	v1SoftLimit

	v1CPUPressure
	v1MemPressure
	v1IOPressure
	numV1Files
)

var v1Files = [numFiles]cgroupFile{
	v1Usage: {"memory", "memory.usage_in_bytes", false},
	v1Limit: {"memory", "memory.limit_in_bytes", false},
	// memory.stat also has the swap in use, total_swap, where the host
	// accounts swap: memory.memsw.usage_in_bytes less the usage, without
	// reading it.
	v1MemStat: {"memory", "memory.stat", false},
	v1CPU:     {"cpuacct", "cpuacct.usage", false},
	// runc joins every controller it finds, but a cgroup made by someone
	// else may lack pids: no count then, as on a host without it.
	v1Pids: {"pids", "pids.current", true},

	// What only the metrics read. A file of a controller the cgroup lacks,
	// or of a kernel without it (kmem, CFS bandwidth), leaves its numbers
	// at zero rather than failing the read.
	v1CPUAcctStat: {"cpuacct", "cpuacct.stat", true},
	v1CPUStat:     {"cpu", "cpu.stat", true},
	v1CFSPeriod:   {"cpu", "cpu.cfs_period_us", true},
	v1CFSQuota:    {"cpu", "cpu.cfs_quota_us", true},
	v1Shares:      {"cpu", "cpu.shares", true},
	v1MaxUsage:    {"memory", "memory.max_usage_in_bytes", true},
	v1Failcnt:     {"memory", "memory.failcnt", true},
	v1Kmem:        {"memory", "memory.kmem.usage_in_bytes", true},
	v1MemswLimit:  {"memory", "memory.memsw.limit_in_bytes", true},
	v1OOMControl:  {"memory", "memory.oom_control", true},
	// The throttle files count every bio the cgroup issued, whatever the
	// scheduler; the _recursive ones include the cgroups below, as a pod's
	// numbers should.
	v1IOBytes:    {"blkio", "blkio.throttle.io_service_bytes_recursive", true},
	v1IOServiced: {"blkio", "blkio.throttle.io_serviced_recursive", true},
	v1PidsMax:    {"pids", "pids.max", true},
	v1Procs:      {"memory", "cgroup.procs", true},
	v1SoftLimit:  {"memory", "memory.soft_limit_in_bytes", true},

	// Pressure stall information is cgroup v2's: a hybrid host has it in
	// the controller-less hierarchy, where runc makes every container's
	// cgroup too, as long as the kernel tracks it (psi=1).
	v1CPUPressure: {"unified", "cpu.pressure", true},
	v1MemPressure: {"unified", "memory.pressure", true},
	v1IOPressure:  {"unified", "io.pressure", true},
}

// cpu.stat is a core file every v2 cgroup has; the memory and pids files
// exist only where the parent enabled those controllers in
// cgroup.subtree_control, and memory.swap.current only with swap
// accounting.
const (
	v2CPU = iota
	v2MemCurrent
	v2MemMax
	v2MemStat
	v2Swap
	v2Pids

	v2CPUMax
	v2CPUWeight
	v2MemEvents
	v2MemPeak
	v2SwapMax
	v2IOStat
	v2PidsMax
	v2Procs

	v2MemMin

	v2CPUPressure
	v2MemPressure
	v2IOPressure
	numV2Files
)

const numFiles = max(numV1Files, numV2Files)

var v2Files = [numFiles]cgroupFile{
	v2CPU:        {"", "cpu.stat", false},
	v2MemCurrent: {"", "memory.current", true},
	v2MemMax:     {"", "memory.max", true},
	v2MemStat:    {"", "memory.stat", true},
	v2Swap:       {"", "memory.swap.current", true},
	v2Pids:       {"", "pids.current", true},

	v2CPUMax:    {"", "cpu.max", true},
	v2CPUWeight: {"", "cpu.weight", true},
	v2MemEvents: {"", "memory.events", true},
	// memory.peak is new in 5.19.
	v2MemPeak: {"", "memory.peak", true},
	v2SwapMax: {"", "memory.swap.max", true},
	v2IOStat:  {"", "io.stat", true},
	v2PidsMax: {"", "pids.max", true},
	v2Procs:   {"", "cgroup.procs", false},
	// cAdvisor's memory reservation on v2.
	v2MemMin: {"", "memory.min", true},

	// Absent on a kernel without PSI or booted with psi=0.
	v2CPUPressure: {"", "cpu.pressure", true},
	v2MemPressure: {"", "memory.pressure", true},
	v2IOPressure:  {"", "io.pressure", true},
}

// The keyed-file keys read, in the order readFields returns them. The
// StatAll lists begin with the Stat ones.
var (
	v1MemoryStat    = []string{"total_rss", "total_inactive_file", "total_pgfault", "total_pgmajfault", "total_swap"}
	v1MemoryStatAll = append(v1MemoryStat[:len(v1MemoryStat):len(v1MemoryStat)], "total_cache", "total_mapped_file", "pgfault", "pgmajfault")
	v1CPUAcct       = []string{"user", "system"}
	v1CPUStatKeys   = []string{"nr_periods", "nr_throttled", "throttled_time"}
	v1OOMKeys       = []string{"oom_kill"}
	v2MemoryStat    = []string{"anon", "inactive_file", "pgfault", "pgmajfault"}
	// kernel is the sum of the others, which kernels before 6.1 report
	// without it.
	v2MemoryStatAll = append(v2MemoryStat[:len(v2MemoryStat):len(v2MemoryStat)], "file", "file_mapped", "kernel",
		"kernel_stack", "pagetables", "percpu", "sock", "vmalloc", "slab")
	v2CPUStat    = []string{"usage_usec"}
	v2CPUStatAll = []string{"usage_usec", "user_usec", "system_usec", "nr_periods", "nr_throttled", "throttled_usec"}
	v2EventKeys  = []string{"max", "oom_kill"}
)

// userHZ is the unit of cpuacct.stat: USER_HZ, 100 on every architecture
// Linux runs containers on.
const userHZ = 100

// detail is how much of a cgroup a read takes.
type detail int

const (
	// statUsage is CPU usage, memory and swap: what CRI's container stats
	// report.
	statUsage detail = iota
	// statTasks adds the task count, which CRI's pod stats report.
	statTasks
	// statAll is everything the metrics report.
	statAll
)

// Stat reads the cgroup named group (a cgroupfs path such as
// "/pinrt/<pod>/pinrt-<ctr>"): CPU usage, memory and swap, what CRI's
// container stats report. It leaves Pids 0. A cgroup that does not exist
// (a container never started, or already deleted, also while it is being
// read) is ErrNotFound.
//
// A node's containers are read every 10 seconds, and on this kernel's
// interface a read is a syscall that prints the file anew: Stat reads 4
// files on v1 and 5 on v2, memory.stat by far the costliest.
//
// The files stay open for the next Stat of the same cgroup: a cgroupfs
// file is generated anew by every read from offset 0, and one pread costs
// a third of an open, read and close. A removed cgroup's open files read
// ENODEV, which closes them; a cgroup not read for idleClose has its files
// closed too.
func (r *Reader) Stat(group string) (*Stats, error) {
	return r.stat(group, statUsage)
}

// StatPod reads what Stat does and the task count, Pids: what CRI's pod
// stats report.
func (r *Reader) StatPod(group string) (*Stats, error) {
	return r.stat(group, statTasks)
}

// StatAll reads what Stat does and everything else the cAdvisor metrics
// report: the CPU split and throttling, the CPU and memory limits, the
// memory detail and OOM kills, block I/O, the task limit, and the
// processes' file descriptors. It reads some 20 files on v1 and 14 on
// v2, each once, and one /proc directory per process in the cgroup.
func (r *Reader) StatAll(group string) (*Stats, error) {
	return r.stat(group, statAll)
}

func (r *Reader) stat(group string, d detail) (*Stats, error) {
	if !validGroup(group) {
		return nil, fmt.Errorf("cgroup %q: must be absolute without '..': %w", group, errdefs.ErrInvalidArgument)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	st := &Stats{Timestamp: time.Now()}
	for {
		g := r.lookup(group, st.Timestamp)
		g.mu.Lock()
		if g.closed {
			// Closed by another Stat's failure or for idleness after the
			// lookup: take a fresh one.
			g.mu.Unlock()
			r.drop(g)
			continue
		}
		var err error
		if r.mode == Unified {
			err = r.statV2(g, bp, st, d)
		} else {
			err = r.statV1(g, bp, st, d)
		}
		if err == nil {
			err = r.statPressure(g, bp, st)
		}
		if err == nil && d == statAll {
			st.Hugetlb, err = r.statHugetlb(group, bp)
		}
		// Last: procs is in *bp until processes has read it.
		var procs []byte
		if err == nil && d == statAll {
			procs, err = r.readProcs(g, bp)
		}
		if err != nil {
			g.closeLocked()
		}
		g.mu.Unlock()
		if err != nil {
			r.drop(g)
			return nil, statError(group, err)
		}
		if d == statAll {
			// Outside the lock: /proc is not the cgroup's.
			st.Processes = r.processes(procs)
		}
		return st, nil
	}
}

func (r *Reader) statV1(g *openGroup, bp *[]byte, st *Stats, d detail) error {
	usage, _, err := r.readUint(g, v1Usage, bp)
	if err != nil {
		return err
	}
	limit, _, err := r.readUint(g, v1Limit, bp)
	if err != nil {
		return err
	}
	// The total_* counters include descendants: a pod cgroup's numbers
	// are its containers' sum, and a leaf's equal its own.
	keys := v1MemoryStat
	if d == statAll {
		keys = v1MemoryStatAll
	}
	var ms [9]uint64
	if _, err := r.readFields(g, v1MemStat, bp, keys, ms[:]); err != nil {
		return err
	}
	st.Memory = Memory{
		Usage: usage, RSS: ms[0], PageFaults: ms[2], MajorPageFaults: ms[3],
		WorkingSet: workingSet(usage, ms[1]),
		// Without swap accounting the kernel prints no total_swap.
		Swap: ms[4], HasSwap: r.memsw,
		Cache: ms[5], MappedFile: ms[6], LocalPageFaults: ms[7], LocalMajorPageFaults: ms[8],
	}
	st.Memory.Limit = limitOrZero(limit)
	if st.CPUUsageNanos, _, err = r.readUint(g, v1CPU, bp); err != nil || d == statUsage {
		return err
	}
	if st.Pids, _, err = r.readUint(g, v1Pids, bp); err != nil || d == statTasks {
		return err
	}
	return r.statV1All(g, bp, st)
}

// statV1All reads the files only the metrics need. The integers come
// first, each a file of its own.
func (r *Reader) statV1All(g *openGroup, bp *[]byte, st *Stats) error {
	m := &st.Memory
	var period, quota, shares, swapLimit, pidsMax, soft uint64
	var hasShares bool
	for _, u := range []struct {
		file int
		v    *uint64
		ok   *bool
	}{
		{v1CFSPeriod, &period, nil}, {v1Shares, &shares, &hasShares},
		{v1MaxUsage, &m.MaxUsage, nil}, {v1Failcnt, &m.Failcnt, nil}, {v1Kmem, &m.Kernel, nil},
		{v1MemswLimit, &swapLimit, nil}, {v1PidsMax, &pidsMax, nil}, {v1SoftLimit, &soft, nil},
	} {
		v, ok, err := r.readUint(g, u.file, bp)
		if err != nil {
			return err
		}
		*u.v = v
		if u.ok != nil {
			*u.ok = ok
		}
	}
	m.SwapLimit, st.PidsLimit, m.Reservation = limitOrZero(swapLimit), limitOrZero(pidsMax), limitOrZero(soft)
	// cfs_quota_us is -1 without a quota.
	b, ok, err := r.read(g, v1CFSQuota, bp)
	if err != nil {
		return err
	}
	if ok {
		q, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", r.path(g.group, v1CFSQuota), err)
		}
		quota = uint64(max(q, 0))
	}
	st.CPU.Spec = CPUSpec{Period: period, Quota: quota, Shares: shares, Known: hasShares}

	var acct [2]uint64
	if _, err := r.readFields(g, v1CPUAcctStat, bp, v1CPUAcct, acct[:]); err != nil {
		return err
	}
	st.CPU.UserNanos, st.CPU.SystemNanos = acct[0]*(1e9/userHZ), acct[1]*(1e9/userHZ)
	var cfs [3]uint64
	if _, err := r.readFields(g, v1CPUStat, bp, v1CPUStatKeys, cfs[:]); err != nil {
		return err
	}
	st.CPU.Periods, st.CPU.ThrottledPeriods, st.CPU.ThrottledNanos = cfs[0], cfs[1], cfs[2]
	var oom [1]uint64
	if _, err := r.readFields(g, v1OOMControl, bp, v1OOMKeys, oom[:]); err != nil {
		return err
	}
	st.OOMKills = oom[0]

	b, ok, err = r.read(g, v1IOBytes, bp)
	if err != nil || !ok {
		return err
	}
	if st.IO, err = parseBlkio(b, nil, false); err != nil {
		return fmt.Errorf("%s: %w", r.path(g.group, v1IOBytes), err)
	}
	b, ok, err = r.read(g, v1IOServiced, bp)
	if err != nil || !ok {
		return err
	}
	if st.IO, err = parseBlkio(b, st.IO, true); err != nil {
		return fmt.Errorf("%s: %w", r.path(g.group, v1IOServiced), err)
	}
	r.nameDevices(st.IO)
	return nil
}

func (r *Reader) statV2(g *openGroup, bp *[]byte, st *Stats, d detail) error {
	keys := v2CPUStat
	if d == statAll {
		keys = v2CPUStatAll
	}
	var cpu [6]uint64
	if _, err := r.readFields(g, v2CPU, bp, keys, cpu[:]); err != nil {
		return err
	}
	st.CPUUsageNanos = cpu[0] * 1000
	st.CPU.UserNanos, st.CPU.SystemNanos = cpu[1]*1000, cpu[2]*1000
	st.CPU.Periods, st.CPU.ThrottledPeriods, st.CPU.ThrottledNanos = cpu[3], cpu[4], cpu[5]*1000
	usage, ok, err := r.readUint(g, v2MemCurrent, bp)
	if err != nil {
		return err
	}
	if ok {
		// memory.max is "max" when unlimited, which readUint returns as
		// MaxUint64; absent, it is unlimited as well.
		limit, _, err := r.readUint(g, v2MemMax, bp)
		if err != nil {
			return err
		}
		keys := v2MemoryStat
		if d == statAll {
			keys = v2MemoryStatAll
		}
		var ms [13]uint64
		if _, err := r.readFields(g, v2MemStat, bp, keys, ms[:]); err != nil {
			return err
		}
		st.Memory = Memory{
			Usage: usage, RSS: ms[0], PageFaults: ms[2], MajorPageFaults: ms[3],
			WorkingSet: workingSet(usage, ms[1]),
			Cache:      ms[4], MappedFile: ms[5], Kernel: ms[6],
		}
		if d == statAll {
			// v2 has no local counters: memory.stat is hierarchical.
			st.Memory.LocalPageFaults, st.Memory.LocalMajorPageFaults = ms[2], ms[3]
		}
		if st.Memory.Kernel == 0 {
			for _, v := range ms[7:] {
				st.Memory.Kernel += v
			}
		}
		st.Memory.Limit = limitOrZero(limit)
		if st.Memory.Swap, st.Memory.HasSwap, err = r.readUint(g, v2Swap, bp); err != nil {
			return err
		}
	}
	if d == statUsage {
		return nil
	}
	if st.Pids, _, err = r.readUint(g, v2Pids, bp); err != nil || d == statTasks {
		return err
	}
	return r.statV2All(g, bp, st)
}

func (r *Reader) statV2All(g *openGroup, bp *[]byte, st *Stats) error {
	m := &st.Memory
	var swapLimit, pidsMax, weight, memMin uint64
	var hasWeight bool
	for _, u := range []struct {
		file int
		v    *uint64
		ok   *bool
	}{
		{v2MemPeak, &m.MaxUsage, nil}, {v2SwapMax, &swapLimit, nil}, {v2PidsMax, &pidsMax, nil},
		{v2CPUWeight, &weight, &hasWeight}, {v2MemMin, &memMin, nil},
	} {
		v, ok, err := r.readUint(g, u.file, bp)
		if err != nil {
			return err
		}
		*u.v = v
		if u.ok != nil {
			*u.ok = ok
		}
	}
	m.SwapLimit, st.PidsLimit, m.Reservation = limitOrZero(swapLimit), limitOrZero(pidsMax), limitOrZero(memMin)
	if hasWeight {
		st.CPU.Spec = CPUSpec{Shares: weightToShares(weight), Known: true}
	}
	// cpu.max is "$QUOTA $PERIOD", the quota "max" without one.
	b, ok, err := r.read(g, v2CPUMax, bp)
	if err != nil {
		return err
	}
	if ok {
		q, p, _ := bytes.Cut(bytes.TrimSpace(b), []byte{' '})
		if st.CPU.Spec.Period, err = strconv.ParseUint(string(p), 10, 64); err != nil {
			return fmt.Errorf("%s: %w", r.path(g.group, v2CPUMax), err)
		}
		if string(q) != "max" {
			if st.CPU.Spec.Quota, err = strconv.ParseUint(string(q), 10, 64); err != nil {
				return fmt.Errorf("%s: %w", r.path(g.group, v2CPUMax), err)
			}
		}
	}
	// memory.events counts hierarchically: "max" is how often usage hit
	// memory.max, v1's failcnt.
	var ev [2]uint64
	if _, err := r.readFields(g, v2MemEvents, bp, v2EventKeys, ev[:]); err != nil {
		return err
	}
	m.Failcnt, st.OOMKills = ev[0], ev[1]
	b, ok, err = r.read(g, v2IOStat, bp)
	if err != nil || !ok {
		return err
	}
	if st.IO, err = parseIOStat(b); err != nil {
		return fmt.Errorf("%s: %w", r.path(g.group, v2IOStat), err)
	}
	r.nameDevices(st.IO)
	return nil
}

// statPressure reads the cgroup's pressure stall information, which every
// detail reports: CRI's CPU, memory and I/O usage carry it.
func (r *Reader) statPressure(g *openGroup, bp *[]byte, st *Stats) error {
	first := v1CPUPressure
	if r.mode == Unified {
		first = v2CPUPressure
	}
	var all *[3]Pressure // one allocation for the three
	for i, p := range []**Pressure{&st.CPUPressure, &st.MemoryPressure, &st.IOPressure} {
		b, ok, err := r.read(g, first+i, bp)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if all == nil {
			all = new([3]Pressure)
		}
		if err := parsePressure(b, &all[i]); err != nil {
			return fmt.Errorf("%s: %w", r.path(g.group, first+i), err)
		}
		*p = &all[i]
	}
	return nil
}

var errNotKeyValue = errors.New("not key=value")

// parsePressure parses a *.pressure file: a "some" line and, on every
// file since Linux 5.13 (before, not on cpu.pressure), a "full" one, each
// "avg10=0.12 avg60=0.05 avg300=0.01 total=12345".
func parsePressure(b []byte, p *Pressure) error {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		kind, rest, _ := bytes.Cut(line, []byte{' '})
		var d *PressureData
		switch string(kind) {
		case "some":
			d = &p.Some
		case "full":
			d = &p.Full
		default:
			continue
		}
		for len(rest) > 0 {
			var f []byte
			if f, rest, _ = bytes.Cut(rest, []byte{' '}); len(f) == 0 {
				continue
			}
			k, v, ok := bytes.Cut(f, []byte{'='})
			if !ok {
				return fmt.Errorf("%s: field %q: %w", kind, f, errNotKeyValue)
			}
			var err error
			switch string(k) {
			case "avg10":
				d.Avg10, err = strconv.ParseFloat(string(v), 64)
			case "avg60":
				d.Avg60, err = strconv.ParseFloat(string(v), 64)
			case "avg300":
				d.Avg300, err = strconv.ParseFloat(string(v), 64)
			case "total":
				// Microseconds in the file; nanoseconds, as CPUUsageNanos.
				d.TotalNanos, err = strconv.ParseUint(string(v), 10, 64)
				d.TotalNanos *= 1000
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", kind, k, err)
			}
		}
	}
	return nil
}

// limitOrZero is a limit, 0 for unlimited (v1's huge number, v2's "max").
func limitOrZero(v uint64) uint64 {
	if v >= unlimited {
		return 0
	}
	return v
}

// weightToShares turns cpu.weight (1-10000) back into v1 shares
// (2-262144), the inverse of the conversion runc applies and the one
// cAdvisor reports: the default weight 100 is 2597, not 1024.
func weightToShares(w uint64) uint64 {
	if w == 0 || w > 10000 {
		return 0
	}
	return 2 + (w-1)*262142/9999
}

// openGroup is a cgroup's files, opened when first read.
type openGroup struct {
	group string
	// used is when the cgroup was last looked up, under Reader.mu.
	used time.Time

	mu     sync.Mutex
	fds    [numFiles]int // an open fd, fdUnopened or fdAbsent
	closed bool
}

const (
	fdUnopened = -1
	// fdAbsent is an optional file the cgroup does not have. Which
	// controllers a cgroup has is fixed when it is created.
	fdAbsent = -2
)

// idleClose is how long a cgroup's files stay open without a Stat. kubelet
// reads every container every 10 seconds; a container that is gone is read
// no more, and its files are closed one to two idleClose later.
const idleClose = time.Minute

// lookup returns group's files, and closes those of the cgroups nobody
// read for idleClose, once per idleClose.
func (r *Reader) lookup(group string, now time.Time) *openGroup {
	var idle []*openGroup
	defer func() {
		for _, g := range idle {
			g.mu.Lock()
			g.closeLocked()
			g.mu.Unlock()
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	if now.Sub(r.swept) >= idleClose {
		r.swept = now
		for k, g := range r.open {
			if now.Sub(g.used) >= idleClose {
				idle = append(idle, g)
				delete(r.open, k)
			}
		}
	}
	g, ok := r.open[group]
	if !ok {
		g = &openGroup{group: group}
		for i := range g.fds {
			g.fds[i] = fdUnopened
		}
		// Files the host cannot have are never tried.
		if r.mode != Unified && !r.memsw {
			g.fds[v1MemswLimit] = fdAbsent
		}
		if r.mode != Unified && !r.pids {
			g.fds[v1Pids], g.fds[v1PidsMax] = fdAbsent, fdAbsent
		}
		if r.mode == Legacy {
			g.fds[v1CPUPressure], g.fds[v1MemPressure], g.fds[v1IOPressure] = fdAbsent, fdAbsent, fdAbsent
		}
		r.open[group] = g
	}
	g.used = now
	return g
}

// Forget closes the files of group, a cgroup just removed: the kernel
// frees a removed cgroup only once no file of it is open, and the idle
// sweep runs only when some cgroup is read. A Stat of group after it
// opens them again.
func (r *Reader) Forget(group string) {
	r.mu.Lock()
	g, ok := r.open[group]
	delete(r.open, group)
	r.mu.Unlock()
	if ok {
		g.mu.Lock()
		g.closeLocked()
		g.mu.Unlock()
	}
}

// drop forgets g, if it is still what the reader has for its cgroup.
func (r *Reader) drop(g *openGroup) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.open[g.group] == g {
		delete(r.open, g.group)
	}
}

func (g *openGroup) closeLocked() {
	for i, fd := range g.fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		g.fds[i] = fdUnopened
	}
	g.closed = true
}

// Close closes every file the reader holds open. Stat may be called after
// and opens them again.
func (r *Reader) Close() error {
	r.mu.Lock()
	open := r.open
	r.open = map[string]*openGroup{}
	r.mu.Unlock()
	for _, g := range open {
		g.mu.Lock()
		g.closeLocked()
		g.mu.Unlock()
	}
	return nil
}

func (r *Reader) path(group string, i int) string {
	f := r.files[i]
	if f.controller == "" {
		return r.root + group + "/" + f.name
	}
	return r.root + "/" + f.controller + group + "/" + f.name
}

// read reads file i of g into *bp; false for an optional file the cgroup
// lacks. A missing file in a missing cgroup is the cgroup removed, also
// while it was read, which stays an error (ENOENT, NotFound for Stat)
// rather than a zero.
func (r *Reader) read(g *openGroup, i int, bp *[]byte) ([]byte, bool, error) {
	fd := g.fds[i]
	if fd == fdAbsent {
		return nil, false, nil
	}
	if fd == fdUnopened {
		p := r.path(g.group, i)
		var err error
		fd, err = ignoringEINTR(func() (int, error) { return unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0) })
		if err != nil {
			if !r.files[i].optional || !errors.Is(err, unix.ENOENT) {
				return nil, false, &os.PathError{Op: "open", Path: p, Err: err}
			}
			// The first file's directory: memory's on v1.
			dir := filepath.Dir(r.path(g.group, 0))
			if err := unix.Access(dir, unix.F_OK); err != nil {
				return nil, false, &os.PathError{Op: "access", Path: dir, Err: err}
			}
			g.fds[i] = fdAbsent
			return nil, false, nil
		}
		g.fds[i] = fd
	}
	b, err := preadAll(fd, bp)
	if err != nil {
		return nil, false, &os.PathError{Op: "read", Path: r.path(g.group, i), Err: err}
	}
	return b, true, nil
}

// bufPool holds the read buffers: every stats poll reads a few files per
// container, and a fresh buffer each would be most of its garbage.
var bufPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 8<<10)
	return &b
}}

// preadAll reads fd from offset 0 into *bp with plain syscalls. os.File
// would register every cgroupfs file with the runtime's poller (epoll_ctl
// and fcntl, and a deregistration on close) for reads that never block.
// A read that fills the buffer is repeated from 0 into a larger one, so
// that the numbers always come from one generation of the file.
func preadAll(fd int, bp *[]byte) ([]byte, error) {
	buf := (*bp)[:cap(*bp)]
	for {
		n, err := ignoringEINTR(func() (int, error) { return unix.Pread(fd, buf, 0) })
		if err != nil {
			return nil, err
		}
		if n < len(buf) {
			return buf[:n], nil
		}
		buf = make([]byte, 2*len(buf))
		*bp = buf[:0]
	}
}

func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// readUint reads file i of g, holding one number or "max" (v2's
// unlimited, returned as MaxUint64); false for an optional file the
// cgroup lacks.
func (r *Reader) readUint(g *openGroup, i int, bp *[]byte) (uint64, bool, error) {
	b, ok, err := r.read(g, i, bp)
	if err != nil || !ok {
		return 0, false, err
	}
	b = bytes.TrimSpace(b)
	if string(b) == "max" {
		return ^uint64(0), true, nil
	}
	v, err := strconv.ParseUint(string(b), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", r.path(g.group, i), err)
	}
	return v, true, nil
}

// readFields reads file i of g, a flat keyed file ("key value" lines, as
// memory.stat and cpu.stat), and stores the value of keys[j] in out[j]; a
// key the file lacks leaves its value 0, as kernels add and drop keys over
// time. False for an optional file the cgroup lacks.
func (r *Reader) readFields(g *openGroup, i int, bp *[]byte, keys []string, out []uint64) (bool, error) {
	b, ok, err := r.read(g, i, bp)
	if err != nil || !ok {
		return false, err
	}
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		k, v, ok := bytes.Cut(line, []byte{' '})
		if !ok {
			continue
		}
		for j, key := range keys {
			if string(k) != key {
				continue
			}
			if out[j], err = strconv.ParseUint(string(v), 10, 64); err != nil {
				return false, fmt.Errorf("%s: %s: %w", r.path(g.group, i), key, err)
			}
			break
		}
	}
	return true, nil
}

// statError makes a cgroup that is gone, before or during the read,
// NotFound. A file still open when its cgroup is removed reads ENODEV.
func statError(group string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("cgroup %s: %w: %w", group, errdefs.ErrNotFound, err)
	}
	return fmt.Errorf("cgroup %s: %w", group, err)
}
