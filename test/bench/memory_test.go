package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseSmapsRollup(t *testing.T) {
	in := "00400000-7ffc [rollup]\nRss:               12884 kB\nPss:                9133 kB\nPss_Dirty:          4000 kB\nPss_Anon:           4000 kB\n"
	pss, rss, err := parseSmapsRollup(in)
	if err != nil || pss != 9133 || rss != 12884 {
		t.Errorf("= %d, %d, %v; want 9133, 12884", pss, rss, err)
	}
	if _, _, err := parseSmapsRollup(""); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("empty rollup (zombie): %v, want a not-exist error", err)
	}
	if _, _, err := parseSmapsRollup("Rss: 12 MB\nPss: 3 kB\n"); err == nil {
		t.Error("a unit other than kB was accepted")
	}
}

// TestCgroupMemory reads a cgroup.procs listing this process and one that
// does not exist: the gone one is skipped, ours counted.
func TestCgroupMemory(t *testing.T) {
	dir := t.TempDir()
	procs := strconv.Itoa(os.Getpid()) + "\n" + "2147483646\n"
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(procs), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := CgroupMemory(dir)
	if err != nil {
		t.Fatal(err)
	}
	pss, rss, err := ReadPSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if m.Procs != 1 || m.PSSKiB <= 0 || m.RSSKiB < m.PSSKiB/2 {
		t.Errorf("CgroupMemory = %+v, want one process with PSS > 0 (self: PSS %d, RSS %d kB)", m, pss, rss)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CgroupMemory(dir); err == nil {
		t.Error("a malformed cgroup.procs was accepted")
	}
}
