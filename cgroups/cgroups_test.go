package cgroups

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// writeTree writes files (relative path -> content) under root.
func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// v1Tree is a container cgroup as a 6.x kernel on a hybrid host shows it,
// with swap accounting (memsw) and without kmem files.
func v1Tree(group string, limit string, memsw bool) map[string]string {
	f := map[string]string{
		"memory/" + group + "/memory.stat": "cache 8192\nrss 4096\n" +
			"total_cache 1048576\ntotal_rss 2097152\ntotal_inactive_file 524288\ntotal_active_file 524288\n" +
			"total_pgfault 1234\ntotal_pgmajfault 5\n",
		"memory/" + group + "/memory.oom_control":        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
		"memory/" + group + "/memory.usage_in_bytes":     "3145728\n",
		"memory/" + group + "/memory.max_usage_in_bytes": "4194304\n",
		"memory/" + group + "/memory.failcnt":            "0\n",
		"memory/" + group + "/memory.limit_in_bytes":     limit + "\n",
		"cpuacct/" + group + "/cpuacct.usage":            "123456789\n",
		"cpuacct/" + group + "/cpuacct.usage_percpu":     "100000000 23456789\n",
		"cpuacct/" + group + "/cpuacct.stat":             "user 10\nsystem 2\n",
		"pids/" + group + "/pids.current":                "3\n",
		"pids/" + group + "/pids.max":                    "max\n",
		// A hybrid host: a controller-less v2 tree beside the v1 ones.
		"unified/cgroup.procs": "",
	}
	if memsw {
		// With swap accounting the kernel adds the swap in use to
		// memory.stat, which is what Stat reads of it.
		f["memory/"+group+"/memory.stat"] += "swap 0\ntotal_swap 524288\n"
		f["memory/memory.memsw.usage_in_bytes"] = "1\n"
		for k, v := range map[string]string{"usage_in_bytes": "3670016", "max_usage_in_bytes": "0", "failcnt": "0", "limit_in_bytes": "9223372036854771712"} {
			f["memory/"+group+"/memory.memsw."+k] = v + "\n"
		}
	}
	return f
}

// without returns files less the named ones.
func without(files map[string]string, names ...string) map[string]string {
	for _, n := range names {
		if _, ok := files[n]; !ok {
			panic("without: no file " + n)
		}
		delete(files, n)
	}
	return files
}

// with returns files with name's content replaced.
func with(files map[string]string, name, content string) map[string]string {
	if _, ok := files[name]; !ok {
		panic("with: no file " + name)
	}
	files[name] = content
	return files
}

// plus returns files with name added.
func plus(files map[string]string, name, content string) map[string]string {
	if _, ok := files[name]; ok {
		panic("plus: already a file " + name)
	}
	files[name] = content
	return files
}

func v2Tree(group, max string, swap bool) map[string]string {
	f := map[string]string{
		"cgroup.controllers": "cpuset cpu io memory pids\n",
		group + "/cpu.stat":  "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
		group + "/memory.stat": "anon 2097152\nfile 1048576\ninactive_file 524288\nactive_file 524288\n" +
			"pgfault 1234\npgmajfault 5\n",
		group + "/memory.current": "3145728\n",
		group + "/memory.max":     max + "\n",
		group + "/pids.current":   "3\n",
		group + "/pids.max":       "max\n",
	}
	if swap {
		f[group+"/memory.swap.current"] = "524288\n"
		f[group+"/memory.swap.max"] = "max\n"
	}
	return f
}

