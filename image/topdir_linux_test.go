package image

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestStagingDirIsTopDir: on ext4 the store marks tmp/, where layers are
// unpacked, with FS_TOPDIR_FL; elsewhere the store starts all the same.
func TestStagingDirIsTopDir(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.EXT4_SUPER_MAGIC {
		t.Skipf("%s is not ext4 (magic %#x): the flag is only a hint there", root, st.Type)
	}
	fd, err := unix.Open(s.path("tmp"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	if flags&fsTopdirFL == 0 {
		t.Errorf("tmp/ flags %#x lack FS_TOPDIR_FL", flags)
	}
	// A second start (tmp/ is removed and made again) marks it again, and
	// a directory already marked is left as it is.
	if _, err := NewStore(Options{Root: root}); err != nil {
		t.Fatal(err)
	}
	if err := markTopDir(s.path("tmp")); err != nil {
		t.Errorf("marking again: %v", err)
	}
}
