package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/internal/osthread"
	"github.com/pinrt/pinrt/internal/validate"
)

// MountRequest describes one container's rootfs.
type MountRequest struct {
	ContainerID string
	PodID       string
	ImageID     string
	// Dir is the per-container directory: the rootfs is Dir/rootfs, the
	// overlay's upper and work dirs are Dir/upper and Dir/work.
	Dir string
	// UsernsPath is the pod's pinned user namespace; "" means none.
	UsernsPath string
	// RootUID and RootGID are the host IDs of the container's root, the
	// owner of the upper and work dirs when UsernsPath is set.
	RootUID, RootGID uint32
	// Changes, when set, fills a new writable layer before the overlay
	// is mounted: what a checkpointed container had changed in its
	// rootfs (see ApplyRootfsDiff).
	Changes *RootfsChanges
}

type mountedRootfs struct {
	podID    string
	chainIDs []string
}

// checkMountTarget checks what MountRootfs and MountImageVolume build
// paths from: the container ID, the pod ID when there is one or a user
// namespace needs it, and the container's directory.
func checkMountTarget(containerID, podID, usernsPath, dir string) error {
	if err := validate.ID("container", containerID); err != nil {
		return err
	}
	if usernsPath != "" || podID != "" {
		if err := validate.ID("pod", podID); err != nil {
			return err
		}
	}
	if dir == "" || !filepath.IsAbs(dir) {
		return fmt.Errorf("container dir %q must be absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	return nil
}

// MountRootfs mounts the container's overlay rootfs and returns its path.
//
// For a userns pod the whole layers directory is idmapped once per pod
// onto <root>/idmapped/<pod-id> and the lower dirs come from there, so
// the container sees image owners shifted into its user namespace while
// the layers on disk keep the image's own IDs.
//
// Mounting an already mounted rootfs is a no-op that returns the same
// path. After a daemon restart the caller rebuilds the in-memory
// bookkeeping by calling MountRootfs again for each existing container;
// whether a pod's idmapped tree is still needed is decided from
// /proc/self/mountinfo, so it is never dropped under a live container.
func (s *Store) MountRootfs(ctx context.Context, req MountRequest) (_ string, retErr error) {
	if err := checkMountTarget(req.ContainerID, req.PodID, req.UsernsPath, req.Dir); err != nil {
		return "", err
	}
	if done := s.rememberMounted(req.ContainerID, req.PodID, filepath.Join(req.Dir, "rootfs")); done {
		return filepath.Join(req.Dir, "rootfs"), nil
	}
	// The image is resolved under mountMu, under which gc reads what is
	// mounted after Remove dropped the record: gc sees this mount, or Get
	// finds no image. Resolved before it, a Remove in between could trash
	// the layers of a rootfs that then mounted empty.
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	img, err := s.Get(req.ImageID)
	if err != nil {
		return "", err
	}
	if s.resolved != nil {
		s.resolved()
	}
	if len(img.ChainIDs) == 0 {
		return "", fmt.Errorf("image %s has no layers: %w", img.ID, errdefs.ErrFailedPrecondition)
	}
	rootfs := filepath.Join(req.Dir, "rootfs")
	upper := filepath.Join(req.Dir, "upper")
	work := filepath.Join(req.Dir, "work")
	if ok, _ := mountinfo.Mounted(rootfs); ok {
		s.mounted[req.ContainerID] = mountedRootfs{podID: req.PodID, chainIDs: img.ChainIDs}
		return rootfs, nil
	}
	for _, d := range []string{rootfs, upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("create rootfs dirs: %w", err)
		}
	}
	if req.Changes != nil {
		if err := ApplyRootfsDiff(upper, req.Changes); err != nil {
			return "", fmt.Errorf("rootfs changes of container %s: %w", req.ContainerID, err)
		}
	}
	lowerBase := s.path("layers")
	if req.UsernsPath != "" {
		// The container's root must own its writable layer, as the mapped
		// root owns "/" of the image through the idmapped lower dirs.
		for _, d := range []string{upper, work} {
			if err := os.Lchown(d, int(req.RootUID), int(req.RootGID)); err != nil {
				return "", fmt.Errorf("chown %s: %w", d, err)
			}
		}
		lowerBase, err = s.idmapLayers(ctx, req.PodID, req.UsernsPath)
		if err != nil {
			return "", err
		}
		defer func() {
			if retErr != nil {
				if err := s.maybeReleasePodLocked(ctx, req.PodID); err != nil {
					log.G(ctx).WithError(err).WithField("pod", req.PodID).Warn("release idmapped layers after failed mount")
				}
			}
		}()
	}
	lowers := make([]string, 0, len(img.ChainIDs))
	for i := len(img.ChainIDs) - 1; i >= 0; i-- {
		lowers = append(lowers, filepath.Join(lowerBase, strings.TrimPrefix(img.ChainIDs[i], "sha256:")))
	}
	if err := mountOverlay(lowers, upper, work, rootfs); err != nil {
		if !clearVolatile(work) {
			return "", fmt.Errorf("mount rootfs of container %s: %w", req.ContainerID, err)
		}
		if err := mountOverlay(lowers, upper, work, rootfs); err != nil {
			return "", fmt.Errorf("mount rootfs of container %s again: %w", req.ContainerID, err)
		}
		log.G(ctx).WithField("container", req.ContainerID).Info("mounted the rootfs again: it had been unmounted while its pod was ready")
	}
	s.mounted[req.ContainerID] = mountedRootfs{podID: req.PodID, chainIDs: img.ChainIDs}
	log.G(ctx).WithField("container", req.ContainerID).WithField("pod", req.PodID).Debug("mounted rootfs")
	return rootfs, nil
}

// clearVolatile removes the marker the kernel left in work when it
// mounted a volatile writable layer, which makes it refuse a second mount
// (EINVAL). It reports whether there was one. A rootfs is only mounted a
// second time while its pod is Ready, and a host crash, the one event
// after which a volatile layer may be torn, ends every pod (its pins go
// with /run): a layer unmounted without one is whole.
func clearVolatile(work string) bool {
	marker := filepath.Join(work, "work", "incompat", "volatile")
	if _, err := os.Lstat(marker); err != nil {
		return false
	}
	return os.RemoveAll(marker) == nil
}

// mountOverlay uses the new mount API: every "lowerdir+" is its own
// fsconfig call (kernel >= 6.8), so the one-page limit of a mount(2)
// option string doesn't cap the number of layers. Older kernels fall back
// to mount(2) (mountOverlayLegacy).
//
// The rootfs is mounted nodev, as CRI-O's default mount options have it:
// a device node that a container created or an image carried cannot be
// opened through the host path, and the container loses nothing, since
// its /dev is a tmpfs of the runtime's. It cannot also be nosuid at the
// host path: runc bind-mounts the rootfs onto itself before pivot_root,
// a bind keeps the flags of its source, and setuid binaries (ping, su)
// inside containers would stop working. What keeps other host users
// from running a container's setuid binaries is the 0700 (0710 for a
// userns pod) container directory above the mount point.
//
// The writable layer is volatile (overlayfs skips every sync of it),
// so that unmounting it does not commit the upper file system's
// journal: 3-4 ms of every RemoveContainer on ext4, where the whole
// call is 4 ms in containerd. A container's writable layer never
// outlives a host crash in Kubernetes: after a reboot kubelet makes new
// containers with new layers, and what must survive one goes in
// volumes, which stay synced. The kernel refuses to mount a volatile
// layer a second time (incompat/volatile in its work dir); pinrt mounts
// a rootfs again only while its pod is Ready, which a reboot ends, and
// then clears the marker (clearVolatile).
func mountOverlay(lowers []string, upper, work, target string) error {
	if lowerdirPlus {
		err := fsmountOverlay(lowers, upper, work, target)
		if err == nil || !errors.Is(err, unix.EINVAL) {
			return err
		}
	}
	rest := ",upperdir=" + upper + ",workdir=" + work
	err := mountOverlayLegacy(lowers, rest+",volatile", target, unix.MS_NODEV)
	if errors.Is(err, unix.EINVAL) { // a kernel before 5.10
		err = mountOverlayLegacy(lowers, rest, target, unix.MS_NODEV)
	}
	return err
}

// lowerdirPlus is false where tests play a kernel without "lowerdir+".
var lowerdirPlus = true

// lowerAliases is the directory, beside an overlay's mount point, of the
// short names mountOverlayLegacy gives its lower dirs.
const lowerAliases = "lowers"

// mountOverlayLegacy mounts an overlay with mount(2), whose option
// string must fit in a page: under the default root, 40 layer paths, and
// 23 through a pod's idmapped tree, where images may have 127. When the
// paths do not fit, each lower dir is named by a symlink "0", "1", ...
// in lowerAliases beside target, and the overlay is mounted from a
// thread whose working directory is there, as containerd and
// containers/storage shorten theirs. The kernel's mount table then shows
// the short names; lowerDirs reads them back through the links, which go
// with the container's directory.
func mountOverlayLegacy(lowers []string, rest, target string, flags uintptr) error {
	opts := "lowerdir=" + strings.Join(lowers, ":") + rest
	if len(opts) < os.Getpagesize() {
		if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
			return fmt.Errorf("mount overlay: %w", err)
		}
		return nil
	}
	aliases := filepath.Join(filepath.Dir(target), lowerAliases)
	if err := os.RemoveAll(aliases); err != nil {
		return fmt.Errorf("overlay lower dir names: %w", err)
	}
	if err := os.Mkdir(aliases, 0o700); err != nil {
		return fmt.Errorf("overlay lower dir names: %w", err)
	}
	short := make([]string, len(lowers))
	for i, l := range lowers {
		short[i] = strconv.Itoa(i)
		if err := os.Symlink(l, filepath.Join(aliases, short[i])); err != nil {
			return fmt.Errorf("overlay lower dir names: %w", err)
		}
	}
	opts = "lowerdir=" + strings.Join(short, ":") + rest
	if len(opts) >= os.Getpagesize() {
		return fmt.Errorf("overlay of %d layers: options of %d bytes, over one page, and this kernel lacks lowerdir+: %w", len(lowers), len(opts), errdefs.ErrNotImplemented)
	}
	err := inDir(aliases, func() error { return unix.Mount("overlay", target, "overlay", flags, opts) })
	if err != nil {
		return fmt.Errorf("mount overlay of %d layers: %w", len(lowers), err)
	}
	return nil
}

