package oci

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// debianConmonHelp is part of `conmon --help` of Debian bookworm's conmon
// 2.1.6+ds1-1, as printed on the test host.
const debianConmonHelp = `Usage:
  conmon [OPTION…] - conmon utility

Help Options:
  -h, --help                   Show help options

Application Options:
  --api-version                Conmon API version to use
  -b, --bundle                 Location of the OCI Bundle path
  --socket-dir-path            Location of container attach sockets
  -i, --stdin                  Open up a pipe to pass stdin to the container
  --version                    Print the version and exit
  --full-attach                Don't truncate the path to the attach socket. This option causes conmon to ignore --socket-dir-path
  --seccomp-notify-socket      Path to the socket where the seccomp notification fd is received
`

// oldConmonHelp is the same for a conmon before 2.0.23, which has no
// --full-attach; the last line names it only in a description.
const oldConmonHelp = `Application Options:
  --api-version                Conmon API version to use
  --socket-dir-path            Location of container attach sockets
  --version                    Print the version and exit
  --syslog                     Log to syslog (no --full-attach here)
`

func TestHasFullAttach(t *testing.T) {
	tests := []struct {
		name string
		help string
		want bool
	}{
		{"debian 2.1.6", debianConmonHelp, true},
		{"before 2.0.23", oldConmonHelp, false},
		{"no output", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := hasFullAttach([]byte(tc.help)); got != tc.want {
				t.Errorf("hasFullAttach = %v, want %v", got, tc.want)
			}
		})
	}
}

