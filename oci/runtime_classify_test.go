package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// scriptedRuntime writes a runtime binary whose failing command prints
// stderr and exits 1, and whose `state` and `list` answer as given ("" for
// state means it fails as runc does for an unknown container).
func scriptedRuntime(t *testing.T, failing, stderr, state, list string) *Runtime {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
[ "$1" = --root ] && shift 2
case "$1" in
%s) echo %q >&2; exit 1 ;;
state) [ -n %q ] || { echo "container does not exist" >&2; exit 1; }; echo %q ;;
list) echo %q ;;
*) exit 0 ;;
esac
`, failing, stderr, state, state, list)
	bin := filepath.Join(dir, "fakerunc")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewRuntime(Handler{Name: "fake", Binary: bin, Root: filepath.Join(dir, "root"), MonitorPath: "/bin/true"}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// recordCreated writes what Create leaves of a container created in the
// runtime: its record, and a bundle with config.json and conmon's pid.
func recordCreated(rt *Runtime, id string) error {
	bundle := filepath.Join(filepath.Dir(rt.stateDir), "bundles", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return err
	}
	for name, data := range map[string]string{"config.json": "{}", "conmon.pid": "1"} {
		if err := os.WriteFile(filepath.Join(bundle, name), []byte(data), 0o600); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(rt.recordPath(id)), 0o700); err != nil {
		return err
	}
	rec, _ := json.Marshal(record{Version: recordVersion, ID: id, Bundle: bundle, ExitDir: bundle})
	return os.WriteFile(rt.recordPath(id), rec, 0o600)
}

func TestRuntimeErrorsFollowState(t *testing.T) {
	const id = "c1"
	running := `{"id":"c1","pid":42,"status":"running"}`
	stopped := `{"id":"c1","pid":0,"status":"stopped"}`
	listed, empty := `[{"id":"c1","status":"running"}]`, "null"
	kill := func(rt *Runtime) error { return rt.Kill(context.Background(), id, syscall.SIGTERM, false) }
	update := func(rt *Runtime) error {
		if err := recordCreated(rt, id); err != nil {
			return err
		}
		return rt.Update(context.Background(), id, &specs.LinuxResources{})
	}
	tests := []struct {
		name        string
		failing     string
		stderr      string
		state, list string
		op          func(rt *Runtime) error
		want        error // nil: success
		wantMsg     string
	}{
		{"kill EPERM while running is not gone", "kill", "kill container: operation not permitted", running, listed, kill, errdefs.ErrUnknown, "operation not permitted"},
		{"kill's stderr wording does not decide", "kill", "container does not exist", running, listed, kill, errdefs.ErrUnknown, "container does not exist"},
		{"kill of a stopped container is done", "kill", "container not running", stopped, listed, kill, nil, ""},
		{"kill of an unknown container", "kill", "whatever", "", empty, kill, errdefs.ErrNotFound, "the runtime does not know it"},
		{"missing cgroup file is not NotFound", "update", "open /sys/fs/cgroup/pids/x/pids.max: no such file or directory", running, listed, update, errdefs.ErrUnknown, "pids.max: no such file"},
		{"update of a stopped container", "update", "x", stopped, listed, update, errdefs.ErrFailedPrecondition, "is stopped"},
		{"start of a running container", "start", "cannot start a container that has stopped", running, listed,
			func(rt *Runtime) error { return rt.Start(context.Background(), id) }, errdefs.ErrFailedPrecondition, "is running"},
		{"delete of an unknown container succeeds", "delete", "no such file", "", empty,
			func(rt *Runtime) error { return rt.Delete(context.Background(), id, true) }, nil, ""},
		{"delete that fails on a known container", "delete", "device or resource busy", stopped, listed,
			func(rt *Runtime) error { return rt.Delete(context.Background(), id, true) }, errdefs.ErrUnknown, "busy"},
		{"state fails for a listed container", "none", "", "", listed,
			func(rt *Runtime) error { _, err := rt.State(context.Background(), id); return err }, errdefs.ErrUnknown, "container does not exist"},
		{"state of an unknown container", "none", "", "", empty,
			func(rt *Runtime) error { _, err := rt.State(context.Background(), id); return err }, errdefs.ErrNotFound, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := scriptedRuntime(t, tc.failing, tc.stderr, tc.state, tc.list)
			err := tc.op(rt)
			// A failed update is not pending: nothing would finish it.
			if _, err := os.Stat(filepath.Join(filepath.Dir(rt.stateDir), "bundles", id, pendingUpdateFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("update pending after the call: %v", err)
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("err = %v, want success", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.wantMsg)
			}
			for _, other := range []error{errdefs.ErrNotFound, errdefs.ErrUnknown, errdefs.ErrFailedPrecondition} {
				if !errors.Is(other, tc.want) && errors.Is(err, other) {
					t.Errorf("err = %v is also %v", err, other)
				}
			}
		})
	}
}
