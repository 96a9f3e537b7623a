package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	// overlayOpaqueXattr marks a directory whose lower contents are hidden.
	// As root the trusted.* namespace is what overlayfs reads (userxattr
	// mounts would want user.overlay.* instead).
	overlayOpaqueXattr = "trusted.overlay.opaque"
	paxXattrPrefix     = "SCHILY.xattr."
)

// UnpackLayer unpacks the compressed layer stream r into the existing,
// empty directory dir. It checks that r hashes to compressedDigest and
// its uncompressed form to diffID (both "sha256:<hex>"; empty skips the
// check) and returns errdefs.ErrDataLoss when either differs.
//
// Entries that would escape dir (".." components, a parent that is a
// symlink, hard links out of dir) are refused with
// errdefs.ErrInvalidArgument. OCI whiteouts become overlayfs whiteouts.
// Owners, modes and device nodes need root.
func UnpackLayer(r io.Reader, dir, compressedDigest, diffID string) (size int64, retErr error) {
	return unpackLayer(r, dir, compressedDigest, diffID, true)
}

// unpackLayer is UnpackLayer, with the compressed digest checked only if
// checkCompressed (it still names the layer in errors).
func unpackLayer(r io.Reader, dir, compressedDigest, diffID string, checkCompressed bool) (size int64, retErr error) {
	ch := sha256.New()
	if checkCompressed {
		r = io.TeeReader(r, ch)
	}
	counted := &countingReader{r: r}
	br := bufio.NewReaderSize(counted, 64<<10)
	plain, closeFn, err := decompress(br)
	if err != nil {
		return 0, fmt.Errorf("layer %s: %w", compressedDigest, err)
	}
	defer closeFn()
	uh := sha256.New()
	hashed := io.TeeReader(&decoderReader{r: plain, src: counted}, uh)
	if err := unpackTar(hashed, dir); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) {
			return 0, fmt.Errorf("layer %s: %w: %w", compressedDigest, err, errdefs.ErrDataLoss)
		}
		return 0, fmt.Errorf("layer %s: %w", compressedDigest, err)
	}
	// Tar readers stop at the end-of-archive marker, but writers pad
	// after it (GNU tar to 10240-byte records) and the diffID covers that
	// padding: drain it through the hash, not around it.
	if _, err := io.Copy(io.Discard, hashed); err != nil {
		return 0, fmt.Errorf("layer %s: %w: %w", compressedDigest, err, errdefs.ErrDataLoss)
	}
	// Likewise the compressed digest covers every byte of the blob, even
	// bytes after the end of the compressed stream.
	if _, err := io.Copy(io.Discard, br); err != nil {
		return 0, fmt.Errorf("layer %s: %w: %w", compressedDigest, err, errdefs.ErrDataLoss)
	}
	if checkCompressed {
		if err := checkDigest("compressed digest", ch, compressedDigest); err != nil {
			return 0, err
		}
	}
	if err := checkDigest("diffID", uh, diffID); err != nil {
		return 0, err
	}
	return counted.n, nil
}

