package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// probeRuntime writes a runtime binary answering `features` with features
// (or failing, like crun 1.8.1, when it is "") and `spec` with a
// config.json of version specVersion.
func probeRuntime(t *testing.T, features, specVersion string) *Runtime {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
case "$1" in
features) [ -n %q ] || { echo "unknown command features" >&2; exit 1; }; echo %q ;;
spec) echo '{"ociVersion": "%s"}' > config.json ;;
esac
`, features, features, specVersion)
	bin := filepath.Join(dir, "rt-"+binName(t))
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	rt, err := NewRuntime(Handler{Name: "probe", Binary: bin, MonitorPath: "/bin/true"}, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// binName keeps binaries distinct: Features caches by binary path.
func binName(t *testing.T) string {
	return strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
}

func TestProbe(t *testing.T) {
	tests := []struct {
		name, features, spec string
		want                 error
		msg                  string
	}{
		{"runc 1.5", `{"ociVersionMin":"1.0.0","ociVersionMax":"1.3.0"}`, "1.3.0", nil, ""},
		{"runc 1.2 runs 1.3 configs", `{"ociVersionMin":"1.0.0","ociVersionMax":"1.2.0"}`, "1.2.0", nil, ""},
		{"another major", `{"ociVersionMin":"2.0.0","ociVersionMax":"2.1.0"}`, "2.0.0", errdefs.ErrFailedPrecondition, "recognizes OCI spec from 2.0.0"},
		{"crun 1.8.1: no features, spec 1.0.0", "", "1.0.0", errdefs.ErrFailedPrecondition, "has no features command and writes OCI spec 1.0.0, older than the 1.3.0"},
		{"no features, current spec", "", "1.3.0", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := probeRuntime(t, tc.features, tc.spec).Probe(context.Background())
			if !errors.Is(err, tc.want) || (err != nil && !strings.Contains(err.Error(), tc.msg)) {
				t.Fatalf("Probe = %v, want %v containing %q", err, tc.want, tc.msg)
			}
		})
	}
}

// TestProbeDebianCrun runs the real crun when it is installed.
func TestProbeDebianCrun(t *testing.T) {
	if _, err := os.Stat("/usr/bin/crun"); err != nil {
		t.Skip("crun is not installed")
	}
	rt, err := NewRuntime(Handler{Name: "crun", Binary: "/usr/bin/crun", MonitorPath: "/bin/true"}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, _ := rt.Features(context.Background())
	err = rt.Probe(context.Background())
	if f.Raw == nil && !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("crun without a features command: Probe = %v, want FailedPrecondition", err)
	}
	t.Logf("crun: %v", err)
}
