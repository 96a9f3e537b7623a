package cgroups

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/containerd/errdefs"
)

// OOMKills reads the oom_kill counter of group's memory.events on cgroup
// v2, where it counts the OOM kills in group and every cgroup below it.
// ok is false on v1 and hybrid hosts, and where the memory controller is
// not enabled for group.
//
// It exists for the systemd driver: systemd removes a container's scope,
// memory.events with it, as soon as its last process is gone, often
// before conmon reads the file, so conmon misses the OOM kill
// (containers/conmon#426, fixed only in releases newer than Debian's).
// The pod's slice outlives its containers, and its counter still has it.
func (r *Reader) OOMKills(group string) (n uint64, ok bool, err error) {
	if !validGroup(group) {
		return 0, false, fmt.Errorf("cgroup %q: must be absolute without '..': %w", group, errdefs.ErrInvalidArgument)
	}
	if r.mode != Unified {
		return 0, false, nil
	}
	b, err := os.ReadFile(filepath.Join(r.root, group, "memory.events"))
	if os.IsNotExist(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, statError(group, err)
	}
	return parseOOMKills(b)
}

func parseOOMKills(b []byte) (uint64, bool, error) {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if v, found := bytes.CutPrefix(line, []byte("oom_kill ")); found {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, false, fmt.Errorf("memory.events oom_kill %q: %w", v, err)
			}
			return n, true, nil
		}
	}
	return 0, false, nil
}