// inDir runs f on an OS thread of its own whose working directory is
// dir. The thread first unshares its file system attributes (CLONE_FS),
// so no other thread's relative paths move, and it ends with f: its
// goroutine exits locked to it.
func inDir(dir string, f func() error) error {
	errc := make(chan error, 1)
	osthread.Go(func() {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare the file system attributes: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			errc <- fmt.Errorf("chdir %s: %w", dir, err)
			return
		}
		errc <- f()
	})
	return <-errc
}

func fsmountOverlay(lowers []string, upper, work, target string) error {
	return fsmountOverlayAttr(lowers, upper, work, target, unix.MOUNT_ATTR_NODEV)
}

// fsmountOverlayAttr mounts an overlay of lowers (and a volatile
// upper/work unless upper is "") at target with the mount attributes attr.
func fsmountOverlayAttr(lowers []string, upper, work, target string, attr int) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", "overlay"); err != nil {
		return fmt.Errorf("fsconfig source: %w", err)
	}
	for _, l := range lowers {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
			return fmt.Errorf("fsconfig lowerdir+ %s: %w", l, err)
		}
	}
	if upper != "" {
		if err := unix.FsconfigSetString(fsfd, "upperdir", upper); err != nil {
			return fmt.Errorf("fsconfig upperdir: %w", err)
		}
		if err := unix.FsconfigSetString(fsfd, "workdir", work); err != nil {
			return fmt.Errorf("fsconfig workdir: %w", err)
		}
		if err := unix.FsconfigSetFlag(fsfd, "volatile"); err != nil {
			return fmt.Errorf("fsconfig volatile: %w", err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attr)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move overlay to %s: %w", target, err)
	}
	return nil
}

