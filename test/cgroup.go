package test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
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
