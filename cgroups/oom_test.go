package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func TestOOMKills(t *testing.T) {
	root := t.TempDir()
	// A v2 root has cgroup.controllers.
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := filepath.Join(root, "kubepods.slice", "kubepods-pod1.slice")
	if err := os.MkdirAll(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	events := "low 0\nhigh 0\nmax 7\noom 2\noom_kill 3\noom_group_kill 0\n"
	if err := os.WriteFile(filepath.Join(pod, "memory.events"), []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	r := NewReader(root)
	if r.Mode() != Unified {
		t.Fatalf("mode %v, want unified", r.Mode())
	}
	tests := []struct {
		name    string
		group   string
		n       uint64
		ok      bool
		wantErr error
	}{
		{"counter", "/kubepods.slice/kubepods-pod1.slice", 3, true, nil},
		{"no memory controller", "/kubepods.slice", 0, false, nil},
		{"gone", "/kubepods.slice/kubepods-pod2.slice", 0, false, nil},
		{"escape", "/../etc", 0, false, errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, ok, err := r.OOMKills(tt.group)
			if !errors.Is(err, tt.wantErr) || n != tt.n || ok != tt.ok {
				t.Errorf("OOMKills(%s) = %d, %v, %v; want %d, %v, %v", tt.group, n, ok, err, tt.n, tt.ok, tt.wantErr)
			}
		})
	}
	if _, _, err := parseOOMKills([]byte("oom_kill x\n")); err == nil {
		t.Error("a malformed counter parsed")
	}
	v1 := NewReader(t.TempDir())
	if _, ok, err := v1.OOMKills("/kubepods.slice"); ok || err != nil {
		t.Errorf("v1 OOMKills = %v, %v; want not ok, no error", ok, err)
	}
}
