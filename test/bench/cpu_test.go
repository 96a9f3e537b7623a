package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCgroupCPU(t *testing.T) {
	tests := []struct {
		name, file, content string
		want                time.Duration
	}{
		{"v1 cpuacct", "cpuacct.usage", "1234567890\n", 1234567890},
		{"v2 cpu.stat", "cpu.stat", "usage_usec 2500\nuser_usec 2000\nsystem_usec 500\n", 2500 * time.Microsecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := NewCgroupCPU(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := c.Usage(); err != nil || got != tc.want {
				t.Fatalf("Usage() = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := NewCgroupCPU(t.TempDir()); err == nil {
		t.Fatal("NewCgroupCPU on a directory without accounting files succeeded")
	}
}

func TestParsePhases(t *testing.T) {
	log := `time="x" level=debug msg="pod namespaces pinned" duration_ms=4.5 kinds="[net]" phase=namespaces sandbox=a
time="x" level=info msg="using cni network config"
{"level":"debug","msg":"cni add done","phase":"cni_add","duration_ms":12.25}
time="x" level=debug msg="pod namespaces pinned" duration_ms=5.5 phase=namespaces sandbox=b
`
	got, err := ParsePhases(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]time.Duration{
		"namespaces": {4500 * time.Microsecond, 5500 * time.Microsecond},
		"cni_add":    {12250 * time.Microsecond},
	}
	if len(got) != len(want) {
		t.Fatalf("phases = %v, want %v", got, want)
	}
	for k, w := range want {
		if g := got[k]; len(g) != len(w) || g[0] != w[0] || g[len(g)-1] != w[len(w)-1] {
			t.Fatalf("phase %s = %v, want %v", k, g, w)
		}
	}
}

func TestParseProcStatCPU(t *testing.T) {
	stat := "1234 (pinrt (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 0 0\n"
	got, err := parseProcStatCPU(stat)
	if err != nil || got != 3*time.Second {
		t.Fatalf("parseProcStatCPU = %v, %v; want 3s (300 ticks)", got, err)
	}
	if _, err := ProcessCPU(os.Getpid()); err != nil {
		t.Fatalf("ProcessCPU(self) = %v", err)
	}
}
