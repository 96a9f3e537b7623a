package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// besideExe is the helper binary name in exe's directory, where make
// install puts pinrt's helpers, so a daemon runs those of its own build.
// It returns the path with the error too: fs.ErrNotExist when there is
// no such file, FailedPrecondition when the file cannot run.
func besideExe(exe, name string) (string, error) {
	p := filepath.Join(filepath.Dir(exe), name)
	if !filepath.IsAbs(exe) {
		return p, fmt.Errorf("pinrt's own path %q is not absolute: %w", exe, os.ErrNotExist)
	}
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return p, err
	case err != nil:
		return p, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return p, fmt.Errorf("%s is not an executable file (mode %s): %w", p, fi.Mode(), errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// execHelperName is pinrt's small helper binary (cmd/pinrt-exec): the
// exec helper of streaming execs and the pause process of shared-PID
// pods.
const execHelperName = "pinrt-exec"

// execHelper is pinrt-exec beside the daemon's binary, or "" when it is
// not there or cannot run: the daemon's own binary then does its work,
// 10 ms slower to start and with 16 MiB more mapped per pause process,
// so a lone pinrt binary still works.
func execHelper(ctx context.Context, exe string) string {
	p, err := besideExe(exe, execHelperName)
	if err != nil {
		log.G(ctx).WithError(err).Infof("streaming execs and pause processes run pinrt itself, not %s", execHelperName)
		return ""
	}
	return p
}