// decompress recognises the layer's compression by its magic bytes, not
// its media type: registries mislabel layers, and the digests decide
// whether the content is right anyway. gzip, zstd and plain tar are
// accepted.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %w", err, errdefs.ErrDataLoss)
		}
		return zr, func() { _ = zr.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, nil, zstdErr(err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

// maxZstdWindow is the largest window a zstd layer may declare, what the
// zstd CLI decompresses without --memory. The decoder allocates the
// declared window (a single segment's content size) up front, so the
// library's default of 512 MiB let a layer of a few KB take that much
// memory, once per layer unpacked in parallel.
const maxZstdWindow = 128 << 20

// zstdErr classifies an error of the zstd decoder: a frame refused for
// its window (or, single segment, its size) is a layer this store does
// not unpack, anything else is damage. The decoder also says "window
// size exceeded" of a block that overruns its frame's own window, rare
// enough to share the message.
func zstdErr(err error) error {
	if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return fmt.Errorf("zstd: %w (a layer's frames may use a window of at most %d MiB, what zstd -d allows without --memory): %w",
			err, maxZstdWindow>>20, errdefs.ErrNotImplemented)
	}
	return fmt.Errorf("zstd: %w: %w", err, errdefs.ErrDataLoss)
}

func checkDigest(what string, h hash.Hash, want string) error {
	if want == "" {
		return nil
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if got != want {
		return fmt.Errorf("layer %s mismatch: got %s, want %s: %w", what, got, want, errdefs.ErrDataLoss)
	}
	return nil
}

type countingReader struct {
	r   io.Reader
	n   int64
	err error // the first read error other than io.EOF
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && c.err == nil {
		c.err = err
	}
	return n, err
}

// decoderReader makes the decompressor's own errors data loss. A damaged
// stream fails in the decoder with whatever error it has for the damage
// (flate.CorruptInputError, gzip's checksum, the dozens of zstd errors,
// most unexported) long before a digest could be checked; an error
// reading the source passes through as it is, since a cut connection is
// the network's fault, not the data's.
type decoderReader struct {
	r   io.Reader
	src *countingReader
}

func (d *decoderReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && (d.src.err == nil || !errors.Is(err, d.src.err)) {
		if _, ok := d.r.(*zstd.Decoder); ok {
			return n, zstdErr(err)
		}
		err = fmt.Errorf("%w: %w", err, errdefs.ErrDataLoss)
	}
	return n, err
}

// unpacker writes one tar stream below root. Every path is resolved with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) from the root fd, so
// neither ".." nor a symlink planted by an earlier entry can redirect a
// write outside the layer, whatever races happen in the directory.
type unpacker struct {
	rootFd int
	// dirTimes are applied at the end, children would bump them.
	dirTimes []dirTime
}

type dirTime struct {
	name  string
	mtime time.Time
}

func unpackTar(r io.Reader, dir string) error {
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open layer dir: %w", err)
	}
	u := &unpacker{rootFd: fd}
	defer unix.Close(fd)

	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		d := u.dirTimes[i]
		if err := u.setTimes(d.name, d.mtime); err != nil {
			return fmt.Errorf("entry %q: %w", d.name, err)
		}
	}
	return nil
}

// cleanName turns a tar entry name into a path relative to the layer
// root. A ".." component is refused outright rather than cleaned away:
// no legitimate layer needs one and cleaning could hide an attack.
func cleanName(name string) (string, error) {
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q has a \"..\" component: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	p := strings.TrimPrefix(path.Clean("/"+name), "/")
	if p == "" {
		p = "."
	}
	return p, nil
}

// openDir opens the directory rel beneath the root, creating missing
// components with mode 0755 (tar streams may omit parent entries).
func (u *unpacker) openDir(rel string) (int, error) {
	if rel == "." || rel == "" {
		return unix.Dup(u.rootFd)
	}
	fd, err := u.openBeneath(rel, unix.O_DIRECTORY|unix.O_RDONLY)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	cur, err := unix.Dup(u.rootFd)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(cur, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, err
		}
		next, err := unix.Openat2(cur, c, &unix.OpenHow{
			Flags:   unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		unix.Close(cur)
		if err != nil {
			return -1, escapeErr(rel, err)
		}
		cur = next
	}
	return cur, nil
}

func (u *unpacker) openBeneath(rel string, flags int) (int, error) {
	fd, err := unix.Openat2(u.rootFd, rel, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, escapeErr(rel, err)
	}
	return fd, nil
}

// escapeErr classifies the openat2 errors that mean "this path goes
// through a symlink or out of the root" as invalid input.
func escapeErr(rel string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("path %q resolves through a symlink or out of the layer: %w", rel, errors.Join(err, errdefs.ErrInvalidArgument))
	}
	return err
}

// removeExisting makes room for a new entry: a later entry for the same
// name replaces the earlier one, except that directories merge.
func removeExisting(dirFd int, base string, keepDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirFd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return nil
		}
		return unix.Unlinkat(dirFd, base, unix.AT_REMOVEDIR)
	}
	return unix.Unlinkat(dirFd, base, 0)
}

// entry unpacks one tar entry: a whiteout, or a file of hdr's type,
// made beneath the layer's root without following any symlink.
func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	parent, base := path.Split(name)
	parent = strings.TrimSuffix(parent, "/")
	if name == "." {
		parent, base = ".", "."
	}
	pfd, err := u.openDir(parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	if base == whiteoutOpaque {
		return unix.Fsetxattr(pfd, overlayOpaqueXattr, []byte("y"), 0)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return whiteout(pfd, strings.TrimPrefix(base, whiteoutPrefix))
	}

	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(pfd, name, base, hdr, mode)
	case tar.TypeReg:
		return regular(pfd, base, hdr, mode, r)
	case tar.TypeSymlink:
		return symlink(pfd, base, hdr)
	case tar.TypeLink:
		return u.hardlink(pfd, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return device(pfd, base, hdr, mode)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return fmt.Errorf("tar type %q: %w", hdr.Typeflag, errdefs.ErrNotImplemented)
	}
}

