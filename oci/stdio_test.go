package oci

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestMapIDIn(t *testing.T) {
	const twoRanges = "         0     100000       1000\n      1000     300000      64536\n"
	for _, tc := range []struct {
		name    string
		idMap   string
		id      uint32
		want    uint32
		wantErr bool
	}{
		{name: "root of a pod range", idMap: "0 100000 65536\n", id: 0, want: 100000},
		{name: "user in a pod range", idMap: "0 100000 65536\n", id: 1000, want: 101000},
		{name: "last id of the range", idMap: "0 100000 65536\n", id: 65535, want: 165535},
		{name: "past the range", idMap: "0 100000 65536\n", id: 65536, wantErr: true},
		{name: "second range, as the kernel pads it", idMap: twoRanges, id: 1500, want: 300500},
		{name: "first range, as the kernel pads it", idMap: twoRanges, id: 999, want: 100999},
		{name: "identity map", idMap: "0 0 4294967295\n", id: 1000, want: 1000},
		{name: "empty map (nothing written yet)", idMap: "", id: 0, wantErr: true},
		{name: "garbage lines are skipped", idMap: "x y z\n0 100000\n0 200000 10\n", id: 5, want: 200005},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mapIDIn([]byte(tc.idMap), tc.id, "uid_map")
			if tc.wantErr {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("mapIDIn(%d) = %d, %v; want ErrInvalidArgument", tc.id, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("mapIDIn(%d) = %d, %v; want %d", tc.id, got, err, tc.want)
			}
		})
	}
}

func TestProcessSpec(t *testing.T) {
	for _, tc := range []struct {
		name     string
		json     string
		wantNS   bool
		wantPath string
		wantEnv  []string
	}{
		{name: "userns by path", json: `{"process":{"user":{"uid":0,"gid":0},"env":["A=1","TERM=vt100"]},"linux":{"namespaces":[{"type":"network","path":"/run/x/net"},{"type":"user","path":"/run/x/user"}]}}`, wantNS: true, wantPath: "/run/x/user", wantEnv: []string{"A=1", "TERM=vt100"}},
		{name: "userns made by the runtime", json: `{"process":{"user":{"uid":0,"gid":0}},"linux":{"namespaces":[{"type":"user"}]}}`, wantNS: true},
		{name: "no userns", json: `{"process":{"user":{"uid":0,"gid":0}},"linux":{"namespaces":[{"type":"mount"}]}}`},
		{name: "no linux section", json: `{"process":{"user":{"uid":0,"gid":0}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tc.json), 0o600); err != nil {
				t.Fatal(err)
			}
			ps, err := readProcessSpec(dir)
			if err != nil {
				t.Fatal(err)
			}
			path, ok := ps.userNS()
			if ok != tc.wantNS || path != tc.wantPath {
				t.Errorf("userNS() = %q, %v; want %q, %v", path, ok, tc.wantPath, tc.wantNS)
			}
			if len(ps.env()) != len(tc.wantEnv) || (len(tc.wantEnv) > 0 && envIndex(ps.env(), "TERM") != 1) {
				t.Errorf("env() = %v, want %v", ps.env(), tc.wantEnv)
			}
			// Without a user namespace nobody needs the pipes.
			if !tc.wantNS {
				if o, err := ps.stdioOwner(os.Getpid()); o != nil || err != nil {
					t.Errorf("stdioOwner without a userns = %+v, %v; want nil, nil", o, err)
				}
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		if _, err := readProcessSpec(t.TempDir()); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("readProcessSpec of an empty bundle: %v, want ErrNotFound", err)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		dir := t.TempDir()
		_ = os.WriteFile(filepath.Join(dir, "config.json"), []byte("{"), 0o600)
		if _, err := readProcessSpec(dir); !errors.Is(err, errdefs.ErrDataLoss) {
			t.Errorf("readProcessSpec of a corrupt config.json: %v, want ErrDataLoss", err)
		}
	})
}

// TestStdioOwnerWrongNamespace: a pid that is not in the container's user
// namespace (a reused PID) gives no owner.
func TestStdioOwnerWrongNamespace(t *testing.T) {
	other := t.TempDir() // any file that is not our user namespace
	_, err := stdioOwner(specs.User{}, other, os.Getpid())
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stdioOwner with a foreign pid: %v, want ErrNotFound", err)
	}
	// Our own user namespace maps through our own uid_map.
	o, err := stdioOwner(specs.User{UID: 0, GID: 0}, "/proc/self/ns/user", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if o == nil {
		t.Fatal("no owner for a process in the user namespace")
	}
}

func pipeOwner(t *testing.T, f *os.File) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func TestOwnedPipe(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chowns a pipe to another user")
	}
	r, w, err := ownedPipe(&hostIDs{UID: 123456, GID: 234567})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if uid, gid := pipeOwner(t, r); uid != 123456 || gid != 234567 {
		t.Errorf("pipe owned by %d:%d, want 123456:234567", uid, gid)
	}
	r2, w2, err := ownedPipe(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	defer w2.Close()
	if uid, gid := pipeOwner(t, r2); uid != 0 || gid != 0 {
		t.Errorf("pipe without an owner is %d:%d, want root's", uid, gid)
	}
}

// TestChownProcStdio chowns another process's stdio pipes through /proc
// and leaves its /dev/null alone.
func TestChownProcStdio(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chowns another process's pipes")
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	var before unix.Stat_t
	if err := unix.Stat(os.DevNull, &before); err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sleep", "30")
	c.Stdin, c.Stdout = devNull, outW // stderr: exec.Cmd's /dev/null too
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	outW.Close()
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()

	if err := chownProcStdio(c.Process.Pid, hostIDs{UID: 123456, GID: 234567}); err != nil {
		t.Fatal(err)
	}
	if uid, gid := pipeOwner(t, outR); uid != 123456 || gid != 234567 {
		t.Errorf("stdout pipe owned by %d:%d, want 123456:234567", uid, gid)
	}
	var after unix.Stat_t
	if err := unix.Stat(os.DevNull, &after); err != nil {
		t.Fatal(err)
	}
	if after.Uid != before.Uid || after.Gid != before.Gid {
		t.Fatalf("/dev/null's owner changed from %d:%d to %d:%d", before.Uid, before.Gid, after.Uid, after.Gid)
	}
	if err := chownProcStdio(1<<30, hostIDs{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("chownProcStdio of a pid that does not exist: %v, want ErrNotFound", err)
	}
}
