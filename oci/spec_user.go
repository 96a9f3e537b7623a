package oci

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/moby/sys/user"
	"golang.org/x/sys/unix"
)

func fileMode(mode uint32) os.FileMode { return os.FileMode(mode & 0o7777) }

// WithUser resolves the process identity against the rootfs's /etc/passwd
// and /etc/group. The request's UID or username wins over the image USER;
// a requested GID replaces the primary group; supplemental groups are the
// user's /etc/group memberships (unless the policy is Strict) plus the
// requested ones. HOME comes from passwd unless the env already sets it.
func WithUser(rootfs string, u User, imageUser string) SpecOpt {
	return func(g *Generator) error {
		spec, err := userSpec(u, imageUser)
		if err != nil {
			return err
		}
		eu, err := resolveUser(rootfs, spec)
		if err != nil {
			return err
		}
		p := g.Config.Process
		p.User.UID, p.User.GID = uint32(eu.Uid), uint32(eu.Gid)
		gids, err := additionalGids(eu, u)
		if err != nil {
			return err
		}
		p.User.AdditionalGids = gids
		if envIndex(p.Env, "HOME") < 0 {
			p.Env = append(p.Env, "HOME="+eu.Home)
		}
		return nil
	}
}

// checkID refuses a uid or gid outside 0-2147483647, the range the
// Kubernetes API and the image's passwd parsing accept: past 32 bits one
// would wrap around (2^32 to root's 0), and 2^32-1 is (uid_t)-1, "no ID",
// to the kernel.
func checkID(kind string, id int64) error {
	if id < 0 || id > math.MaxInt32 {
		return fmt.Errorf("%s %d is outside 0-%d: %w", kind, id, math.MaxInt32, errdefs.ErrInvalidArgument)
	}
	return nil
}

// userSpec is the user[:group] to resolve: the request's UID or username
// over the image USER, with a requested GID replacing the group.
func userSpec(u User, imageUser string) (string, error) {
	spec := imageUser
	switch {
	case u.UID != nil:
		if err := checkID("uid", *u.UID); err != nil {
			return "", err
		}
		spec = strconv.FormatInt(*u.UID, 10)
	case u.Username != "":
		spec = u.Username
	}
	if u.GID != nil {
		if err := checkID("gid", *u.GID); err != nil {
			return "", err
		}
		name, _, _ := strings.Cut(spec, ":")
		if name == "" {
			name = "0"
		}
		spec = name + ":" + strconv.FormatInt(*u.GID, 10)
	}
	return spec, nil
}

// resolveUser resolves spec against the rootfs's /etc/passwd and
// /etc/group; Sgids are the user's /etc/group memberships.
func resolveUser(rootfs, spec string) (*user.ExecUser, error) {
	passwd, err := readInRoot(rootfs, "etc/passwd")
	if err != nil {
		return nil, err
	}
	group, err := readInRoot(rootfs, "etc/group")
	if err != nil {
		return nil, err
	}
	resolve := func(spec string) (*user.ExecUser, error) {
		eu, err := user.GetExecUser(spec, &user.ExecUser{Uid: 0, Gid: 0, Home: "/"}, readerOf(passwd), readerOf(group))
		if err != nil {
			return nil, fmt.Errorf("resolve user %q in %s: %w: %w", spec, rootfs, err, errdefs.ErrInvalidArgument)
		}
		return eu, nil
	}
	eu, err := resolve(spec)
	if err != nil {
		return nil, err
	}
	// An explicit group makes moby/sys/user skip /etc/group
	// memberships; Kubernetes keeps them, so look them up by user alone.
	if name, grp, ok := strings.Cut(spec, ":"); ok && grp != "" {
		byName, err := resolve(name)
		if err != nil {
			return nil, err
		}
		eu.Sgids = byName.Sgids
	}
	if err := checkImageIDs(eu); err != nil {
		return nil, fmt.Errorf("resolve user %q in %s: %w", spec, rootfs, err)
	}
	return eu, nil
}

// checkImageIDs holds the IDs read from the image's passwd and group to
// checkID's range: moby/sys/user takes any int there, and uint32 would
// wrap 2^32 to root's 0. additionalGids checks the memberships it uses.
func checkImageIDs(eu *user.ExecUser) error {
	if err := checkID("uid", int64(eu.Uid)); err != nil {
		return err
	}
	return checkID("gid", int64(eu.Gid))
}

// additionalGids is the process's group list, without duplicates.
func additionalGids(eu *user.ExecUser, u User) ([]uint32, error) {
	var gids []uint32
	seen := map[uint32]bool{}
	addGid := func(gid uint32) {
		if !seen[gid] {
			seen[gid] = true
			gids = append(gids, gid)
		}
	}
	// The primary group comes first, under both policies, as in
	// containerd and CRI-O: the CRI conformance suite expects it in
	// the process's groups and in ContainerStatus.user, and a
	// process that drops its gid with setgid must keep the group.
	addGid(uint32(eu.Gid))
	if u.GroupsPolicy != GroupsStrict {
		for _, sg := range eu.Sgids {
			if err := checkID("image group", int64(sg)); err != nil {
				return nil, err
			}
			addGid(uint32(sg))
		}
	}
	for _, sg := range u.SupplementalGroups {
		if err := checkID("supplemental group", sg); err != nil {
			return nil, err
		}
		addGid(uint32(sg))
	}
	return gids, nil
}

func readerOf(b []byte) io.Reader {
	if b == nil {
		return nil
	}
	return bytes.NewReader(b)
}

// readInRoot reads name inside rootfs with every symlink resolved inside
// it: an image's /etc/passwd may be a symlink aiming at the host. A
// missing file is nil, nil (numeric users need no passwd). Only a regular
// file is read: O_NONBLOCK, because an image layer may make the file a
// FIFO, whose plain open would wait for a writer for ever.
func readInRoot(rootfs, name string) ([]byte, error) {
	dir, err := os.Open(rootfs)
	if err != nil {
		return nil, fmt.Errorf("open rootfs %s: %w", rootfs, err)
	}
	defer dir.Close()
	fd, err := unix.Openat2(int(dir.Fd()), name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s in rootfs %s: %w: %w", name, rootfs, err, errdefs.ErrInvalidArgument)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("stat %s in rootfs %s: %w", name, rootfs, err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s in rootfs %s is not a regular file (%s): %w", name, rootfs, st.Mode().Type(), errdefs.ErrInvalidArgument)
	}
	// Bounded: a hostile image could make /etc/passwd huge.
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s in rootfs %s: %w", name, rootfs, err)
	}
	return b, nil
}