// whiteout hides target of the layers below: overlayfs reads a 0/0
// character device as a whiteout.
func whiteout(pfd int, target string) error {
	if err := removeExisting(pfd, target, false); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, target, unix.S_IFCHR, 0); err != nil {
		return err
	}
	return unix.Fchownat(pfd, target, 0, 0, unix.AT_SYMLINK_NOFOLLOW)
}

// dir makes (or merges into) the directory name, base in pfd, and
// records its mtime to set once its contents are unpacked.
func (u *unpacker) dir(pfd int, name, base string, hdr *tar.Header, mode uint32) error {
	if base != "." {
		if err := removeExisting(pfd, base, true); err != nil {
			return err
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
	fd, err := u.openBeneath(name, unix.O_DIRECTORY|unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := setFdMeta(fd, hdr, mode); err != nil {
		return err
	}
	u.dirTimes = append(u.dirTimes, dirTime{name: name, mtime: hdr.ModTime})
	return nil
}

// regular writes the regular file base in pfd from r.
func regular(pfd int, base string, hdr *tar.Header, mode uint32, r io.Reader) error {
	if err := removeExisting(pfd, base, false); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	_, cerr := io.Copy(f, r)
	if cerr == nil {
		cerr = setFdMeta(fd, hdr, mode)
	}
	if err := f.Close(); cerr == nil {
		cerr = err
	}
	if cerr != nil {
		return cerr
	}
	return setTimesAt(pfd, base, hdr.ModTime)
}

// symlink makes the symlink base in pfd. The target is stored verbatim:
// it is only ever resolved inside the container's root, and unpacking
// never follows it.
func symlink(pfd int, base string, hdr *tar.Header) error {
	if err := removeExisting(pfd, base, false); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		return err
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := setXattrsAt(pfd, base, hdr); err != nil {
		return err
	}
	return setTimesAt(pfd, base, hdr.ModTime)
}

// hardlink links base in pfd to hdr.Linkname, an earlier entry of the
// layer.
func (u *unpacker) hardlink(pfd int, base string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	tparent, tbase := path.Split(target)
	tfd, err := u.openBeneath(orDot(strings.TrimSuffix(tparent, "/")), unix.O_DIRECTORY|unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err := removeExisting(pfd, base, false); err != nil {
		return err
	}
	// No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink.
	return unix.Linkat(tfd, tbase, pfd, base, 0)
}

// device makes the character device, block device or FIFO base in pfd.
func device(pfd int, base string, hdr *tar.Header, mode uint32) error {
	typ := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
	if err := removeExisting(pfd, base, false); err != nil {
		return err
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := unix.Mknodat(pfd, base, typ|mode, int(dev)); err != nil {
		return err
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	// chown clears setuid/setgid, and mknod applied the umask.
	if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
		return err
	}
	if err := setXattrsAt(pfd, base, hdr); err != nil {
		return err
	}
	return setTimesAt(pfd, base, hdr.ModTime)
}

func orDot(s string) string {
	if s == "" {
		return "."
	}
	return s
}

// setFdMeta sets owner, then mode (chown clears setuid), then xattrs.
func setFdMeta(fd int, hdr *tar.Header, mode uint32) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattrPrefix); ok {
			if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
				return fmt.Errorf("xattr %s: %w", name, err)
			}
		}
	}
	return nil
}

// setXattrsAt sets xattrs on a non-regular entry. There's no
// lsetxattrat, so go through the parent's /proc fd, which the kernel
// resolves to the very directory we hold open.
func setXattrsAt(dirFd int, base string, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattrPrefix); ok {
			p := "/proc/self/fd/" + strconv.Itoa(dirFd) + "/" + base
			if err := unix.Lsetxattr(p, name, []byte(v), 0); err != nil {
				return fmt.Errorf("xattr %s: %w", name, err)
			}
		}
	}
	return nil
}

func setTimesAt(dirFd int, base string, mtime time.Time) error {
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return unix.UtimesNanoAt(dirFd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

func (u *unpacker) setTimes(name string, mtime time.Time) error {
	if name == "." {
		return setTimesAt(u.rootFd, ".", mtime)
	}
	parent, base := path.Split(name)
	pfd, err := u.openBeneath(orDot(strings.TrimSuffix(parent, "/")), unix.O_DIRECTORY|unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return setTimesAt(pfd, base, mtime)
}
