package oci

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// This file gives a user-namespaced process stdio it can reopen.
//
// A process's stdout is often reopened by path: nginx's image links its
// logs to /dev/stdout, i.e. /proc/self/fd/1. For a pipe that open checks
// the pipe inode's owner and mode (0600), as for a file. The pipes of a
// container's stdio are made by host root (conmon, or pinrt for exec);
// inside a user namespace that owner is unmapped, so even the container's
// root gets EACCES. runc's init does chown its stdio to the process user
// (fixStdioPermissions), but from inside the user namespace, where it may
// not chown an inode with an unmapped owner, and it ignores the EPERM
// (opencontainers/runc#4475). So pinrt chowns the pipes, from the host, to
// the host IDs the process user maps to: the IDs runc itself gives them
// when there is no user namespace, so a non-root user gets what it gets
// in a pod without one (crun does the same before it joins the user
// namespace, containers/crun#1020; containerd's CRI does it for its
// pipes, containerd/containerd#10598).
//
// That is needed where the process gets pipes made on the host: conmon's
// (Create) and the exec helper's (ExecStream without a TTY, where runc
// runs detached). ExecSync needs nothing: runc exec in the foreground
// relays through pipes of its own that it already gives to the
// container's root (runc's InitializeIO), and a terminal is made inside
// the container by runc.

// hostIDs are host-side user and group IDs.
type hostIDs struct {
	UID, GID int
}

// processSpec is the part of a bundle's config.json that says who the
// process runs as and in which user namespace.
type processSpec struct {
	Process *struct {
		User specs.User `json:"user"`
		Env  []string   `json:"env,omitempty"`
	} `json:"process,omitempty"`
	Linux *struct {
		Namespaces []specs.LinuxNamespace `json:"namespaces,omitempty"`
	} `json:"linux,omitempty"`
}

// spec is ps as a spec, for ownCreatedStdio.
func (ps *processSpec) spec() *specs.Spec {
	sp := &specs.Spec{}
	if ps.Process != nil {
		sp.Process = &specs.Process{User: ps.Process.User}
	}
	if ps.Linux != nil {
		sp.Linux = &specs.Linux{Namespaces: ps.Linux.Namespaces}
	}
	return sp
}

func readProcessSpec(bundle string) (*processSpec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("bundle %s has no config.json: %w", bundle, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var ps processSpec
	if err := json.Unmarshal(b, &ps); err != nil {
		return nil, fmt.Errorf("bundle %s config.json: %w: %w", bundle, err, errdefs.ErrDataLoss)
	}
	return &ps, nil
}

// env is the process's environment in the spec.
func (ps *processSpec) env() []string {
	if ps.Process == nil {
		return nil
	}
	return ps.Process.Env
}

// userNS reports whether the process has a user namespace of its own, and
// the path it joins ("" when the runtime creates it).
func (ps *processSpec) userNS() (path string, ok bool) {
	if ps.Linux == nil {
		return "", false
	}
	for _, ns := range ps.Linux.Namespaces {
		if ns.Type == specs.UserNamespace {
			return ns.Path, true
		}
	}
	return "", false
}

// stdioOwner is who must own the stdio pipes of a process of the
// container whose process (or one in its user namespace) is pid: nil
// without a user namespace, where the runtime chowns them itself.
func (ps *processSpec) stdioOwner(pid int) (*hostIDs, error) {
	nsPath, ok := ps.userNS()
	if !ok {
		return nil, nil
	}
	var u specs.User
	if ps.Process != nil {
		u = ps.Process.User
	}
	return stdioOwner(u, nsPath, pid)
}

// stdioOwner is the host IDs that user u of user namespace nsPath (the
// one pid is in, when nsPath is "") maps to.
func stdioOwner(u specs.User, nsPath string, pid int) (*hostIDs, error) {
	proc := "/proc/" + strconv.Itoa(pid)
	if nsPath != "" {
		// The pid came from a pid file: make sure it is still in the
		// container's user namespace, not a process that reused the PID.
		if same, err := sameFile(nsPath, proc+"/ns/user"); err != nil || !same {
			return nil, fmt.Errorf("pid %d is not in user namespace %s: %w", pid, nsPath, errdefs.ErrNotFound)
		}
	}
	uid, err := mapID(proc+"/uid_map", u.UID)
	if err != nil {
		return nil, err
	}
	gid, err := mapID(proc+"/gid_map", u.GID)
	if err != nil {
		return nil, err
	}
	return &hostIDs{UID: int(uid), GID: int(gid)}, nil
}

func sameFile(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// mapID maps id through an ID map file (/proc/<pid>/uid_map:
// "<inside> <outside> <count>" lines) to the host.
func mapID(mapFile string, id uint32) (uint32, error) {
	b, err := os.ReadFile(mapFile)
	if err != nil {
		return 0, err
	}
	return mapIDIn(b, id, mapFile)
}

func mapIDIn(idMap []byte, id uint32, name string) (uint32, error) {
	sc := bufio.NewScanner(bytes.NewReader(idMap))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			continue
		}
		in, err1 := strconv.ParseUint(f[0], 10, 32)
		out, err2 := strconv.ParseUint(f[1], 10, 32)
		n, err3 := strconv.ParseUint(f[2], 10, 32)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		if uint64(id) >= in && uint64(id) < in+n {
			return uint32(out + uint64(id) - in), nil
		}
	}
	return 0, fmt.Errorf("id %d is not mapped in %s: %w", id, name, errdefs.ErrInvalidArgument)
}

