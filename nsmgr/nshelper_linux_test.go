package nsmgr

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containerd/errdefs"
)

var (
	buildHelperOnce sync.Once
	helperBin       string
	errHelperBuild  error
)

// buildNSHelper builds cmd/pinrt-nshelper into a private (0700) directory,
// which the pod's mapped root could not search: the Manager must exec it
// through its descriptor.
func buildNSHelper(tb testing.TB) string {
	tb.Helper()
	buildHelperOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nshelper-")
		if err != nil {
			errHelperBuild = err
			return
		}
		helperBin = filepath.Join(dir, "pinrt-nshelper")
		cmd := exec.Command("go", "build", "-o", helperBin, "../cmd/pinrt-nshelper")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			errHelperBuild = &buildError{err: err, out: string(out)}
		}
	})
	if errHelperBuild != nil {
		tb.Skipf("cannot build pinrt-nshelper: %v", errHelperBuild)
	}
	return helperBin
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// TestSeparateHelperBinary: pinrt-nshelper does what the re-executed
// binary does: owned namespaces, mappings, sysctls, hostname and lo.
func TestSeparateHelperBinary(t *testing.T) {
	requireRoot(t)
	requireNsenter(t)
	bin := buildNSHelper(t)
	dir := t.TempDir()
	m, err := NewManager(dir, bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove(t.Context(), "sep") })
	req := fullRequest("sep", 6, map[string]string{"kernel.shmmax": "777777"})
	req.Hostname = "sep-0"
	pins := mustCreate(t, m, req)
	if _, err := m.Open(t.Context(), "sep", req.Kinds); err != nil {
		t.Fatalf("Open() = %v: namespaces not owned by the pod userns", err)
	}
	checks := []struct {
		ns, want string
		cmd      []string
	}{
		{"--uts=" + pins[UTS], "sep-0", []string{"cat", "/proc/sys/kernel/hostname"}},
		{"--ipc=" + pins[IPC], "777777", []string{"cat", "/proc/sys/kernel/shmmax"}},
		{"--user=" + pins[User], fmt.Sprintf("0 %d %d", podMapping(6)[0].HostID, BlockSize), []string{"cat", "/proc/self/uid_map"}},
	}
	for _, c := range checks {
		out, err := nsenter(append([]string{c.ns}, c.cmd...)...)
		if err != nil || strings.Join(strings.Fields(out), " ") != c.want {
			t.Errorf("nsenter %s %v = %q, %v; want %q", c.ns, c.cmd, out, err, c.want)
		}
	}
	if _, err := exec.LookPath("ip"); err == nil {
		if out, err := nsenter("--net="+pins[Net], "ip", "-o", "link", "show", "lo"); err != nil || !strings.Contains(out, "<LOOPBACK,UP,LOWER_UP>") {
			t.Errorf("lo: %v: %s", err, out)
		}
	}
}

func TestNewManagerRefusesHelper(t *testing.T) {
	dir := t.TempDir()
	noExec := filepath.Join(dir, "noexec")
	if err := os.WriteFile(noExec, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{noExec, filepath.Join(dir, "missing"), dir} {
		if _, err := NewManager(dir, p); err == nil {
			t.Errorf("NewManager(%s) = nil error", p)
		}
	}
}

// TestSeparateHelperFailures: with pinrt-nshelper exec'd through its
// descriptor, the helper's refusal reaches Create as the same error, and
// nothing is left: no pin, no mount, no process.
func TestSeparateHelperFailures(t *testing.T) {
	requireRoot(t)
	bin := buildNSHelper(t)
	dir := t.TempDir()
	m, err := NewManager(dir, bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want string
	}{
		{"userns, refused sysctl", fullRequest("bad", 7, map[string]string{"net.ipv4.no_such_knob": "1"}),
			"namespace helper: sysctl net.ipv4.no_such_knob: open /proc/sys/net/ipv4/no_such_knob: no such file or directory: invalid argument"},
		// Without a user namespace a thread of the daemon makes them.
		{"no userns, refused sysctl", CreateRequest{ID: "bad2", Kinds: []Kind{Net, UTS}, Sysctls: map[string]string{"net.ipv4.no_such_knob": "1"}},
			"pod namespaces: sysctl net.ipv4.no_such_knob: open /proc/sys/net/ipv4/no_such_knob: no such file or directory: invalid argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Create(t.Context(), tc.req)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != tc.want {
				t.Fatalf("Create = %v, want %q", err, tc.want)
			}
			assertClean(t, dir)
			out, _ := exec.Command("pgrep", "-f", bin).Output()
			if len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("helper processes left: %s", out)
			}
		})
	}
}