// idmapLayers mounts the layers directory idmapped with the pod's user
// namespace at <root>/idmapped/<pod-id>, once per pod, and returns it.
func (s *Store) idmapLayers(ctx context.Context, podID, usernsPath string) (_ string, retErr error) {
	target := s.path("idmapped", podID)
	if ok, _ := mountinfo.Mounted(target); ok {
		return target, nil
	}
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("create idmapped dir: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.Remove(target)
		}
	}()
	usernsFd, err := unix.Open(usernsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open user namespace %s: %w", usernsPath, err)
	}
	defer unix.Close(usernsFd)
	// A detached clone (not recursive: nothing is mounted below layers/)
	// can get an idmapping before it is attached anywhere.
	treeFd, err := unix.OpenTree(unix.AT_FDCWD, s.path("layers"), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return "", fmt.Errorf("open_tree %s: %w", s.path("layers"), err)
	}
	defer unix.Close(treeFd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFd)}
	if err := unix.MountSetattr(treeFd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return "", fmt.Errorf("idmap layers for pod %s: %w", podID, err)
	}
	if err := unix.MoveMount(treeFd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return "", fmt.Errorf("attach idmapped layers for pod %s: %w", podID, err)
	}
	log.G(ctx).WithField("pod", podID).Debug("idmapped image layers")
	return target, nil
}

