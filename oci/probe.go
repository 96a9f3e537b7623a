package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Probe checks, once at start, that the runtime can run the specs pinrt
// writes (specs.Version), and fails with FailedPrecondition saying why
// not. A runtime with a features command must recognize that major
// version. One without (Debian's crun 1.8.1) is judged by the spec its
// `spec` command writes: crun 1.8.1 writes 1.0.0 and refuses every newer
// config with "unknown version specified".
func (r *Runtime) Probe(ctx context.Context) error {
	f, err := r.Features(ctx)
	if err != nil {
		return err
	}
	if f.Raw != nil {
		if err := majorMatches(f.Raw.OCIVersionMin, f.Raw.OCIVersionMax, specs.Version); err != nil {
			return fmt.Errorf("runtime %q (%s): %w: %w", r.h.Name, r.binary, err, errdefs.ErrFailedPrecondition)
		}
		return nil
	}
	v, err := r.defaultSpecVersion(ctx)
	if err != nil {
		return fmt.Errorf("runtime %q (%s) has no features command and its spec command failed: %w: %w", r.h.Name, r.binary, err, errdefs.ErrFailedPrecondition)
	}
	if older(v, specs.Version) {
		return fmt.Errorf("runtime %q (%s) has no features command and writes OCI spec %s, older than the %s pinrt generates: %w", r.h.Name, r.binary, v, specs.Version, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// defaultSpecVersion runs `<runtime> spec` in a scratch directory and
// reads the ociVersion of the config.json it writes.
func (r *Runtime) defaultSpecVersion(ctx context.Context) (string, error) {
	dir, err := os.MkdirTemp(r.stateDir, "probe-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.binary, "spec")
	cmd.Dir = dir
	cmd.WaitDelay = time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return "", err
	}
	var s struct {
		Version string `json:"ociVersion"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return "", fmt.Errorf("parse the spec it wrote: %w", err)
	}
	return s.Version, nil
}

// semver parses "1.2.3", "1.0.2-dev" or "1.1.0+dev" into major and minor.
func semver(v string) (major, minor int, ok bool) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	maj, err1 := strconv.Atoi(parts[0])
	mn, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return maj, mn, err1 == nil && err2 == nil
}

// older reports whether v's major.minor is below want's; an unparsable v
// is older.
func older(v, want string) bool {
	vm, vn, ok := semver(v)
	wm, wn, _ := semver(want)
	return !ok || vm < wm || vm == wm && vn < wn
}

// majorMatches accepts a features range whose major version is want's.
// Only the major is compared: runc 1.2 reports ociVersionMax 1.2.0 and runs
// 1.3.0 configs, as minor versions only add fields.
func majorMatches(minV, maxV, want string) error {
	wm, _, _ := semver(want)
	if m, _, ok := semver(maxV); ok && m < wm {
		return fmt.Errorf("recognizes OCI spec up to %s, pinrt generates %s", maxV, want)
	}
	if m, _, ok := semver(minV); ok && m > wm {
		return fmt.Errorf("recognizes OCI spec from %s, pinrt generates %s", minV, want)
	}
	return nil
}
