package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CgroupCPU reads the CPU time used by every process of one cgroup: the
// runtime daemon and whatever it started and left there (unshare and cat,
// CNI plugins, runc, conmon). The kernel accounts a process's CPU to the
// cgroup it ran in, also after it exited, which is what rusage of the
// daemon alone misses.
type CgroupCPU struct {
	file string
	v2   bool
}

// NewCgroupCPU accepts a cgroup directory of either hierarchy: cgroup v1's
// cpuacct (cpuacct.usage, nanoseconds) or cgroup v2 (cpu.stat usage_usec).
func NewCgroupCPU(dir string) (*CgroupCPU, error) {
	if f := filepath.Join(dir, "cpuacct.usage"); fileExists(f) {
		return &CgroupCPU{file: f}, nil
	}
	if f := filepath.Join(dir, "cpu.stat"); fileExists(f) {
		return &CgroupCPU{file: f, v2: true}, nil
	}
	return nil, fmt.Errorf("cgroup %s has neither cpuacct.usage (v1) nor cpu.stat (v2)", dir)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Usage is the cgroup's total CPU time so far.
func (c *CgroupCPU) Usage() (time.Duration, error) {
	data, err := os.ReadFile(c.file)
	if err != nil {
		return 0, err
	}
	return parseCPUUsage(string(data), c.v2)
}

func parseCPUUsage(data string, v2 bool) (time.Duration, error) {
	if !v2 {
		ns, err := strconv.ParseInt(strings.TrimSpace(data), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpuacct.usage: %w", err)
		}
		return time.Duration(ns), nil
	}
	for line := range strings.Lines(data) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == "usage_usec" {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cpu.stat usage_usec: %w", err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, errors.New("cpu.stat has no usage_usec")
}

// phaseRE finds the daemon's phase timings in a debug log line, in logrus
// text (phase=cni_add duration_ms=4.2) or JSON ("phase":"cni_add",
// "duration_ms":4.2) format.
var (
	phaseRE    = regexp.MustCompile(`"?phase"?[=:]"?([a-z_]+)"?`)
	durationRE = regexp.MustCompile(`"?duration_ms"?[=:]([0-9.]+)`)
)

// ParsePhases reads the daemon's per-phase timings (lines carrying phase=
// and duration_ms= fields) and returns every phase's samples.
func ParsePhases(r io.Reader) (map[string][]time.Duration, error) {
	out := map[string][]time.Duration{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		pm := phaseRE.FindStringSubmatch(line)
		dm := durationRE.FindStringSubmatch(line)
		if pm == nil || dm == nil {
			continue
		}
		v, err := strconv.ParseFloat(dm[1], 64)
		if err != nil {
			continue
		}
		out[pm[1]] = append(out[pm[1]], time.Duration(v*float64(time.Millisecond)))
	}
	return out, sc.Err()
}

// LogTail remembers where a log file ended, so that only the lines a
// scenario caused are parsed afterwards.
type LogTail struct {
	path   string
	offset int64
}

// NewLogTail marks the current end of path (0 if it does not exist yet).
func NewLogTail(path string) *LogTail {
	t := &LogTail{path: path}
	if st, err := os.Stat(path); err == nil {
		t.offset = st.Size()
	}
	return t
}

// Phases parses the lines written since NewLogTail.
func (t *LogTail) Phases() (map[string][]time.Duration, error) {
	f, err := os.Open(t.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(t.offset, io.SeekStart); err != nil {
		return nil, err
	}
	return ParsePhases(f)
}

// phaseMetrics turns phase samples into p50 and mean metrics.
func phaseMetrics(phases map[string][]time.Duration, set func(string, float64)) {
	for name, s := range phases {
		if len(s) == 0 {
			continue
		}
		slices.Sort(s)
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		set("phase_"+name+"_p50_ms", ms(percentileSorted(s, 50)))
		set("phase_"+name+"_mean_ms", ms(sum/time.Duration(len(s))))
		set("phase_"+name+"_count", float64(len(s)))
	}
}

// ProcessCPU is the user+system time of one process (not its children),
// from /proc/<pid>/stat: how much of the cgroup's CPU the daemon itself
// used, besides the processes it started.
func ProcessCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseProcStatCPU(string(data))
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

func parseProcStatCPU(stat string) (time.Duration, error) {
	// The command name may hold spaces and parentheses: split after the
	// last ')'. utime and stime are fields 14 and 15, 12 and 13 after it.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat: %w", err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