// UnmountRootfs unmounts the container's image volumes and rootfs and,
// with the pod's last container, the pod's idmapped layers. It is
// idempotent.
func (s *Store) UnmountRootfs(ctx context.Context, containerID, podID, dir string) error {
	if err := validate.ID("container", containerID); err != nil {
		return err
	}
	if podID != "" {
		if err := validate.ID("pod", podID); err != nil {
			return err
		}
	}
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	if err := s.unmountVolumesLocked(containerID, dir); err != nil {
		return err
	}
	if err := unmount(filepath.Join(dir, "rootfs")); err != nil {
		return fmt.Errorf("unmount rootfs of container %s: %w", containerID, err)
	}
	delete(s.mounted, containerID)
	if podID == "" {
		return nil
	}
	return s.maybeReleasePodLocked(ctx, podID)
}

// maybeReleasePodLocked drops the pod's idmapped tree when no mounted
// overlay uses it any more. The kernel's mount table is the truth here,
// not s.mounted, so this stays right after a restart.
func (s *Store) maybeReleasePodLocked(ctx context.Context, podID string) error {
	target := s.path("idmapped", podID)
	for _, m := range s.mounted {
		if m.podID == podID {
			return nil
		}
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("overlay"))
	if err != nil {
		return err
	}
	for _, m := range mounts {
		for _, l := range lowerDirs(m) {
			if strings.HasPrefix(l, target+"/") {
				log.G(ctx).WithField("pod", podID).WithField("mount", m.Mountpoint).Debug("idmapped layers still in use")
				return nil
			}
		}
	}
	return s.releasePodLocked(podID)
}

// ReleasePod unmounts the pod's idmapped layers. Overlays mounted from
// them keep working (overlayfs holds its own clones of its layers), so
// call it when the pod is gone. It is idempotent.
func (s *Store) ReleasePod(ctx context.Context, podID string) error {
	if err := validate.ID("pod", podID); err != nil {
		return err
	}
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	return s.releasePodLocked(podID)
}

