package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// WriteRootfsDiff writes, as a tar stream to w, what a container changed
// in its rootfs: the writable layer (Dir/upper of its MountRequest) as
// overlayfs keeps it, files, directories, links and device nodes with
// their owners and modes as they are on disk, and the extended
// attributes diffXattr keeps as PAX records. The files the container
// deleted from the image are overlayfs whiteouts there; they are not in
// the stream but returned, as absolute paths inside the container, which
// is how CRI-O and Podman list them in a checkpoint archive
// (deleted.files). A directory that replaced the image's hides all of
// the image's below it without a whiteout each: it is followed by an OCI
// opaque whiteout, which ApplyRootfsDiff, as containers/storage's
// unpacker, applies. A container without a writable layer has an empty
// diff.
//
// The container runs while its layer is read, and the layer is its own:
// every entry is opened from the layer's directory fd with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), as the unpacker writes
// layers, and described from that fd, so no symlink, not even a
// directory swapped for one between the walk and the read, leads out of
// the layer (such an entry is skipped). A file that changes size while
// it is copied is cut or padded to the size its header gave.
func WriteRootfsDiff(dir string, w io.Writer) (deleted []string, err error) {
	upper := filepath.Join(dir, "upper")
	root, err := unix.Open(upper, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, tar.NewWriter(w).Close()
	}
	if err != nil {
		return nil, fmt.Errorf("rootfs diff of %s: %w", dir, err)
	}
	defer unix.Close(root)
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // gone while walked
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
		whiteout, err := writeDiffEntry(tw, root, rel)
		if whiteout {
			deleted = append(deleted, "/"+rel)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("rootfs diff of %s: %w", dir, err)
	}
	sort.Strings(deleted)
	return deleted, tw.Close()
}

// beneath opens rel below the layer's fd root with flags, refusing any
// symlink on the way and "..": ELOOP or EXDEV for a path that would
// leave the layer.
func beneath(root int, rel string, flags int) (int, error) {
	return unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// writeDiffEntry writes the entry rel of the layer whose fd is root, or
// reports it a whiteout. An entry that is gone, or no longer reachable
// without a symlink, since the walk saw it is skipped.
func writeDiffEntry(tw *tar.Writer, root int, rel string) (whiteout bool, err error) {
	fd, err := beneath(root, rel, unix.O_PATH)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return false, nil
		}
		return false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, err
	}
	mode := st.Mode & unix.S_IFMT
	if mode == unix.S_IFCHR && st.Rdev == 0 {
		return true, nil
	}
	hdr, err := diffHeader(fd, rel, &st)
	if err != nil || hdr == nil {
		return false, err
	}
	if mode != unix.S_IFREG && mode != unix.S_IFDIR {
		return false, tw.WriteHeader(hdr)
	}
	// Reopened for reading through the O_PATH fd's /proc link: the same
	// inode, whatever the path names by now.
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	opaque, err := diffXattrs(int(f.Fd()), hdr)
	if err != nil {
		return false, err
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return false, err
	}
	if mode == unix.S_IFDIR {
		if !opaque {
			return false, nil
		}
		// The directory replaced the image's (rm -rf, mkdir): overlayfs
		// hides what the lower layers have under it by this mark, with
		// no whiteouts. A restore unpacks the OCI opaque whiteout as
		// the same mark.
		return false, tw.WriteHeader(&tar.Header{Name: path.Join(rel, whiteoutOpaque), Typeflag: tar.TypeReg, Mode: 0o600, ModTime: hdr.ModTime})
	}
	n, err := io.CopyN(tw, f, hdr.Size)
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	_, err = io.CopyN(tw, zeros{}, hdr.Size-n) // shrank while copied
	return false, err
}

// diffHeader describes the entry rel, whose O_PATH fd is fd and stat st,
// without its xattrs; nil for a socket, which no tar holds.
func diffHeader(fd int, rel string, st *unix.Stat_t) (*tar.Header, error) {
	hdr := &tar.Header{
		Name: rel, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX,
	}
	switch mode := st.Mode & unix.S_IFMT; mode {
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return nil, err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if mode == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFREG:
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	default:
		return nil, nil
	}
	return hdr, nil
}

