package oci

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
)

// VolumeMountOptions are the mount options a volume may ask for beyond
// what the CRI's own fields say (Mount.mount_options, KEP-5855). They are
// the three Kubernetes' API accepts for volumeMounts[].bindMountOptions,
// and each only takes something away from the container. They are passed
// as OCI mount options, as the CRI says: runc's bind remount sets them on
// the volume's own mount, not on mounts below it.
//
// Everything else is refused. "exec", "dev" and "suid" would clear a flag
// the host set on the volume's source (runc remounts the bind with the
// flags it is given), so setuid files or device nodes on a host volume
// would work in the container again. "ro"/"rw", "rro", "bind"/"rbind",
// "remount" and the propagation modes each have a CRI field of their own,
// which kubelet derives from the pod and checks ("rw" over a read-only
// volume, "rshared" for an unprivileged pod); the rest (atime, sync,
// recursive variants, "idmap") no caller asks for.
var VolumeMountOptions = []string{"nodev", "noexec", "nosuid"}

// ValidMountOptions checks the extra options of the volume at dest
// against VolumeMountOptions. It returns them in request order without
// repeats, or nil for none; an option outside the list is
// InvalidArgument naming it and the volume.
func ValidMountOptions(dest string, opts []string) ([]string, error) {
	var out []string
	for _, o := range opts {
		if !slices.Contains(VolumeMountOptions, o) {
			return nil, fmt.Errorf("mount %s: mount option %q is not allowed (allowed: %s): %w",
				dest, o, strings.Join(VolumeMountOptions, ", "), errdefs.ErrInvalidArgument)
		}
		if !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out, nil
}

// AppliesVolumeMountOptions reports whether the runtime applies every
// option in VolumeMountOptions. Every OCI runtime has taken these since
// the first spec; only a features list that leaves one out says
// otherwise (no list, or no features command, means unknown).
func (f *Features) AppliesVolumeMountOptions() bool {
	return f.missingMountOption(VolumeMountOptions) == ""
}

// missingMountOption is the first of opts the runtime's features list
// lacks, or "".
func (f *Features) missingMountOption(opts []string) string {
	if f == nil || f.MountOptions == nil {
		return ""
	}
	for _, o := range opts {
		if !slices.Contains(f.MountOptions, o) {
			return o
		}
	}
	return ""
}

// withVolumeOptions appends a volume's extra options to its spec
// options, after checking them again here, where the spec is made, and
// that the runtime knows them; an option already there is not repeated.
func withVolumeOptions(opts []string, dest string, extra []string, feat *Features) ([]string, error) {
	extra, err := ValidMountOptions(dest, extra)
	if err != nil {
		return nil, err
	}
	if o := feat.missingMountOption(extra); o != "" {
		return nil, fmt.Errorf("mount %s: the runtime does not know mount option %q (not in its features' mountOptions): %w", dest, o, errdefs.ErrFailedPrecondition)
	}
	for _, o := range extra {
		if !slices.Contains(opts, o) {
			opts = append(opts, o)
		}
	}
	return opts, nil
}
