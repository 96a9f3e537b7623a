package image

import (
	"errors"

	"golang.org/x/sys/unix"
)

// fsTopdirFL is FS_TOPDIR_FL (chattr +T), which x/sys/unix lacks.
const fsTopdirFL = 0x00020000

// markTopDir asks ext2/3/4's Orlov allocator to treat each directory made
// in dir as the top of its own hierarchy: a new layer's directory (and
// so, by the allocator's preference for the parent's group, its files)
// goes to a block group chosen afresh, as a directory made in the
// filesystem's root would, instead of the groups the last layers used.
//
// It matters on ext4 without a journal (this project's test hosts are
// such): there the allocator skips every inode freed in the last minute
// and looks each one up again for every new inode, so a pull of 20 000
// files right after the removal of an image with as many, in the same
// groups, spent 10 s and more of kernel time there (docs/performance.md).
// Other filesystems refuse the flag or ignore it; it is only a hint, so
// an error is returned for logging, never to fail the store.
func markTopDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err == nil && flags&fsTopdirFL == 0 {
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsTopdirFL))
	}
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		return nil // a filesystem without inode flags, or without this one
	}
	return err
}
