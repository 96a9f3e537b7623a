package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// checkpointRuntime is a runtime whose checkpoint runs script (with
// $work the --work-path), and whose state says status.
func checkpointRuntime(t *testing.T, script, status string) *Runtime {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fakerunc")
	body := fmt.Sprintf(`#!/bin/sh
[ "$1" = --root ] && shift 2
case "$1" in
checkpoint)
	work=
	while [ $# -gt 0 ]; do [ "$1" = --work-path ] && work=$2; shift; done
	%s ;;
state) echo '{"id":"c1","status":%q}' ;;
list) echo '[{"id":"c1"}]' ;;
esac
`, script, status)
	if err := os.WriteFile(bin, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewRuntime(Handler{Name: "fake", Binary: bin, Root: filepath.Join(dir, "root"), MonitorPath: "/bin/true"}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// A caller that gives up does not kill the dump: CRIU thaws the
// container only at its end.
func TestCheckpointOutlivesItsCaller(t *testing.T) {
	rt := checkpointRuntime(t, `sleep 1; echo finished > "$work/finished"`, "running")
	work := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	// The script exits 0 after its sleep: the deadline's error shows the
	// call returned before the dump ended, with no clock read here.
	err := rt.Checkpoint(ctx, "c1", filepath.Join(work, "images"), work)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the caller's deadline", err)
	}
	if _, err := os.Stat(filepath.Join(work, "finished")); err == nil {
		t.Fatal("the call waited for the dump to end")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if b, err := os.ReadFile(filepath.Join(work, "finished")); err == nil && string(b) == "finished\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the runtime's checkpoint never finished: it was killed with the call")
		}
	}
}

// A failed dump says why from the runtime's output; one of a container
// that is not running is FailedPrecondition.
func TestCheckpointFailures(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   func(error) bool
	}{
		{"running", errdefs.IsUnknown},
		{"stopped", errdefs.IsFailedPrecondition},
	} {
		rt := checkpointRuntime(t, `echo "criu failed: type DUMP errno 0" >&2; exit 1`, tc.status)
		work := t.TempDir()
		err := rt.Checkpoint(context.Background(), "c1", filepath.Join(work, "images"), work)
		if !tc.want(err) {
			t.Errorf("%s container: err = %v", tc.status, err)
		}
		if tc.status == "running" && (err == nil || !strings.Contains(err.Error(), "criu failed: type DUMP")) {
			t.Errorf("err = %v, want the runtime's words", err)
		}
	}
	rt := checkpointRuntime(t, "exit 0", "running")
	if err := rt.Checkpoint(context.Background(), "../c1", "/tmp/x", "/tmp/y"); !errdefs.IsInvalidArgument(err) && !errdefs.IsNotFound(err) {
		t.Errorf("a hostile id: %v", err)
	}
}
