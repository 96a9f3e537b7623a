package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// WriteRootfsDiff writes, as a tar stream to w, what a container changed
// in its rootfs: the writable layer (Dir/upper of its MountRequest) as
// overlayfs keeps it, files, directories, links and device nodes with
// their owners and modes as they are on disk. The files the container
// deleted from the image are overlayfs whiteouts there; they are not in
// the stream but returned, as absolute paths inside the container, which
// is how CRI-O and Podman list them in a checkpoint archive
// (deleted.files). A container without a writable layer has an empty
// diff.
//
// The container runs while its layer is read, and the layer is its own:
// nothing in it is followed (a file swapped for a symlink between the
// walk and the read is skipped, not read through), and a file that
// changes size while it is copied is cut or padded to the size its
// header gave.
func WriteRootfsDiff(dir string, w io.Writer) (deleted []string, err error) {
	upper := filepath.Join(dir, "upper")
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone while walked, or no writable layer at all
			}
			return err
		}
		if p == upper {
			return nil
		}
		rel, err := filepath.Rel(upper, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			deleted = append(deleted, "/"+rel)
			return nil
		}
		return writeDiffEntry(tw, p, rel, &st)
	})
	if err != nil {
		return nil, fmt.Errorf("rootfs diff of %s: %w", dir, err)
	}
	sort.Strings(deleted)
	return deleted, tw.Close()
}

// writeDiffEntry writes one entry of the writable layer found at p.
func writeDiffEntry(tw *tar.Writer, p, rel string, st *unix.Stat_t) error {
	fi, err := os.Lstat(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(p); err != nil {
			return nil // replaced since the walk saw it
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = rel
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	hdr.Uname, hdr.Gname = "", ""
	hdr.Format = tar.FormatPAX
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(hdr)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, fs.ErrNotExist) {
			return nil // swapped for a symlink, or removed, since the walk
		}
		return err
	}
	defer f.Close()
	if now, err := f.Stat(); err != nil || !now.Mode().IsRegular() {
		return err
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyN(tw, f, hdr.Size)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = io.CopyN(tw, zeros{}, hdr.Size-n) // shrank while copied
	return err
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}
