package cni

import "golang.org/x/sys/unix"

// usableNetNS returns path if it is a live network namespace pin, else "".
// After a reboot the pin file is gone (or, if a removal was interrupted,
// left as a plain file); plugins handed such a path fail instead of doing
// the host-side half of DEL, so they get "" as the spec allows.
func usableNetNS(path string) string {
	if path == "" {
		return ""
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		return ""
	}
	return path
}
