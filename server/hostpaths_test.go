package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/pinrt/pinrt/oci"
)

// A failed create removes the host paths it made, unless another create
// in flight or a container uses them or a path under them; what it made
// that no one uses goes, parents included.
func TestHostPathsRollbackSpareOthers(t *testing.T) {
	base := t.TempDir()
	shared := filepath.Join(base, "new", "shared")
	mine := filepath.Join(base, "new", "mine")
	var containerUses string
	h := newHostPaths(func(dir string) bool { return containerUses != "" && under(containerUses, dir) })
	bind := func(paths ...string) []oci.Mount {
		var ms []oci.Mount
		for _, p := range paths {
			ms = append(ms, oci.Mount{HostPath: p, ContainerPath: "/m"})
		}
		return ms
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	// A makes base/new, base/new/shared and base/new/mine; B, in flight,
	// finds base/new/shared. A fails: only mine goes.
	var undoA, undoB cleanups
	doneA, err := h.make(bind(shared, mine), &undoA)
	if err != nil {
		t.Fatal(err)
	}
	doneB, err := h.make(bind(shared), &undoB)
	if err != nil {
		t.Fatal(err)
	}
	if len(undoB) != 0 {
		t.Errorf("B made %d directories, want none: A made them", len(undoB))
	}
	doneA()
	undoA.run(context.Background())
	if !exists(shared) || exists(mine) {
		t.Errorf("after A's rollback with B in flight: shared exists %v (want true), mine exists %v (want false)", exists(shared), exists(mine))
	}

	// C makes base/q; E finds it and becomes a container using it before
	// C fails: base/q stays. A path of no one's under base/new is made
	// and removed by C too.
	doneB()
	q, c := filepath.Join(base, "q"), filepath.Join(base, "new", "c")
	var undoC, undoE cleanups
	doneC, err := h.make(bind(q, c), &undoC)
	if err != nil {
		t.Fatal(err)
	}
	doneE, err := h.make(bind(q), &undoE)
	if err != nil {
		t.Fatal(err)
	}
	doneE()
	containerUses = q
	doneC()
	undoC.run(context.Background())
	if !exists(q) || exists(c) || !exists(shared) {
		t.Errorf("after C's rollback: q exists %v (want true), c exists %v (want false), shared exists %v (want true)", exists(q), exists(c), exists(shared))
	}

	// Once nobody uses them, a failed create that made base/other/x
	// removes both directories; no count is left behind.
	containerUses = ""
	x := filepath.Join(base, "other", "x")
	var undoD cleanups
	doneD, err := h.make(bind(x), &undoD)
	if err != nil {
		t.Fatal(err)
	}
	undoD.run(context.Background()) // done runs from the rollback too
	doneD()
	if exists(filepath.Join(base, "other")) {
		t.Error("a failed create's host path with no other user was left")
	}
	if len(h.inFlight) != 0 {
		t.Errorf("in-flight counts left: %v", h.inFlight)
	}
}

// A path that cannot be made (a file in the way) fails the create and
// leaves no count.
func TestHostPathsMakeError(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHostPaths(func(string) bool { return false })
	var undo cleanups
	done, err := h.make([]oci.Mount{{HostPath: filepath.Join(file, "x")}}, &undo)
	if err == nil {
		t.Fatal("making a path under a file succeeded")
	}
	done()
	if len(h.inFlight) != 0 {
		t.Errorf("in-flight counts left: %v", h.inFlight)
	}
}
