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

// TestResourcesCachePrimed: a bundle primed from the spec it was written
// from is answered from the spec, until config.json changes.
func TestResourcesCachePrimed(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	spec := func(limit int64) *specs.Spec {
		return &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}}}
	}
	if err := os.WriteFile(p, []byte(`{"linux": {"resources": {"memory": {"limit": 1000}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var rc resourcesCache
	// Another limit than the file's, to tell a primed answer from a read.
	rc.prime(dir, spec(7000))
	if got := rc.get(dir).GetLinux().GetMemoryLimitInBytes(); got != 7000 {
		t.Errorf("primed: %d, want 7000 (from the spec, not a read of the file)", got)
	}
	if err := os.WriteFile(p, []byte(`{"linux": {"resources": {"memory": {"limit": 20000}}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := rc.get(dir).GetLinux().GetMemoryLimitInBytes(); got != 20000 {
		t.Errorf("after a rewrite: %d, want 20000", got)
	}
	// Priming a bundle without config.json leaves no entry.
	rc.prime(t.TempDir(), spec(1))
	n := 0
	rc.m.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Errorf("%d entries, want 1", n)
	}
}
