package cgroups

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Processes are the processes in a cgroup itself (cgroup.procs, not the
// cgroups below it, as cAdvisor counts them) and their open files.
type Processes struct {
	Count   uint64
	FDs     uint64
	Sockets uint64
}

func (r *Reader) readProcs(g *openGroup, bp *[]byte) ([]byte, error) {
	i := v1Procs
	if r.mode == Unified {
		i = v2Procs
	}
	b, _, err := r.read(g, i, bp)
	return b, err
}

// processes counts the descriptors of every pid in procs (cgroup.procs,
// one a line) from /proc/<pid>/fd, and which of them are sockets. A
// process that exits meanwhile, or whose directory cannot be read, is
// counted without descriptors, as cAdvisor does.
func (r *Reader) processes(procs []byte) Processes {
	var p Processes
	if len(procs) == 0 {
		return p
	}
	buf := make([]byte, 4096)
	link := make([]byte, 64)
	for len(procs) > 0 {
		var line []byte
		line, procs, _ = bytes.Cut(procs, []byte{'\n'})
		pid, err := strconv.Atoi(string(bytes.TrimSpace(line)))
		if err != nil || pid <= 0 {
			continue
		}
		p.Count++
		fds, sockets := r.countFDs(pid, buf, link)
		p.FDs += fds
		p.Sockets += sockets
	}
	return p
}

// countFDs lists /proc/<pid>/fd with getdents and reads each link with
// readlinkat: two syscalls a descriptor, no per-entry allocations beyond
// the names.
func (r *Reader) countFDs(pid int, buf, link []byte) (fds, sockets uint64) {
	dir, err := ignoringEINTR(func() (int, error) {
		return unix.Open(r.proc+"/"+strconv.Itoa(pid)+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return 0, 0
	}
	defer unix.Close(dir)
	var names []string
	for {
		n, err := ignoringEINTR(func() (int, error) { return unix.ReadDirent(dir, buf) })
		if err != nil || n <= 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			fds++
			// A socket's link is "socket:[inode]".
			if m, err := unix.Readlinkat(dir, name, link); err == nil && bytes.HasPrefix(link[:m], []byte("socket:")) {
				sockets++
			}
		}
	}
	return fds, sockets
}

// OpenFilesLimit is the soft limit on open files of process pid, from
// /proc/<pid>/limits, which anyone may read (prlimit on another user's
// process, such as one in a user namespace, needs CAP_SYS_RESOURCE);
// false when the process is gone or has no limit.
func (r *Reader) OpenFilesLimit(pid int) (uint64, bool) {
	b, err := os.ReadFile(r.proc + "/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return 0, false
	}
	return parseOpenFilesLimit(b)
}

// parseOpenFilesLimit finds "Max open files  <soft>  <hard>  files".
func parseOpenFilesLimit(b []byte) (uint64, bool) {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		rest, ok := bytes.CutPrefix(line, []byte("Max open files"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) < 2 {
			return 0, false
		}
		v, err := strconv.ParseUint(string(f[0]), 10, 64)
		return v, err == nil
	}
	return 0, false
}
