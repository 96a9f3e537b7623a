package main

import (
	"strings"
	"testing"
)

// A second lock on a held directory fails naming the directory; flock
// conflicts between two opens, so this works within one process.
func TestLockDirRefusesSecondHolder(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDir(dir, "root")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = lockDir(dir, "root")
	if err == nil || !strings.Contains(err.Error(), "already running on root "+dir) {
		t.Fatalf("second lock = %v, want 'already running on root %s'", err, dir)
	}
	first.Close()
	again, err := lockDir(dir, "root")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
}
