package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
)

// v1TreeAll is v1Tree with the files only StatAll reads, every number
// distinct so that a value read from the wrong file shows.
func v1TreeAll(group string) map[string]string {
	f := v1Tree(group, "67108864", true)
	for name, content := range map[string]string{
		"memory/" + group + "/memory.stat": "cache 8192\nrss 4096\nmapped_file 4096\npgfault 100\npgmajfault 2\n" +
			"total_cache 1048576\ntotal_rss 2097152\ntotal_mapped_file 65536\ntotal_inactive_file 524288\ntotal_active_file 524288\n" +
			"total_pgfault 1234\ntotal_pgmajfault 5\nswap 0\ntotal_swap 262144\n",
		"memory/" + group + "/memory.failcnt":                  "7\n",
		"memory/" + group + "/memory.kmem.usage_in_bytes":      "262144\n",
		"memory/" + group + "/memory.oom_control":              "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		"memory/" + group + "/memory.memsw.limit_in_bytes":     "134217728\n",
		"memory/" + group + "/memory.soft_limit_in_bytes":      "33554432\n",
		"hugetlb/" + group + "/hugetlb.2MB.usage_in_bytes":     "4194304\n",
		"hugetlb/" + group + "/hugetlb.2MB.max_usage_in_bytes": "6291456\n",
		"hugetlb/" + group + "/hugetlb.1GB.usage_in_bytes":     "0\n",
		"hugetlb/" + group + "/hugetlb.1GB.max_usage_in_bytes": "1073741824\n",
		"memory/" + group + "/cgroup.procs":                    "100\n101\n102\n",
		"cpu/" + group + "/cpu.stat":                           "nr_periods 50\nnr_throttled 9\nthrottled_time 1500000000\nnr_bursts 0\nburst_time 0\n",
		"cpu/" + group + "/cpu.cfs_period_us":                  "100000\n",
		"cpu/" + group + "/cpu.cfs_quota_us":                   "20000\n",
		"cpu/" + group + "/cpu.shares":                         "1024\n",
		"pids/" + group + "/pids.max":                          "1024\n",
		"blkio/" + group + "/blkio.throttle.io_service_bytes_recursive": "254:0 Read 8192\n254:0 Write 4096\n254:0 Sync 12288\n" +
			"254:0 Async 0\n254:0 Discard 0\n254:0 Total 12288\n8:16 Read 0\n8:16 Write 512\n8:16 Sync 512\n8:16 Async 0\n" +
			"8:16 Discard 0\n8:16 Total 512\nTotal 12800\n",
		"blkio/" + group + "/blkio.throttle.io_serviced_recursive": "254:0 Read 2\n254:0 Write 1\n254:0 Sync 3\n254:0 Async 0\n" +
			"254:0 Discard 0\n254:0 Total 3\n8:16 Read 0\n8:16 Write 1\n8:16 Sync 1\n8:16 Async 0\n8:16 Discard 0\n8:16 Total 1\nTotal 4\n",
	} {
		f[name] = content
	}
	return f
}

func v2TreeAll(group string) map[string]string {
	f := v2Tree(group, "67108864", true)
	for name, content := range map[string]string{
		group + "/cpu.stat": "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 50\nnr_throttled 9\n" +
			"throttled_usec 1500000\nnr_bursts 0\nburst_usec 0\n",
		group + "/memory.stat": "anon 2097152\nfile 1048576\nkernel 393216\nkernel_stack 16384\npagetables 8192\n" +
			"sock 0\nvmalloc 0\nslab 32768\nfile_mapped 65536\ninactive_file 524288\nactive_file 524288\n" +
			"pgfault 1234\npgmajfault 5\n",
		group + "/memory.events":       "low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\noom_group_kill 0\n",
		group + "/memory.peak":         "4194304\n",
		group + "/memory.swap.max":     "0\n",
		group + "/memory.min":          "16777216\n",
		group + "/hugetlb.2MB.current": "2097152\n",
		group + "/hugetlb.1GB.current": "0\n",
		group + "/cpu.max":             "20000 100000\n",
		// runc writes shares 1024 as weight 39.
		group + "/cpu.weight":   "39\n",
		group + "/pids.max":     "1024\n",
		group + "/cgroup.procs": "100\n101\n102\n",
		group + "/io.stat": "254:0 rbytes=8192 wbytes=4096 rios=2 wios=1 dbytes=0 dios=0\n" +
			"8:16 rbytes=0 wbytes=512 rios=0 wios=1 dbytes=0 dios=0\n",
	} {
		f[name] = content
	}
	return f
}