func TestStat(t *testing.T) {
	const group = "/pinrt/pod1/pinrt-ctr1"
	tests := []struct {
		name  string
		files map[string]string
		mode  Mode
		want  Stats
	}{
		{
			name: "v1 unlimited without swap accounting", files: v1Tree(group, "9223372036854771712", false), mode: Legacy,
			want: Stats{CPUUsageNanos: 123456789, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
			}},
		},
		{
			name: "v1 limited with memsw", files: v1Tree(group, "10485760", true), mode: Legacy,
			want: Stats{CPUUsageNanos: 123456789, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
				Limit: 10485760, Swap: 524288, HasSwap: true,
			}},
		},
		{
			name: "v2 unlimited with swap", files: v2Tree(group, "max", true), mode: Unified,
			want: Stats{CPUUsageNanos: 123456000, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
				Swap: 524288, HasSwap: true,
			}},
		},
		{
			name: "v2 limited without swap", files: v2Tree(group, "10485760", false), mode: Unified,
			want: Stats{CPUUsageNanos: 123456000, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
				Limit: 10485760,
			}},
		},
		{
			// runc joins every v1 controller it finds; a cgroup someone
			// else made may lack pids even where the host has it.
			name: "v1 without the cgroup's pids", files: without(v1Tree(group, "10485760", false), "pids/"+group+"/pids.current"), mode: Legacy,
			want: Stats{CPUUsageNanos: 123456789, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
				Limit: 10485760,
			}},
		},
		{
			name: "v1 host without pids", files: without(v1Tree(group, "10485760", false), "pids/"+group+"/pids.current", "pids/"+group+"/pids.max"), mode: Legacy,
			want: Stats{CPUUsageNanos: 123456789, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
				Limit: 10485760,
			}},
		},
		{
			// A kernel that dropped or renamed a memory.stat key leaves
			// that number 0, not the whole read failed.
			name: "v1 memory.stat without pgmajfault", files: with(v1Tree(group, "10485760", false), "memory/"+group+"/memory.stat",
				"total_rss 2097152\ntotal_inactive_file 524288\ntotal_pgfault 1234\n"), mode: Legacy,
			want: Stats{CPUUsageNanos: 123456789, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, Limit: 10485760,
			}},
		},
		{
			// The parent did not enable memory and pids in
			// cgroup.subtree_control: cpu.stat alone exists.
			name: "v2 without the memory and pids controllers", mode: Unified,
			files: without(v2Tree(group, "max", true), group+"/memory.stat", group+"/memory.current", group+"/memory.max",
				group+"/memory.swap.current", group+"/memory.swap.max", group+"/pids.current", group+"/pids.max"),
			want: Stats{CPUUsageNanos: 123456000},
		},
		{
			// PSI of a hybrid host, from the v2 hierarchy beside the v1
			// ones; each number distinct, so one read from the wrong file
			// or field shows.
			name: "hybrid with pressure", mode: Hybrid,
			files: plus(plus(plus(plus(v1Tree(group, "10485760", false),
				"unified/cgroup.controllers", ""),
				"unified"+group+"/cpu.pressure", "some avg10=1.50 avg60=0.25 avg300=0.05 total=123456\nfull avg10=0.75 avg60=0.12 avg300=0.01 total=65432\n"),
				"unified"+group+"/memory.pressure", "some avg10=2.00 avg60=0.00 avg300=0.00 total=42\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=41\n"),
				"unified"+group+"/io.pressure", "some avg10=0.00 avg60=3.00 avg300=0.00 total=7\nfull avg10=0.00 avg60=0.00 avg300=4.00 total=6\n"),
			want: Stats{CPUUsageNanos: 123456789, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5, Limit: 10485760,
			},
				CPUPressure:    &Pressure{Some: PressureData{1.5, 0.25, 0.05, 123456000}, Full: PressureData{0.75, 0.12, 0.01, 65432000}},
				MemoryPressure: &Pressure{Some: PressureData{2, 0, 0, 42000}, Full: PressureData{0, 0, 0, 41000}},
				IOPressure:     &Pressure{Some: PressureData{0, 3, 0, 7000}, Full: PressureData{0, 0, 4, 6000}},
			},
		},
		{
			// cpu.pressure before Linux 5.13 has no full line; a kernel
			// without PSI for I/O (none) leaves it out.
			name: "v2 with pressure", mode: Unified,
			files: plus(plus(v2Tree(group, "max", false),
				group+"/cpu.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"),
				group+"/memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
			want: Stats{CPUUsageNanos: 123456000, Pids: 3, Memory: Memory{
				Usage: 3145728, WorkingSet: 3145728 - 524288, RSS: 2097152, PageFaults: 1234, MajorPageFaults: 5,
			},
				CPUPressure:    &Pressure{Some: PressureData{TotalNanos: 99000}},
				MemoryPressure: &Pressure{},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			r := NewReader(root)
			if r.Mode() != tc.mode {
				t.Fatalf("mode = %v, want %v", r.Mode(), tc.mode)
			}
			// Stat leaves the task count to StatPod.
			container := tc.want
			container.Pids = 0
			for _, read := range []struct {
				name string
				stat func(string) (*Stats, error)
				want Stats
			}{{"Stat", r.Stat, container}, {"StatPod", r.StatPod, tc.want}} {
				got, err := read.stat(group)
				if err != nil {
					t.Fatal(err)
				}
				if got.Timestamp.IsZero() {
					t.Error("no timestamp")
				}
				got.Timestamp = time.Time{}
				if !reflect.DeepEqual(*got, read.want) {
					t.Errorf("%s =\n%+v\nwant\n%+v", read.name, *got, read.want)
				}
			}
		})
	}
}

func TestStatErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		group string
		want  error
	}{
		{"v1 missing cgroup", v1Tree("/pinrt/a", "1", false), "/pinrt/b", errdefs.ErrNotFound},
		{"v2 missing cgroup", v2Tree("/pinrt/a", "max", false), "/pinrt/b", errdefs.ErrNotFound},
		// A cgroup removed between two controllers' reads: memory is
		// still there, cpuacct no more.
		{"v1 removed mid-read", without(v1Tree("/pinrt/a", "1", false), "cpuacct//pinrt/a/cpuacct.usage", "cpuacct//pinrt/a/cpuacct.usage_percpu", "cpuacct//pinrt/a/cpuacct.stat"), "/pinrt/a", errdefs.ErrNotFound},
		// cpu.stat is a core file of every v2 cgroup.
		{"v2 without cpu.stat", without(v2Tree("/pinrt/a", "max", false), "/pinrt/a/cpu.stat"), "/pinrt/a", errdefs.ErrNotFound},
		{"v1 garbage", with(v1Tree("/pinrt/a", "1", false), "memory//pinrt/a/memory.usage_in_bytes", "lots\n"), "/pinrt/a", strconv.ErrSyntax},
		{"v2 garbage pressure", plus(v2Tree("/pinrt/a", "max", false), "/pinrt/a/io.pressure", "some avg10=x avg60=0.00 avg300=0.00 total=1\n"), "/pinrt/a", strconv.ErrSyntax},
		{"v2 pressure without values", plus(v2Tree("/pinrt/a", "max", false), "/pinrt/a/cpu.pressure", "some avg10\n"), "/pinrt/a", errNotKeyValue},
		{"relative", v2Tree("/pinrt/a", "max", false), "pinrt/a", errdefs.ErrInvalidArgument},
		{"dotdot", v2Tree("/pinrt/a", "max", false), "/pinrt/../../etc", errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			_, err := NewReader(root).Stat(tc.group)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestMemoryAvailable(t *testing.T) {
	tests := []struct {
		name string
		m    Memory
		want uint64
	}{
		{"unlimited", Memory{WorkingSet: 10}, 0},
		{"limited", Memory{WorkingSet: 10, Limit: 100}, 90},
		{"over the limit", Memory{WorkingSet: 200, Limit: 100}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.m.Available(); got != tc.want {
				t.Fatalf("Available = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCPURates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewCPURates()
	steps := []struct {
		name   string
		at     time.Time
		usage  uint64
		want   uint64
		wantOK bool
	}{
		{"first sample has no rate", t0, 1e9, 0, false},
		// Before a full window, the time there is.
		{"short first window", t0.Add(500 * time.Millisecond), 1e9 + 1e8, 2e8, true},
		{"half a core over 2s", t0.Add(2 * time.Second), 2e9, 5e8, true},
		{"same instant: the same rate", t0.Add(2 * time.Second), 3e9, 5e8, true},
		// kubelet's second call, milliseconds after the first, of a
		// container that slept through them: the window's rate, not 0.
		{"within the window", t0.Add(2005 * time.Millisecond), 2e9, 5e8, true},
		{"still the stored window's", t0.Add(2900 * time.Millisecond), 2e9 + 9e8, 5e8, true},
		{"the next full window", t0.Add(3 * time.Second), 2e9 + 1e9, 1e9, true},
		{"counter reset", t0.Add(4 * time.Second), 1e6, 0, false},
		{"after reset", t0.Add(5 * time.Second), 1e6 + 2e9, 2e9, true},
	}
	for _, s := range steps {
		got, ok := c.Rate("ctr", s.at, s.usage)
		if got != s.want || ok != s.wantOK {
			t.Errorf("%s: Rate = %d, %v; want %d, %v", s.name, got, ok, s.want, s.wantOK)
		}
	}
	c.Forget("ctr")
	if _, ok := c.Rate("ctr", t0.Add(10*time.Second), 5e9); ok {
		t.Error("a forgotten key still had a previous sample")
	}
}

func TestUpdate(t *testing.T) {
	const group = "/pinrt/pod1"
	shares, period := uint64(512), uint64(100000)
	quota, limit := int64(50000), int64(64<<20)
	res := &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &limit},
		Pids:   &specs.LinuxPids{Limit: &quota},
	}
	tests := []struct {
		name  string
		files map[string]string
		want  map[string]string
	}{
		{
			name: "v1",
			files: map[string]string{
				"memory" + group + "/memory.limit_in_bytes": "9223372036854771712\n",
				"cpu" + group + "/cpu.shares":               "1024\n",
				"pids" + group + "/pids.max":                "max\n",
			},
			want: map[string]string{
				"memory" + group + "/memory.limit_in_bytes": "67108864",
				"cpu" + group + "/cpu.shares":               "512",
				"cpu" + group + "/cpu.cfs_quota_us":         "50000",
				"cpu" + group + "/cpu.cfs_period_us":        "100000",
				// Only CPU and memory are applied.
				"pids" + group + "/pids.max": "max\n",
			},
		},
		{
			name: "v2",
			files: map[string]string{
				"cgroup.controllers":  "cpu memory pids\n",
				group + "/memory.max": "max\n",
				group + "/cpu.weight": "100\n",
				group + "/pids.max":   "max\n",
			},
			want: map[string]string{
				group + "/memory.max": "67108864",
				// shares 512 is weight 59 in the conversion runc uses too.
				group + "/cpu.weight": "59",
				group + "/cpu.max":    "50000 100000",
				group + "/pids.max":   "max\n",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeTree(t, root, tc.files)
			r := NewReader(root)
			if err := r.Update(group, res); err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.want {
				b, err := os.ReadFile(filepath.Join(root, name))
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				if string(b) != want {
					t.Errorf("%s = %q, want %q", name, b, want)
				}
			}
			if err := r.Update("/pinrt/missing", res); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Update of a missing cgroup = %v, want NotFound", err)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		want  Mode
	}{
		{"unified", []string{"cgroup.controllers"}, Unified},
		{"hybrid", []string{"unified/cgroup.controllers", "memory/memory.limit_in_bytes"}, Hybrid},
		{"legacy", []string{"memory/memory.limit_in_bytes"}, Legacy},
		{"nothing mounted", nil, Legacy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(root, f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := Detect(root); got != tc.want {
				t.Errorf("Detect = %v, want %v", got, tc.want)
			}
		})
	}
}

// openFDs counts the process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(fds)
}

// TestStatKeepsFilesOpen: the second Stat of a cgroup reads its files
// anew through the descriptors the first opened, the files of a cgroup
// nobody reads are closed after idleClose, and Close closes the rest.
func TestStatKeepsFilesOpen(t *testing.T) {
	const a, b = "/pinrt/a", "/pinrt/b"
	root := t.TempDir()
	files := v2Tree(a, "max", false)
	maps.Copy(files, v2Tree(b, "max", false))
	writeTree(t, root, files)
	before := openFDs(t)
	r := NewReader(root)
	if _, err := r.Stat(a); err != nil {
		t.Fatal(err)
	}
	// cpu.stat, memory.current, memory.max, memory.stat;
	// memory.swap.current is absent.
	if got := openFDs(t) - before; got != 4 {
		t.Errorf("%d files open after one Stat, want 4", got)
	}
	writeTree(t, root, map[string]string{a + "/memory.current": "4194304\n"})
	st, err := r.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	if st.Memory.Usage != 4194304 {
		t.Errorf("usage after the file changed = %d, want 4194304", st.Memory.Usage)
	}
	if got := openFDs(t) - before; got != 4 {
		t.Errorf("%d files open after a second Stat of the same cgroup, want 4", got)
	}

	// a idles; reading b past idleClose closes a's files.
	r.mu.Lock()
	r.open[a].used = r.open[a].used.Add(-idleClose)
	r.swept = r.swept.Add(-idleClose)
	r.mu.Unlock()
	if _, err := r.Stat(b); err != nil {
		t.Fatal(err)
	}
	if got := openFDs(t) - before; got != 4 {
		t.Errorf("%d files open after a idled and b was read, want b's 4", got)
	}
	if _, ok := r.open[a]; ok {
		t.Error("the idle cgroup is still held")
	}
	// Forget closes a removed cgroup's files at once; a later Stat opens
	// them again.
	r.Forget(b)
	r.Forget("/pinrt/never-read")
	if got := openFDs(t) - before; got != 0 || len(r.open) != 0 {
		t.Errorf("%d files and %d cgroups held after Forget", got, len(r.open))
	}
	if _, err := r.Stat(b); err != nil {
		t.Fatal(err)
	}
	if got := openFDs(t) - before; got != 4 {
		t.Errorf("%d files open after b was read again, want 4", got)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := openFDs(t) - before; got != 0 {
		t.Errorf("%d files open after Close", got)
	}
	// A cgroup whose read fails holds nothing.
	if _, err := r.Stat("/pinrt/missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing cgroup: %v", err)
	}
	if got := openFDs(t) - before; got != 0 || len(r.open) != 0 {
		t.Errorf("%d files and %d cgroups held after a failed Stat", got, len(r.open))
	}
}
