package hack

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckTrackedFiles commits files into a scratch repository and runs
// check-tracked-files.sh on it, as make lint does on the real one.
func TestCheckTrackedFiles(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("needs git")
	}
	elf := append([]byte{0x7f, 'E', 'L', 'F'}, make([]byte, 100)...)
	big := bytes.Repeat([]byte("x"), 1024*1024+1)
	small := []byte("package main\n")
	tests := []struct {
		name    string
		files   map[string][]byte
		wantErr string // "" means the check passes
	}{
		{"source only", map[string][]byte{"main.go": small}, ""},
		{"exactly 1 MiB", map[string][]byte{"a.json": bytes.Repeat([]byte("x"), 1024*1024)}, ""},
		{"binary at the top", map[string][]byte{"main.go": small, "pinrt": elf}, "tracked executable: pinrt"},
		{"large file", map[string][]byte{"dump.tar": big}, "tracked file over 1 MiB: dump.tar"},
		{"large test data", map[string][]byte{"image/testdata/layer.tar": big}, ""},
		{"binary test data", map[string][]byte{"oci/testdata/fake-runc": elf}, ""},
		{"not under testdata", map[string][]byte{"testdatax/big": big}, "tracked file over 1 MiB: testdatax/big"},
	}
	script, err := filepath.Abs("check-tracked-files.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			git := func(args ...string) {
				t.Helper()
				cmd := exec.Command("git", args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t",
					"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("git %v: %v\n%s", args, err, out)
				}
			}
			git("init", "-q")
			for name, data := range tt.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, data, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			git("add", "-A")
			git("commit", "-qm", "files")
			out, err := exec.Command("bash", script, dir).CombinedOutput()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("check failed on a clean tree: %v\n%s", err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("check passed, want a failure naming %q", tt.wantErr)
			}
			if !strings.Contains(string(out), tt.wantErr) {
				t.Fatalf("check output %q does not name %q", out, tt.wantErr)
			}
		})
	}
}