// diffXattr says whether a restore gives the extended attribute name
// back: the container's own (user.*), and the capabilities and ACLs
// that overlayfs also copies up with an image's file. Not overlayfs'
// bookkeeping (trusted.overlay.*: origin, impure), which names the old
// layers, nor an LSM's label, which the new container gets from its own
// policy.
func diffXattr(name string) bool {
	switch name {
	case "security.capability", "system.posix_acl_access", "system.posix_acl_default":
		return true
	}
	return strings.HasPrefix(name, "user.")
}

// diffXattrs adds to hdr, as PAX records the unpacker applies, the
// extended attributes of fd that diffXattr keeps, and reports whether
// fd is an opaque directory.
func diffXattrs(fd int, hdr *tar.Header) (opaque bool, err error) {
	list, err := xattrValue(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		return false, fmt.Errorf("list xattrs of %s: %w", hdr.Name, err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		if name != overlayOpaqueXattr && !diffXattr(name) {
			continue
		}
		v, err := xattrValue(func(b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
		if errors.Is(err, unix.ENODATA) {
			continue // removed since listed
		}
		if err != nil {
			return false, fmt.Errorf("xattr %s of %s: %w", name, hdr.Name, err)
		}
		if name == overlayOpaqueXattr {
			opaque = string(v) == "y"
			continue
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords[paxXattrPrefix+name] = string(v)
	}
	return opaque, nil
}

// xattrValue calls get, which fills a buffer as getxattr(2) does, with
// a buffer of the size it asks for; again if the value grew meanwhile.
func xattrValue(get func([]byte) (int, error)) ([]byte, error) {
	for {
		n, err := get(nil)
		if err != nil || n == 0 {
			return nil, err
		}
		b := make([]byte, n)
		n, err = get(b)
		if !errors.Is(err, unix.ERANGE) {
			return b[:max(n, 0)], err
		}
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// RootfsChanges is what WriteRootfsDiff wrote of a container: the tar
// of its writable layer and the image's files it deleted.
type RootfsChanges struct {
	Diff    io.Reader
	Deleted []string
}

// ApplyRootfsDiff writes c into upper, the empty writable layer of a
// rootfs not yet mounted: Diff's entries as the unpacker writes a layer
// (nothing written outside upper, whatever the archive names), then a
// whiteout for every deleted path, so the image's file is hidden.
func ApplyRootfsDiff(upper string, c *RootfsChanges) error {
	if c.Diff != nil {
		if err := unpackTar(c.Diff, upper); err != nil {
			return fmt.Errorf("rootfs diff: %w", err)
		}
	}
	if len(c.Deleted) == 0 {
		return nil
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range c.Deleted {
		name, err := cleanName(p)
		if err != nil || name == "." {
			return fmt.Errorf("deleted file %q: not a path in the rootfs: %w", p, errdefs.ErrInvalidArgument)
		}
		dir, base := path.Split(name)
		if err := tw.WriteHeader(&tar.Header{Name: dir + whiteoutPrefix + base, Typeflag: tar.TypeReg, Mode: 0o600}); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := unpackTar(&buf, upper); err != nil {
		return fmt.Errorf("deleted files: %w", err)
	}
	return nil
}

// TopLayerFiles calls fn with each regular file of image ref's top
// layer, by its slash-separated path in the layer, in lexical order: what
// a checkpoint image (an archive's files added to an empty image) holds.
// Nothing else is read: symlinks, devices and the lower layers are
// skipped, and each file is opened beneath the layer without following
// a symlink.
func (s *Store) TopLayerFiles(ref string, fn func(name string, r io.Reader) error) error {
	img, err := s.Get(ref)
	if err != nil {
		return err
	}
	if len(img.ChainIDs) == 0 {
		return fmt.Errorf("image %s has no layers: %w", img.ID, errdefs.ErrNotFound)
	}
	layer := s.path("layers", strings.TrimPrefix(img.ChainIDs[len(img.ChainIDs)-1], "sha256:"))
	root, err := unix.Open(layer, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("top layer of image %s: %w", img.ID, err)
	}
	defer unix.Close(root)
	return filepath.WalkDir(layer, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(layer, p)
		if err != nil {
			return err
		}
		fd, err := unix.Openat2(root, rel, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return fmt.Errorf("%s of image %s: %w", rel, img.ID, err)
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		return fn(filepath.ToSlash(rel), f)
	})
}
