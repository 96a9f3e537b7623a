package test

import (
	"bufio"
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
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v2 := CgroupV2()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" {
			return filepath.Join("/sys/fs/cgroup", parts[2])
		}
		for _, c := range strings.Split(parts[1], ",") {
			if !v2 && c == controller {
				return filepath.Join("/sys/fs/cgroup", controller, parts[2])
			}
		}
	}
	t.Fatalf("pid %d has no %s cgroup", pid, controller)
	return ""
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
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	v2 := CgroupV2()
	file := ""
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		switch {
		case len(parts) != 3:
		case v2 && parts[0] == "0":
			file = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max")
		case !v2 && slices.Contains(strings.Split(parts[1], ","), "memory"):
			file = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		}
	}
	if file == "" {
		return "", fmt.Errorf("pid %d has no memory cgroup", pid)
	}
	v, err := os.ReadFile(file)
	return strings.TrimSpace(string(v)), err
}
