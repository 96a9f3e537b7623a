package oci

import (
	"fmt"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// ImageVolume is an image mounted as a volume (KEP-4639). Source is the
// host path of the mounted image, or of its sub path. It is already
// shifted into a userns pod's IDs (the image package mounts it from the
// pod's idmapped layers), so the bind carries no idmapping.
type ImageVolume struct {
	Source, ContainerPath string
	// Options are the extra mount options asked for, as Mount's.
	Options []string
}

// WithImageVolumes binds the image volumes read-only, whatever the
// request said: an image is never writable. They are always nosuid and
// nodev; noexec comes from the request's options. They replace a default
// mount at the same destination like other volumes, and when one is the
// parent of another mount the mounts are reordered parents first.
func WithImageVolumes(vols []ImageVolume, feat *Features) SpecOpt {
	return func(g *Generator) error {
		for _, v := range vols {
			if !filepath.IsAbs(v.Source) {
				return fmt.Errorf("image volume source %q is not absolute: %w", v.Source, errdefs.ErrInvalidArgument)
			}
			if !path.IsAbs(v.ContainerPath) {
				return fmt.Errorf("image volume container path %q is not absolute: %w", v.ContainerPath, errdefs.ErrInvalidArgument)
			}
			opts, err := withVolumeOptions([]string{"rbind", "ro", "rprivate", "nosuid", "nodev"}, v.ContainerPath, v.Options, feat)
			if err != nil {
				return err
			}
			g.setMount(specs.Mount{
				Destination: path.Clean(v.ContainerPath), Type: "bind", Source: filepath.Clean(v.Source),
				Options: opts,
			})
		}
		dsts := make([]string, 0, len(vols))
		for _, v := range vols {
			dsts = append(dsts, v.ContainerPath)
		}
		g.parentsFirst(dsts)
		return nil
	}
}

// parentsFirst reorders the mounts parents first (stably) when one of
// dsts, the volumes just added, is the parent of another mount: a volume
// appended after that mount would be mounted over it and hide it.
func (g *Generator) parentsFirst(dsts []string) {
	if hidesChild(g.Config.Mounts, dsts) {
		sort.SliceStable(g.Config.Mounts, func(i, j int) bool {
			return depth(g.Config.Mounts[i].Destination) < depth(g.Config.Mounts[j].Destination)
		})
	}
}

// hidesChild reports whether a mount at one of dsts would be mounted
// over a mount below it.
func hidesChild(mounts []specs.Mount, dsts []string) bool {
	for _, d := range dsts {
		parent := path.Clean(d)
		if parent != "/" {
			parent += "/"
		}
		for _, m := range mounts {
			if strings.HasPrefix(m.Destination, parent) {
				return true
			}
		}
	}
	return false
}
