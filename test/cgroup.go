package test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CgroupV2 reports whether the host runs the unified hierarchy only.
func CgroupV2() bool {
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	return err == nil
}

// CgroupDir is the directory of process pid's cgroup: the unified one on
// cgroup v2, controller's hierarchy on v1. It reads /proc/<pid>/cgroup, so
// it finds the cgroup whatever the driver named it.
func CgroupDir(t testing.TB, pid int, controller string) string {
	t.Helper()
	dir, err := cgroupDir(pid, controller)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// cgroupDir is CgroupDir, with an error once pid is gone.
func cgroupDir(pid int, controller string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	v2 := CgroupV2()
	for _, l := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(l, ":", 3)
		switch {
		case len(parts) != 3:
		case v2 && parts[0] == "0":
			return filepath.Join("/sys/fs/cgroup", parts[2]), nil
		case !v2 && slices.Contains(strings.Split(parts[1], ","), controller):
			return filepath.Join("/sys/fs/cgroup", controller, parts[2]), nil
		}
	}
	return "", fmt.Errorf("pid %d has no %s cgroup", pid, controller)
}

// ReadCgroupFile is the trimmed content of file in dir.
func ReadCgroupFile(t testing.TB, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// MemoryLimit is the memory limit of pid's cgroup as the kernel shows it
// (v1 memory.limit_in_bytes, v2 memory.max), or an error once pid is gone.
func MemoryLimit(pid int) (string, error) {
	dir, err := cgroupDir(pid, "memory")
	if err != nil {
		return "", err
	}
	file := "memory.limit_in_bytes"
	if CgroupV2() {
		file = "memory.max"
	}
	v, err := os.ReadFile(filepath.Join(dir, file))
	return strings.TrimSpace(string(v)), err
}