// chownProcStdio gives the pipes among pid's fds 0-2 to o. Other kinds of
// stdio are left alone: /dev/null (conmon's stdin without -i) is shared
// by the host, and a terminal is set up by the runtime.
func chownProcStdio(pid int, o hostIDs) error {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("stdio of pid %d: %w: %w", pid, err, errdefs.ErrNotFound)
	}
	for fd := range 3 {
		p := dir + "/" + strconv.Itoa(fd)
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // closed
			}
			return fmt.Errorf("stat %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFIFO {
			continue
		}
		// chown follows the magic link to the pipe itself.
		if err := unix.Chown(p, o.UID, o.GID); err != nil {
			return fmt.Errorf("chown %s to %d:%d: %w", p, o.UID, o.GID, err)
		}
	}
	return nil
}

// ownedPipe is os.Pipe with the pipe given to o (nil: left to host root).
func ownedPipe(o *hostIDs) (r, w *os.File, err error) {
	r, w, err = os.Pipe()
	if err != nil || o == nil {
		return r, w, err
	}
	// Both ends are the one pipe inode.
	if err := w.Chown(o.UID, o.GID); err != nil {
		r.Close()
		w.Close()
		return nil, nil, fmt.Errorf("chown exec pipe to %d:%d: %w", o.UID, o.GID, err)
	}
	return r, w, nil
}

// execStdioOwner is who must own the stdio pipes of an exec in the
// container of rec. When that cannot be told (the container's process is
// gone), the pipes stay host root's and runc exec reports the real error.
func execStdioOwner(rec *record, ps *processSpec) *hostIDs {
	if _, ok := ps.userNS(); !ok {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(rec.Bundle, "pidfile"))
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return nil
	}
	o, err := ps.stdioOwner(pid)
	if err != nil {
		return nil
	}
	return o
}

// ownCreatedStdio gives the stdio pipes of a just-created container's
// process (pid, still in runc init, waiting for `runc start`) to the host
// IDs its user maps to, if it has a user namespace.
func ownCreatedStdio(spec *specs.Spec, pid int) error {
	if spec.Linux == nil || spec.Process == nil {
		return nil
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type != specs.UserNamespace {
			continue
		}
		o, err := stdioOwner(spec.Process.User, ns.Path, pid)
		if err != nil {
			return err
		}
		return chownProcStdio(pid, *o)
	}
	return nil
}

// execSpec is the process part of the container's spec, which runc exec
// starts its process from; empty when it cannot be read, and then runc
// exec says what is wrong with the container.
func execSpec(rec *record) *processSpec {
	ps, err := readProcessSpec(rec.Bundle)
	if err != nil {
		return &processSpec{}
	}
	return ps
}
