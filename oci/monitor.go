package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
)

// sunPathMax is the longest path a unix socket address holds: sun_path is
// 108 bytes, the last one the terminating NUL.
const sunPathMax = 107

// CheckMonitor checks, once at start, that the conmon at path ("" means
// conmon from PATH) has --full-attach, which every container is created
// with. conmon before 2.0.23 lacks it, fails every create on the unknown
// flag, and binds its attach socket at a path cut to sunPathMax bytes,
// which under a long --root leaves attach nothing to connect to. A conmon
// that is not installed is NotFound: the handlers report that themselves.
func CheckMonitor(ctx context.Context, path string) error {
	if path == "" {
		path = "conmon"
	}
	bin, err := exec.LookPath(path)
	if err != nil {
		return fmt.Errorf("conmon %q: %w: %w", path, err, errdefs.ErrNotFound)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, "--help")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("conmon %s --help: %w: %w", bin, err, errdefs.ErrFailedPrecondition)
	}
	if !hasFullAttach(out) {
		return fmt.Errorf("conmon %s has no --full-attach option (conmon 2.0.23 or later has it): "+
			"without it conmon binds the attach socket at a path cut to the %d bytes of a unix socket address: %w",
			bin, sunPathMax, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// hasFullAttach reports whether conmon's --help output lists the
// --full-attach option. GLib prints each option indented, first on its
// line, followed by its description.
func hasFullAttach(help []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(help))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == "--full-attach" {
			return true
		}
	}
	return false
}

// Containers created before --full-attach was passed got a conmon with
// --socket-dir-path <state dir>/attach. That conmon links
// <state dir>/attach/<id> to the bundle (and binds the socket in the
// bundle, so dialAttach still reaches it), and conmon before 2.1.7 leaves
// the link behind when it exits. The links are removed with their
// container, and dangling ones at start.
const legacyAttachDir = "attach"

// legacyAttachLinks are the paths conmon may have given id's link in
// socketDir: <socketDir>/<id>, or, when that is exactly sunPathMax bytes,
// the same cut by one byte (conmon's own workaround for a link as long as
// the socket address).
func legacyAttachLinks(socketDir, id string) []string {
	p := filepath.Join(socketDir, id)
	if len(p) == sunPathMax {
		return []string{p, p[:sunPathMax-1]}
	}
	return []string{p}
}

// removeLegacyAttachLinks removes id's link, if any, and the link
// directory once it is empty.
func (r *Runtime) removeLegacyAttachLinks(id string) error {
	dir := filepath.Join(r.stateDir, legacyAttachDir)
	for _, p := range legacyAttachLinks(dir, id) {
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing attach link of %s: %w", id, err)
		}
	}
	// Fails while other containers' links are there, as it should.
	_ = os.Remove(dir)
	return nil
}

// pruneLegacyAttachLinks removes the links whose bundle is gone (their
// container was removed by a pinrt that did not remove them) and the
// directory once it is empty, best effort: a link left is a few bytes
// of tmpfs. Links to a bundle that is still there belong to a container
// that is not removed yet.
func pruneLegacyAttachLinks(stateDir string) {
	dir := filepath.Join(stateDir, legacyAttachDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		_ = os.Remove(p)
	}
	_ = os.Remove(dir)
}
