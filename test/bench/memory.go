package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RuntimeMemory is the memory of a runtime's processes: the daemon and
// every monitor it left in its cgroup (conmon for pinrt and CRI-O, the
// shims for containerd), which is what a node pays per container beside
// the containers themselves.
type RuntimeMemory struct {
	Procs  int   // processes in the cgroup
	PSSKiB int64 // their proportional set size, summed
	RSSKiB int64 // their resident set size, summed (shared pages counted in each)
}

// CgroupMemory sums the PSS and RSS of every process in the cgroup
// directory dir (v1 or v2: both list them in cgroup.procs). A process
// gone between the listing and the read is skipped.
func CgroupMemory(dir string) (RuntimeMemory, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return RuntimeMemory{}, err
	}
	var m RuntimeMemory
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return RuntimeMemory{}, fmt.Errorf("cgroup.procs of %s: %q", dir, f)
		}
		pss, rss, err := ReadPSS(pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return RuntimeMemory{}, err
		}
		m.Procs++
		m.PSSKiB += pss
		m.RSSKiB += rss
	}
	return m, nil
}

// ReadPSS reads a process's PSS and RSS in KiB from smaps_rollup.
func ReadPSS(pid int) (pss, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseSmapsRollup(string(b))
}

func parseSmapsRollup(s string) (pss, rss int64, err error) {
	var havePSS, haveRSS bool
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "Pss" && k != "Rss") {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, 0, fmt.Errorf("unexpected smaps_rollup line %q", strings.TrimSpace(line))
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if k == "Pss" {
			pss, havePSS = n, true
		} else {
			rss, haveRSS = n, true
		}
	}
	if !havePSS || !haveRSS {
		// A kernel thread or a zombie has an empty smaps_rollup.
		return 0, 0, fmt.Errorf("no Pss and Rss in smaps_rollup: %w", os.ErrNotExist)
	}
	return pss, rss, nil
}
