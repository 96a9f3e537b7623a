package oci

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// hostDevices lists the device nodes under devRoot as a privileged
// container gets them (containerd's oci.HostDevices): every character and
// block device, at its path under /dev. The pseudo filesystems mounted
// under /dev in every container, and the directories container managers
// keep there, are skipped, and so are the console (runc makes the
// container's own) and symlinks.
func hostDevices() ([]specs.LinuxDevice, error) {
	var out []specs.LinuxDevice
	err := filepath.WalkDir(devRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil // gone since listed, or not ours to see
			}
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev":
				if p != devRoot {
					return fs.SkipDir
				}
			}
			return nil
		}
		if d.Name() == "console" || d.Type()&(fs.ModeDevice|fs.ModeCharDevice) == 0 {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return nil // gone since listed
		}
		typ := "b"
		if st.Mode&unix.S_IFMT == unix.S_IFCHR {
			typ = "c"
		} else if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return nil
		}
		rel, err := filepath.Rel(devRoot, p)
		if err != nil {
			return err
		}
		fm := fileMode(st.Mode)
		uid, gid := st.Uid, st.Gid
		out = append(out, specs.LinuxDevice{
			Path: path.Join("/dev", filepath.ToSlash(rel)), Type: typ,
			Major: int64(unix.Major(st.Rdev)), Minor: int64(unix.Minor(st.Rdev)),
			FileMode: &fm, UID: &uid, GID: &gid,
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list host devices in %s: %w", devRoot, err)
	}
	return out, nil
}

// withHostDevices adds the host's device nodes to a privileged
// container's spec, after the ones it asked for, which keep their entry.
func withHostDevices(s *specs.Spec) error {
	host, err := hostDevices()
	if err != nil {
		return err
	}
	for _, d := range host {
		if !slices.ContainsFunc(s.Linux.Devices, func(x specs.LinuxDevice) bool { return path.Clean(x.Path) == d.Path }) {
			s.Linux.Devices = append(s.Linux.Devices, d)
		}
	}
	return nil
}