func (s *Store) releasePodLocked(podID string) error {
	target := s.path("idmapped", podID)
	if err := unmount(target); err != nil {
		return fmt.Errorf("unmount idmapped layers of pod %s: %w", podID, err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove idmapped dir of pod %s: %w", podID, err)
	}
	return nil
}

// unmount unmounts every mount stacked on target; a missing or
// unmounted target is fine.
func unmount(target string) error {
	for {
		err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY):
			// A process still has its cwd in there; detach so the mount
			// goes away with the last user.
			if err := unix.Unmount(target, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				return err
			}
		default:
			return err
		}
	}
}

// VolumeRequest describes one image volume of a container (KEP-4639):
// an image's filesystem, read-only, at a path of the container.
type VolumeRequest struct {
	ContainerID string
	PodID       string
	// Index numbers the container's image volumes; with ContainerID it
	// names the mount.
	Index int
	// ImageID is the image to mount, as Get resolves it.
	ImageID string
	// Dir is the container's directory; the volume is mounted under
	// Dir/volumes/<index>.
	Dir string
	// SubPath, when set, is the directory or file of the image to expose
	// instead of its root. It is relative and stays inside the image.
	SubPath string
	// UsernsPath is the pod's pinned user namespace; "" means none.
	UsernsPath string
}

// MountImageVolume mounts an image's layers read-only and returns the
// host path to bind into the container: the mount or, with SubPath, the
// path below it with every symlink resolved inside the image.
//
// The mount is an overlay without an upper dir, so nothing can ever
// write to it, whatever the volume asked for. For a userns pod the lower
// dirs come from the pod's idmapped layer tree, as for the rootfs: the
// container sees the image's owners shifted into its user namespace and
// the bind needs no idmapping of its own. The image's chain IDs count as
// in use until the container's UnmountRootfs, so RemoveImage keeps them.
// Mounting a mounted volume again (restore) only rebuilds bookkeeping.
func (s *Store) MountImageVolume(ctx context.Context, req VolumeRequest) (_ string, retErr error) {
	if err := checkMountTarget(req.ContainerID, req.PodID, req.UsernsPath, req.Dir); err != nil {
		return "", err
	}
	if req.Index < 0 {
		return "", fmt.Errorf("image volume index %d: %w", req.Index, errdefs.ErrInvalidArgument)
	}
	sub, err := cleanSubPath(req.SubPath)
	if err != nil {
		return "", err
	}
	key := volumeKey(req.ContainerID, req.Index)
	base := filepath.Join(req.Dir, "volumes", strconv.Itoa(req.Index))
	target, empty := filepath.Join(base, "mnt"), filepath.Join(base, "empty")
	if s.rememberMounted(key, req.PodID, target) {
		src, err := resolveInRoot(target, sub)
		if err != nil {
			return "", fmt.Errorf("image volume sub path %q: %w", req.SubPath, err)
		}
		return src, nil
	}
	// Resolved under mountMu, as in MountRootfs: a Remove's gc sees this
	// mount or Get finds no image.
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	img, err := s.Get(req.ImageID)
	if err != nil {
		return "", fmt.Errorf("image volume: %w", err)
	}
	if s.resolved != nil {
		s.resolved()
	}
	if len(img.ChainIDs) == 0 {
		return "", fmt.Errorf("image %s has no layers: %w", img.ID, errdefs.ErrFailedPrecondition)
	}
	if ok, _ := mountinfo.Mounted(target); !ok {
		if err := s.mountVolumeLocked(ctx, req, img.ChainIDs, target, empty); err != nil {
			return "", err
		}
		defer func() {
			if retErr != nil {
				if err := unmount(target); err != nil {
					log.G(ctx).WithError(err).WithField("volume", target).Warn("unmount image volume after a failure")
				}
				if req.PodID != "" {
					if err := s.maybeReleasePodLocked(ctx, req.PodID); err != nil {
						log.G(ctx).WithError(err).WithField("pod", req.PodID).Warn("release idmapped layers after failed volume")
					}
				}
			}
		}()
	}
	src, err := resolveInRoot(target, sub)
	if err != nil {
		return "", fmt.Errorf("image volume sub path %q of image %s: %w", req.SubPath, img.ID, err)
	}
	s.mounted[key] = mountedRootfs{podID: req.PodID, chainIDs: img.ChainIDs}
	log.G(ctx).WithField("container", req.ContainerID).WithField("image", img.ID).Debug("mounted image volume")
	return src, nil
}

