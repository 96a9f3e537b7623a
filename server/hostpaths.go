package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pinrt/pinrt/oci"
)

// hostPaths makes the missing host paths of bind mounts, as containerd
// and CRI-O do: kubelet checks nothing for a hostPath volume of no type,
// and workloads rely on the runtime making it. A create that fails
// removes the directories it made, but only those no other create in
// flight or container uses: two pods sharing a new host path are
// created at once, the first makes it, the second finds it, and the
// first's failure must not pull it from under the second.
type hostPaths struct {
	mu sync.Mutex
	// inFlight counts, per host path, the creates that use it and are not
	// finished yet (a finished one is a container, or nothing).
	inFlight map[string]int
	// used reports whether a container uses dir or a path under it.
	used func(dir string) bool
}

func newHostPaths(used func(dir string) bool) *hostPaths {
	return &hostPaths{inFlight: map[string]int{}, used: used}
}

// make creates the missing host paths of mounts (directories, 0755,
// root's) and counts every mount's host path as in use by this create
// until done is called, which the caller does once the container is
// known or the create failed. undo gets the removal of the directories it
// made (when still empty and used by no one else).
//
// The paths are counted before any is looked at, and the lock is not
// held while they are made: a host path on a hung network file system
// blocks its own create, not every other one.
func (h *hostPaths) make(mounts []oci.Mount, undo *cleanups) (done func(), err error) {
	paths := make([]string, len(mounts))
	h.mu.Lock()
	for i, m := range mounts {
		paths[i] = filepath.Clean(m.HostPath)
		h.inFlight[paths[i]]++
	}
	h.mu.Unlock()
	var once sync.Once
	done = func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			for _, p := range paths {
				if h.inFlight[p]--; h.inFlight[p] <= 0 {
					delete(h.inFlight, p)
				}
			}
		})
	}
	for _, p := range paths {
		made, err := mkdirAllRecorded(p)
		for _, d := range made {
			undo.add("remove created host path "+d, func(context.Context) error {
				done()
				return h.remove(d)
			})
		}
		if err != nil {
			return done, fmt.Errorf("creating mount host path %s: %w", p, err)
		}
	}
	return done, nil
}

// remove removes dir, which a failed create made, unless a create in
// flight or a container uses it or a path under it.
func (h *hostPaths) remove(dir string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.inFlight {
		if under(p, dir) {
			return nil
		}
	}
	if h.used(dir) {
		return nil
	}
	err := os.Remove(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// under reports whether p is dir or a path under it (both clean).
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/") || dir == "/"
}

// mkdirAllRecorded is os.MkdirAll that returns the directories it made,
// parents first. One made meanwhile by someone else is not counted.
func mkdirAllRecorded(p string) ([]string, error) {
	var missing []string
	for d := filepath.Clean(p); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, d)
	}
	var made []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], 0o755)
		if err == nil {
			made = append(made, missing[i])
			continue
		}
		if st, serr := os.Stat(missing[i]); serr != nil || !st.IsDir() {
			return made, err
		}
	}
	return made, nil
}

// mountsUnder reports whether a container has a bind mount of dir or of a
// path under it.
func (s *Server) mountsUnder(dir string) bool {
	for _, c := range s.containers.List() {
		for _, m := range c.Mounts {
			if under(filepath.Clean(m.HostPath), dir) {
				return true
			}
		}
	}
	return false
}
