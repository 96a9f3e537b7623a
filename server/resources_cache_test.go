package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestResourcesCache: the cached limits follow every rewrite of
// config.json, whoever made it, and a caller's copy is its own.
func TestResourcesCache(t *testing.T) {
	dir := t.TempDir()
	write := func(limit int64, mtime time.Time) {
		t.Helper()
		spec := specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}}
		b, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "config.json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	var rc resourcesCache
	t0 := time.Unix(1_700_000_000, 0)
	write(1000, t0)
	got := rc.get(dir)
	if got.GetLinux().GetMemoryLimitInBytes() != 1000 {
		t.Fatalf("limit = %v, want 1000", got)
	}
	got.Linux.MemoryLimitInBytes = 5 // the caller's copy
	if again := rc.get(dir); again.GetLinux().GetMemoryLimitInBytes() != 1000 {
		t.Errorf("after a caller changed its copy: %d, want 1000", again.GetLinux().GetMemoryLimitInBytes())
	}
	// Same size, another mtime: read again.
	write(2000, t0.Add(time.Nanosecond))
	if got := rc.get(dir); got.GetLinux().GetMemoryLimitInBytes() != 2000 {
		t.Errorf("after a rewrite: %d, want 2000", got.GetLinux().GetMemoryLimitInBytes())
	}
	// Another size, the same mtime: read again.
	write(30000, t0.Add(time.Nanosecond))
	if got := rc.get(dir); got.GetLinux().GetMemoryLimitInBytes() != 30000 {
		t.Errorf("after a rewrite of another size: %d, want 30000", got.GetLinux().GetMemoryLimitInBytes())
	}
	if err := os.Remove(filepath.Join(dir, "config.json")); err != nil {
		t.Fatal(err)
	}
	if got := rc.get(dir); got != nil {
		t.Errorf("without config.json: %v, want nil", got)
	}
	if _, ok := rc.m.Load(dir); ok {
		t.Error("entry of a removed config.json kept")
	}
}