// volumeKey names an image volume in s.mounted; container IDs have no
// "/", so it never collides with a rootfs.
func volumeKey(containerID string, index int) string {
	return containerID + "/volume/" + strconv.Itoa(index)
}

func (s *Store) mountVolumeLocked(ctx context.Context, req VolumeRequest, chainIDs []string, target, empty string) error {
	// overlayfs wants two lower dirs when it has no upper one; an empty
	// bottom layer changes nothing the container can see.
	for _, d := range []string{target, empty} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create image volume dirs: %w", err)
		}
	}
	lowerBase := s.path("layers")
	if req.UsernsPath != "" {
		var err error
		if lowerBase, err = s.idmapLayers(ctx, req.PodID, req.UsernsPath); err != nil {
			return err
		}
	}
	lowers := make([]string, 0, len(chainIDs)+1)
	for i := len(chainIDs) - 1; i >= 0; i-- {
		lowers = append(lowers, filepath.Join(lowerBase, strings.TrimPrefix(chainIDs[i], "sha256:")))
	}
	lowers = append(lowers, empty)
	if err := mountOverlayRO(lowers, target); err != nil {
		if req.UsernsPath != "" {
			if rerr := s.maybeReleasePodLocked(ctx, req.PodID); rerr != nil {
				log.G(ctx).WithError(rerr).WithField("pod", req.PodID).Warn("release idmapped layers after failed volume")
			}
		}
		return fmt.Errorf("mount image volume %d of container %s: %w", req.Index, req.ContainerID, err)
	}
	return nil
}

// mountOverlayRO mounts a read-only overlay of lowers (top first) on
// target, also marking the mount itself read-only, nosuid and nodev.
func mountOverlayRO(lowers []string, target string) error {
	if lowerdirPlus {
		err := fsmountOverlayRO(lowers, target)
		if err == nil || !errors.Is(err, unix.EINVAL) {
			return err
		}
	}
	return mountOverlayLegacy(lowers, "", target, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV)
}

// fsmountOverlayRO mounts a read-only overlay of lowers, with no upper
// layer, nosuid and nodev: an image volume is never writable and never a
// way to run a setuid binary.
func fsmountOverlayRO(lowers []string, target string) error {
	return fsmountOverlayAttr(lowers, "", "", target, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
}

// cleanSubPath checks an image sub path: relative, and no ".." that
// leaves the image. "" and "." mean the image's root.
func cleanSubPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if strings.ContainsRune(p, 0) || filepath.IsAbs(p) {
		return "", fmt.Errorf("image sub path %q must be a relative path: %w", p, errdefs.ErrInvalidArgument)
	}
	c := filepath.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("image sub path %q leaves the image: %w", p, errdefs.ErrInvalidArgument)
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// resolveInRoot resolves sub below root the way the container would see
// it, symlinks included, without ever leaving root (openat2
// RESOLVE_IN_ROOT), and returns the host path of what it found. The
// image is read-only, so the answer cannot change before the bind.
func resolveInRoot(root, sub string) (string, error) {
	if sub == "" {
		return root, nil
	}
	rootFd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFd)
	// Compare real paths: the store root itself may sit below a symlink.
	realRoot, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(rootFd))
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", root, err)
	}
	fd, err := unix.Openat2(rootFd, sub, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return "", fmt.Errorf("not in the image: %w", errdefs.ErrNotFound)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return "", fmt.Errorf("resolve: %w: %w", err, errdefs.ErrInvalidArgument)
	case err != nil:
		return "", fmt.Errorf("resolve: %w", err)
	}
	defer unix.Close(fd)
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", fmt.Errorf("resolve: %w", err)
	}
	if real == realRoot {
		return real, nil
	}
	if !strings.HasPrefix(real, realRoot+"/") {
		return "", fmt.Errorf("resolves to %s, outside the image: %w", real, errdefs.ErrInvalidArgument)
	}
	return real, nil
}

