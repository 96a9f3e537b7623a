package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pinrt/pinrt/internal/inotifytest"
)

// TestRemoveDirOrder: the records restore loads go before anything else,
// the intent records after everything else. A daemon killed at any
// instant of the removal leaves a directory restore tears down (an
// intent, or no state record), never one it loads back as a ghost.
func TestRemoveDirOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "abc123")
	if err := os.MkdirAll(filepath.Join(dir, "infra"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Created in every order, so that no directory order makes it pass.
	files := []string{"removing", "state.json", "creating", "config.json", "meta.json", "status.json", "conmon.pid", "exit"}
	for i := range files {
		if err := os.WriteFile(filepath.Join(dir, files[(i*3)%len(files)]), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := inotifytest.Deletions(t, dir, func() {
		if err := RemoveDir(dir); err != nil {
			t.Fatal(err)
		}
	})
	records := []string{"state.json", "status.json", "meta.json", "config.json"}
	for i, name := range got {
		isRecord, isIntent := slices.Contains(records, name), name == "removing" || name == "creating"
		switch {
		case i < len(records) && !isRecord:
			t.Errorf("deletion %d is %s, before every record restore loads was gone: %q", i, name, got)
		case i >= len(got)-2 && !isIntent:
			t.Errorf("deletion %d is %s, after an intent record: %q", i, name, got)
		}
	}
	if len(got) != len(files)+1 {
		t.Errorf("deleted %q, want the %d entries", got, len(files)+1)
	}
}
