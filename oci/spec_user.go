package oci

import (
	"errors"
	"fmt"
	"io"
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
// user's /etc/group memberships plus the requested ones. HOME comes from
// passwd unless the env already sets it.
func WithUser(rootfs string, u User, imageUser string) SpecOpt {
	return func(g *Generator) error {
		spec := imageUser
		switch {
		case u.UID != nil:
			if *u.UID < 0 {
				return fmt.Errorf("negative uid %d: %w", *u.UID, errdefs.ErrInvalidArgument)
			}
			spec = strconv.FormatInt(*u.UID, 10)
		case u.Username != "":
			spec = u.Username
		}
		if u.GID != nil {
			if *u.GID < 0 {
				return fmt.Errorf("negative gid %d: %w", *u.GID, errdefs.ErrInvalidArgument)
			}
			name, _, _ := strings.Cut(spec, ":")
			if name == "" {
				name = "0"
			}
			spec = name + ":" + strconv.FormatInt(*u.GID, 10)
		}
		passwd, err := openInRoot(rootfs, "etc/passwd")
		if err != nil {
			return err
		}
		if passwd != nil {
			defer passwd.Close()
		}
		group, err := openInRoot(rootfs, "etc/group")
		if err != nil {
			return err
		}
		if group != nil {
			defer group.Close()
		}
		defaults := &user.ExecUser{Uid: 0, Gid: 0, Home: "/"}
		var pr, gr io.Reader
		if passwd != nil {
			pr = passwd
		}
		if group != nil {
			gr = group
		}
		eu, err := user.GetExecUser(spec, defaults, pr, gr)
		if err != nil {
			return fmt.Errorf("resolve user %q in %s: %v: %w", spec, rootfs, err, errdefs.ErrInvalidArgument)
		}
		p := g.Config.Process
		p.User.UID, p.User.GID = uint32(eu.Uid), uint32(eu.Gid)
		p.User.AdditionalGids = nil
		seen := map[uint32]bool{}
		addGid := func(gid uint32) {
			if !seen[gid] {
				seen[gid] = true
				p.User.AdditionalGids = append(p.User.AdditionalGids, gid)
			}
		}
		for _, sg := range eu.Sgids {
			addGid(uint32(sg))
		}
		for _, sg := range u.SupplementalGroups {
			if sg < 0 {
				return fmt.Errorf("negative supplemental group %d: %w", sg, errdefs.ErrInvalidArgument)
			}
			addGid(uint32(sg))
		}
		if envIndex(p.Env, "HOME") < 0 {
			p.Env = append(p.Env, "HOME="+eu.Home)
		}
		return nil
	}
}

// openInRoot opens name inside rootfs with every symlink resolved inside it:
// an image's /etc/passwd may be a symlink aiming at the host. A missing
// file is nil, nil (numeric users need no passwd).
func openInRoot(rootfs, name string) (*os.File, error) {
	dir, err := os.Open(rootfs)
	if err != nil {
		return nil, fmt.Errorf("open rootfs %s: %w", rootfs, err)
	}
	defer dir.Close()
	fd, err := unix.Openat2(int(dir.Fd()), name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s in rootfs %s: %w", name, rootfs, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}
