package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"

	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// maxDeclaredVolumes bounds the VOLUMEs of one image that a create acts
// on: each is a directory and a mount.
const maxDeclaredVolumes = 128

// declaredVolumesDir holds, in a container's directory, the directories
// of its declared volumes. Not "volumes": the image store keeps image
// volume i (KEP-4639) in volumes/<i>, and a declared volume numbered
// alike showed the container that volume's mount inside its own.
const declaredVolumesDir = "declared-volumes"

// declaredVolumes gives every VOLUME the image declares (its config's
// Volumes) that the container's rootfs lacks a directory of the
// container's own under dir, mounted at that path, as containerd does
// for such a path: a program that writes to its declared volume finds
// it there, where Docker would have made one. A VOLUME the rootfs has
// stays the rootfs's (CRI-O's "mkdir"), with the image's content and
// ownership. A VOLUME at or under a mount kubelet asked for is that
// mount's business, and /proc, /sys and /dev are the runtime's.
//
// The mounts go into the spec like kubelet's, so in a pod with a user
// namespace they are idmapped to it. The directories go with the
// container's directory, under declaredVolumesDir.
func declaredVolumes(rootfs, dir string, declared map[string]struct{}, requested []sandbox.ContainerMount) ([]oci.Mount, error) {
	if len(declared) > maxDeclaredVolumes {
		return nil, fmt.Errorf("the image declares %d volumes, more than %d: %w", len(declared), maxDeclaredVolumes, errdefs.ErrInvalidArgument)
	}
	paths := make([]string, 0, len(declared))
	for p := range declared {
		paths = append(paths, filepath.Clean("/"+p))
	}
	slices.Sort(paths)
	paths = slices.Compact(paths)
	var mounts []oci.Mount
	for _, dest := range paths {
		if dest == "/" || slices.ContainsFunc([]string{"/proc", "/sys", "/dev"}, func(d string) bool { return under(dest, d) }) || coveredByMount(dest, requested) {
			continue
		}
		missing, err := missingInRoot(rootfs, dest)
		if err != nil {
			return nil, fmt.Errorf("image volume %s: %w", dest, err)
		}
		if !missing {
			continue
		}
		src := filepath.Join(dir, declaredVolumesDir, strconv.Itoa(len(mounts)))
		if err := os.MkdirAll(src, 0o755); err != nil {
			return nil, fmt.Errorf("image volume %s: %w", dest, err)
		}
		mounts = append(mounts, oci.Mount{HostPath: src, ContainerPath: dest})
	}
	return mounts, nil
}

func coveredByMount(dest string, requested []sandbox.ContainerMount) bool {
	for _, m := range requested {
		if under(dest, filepath.Clean("/"+m.ContainerPath)) {
			return true
		}
	}
	return false
}

// missingInRoot says whether path, resolved inside root as the container
// would resolve it (symlinks included), names nothing. Anything in the
// way (a file where a directory should be, a symlink loop) is not
// missing: the path is left alone.
func missingInRoot(root, path string) (bool, error) {
	rootFd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open the rootfs: %w", err)
	}
	defer unix.Close(rootFd)
	fd, err := unix.Openat2(rootFd, strings.TrimPrefix(path, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err == nil {
		_ = unix.Close(fd)
	}
	return errors.Is(err, unix.ENOENT), nil
}
