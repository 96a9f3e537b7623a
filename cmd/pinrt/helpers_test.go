package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// The exec helper is pinrt-exec beside the daemon when it can run, else
// the daemon itself ("").
func TestExecHelper(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "pinrt")
	ctx := context.Background()
	if got := execHelper(ctx, exe); got != "" {
		t.Errorf("without pinrt-exec: %q, want pinrt itself", got)
	}
	helper := filepath.Join(dir, "pinrt-exec")
	if err := os.WriteFile(helper, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := execHelper(ctx, exe); got != "" {
		t.Errorf("with a pinrt-exec that cannot run: %q, want pinrt itself", got)
	}
	if err := os.Chmod(helper, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := execHelper(ctx, exe); got != helper {
		t.Errorf("with pinrt-exec beside pinrt: %q, want %s", got, helper)
	}
	if got := execHelper(ctx, ""); got != "" {
		t.Errorf("with no path for pinrt: %q, want pinrt itself", got)
	}
}