// unmountVolumesLocked unmounts every image volume under dir/volumes and
// forgets the container's volumes. Callers hold mountMu.
func (s *Store) unmountVolumesLocked(containerID, dir string) error {
	ents, err := os.ReadDir(filepath.Join(dir, "volumes"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("list image volumes of container %s: %w", containerID, err)
	}
	var errs []error
	for _, e := range ents {
		if err := unmount(filepath.Join(dir, "volumes", e.Name(), "mnt")); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unmount image volumes of container %s: %w", containerID, err)
	}
	prefix := containerID + "/volume/"
	for k := range s.mounted {
		if strings.HasPrefix(k, prefix) {
			delete(s.mounted, k)
		}
	}
	return nil
}

// rememberMounted records, under key, the layers of an overlay already
// mounted at target and reports whether there was one. The kernel's
// mount table is the record: after a restart the image may be gone from
// the index while its layers still serve a live container, and Remove
// must keep them.
func (s *Store) rememberMounted(key, podID, target string) bool {
	ids := mountedChainIDs(target)
	if len(ids) == 0 {
		return false
	}
	s.mountMu.Lock()
	defer s.mountMu.Unlock()
	s.mounted[key] = mountedRootfs{podID: podID, chainIDs: ids}
	return true
}

// mountedChainIDs reads the chain IDs, bottom first, of the layers the
// overlay at target has as lower dirs; none when target is no overlay.
func mountedChainIDs(target string) []string {
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(target))
	if err != nil || len(ms) == 0 || ms[len(ms)-1].FSType != "overlay" {
		return nil
	}
	lowers := lowerDirs(ms[len(ms)-1])
	var ids []string
	for i := len(lowers) - 1; i >= 0; i-- {
		if m := fullIDRe.FindStringSubmatch(filepath.Base(lowers[i])); m != nil {
			ids = append(ids, "sha256:"+m[1])
		}
	}
	return ids
}

// lowerDirs are the lower dirs, top first, of the overlay m. A relative
// one is a short name mountOverlayLegacy gave, read back through its link
// beside the mount point.
func lowerDirs(m *mountinfo.Info) []string {
	var lowers []string
	for _, opt := range strings.Split(m.VFSOptions, ",") {
		// "lowerdir+=" with the new mount API, "lowerdir=a:b" with mount(2).
		if l, ok := strings.CutPrefix(opt, "lowerdir+="); ok {
			lowers = append(lowers, l)
		} else if l, ok := strings.CutPrefix(opt, "lowerdir="); ok {
			lowers = append(lowers, strings.Split(l, ":")...)
		}
	}
	for i, l := range lowers {
		if filepath.IsAbs(l) {
			continue
		}
		if real, err := os.Readlink(filepath.Join(filepath.Dir(m.Mountpoint), lowerAliases, l)); err == nil {
			lowers[i] = real
		}
	}
	return lowers
}

// mountedLayers names, as layers/ does, every layer of the store that is
// a lower dir of an overlay mounted on this host: from layers/ itself or
// from a pod's idmapped view of it. The kernel's mount table knows the
// rootfs and image volumes of every container, also those no MountRootfs
// has reported since the daemon started (a container of a stopped pod).
func (s *Store) mountedLayers() (map[string]bool, error) {
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("overlay"))
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	layers, idmapped := s.path("layers"), s.path("idmapped")
	used := map[string]bool{}
	for _, m := range mounts {
		for _, l := range lowerDirs(m) {
			dir := filepath.Dir(l)
			if dir == layers || filepath.Dir(dir) == idmapped {
				used[filepath.Base(l)] = true
			}
		}
	}
	return used, nil
}