// fakeProc makes a /proc with pid 100 holding stdin on /dev/null, a pipe
// and two sockets, and pid 101 one file; 102 has exited.
func fakeProc(t *testing.T, dir string) {
	t.Helper()
	for pid, fds := range map[int][]string{100: {"/dev/null", "pipe:[5]", "socket:[77]", "socket:[78]"}, 101: {"/dev/null"}} {
		d := filepath.Join(dir, strconv.Itoa(pid), "fd")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, target := range fds {
			if err := os.Symlink(target, filepath.Join(d, strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// fakeSysBlock names 254:0 vda; 8:16 has no entry.
func fakeSysBlock(t *testing.T, dir string) {
	t.Helper()
	writeTree(t, dir, map[string]string{"254:0/uevent": "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n"})
}

func readAll(t *testing.T, files map[string]string, group string) *Stats {
	t.Helper()
	root := t.TempDir()
	writeTree(t, filepath.Join(root, "cgroup"), files)
	r := NewReader(filepath.Join(root, "cgroup"))
	r.proc, r.sysBlock, r.hugepages = filepath.Join(root, "proc"), filepath.Join(root, "sys"), filepath.Join(root, "hugepages")
	// The host's huge page sizes, and a directory that is none.
	for _, d := range []string{"hugepages-2048kB", "hugepages-1048576kB", "nothugepages"} {
		if err := os.MkdirAll(filepath.Join(r.hugepages, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fakeProc(t, r.proc)
	fakeSysBlock(t, r.sysBlock)
	st, err := r.StatAll(group)
	if err != nil {
		t.Fatal(err)
	}
	st.Timestamp = st.Timestamp.UTC()
	return st
}

var wantIO = []DeviceIO{
	{Major: 254, Minor: 0, Device: "/dev/vda", ReadBytes: 8192, WriteBytes: 4096, Reads: 2, Writes: 1},
	{Major: 8, Minor: 16, Device: "8:16", WriteBytes: 512, Writes: 1},
}

var wantProcesses = Processes{Count: 3, FDs: 5, Sockets: 2}

// TestStatAll checks every number StatAll adds to Stat's, per metric,
// against the file it comes from.
func TestStatAll(t *testing.T) {
	const group = "/pinrt/pod1/pinrt-ctr1"
	tests := []struct {
		name  string
		files map[string]string
		check func(t *testing.T, st *Stats)
	}{
		{"v1", v1TreeAll(group), func(t *testing.T, st *Stats) {
			expect(t, "CPUUsageNanos", st.CPUUsageNanos, 123456789)
			// cpuacct.stat counts USER_HZ ticks of 10ms.
			expect(t, "CPU.UserNanos", st.CPU.UserNanos, 100e6)
			expect(t, "CPU.SystemNanos", st.CPU.SystemNanos, 20e6)
			expect(t, "CPU.Periods", st.CPU.Periods, 50)
			expect(t, "CPU.ThrottledPeriods", st.CPU.ThrottledPeriods, 9)
			expect(t, "CPU.ThrottledNanos", st.CPU.ThrottledNanos, 1500000000)
			expect(t, "CPU.Spec", st.CPU.Spec, CPUSpec{Period: 100000, Quota: 20000, Shares: 1024, Known: true})
			expect(t, "Memory.Cache", st.Memory.Cache, 1048576)
			expect(t, "Memory.MappedFile", st.Memory.MappedFile, 65536)
			expect(t, "Memory.Kernel", st.Memory.Kernel, 262144)
			expect(t, "Memory.MaxUsage", st.Memory.MaxUsage, 4194304)
			expect(t, "Memory.Failcnt", st.Memory.Failcnt, 7)
			expect(t, "Memory.SwapLimit", st.Memory.SwapLimit, 134217728)
			expect(t, "Memory.Reservation", st.Memory.Reservation, 33554432)
			expect(t, "Hugetlb", st.Hugetlb, []Hugetlb{{"1GB", 0, 1073741824}, {"2MB", 4194304, 6291456}})
			expect(t, "Memory.Swap", st.Memory.Swap, 262144)
			expect(t, "Memory.PageFaults", st.Memory.PageFaults, 1234)
			expect(t, "Memory.MajorPageFaults", st.Memory.MajorPageFaults, 5)
			expect(t, "Memory.LocalPageFaults", st.Memory.LocalPageFaults, 100)
			expect(t, "Memory.LocalMajorPageFaults", st.Memory.LocalMajorPageFaults, 2)
			expect(t, "Memory.Limit", st.Memory.Limit, 67108864)
			expect(t, "OOMKills", st.OOMKills, 2)
			expect(t, "Pids", st.Pids, 3)
			expect(t, "PidsLimit", st.PidsLimit, 1024)
			expect(t, "IO", st.IO, wantIO)
			expect(t, "Processes", st.Processes, wantProcesses)
		}},
		{"v2", v2TreeAll(group), func(t *testing.T, st *Stats) {
			expect(t, "CPUUsageNanos", st.CPUUsageNanos, 123456000)
			expect(t, "CPU.UserNanos", st.CPU.UserNanos, 100000000)
			expect(t, "CPU.SystemNanos", st.CPU.SystemNanos, 23456000)
			expect(t, "CPU.Periods", st.CPU.Periods, 50)
			expect(t, "CPU.ThrottledPeriods", st.CPU.ThrottledPeriods, 9)
			expect(t, "CPU.ThrottledNanos", st.CPU.ThrottledNanos, 1500000000)
			// weight 39 is shares 998, as cAdvisor converts it back.
			expect(t, "CPU.Spec", st.CPU.Spec, CPUSpec{Period: 100000, Quota: 20000, Shares: 998, Known: true})
			expect(t, "Memory.Cache", st.Memory.Cache, 1048576)
			expect(t, "Memory.MappedFile", st.Memory.MappedFile, 65536)
			expect(t, "Memory.Kernel", st.Memory.Kernel, 393216)
			expect(t, "Memory.MaxUsage", st.Memory.MaxUsage, 4194304)
			expect(t, "Memory.Failcnt", st.Memory.Failcnt, 7)
			// swap.max 0: runc's memory+swap equal to the memory limit.
			expect(t, "Memory.SwapLimit", st.Memory.SwapLimit, 0)
			expect(t, "Memory.Reservation", st.Memory.Reservation, 16777216)
			// v2 keeps no peak.
			expect(t, "Hugetlb", st.Hugetlb, []Hugetlb{{"1GB", 0, 0}, {"2MB", 2097152, 0}})
			expect(t, "Memory.Swap", st.Memory.Swap, 524288)
			expect(t, "Memory.LocalPageFaults", st.Memory.LocalPageFaults, 1234)
			expect(t, "Memory.LocalMajorPageFaults", st.Memory.LocalMajorPageFaults, 5)
			expect(t, "OOMKills", st.OOMKills, 2)
			expect(t, "Pids", st.Pids, 3)
			expect(t, "PidsLimit", st.PidsLimit, 1024)
			expect(t, "IO", st.IO, wantIO)
			expect(t, "Processes", st.Processes, wantProcesses)
		}},
		{"v2 unlimited", with(with(with(v2TreeAll(group), group+"/cpu.max", "max 100000\n"), group+"/pids.max", "max\n"),
			group+"/memory.swap.max", "max\n"), func(t *testing.T, st *Stats) {
			expect(t, "CPU.Spec", st.CPU.Spec, CPUSpec{Period: 100000, Shares: 998, Known: true})
			expect(t, "PidsLimit", st.PidsLimit, 0)
			expect(t, "Memory.SwapLimit", st.Memory.SwapLimit, 0)
		}},
		{"v1 unlimited", with(with(with(v1TreeAll(group), "cpu/"+group+"/cpu.cfs_quota_us", "-1\n"), "memory/"+group+"/memory.memsw.limit_in_bytes", "9223372036854771712\n"),
			"memory/"+group+"/memory.soft_limit_in_bytes", "9223372036854771712\n"),
			func(t *testing.T, st *Stats) {
				expect(t, "CPU.Spec", st.CPU.Spec, CPUSpec{Period: 100000, Shares: 1024, Known: true})
				expect(t, "Memory.SwapLimit", st.Memory.SwapLimit, 0)
				expect(t, "Memory.Reservation", st.Memory.Reservation, 0)
			}},
		{
			// Kernels before 6.1 have no "kernel" key: the parts add up.
			"v2 kernel from its parts", with(v2TreeAll(group), group+"/memory.stat", "anon 1\nkernel_stack 16384\npagetables 8192\nslab 32768\nsock 4096\n"),
			func(t *testing.T, st *Stats) { expect(t, "Memory.Kernel", st.Memory.Kernel, 16384+8192+32768+4096) },
		},
		{
			// cpu, io and pids not enabled for the cgroup, memory.peak
			// older than the kernel: no numbers, no error.
			"v2 without controllers", without(v2TreeAll(group), group+"/cpu.max", group+"/cpu.weight", group+"/io.stat",
				group+"/pids.max", group+"/pids.current", group+"/memory.peak"),
			func(t *testing.T, st *Stats) {
				expect(t, "CPU.Spec", st.CPU.Spec, CPUSpec{})
				expect(t, "IO", len(st.IO), 0)
				expect(t, "PidsLimit", st.PidsLimit, 0)
				expect(t, "Memory.MaxUsage", st.Memory.MaxUsage, 0)
				expect(t, "Memory.Failcnt", st.Memory.Failcnt, 7)
			},
		},
		{
			// No blkio or kmem (cgroup.memory=nokmem), a cgroup runc did not
			// make in cpu.
			"v1 without blkio, kmem and cpu", without(v1TreeAll(group), "blkio/"+group+"/blkio.throttle.io_service_bytes_recursive",
				"blkio/"+group+"/blkio.throttle.io_serviced_recursive", "memory/"+group+"/memory.kmem.usage_in_bytes",
				"cpu/"+group+"/cpu.stat", "cpu/"+group+"/cpu.cfs_period_us", "cpu/"+group+"/cpu.cfs_quota_us", "cpu/"+group+"/cpu.shares"),
			func(t *testing.T, st *Stats) {
				expect(t, "IO", len(st.IO), 0)
				expect(t, "Memory.Kernel", st.Memory.Kernel, 0)
				expect(t, "CPU.Spec", st.CPU.Spec, CPUSpec{})
				expect(t, "CPU.UserNanos", st.CPU.UserNanos, 100e6)
				expect(t, "Processes", st.Processes, wantProcesses)
			},
		},
		{
			// A blk-throttle that saw no bio lists only the total.
			"v1 idle blkio", with(with(v1TreeAll(group), "blkio/"+group+"/blkio.throttle.io_service_bytes_recursive", "Total 0\n"),
				"blkio/"+group+"/blkio.throttle.io_serviced_recursive", "Total 0\n"),
			func(t *testing.T, st *Stats) { expect(t, "IO", len(st.IO), 0) },
		},
		{
			// The controller not enabled for the cgroup on v2, or a v1
			// host without its hierarchy: no sizes, no error.
			"v2 without hugetlb", without(v2TreeAll(group), group+"/hugetlb.2MB.current", group+"/hugetlb.1GB.current"),
			func(t *testing.T, st *Stats) { expect(t, "Hugetlb", len(st.Hugetlb), 0) },
		},
		{
			"v1 without hugetlb", without(v1TreeAll(group), "hugetlb/"+group+"/hugetlb.2MB.usage_in_bytes", "hugetlb/"+group+"/hugetlb.2MB.max_usage_in_bytes",
				"hugetlb/"+group+"/hugetlb.1GB.usage_in_bytes", "hugetlb/"+group+"/hugetlb.1GB.max_usage_in_bytes"),
			func(t *testing.T, st *Stats) { expect(t, "Hugetlb", len(st.Hugetlb), 0) },
		},
		{
			// A size whose file is missing is left out, not the sizes
			// after it.
			"v2 without the first size's file", without(v2TreeAll(group), group+"/hugetlb.1GB.current"),
			func(t *testing.T, st *Stats) {
				expect(t, "Hugetlb", st.Hugetlb, []Hugetlb{{PageSize: "2MB", Usage: 2097152}})
			},
		},
		{
			"empty cgroup", with(v2TreeAll(group), group+"/cgroup.procs", ""),
			func(t *testing.T, st *Stats) { expect(t, "Processes", st.Processes, Processes{}) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, readAll(t, tc.files, group))
		})
	}
}

func expect[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}

// TestStatLeavesMetricsOut: Stat reads its six files and nothing of
// StatAll's, on both hierarchies.
func TestStatLeavesMetricsOut(t *testing.T) {
	const group = "/pinrt/a"
	for _, files := range []map[string]string{v1TreeAll(group), v2TreeAll(group)} {
		root := t.TempDir()
		writeTree(t, root, files)
		r := NewReader(root)
		r.proc = t.TempDir()
		st, err := r.Stat(group)
		if err != nil {
			t.Fatal(err)
		}
		if st.CPU != (CPU{}) || st.OOMKills != 0 || st.IO != nil || st.PidsLimit != 0 || st.Memory.Cache != 0 || st.Memory.Failcnt != 0 {
			t.Errorf("%v: Stat read metrics files: %+v", r.Mode(), st)
		}
		// Only the files of Stat's figures are opened, and StatPod's add
		// the task count.
		want := map[Mode][]string{
			Legacy:  {"memory.usage_in_bytes", "memory.limit_in_bytes", "memory.stat", "cpuacct.usage"},
			Unified: {"cpu.stat", "memory.current", "memory.max", "memory.stat", "memory.swap.current"},
		}[r.Mode()]
		if got := r.opened(group); !slices.Equal(got, want) {
			t.Errorf("%v: Stat opened %q, want %q", r.Mode(), got, want)
		}
		if _, err := r.StatPod(group); err != nil {
			t.Fatal(err)
		}
		if got, want := r.opened(group), append(want, "pids.current"); !slices.Equal(got, want) {
			t.Errorf("%v: StatPod opened %q, want %q", r.Mode(), got, want)
		}
		r.Close()
	}
}

// opened names the files r holds open for group, in r's order.
func (r *Reader) opened(group string) []string {
	r.mu.Lock()
	g := r.open[group]
	r.mu.Unlock()
	var out []string
	for i, fd := range g.fds {
		if fd >= 0 {
			out = append(out, r.files[i].name)
		}
	}
	return out
}

func TestStatAllErrors(t *testing.T) {
	const group = "/pinrt/a"
	tests := []struct {
		name  string
		files map[string]string
	}{
		{"v2 cpu.max garbage", with(v2TreeAll(group), group+"/cpu.max", "lots\n")},
		{"v2 io.stat device garbage", with(v2TreeAll(group), group+"/io.stat", "sda rbytes=1\n")},
		{"v2 io.stat value garbage", with(v2TreeAll(group), group+"/io.stat", "8:0 rbytes=many\n")},
		{"v1 quota garbage", with(v1TreeAll(group), "cpu/"+group+"/cpu.cfs_quota_us", "none\n")},
		{"v1 blkio garbage", with(v1TreeAll(group), "blkio/"+group+"/blkio.throttle.io_service_bytes_recursive", "8:x Read 1\n")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			if _, err := NewReader(root).StatAll(group); !errors.Is(err, strconv.ErrSyntax) {
				t.Fatalf("err = %v, want %v", err, strconv.ErrSyntax)
			}
		})
	}
}

func TestOpenFilesLimit(t *testing.T) {
	tests := []struct {
		name, limits string
		want         uint64
		ok           bool
	}{
		{"limited", "Limit                     Soft Limit           Hard Limit           Units     \n" +
			"Max cpu time              unlimited            unlimited            seconds   \n" +
			"Max open files            1048576              1048576              files     \n", 1048576, true},
		{"soft below hard", "Max open files            1024                 524288               files     \n", 1024, true},
		{"unlimited", "Max open files            unlimited            unlimited            files     \n", 0, false},
		{"no such line", "Max processes             63438                63438                processes \n", 0, false},
		{"truncated", "Max open files\n", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			proc := t.TempDir()
			if err := os.MkdirAll(filepath.Join(proc, "42"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, "42", "limits"), []byte(tc.limits), 0o644); err != nil {
				t.Fatal(err)
			}
			r := NewReader(t.TempDir())
			r.proc = proc
			if got, ok := r.OpenFilesLimit(42); got != tc.want || ok != tc.ok {
				t.Errorf("OpenFilesLimit = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
			if _, ok := r.OpenFilesLimit(43); ok {
				t.Error("a process that is gone has a limit")
			}
		})
	}
}

func TestPageSizeName(t *testing.T) {
	for kb, want := range map[uint64]string{64: "64KB", 2048: "2MB", 32768: "32MB", 1048576: "1GB", 16777216: "16GB", 1536: "1536KB"} {
		if got := pageSizeName(kb); got != want {
			t.Errorf("pageSizeName(%d) = %q, want %q", kb, got, want)
		}
	}
}