// fakeConmon writes a conmon that prints help and exits with code.
func fakeConmon(t *testing.T, help string, code int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "conmon")
	script := "#!/bin/sh\ncat <<'EOF'\n" + help + "EOF\nexit " + strconv.Itoa(code) + "\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckMonitor(t *testing.T) {
	tests := []struct {
		name    string
		path    string
		wantErr error
		wantMsg string
	}{
		{"has --full-attach", fakeConmon(t, debianConmonHelp, 0), nil, ""},
		{"too old", fakeConmon(t, oldConmonHelp, 0), errdefs.ErrFailedPrecondition, "107 bytes"},
		{"help fails", fakeConmon(t, debianConmonHelp, 1), errdefs.ErrFailedPrecondition, "--help"},
		{"missing", filepath.Join(t.TempDir(), "conmon"), errdefs.ErrNotFound, "conmon"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMonitor(context.Background(), tc.path)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("CheckMonitor = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("CheckMonitor = %v, want %v naming %q", err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

func TestConmonArgsAttachInBundle(t *testing.T) {
	r := &Runtime{binary: "/usr/bin/runc", stateDir: "/run/pinrt/oci/runc"}
	args := r.conmonArgs(CreateOptions{ID: strings.Repeat("a", 64), Bundle: "/b", ExitDir: "/b"})
	if !slices.Contains(args, "--full-attach") || slices.Contains(args, "--socket-dir-path") {
		t.Fatalf("conmon args %q: want --full-attach and no --socket-dir-path", args)
	}
}

func TestLegacyAttachLinks(t *testing.T) {
	id := strings.Repeat("c", 64)
	// A socket dir that makes <dir>/<id> exactly 107 bytes.
	exact := "/" + strings.Repeat("d", sunPathMax-len(id)-2)
	tests := []struct {
		name string
		dir  string
		want []string
	}{
		{"short", "/run/pinrt/oci/runc/attach", []string{"/run/pinrt/oci/runc/attach/" + id}},
		{"exactly 107 bytes: conmon cut it by one", exact, []string{exact + "/" + id, exact + "/" + id[:63]}},
		{"108 bytes: not cut", exact + "x", []string{exact + "x/" + id}},
		{"long", "/" + strings.Repeat("l", 200), []string{"/" + strings.Repeat("l", 200) + "/" + id}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := legacyAttachLinks(tc.dir, id); !slices.Equal(got, tc.want) {
				t.Errorf("legacyAttachLinks = %q, want %q", got, tc.want)
			}
		})
	}
}

// legacyLinks makes <state>/attach/<name> links to target for each name.
func legacyLinks(t *testing.T, state, target string, names ...string) {
	t.Helper()
	dir := filepath.Join(state, legacyAttachDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.Symlink(target, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

func TestRemoveLegacyAttachLinks(t *testing.T) {
	state := t.TempDir()
	bundle := t.TempDir()
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	legacyLinks(t, state, bundle, a, b)
	dir := filepath.Join(state, legacyAttachDir)
	// Not a link: never conmon's, left alone.
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{stateDir: state}
	if err := r.removeLegacyAttachLinks(a); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(dir, a)) || !exists(filepath.Join(dir, b)) || !exists(bundle) {
		t.Fatalf("after removing %s's link: want only it gone (a %v, b %v, bundle %v)", a, exists(filepath.Join(dir, a)), exists(filepath.Join(dir, b)), exists(bundle))
	}
	if err := r.removeLegacyAttachLinks("file"); err != nil || !exists(filepath.Join(dir, "file")) {
		t.Fatalf("a regular file was removed (err %v)", err)
	}
	_ = os.Remove(filepath.Join(dir, "file"))
	// Idempotent, and the last link takes the directory with it.
	for range 2 {
		if err := r.removeLegacyAttachLinks(b); err != nil {
			t.Fatal(err)
		}
	}
	if exists(dir) {
		t.Fatalf("%s is left after its last link was removed", dir)
	}
}

func TestPruneLegacyAttachLinks(t *testing.T) {
	state := t.TempDir()
	live := t.TempDir()
	gone := filepath.Join(t.TempDir(), "removed-bundle")
	legacyLinks(t, state, live, "live")
	legacyLinks(t, state, gone, "dangling")
	pruneLegacyAttachLinks(state)
	dir := filepath.Join(state, legacyAttachDir)
	if exists(filepath.Join(dir, "dangling")) || !exists(filepath.Join(dir, "live")) {
		t.Fatalf("prune: want the dangling link gone and the live one kept (dangling %v, live %v)", exists(filepath.Join(dir, "dangling")), exists(filepath.Join(dir, "live")))
	}
	if err := os.Remove(filepath.Join(dir, "live")); err != nil {
		t.Fatal(err)
	}
	pruneLegacyAttachLinks(state)
	if exists(dir) {
		t.Fatalf("%s is left with no link in it", dir)
	}
	// Nothing to prune is no error and creates nothing.
	pruneLegacyAttachLinks(state)
	if exists(dir) {
		t.Fatalf("prune created %s", dir)
	}
}

// standInConmon starts a process whose command line names rec's
// container, as conmon's does, records it as its conmon and returns it.
func standInConmon(t *testing.T, rec *record) *exec.Cmd {
	t.Helper()
	// Two commands: a shell would exec a lone one, and its command line
	// with it.
	cmd := exec.Command("sh", "-c", "sleep 1000; exit 0", "conmon", rec.ID)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	if err := os.WriteFile(filepath.Join(rec.Bundle, "conmon.pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	// Start returns once the child's exec has begun, but its command
	// line reads empty until the kernel has laid out the new arguments:
	// wait for it, as conmon's own pid file is written only after its
	// exec has finished.
	for deadline := time.Now().Add(10 * time.Second); !monitorAlive(rec.Bundle, rec.ID); {
		if time.Now().After(deadline) {
			t.Fatal("the stand-in conmon is not taken for one")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd
}

// Stop's wait on conmon: an exit file written while conmon lingers ends
// it, and so does a conmon gone without one, well before the caller's
// deadline; a live conmon with no exit file keeps it waiting.
func TestWaitExitFileOnMonitor(t *testing.T) {
	rec := &record{ID: strings.Repeat("c", 64), Bundle: t.TempDir()}
	exitFile := filepath.Join(t.TempDir(), rec.ID)

	standInConmon(t, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = os.WriteFile(exitFile, []byte("0"), 0o600)
	}()
	if !waitExitFile(ctx, exitFile, 0, rec) {
		t.Fatal("an exit file written while conmon lives did not end the wait")
	}

	if err := os.Remove(exitFile); err != nil {
		t.Fatal(err)
	}
	if waitExitFile(ctx, exitFile, 300*time.Millisecond, rec) {
		t.Fatal("the wait ended with no exit file and conmon alive")
	}

	mon := standInConmon(t, rec)
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = mon.Process.Kill() // a zombie until the cleanup's Wait, as conmon until its reaper's
	}()
	if waitExitFile(ctx, exitFile, 0, rec) {
		t.Fatal("the wait saw an exit file nobody wrote")
	}
	if ctx.Err() != nil {
		t.Fatal("a conmon gone without an exit file kept the wait until its deadline")
	}
}
