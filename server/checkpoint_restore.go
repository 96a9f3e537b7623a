package server

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/sandbox"
)

// Restoring a container from a checkpoint, as CRI-O does: a
// CreateContainer whose image is the absolute path of a checkpoint
// archive (CheckpointContainer's, CRI-O's or containerd's layout) makes a
// container of the image the checkpoint was taken from, with the
// archive's rootfs changes in its writable layer, and StartContainer
// restores its processes with CRIU into the new pod instead of starting
// them (conmon --restore, `runc restore`). The pod's network, IPC and UTS
// namespaces are the new pod's; TCP connections come back closed (the
// peer and the address are gone), which CRIU's tcp-close does.
//
// Refused (nothing is made): an archive that is not a checkpoint, a
// checkpoint of a container with a terminal or in a user namespace, a
// pod with a user namespace (CRIU would bring back the old pod's IDs), an
// image the checkpoint names that is not present, and a bind mount of the
// checkpointed container the request does not give again.

// criuConfigAnnotation names runc's CRIU configuration file. A request's
// is dropped (runc would hand CRIU a file the caller chose); a restored
// container's is pinrt's own.
const criuConfigAnnotation = "org.criu.config"

// Files of a checkpoint archive.
const (
	checkpointImagesDir = "checkpoint"
	rootfsDiffFile      = "rootfs-diff.tar"
	deletedFilesFile    = "deleted.files"
	// restoreCRIUConfig, in a restored container's directory, is CRIU's
	// configuration for its restore.
	restoreCRIUConfig = "criu-restore.conf"
)

// maxCheckpointMetadata bounds config.dump and spec.dump.
const maxCheckpointMetadata = 4 << 20

// checkpointImport is a checkpoint's metadata, read before anything is
// created, and where its files are.
type checkpointImport struct {
	src    checkpointSource
	config checkpointConfig
	spec   specs.Spec
}

// checkpointSource holds a checkpoint's files: an archive, or a
// checkpoint image (the archive's files added to an empty image).
type checkpointSource struct {
	// name is the archive's path or the image, for messages.
	name string
	// each calls fn with each regular file, by its clean relative path.
	each func(fn func(name string, r io.Reader) error) error
}

// checkpointImageAnnotation marks a checkpoint image and names the
// checkpointed container (checkpointctl's, CRI-O's and containerd's).
const checkpointImageAnnotation = "io.kubernetes.cri-o.annotations.checkpoint.name"

// isCheckpointArchive says whether a CreateContainer's image names a
// checkpoint archive: an image reference is never an absolute path.
func isCheckpointArchive(image string) bool { return strings.HasPrefix(image, "/") }

// openCheckpointArchive opens the archive p as a regular file; a path
// that is not one is InvalidArgument, a missing one NotFound.
func openCheckpointArchive(p string) (*os.File, error) {
	if filepath.Clean(p) != p {
		return nil, invalid("checkpoint archive %q: want a clean absolute path", p)
	}
	// O_NONBLOCK: a FIFO put there must not hang the call.
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("checkpoint archive %q: %w", p, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, invalid("checkpoint archive %q: %v", p, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, invalid("checkpoint archive %q is not a regular file", p)
	}
	return f, nil
}

// archiveSource is the checkpoint archive at p.
func archiveSource(p string) checkpointSource {
	return checkpointSource{name: p, each: func(fn func(string, io.Reader) error) error {
		f, err := openCheckpointArchive(p)
		if err != nil {
			return err
		}
		defer f.Close()
		tr := tar.NewReader(f)
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return invalid("checkpoint archive %q: not a tar archive: %v", p, err)
			}
			if hdr.Typeflag != tar.TypeReg {
				continue
			}
			if err := fn(path.Clean(strings.TrimPrefix(hdr.Name, "./")), tr); err != nil {
				return err
			}
		}
	}}
}

// readCheckpointImport reads src's config.dump and spec.dump and checks
// that it holds CRIU's images.
func readCheckpointImport(src checkpointSource) (*checkpointImport, error) {
	ci := &checkpointImport{src: src}
	var haveConfig, haveSpec, haveInventory bool
	err := src.each(func(name string, r io.Reader) error {
		var into any
		switch name {
		case "config.dump":
			into, haveConfig = &ci.config, true
		case "spec.dump":
			into, haveSpec = &ci.spec, true
		case checkpointImagesDir + "/inventory.img":
			haveInventory = true
			return nil
		default:
			return nil
		}
		b, err := io.ReadAll(io.LimitReader(r, maxCheckpointMetadata+1))
		if err != nil {
			return invalid("checkpoint %q: %s: %v", src.name, name, err)
		}
		if len(b) > maxCheckpointMetadata {
			return invalid("checkpoint %q: %s is larger than %d bytes", src.name, name, maxCheckpointMetadata)
		}
		if err := json.Unmarshal(b, into); err != nil {
			return invalid("checkpoint %q: %s: %v", src.name, name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !haveConfig || !haveSpec || !haveInventory {
		return nil, invalid("checkpoint %q is not a container checkpoint: it lacks config.dump, spec.dump or CRIU's images", src.name)
	}
	if ci.spec.Process == nil || ci.spec.Linux == nil {
		return nil, invalid("checkpoint %q: spec.dump has no process or no linux section", src.name)
	}
	return ci, nil
}

// check refuses what a restore into pod sb cannot bring back.
func (ci *checkpointImport) check(sb *sandbox.Sandbox, cfg *runtimeapi.ContainerConfig, declared map[string]struct{}) error {
	if ci.spec.Process.Terminal {
		return fmt.Errorf("checkpoint %q: restoring a container with a terminal is not supported: %w", ci.src.name, errdefs.ErrFailedPrecondition)
	}
	for _, ns := range ci.spec.Linux.Namespaces {
		if ns.Type == specs.UserNamespace {
			return fmt.Errorf("checkpoint %q: the container ran in a user namespace, whose IDs a restore would bring back into another pod: %w", ci.src.name, errdefs.ErrFailedPrecondition)
		}
	}
	if sb.Pins["user"] != "" {
		return fmt.Errorf("pod %s has a user namespace: a checkpoint is restored only in a pod without one: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	var missing []string
	for _, m := range ci.spec.Mounts {
		if m.Type != "bind" && !slices.Contains(m.Options, "bind") && !slices.Contains(m.Options, "rbind") {
			continue
		}
		if _, own := podMounts[m.Destination]; own {
			continue
		}
		if _, own := declared[m.Destination]; own {
			continue
		}
		if !slices.ContainsFunc(cfg.Mounts, func(r *runtimeapi.Mount) bool { return path.Clean(r.ContainerPath) == m.Destination }) {
			missing = append(missing, m.Destination)
		}
	}
	if len(missing) > 0 {
		return invalid("checkpoint %q: the container had bind mounts at %s; the request must give them again", ci.src.name, strings.Join(missing, ", "))
	}
	return nil
}

// podMounts are the mounts pinrt gives every container of a pod; a
// restored container gets its new pod's.
var podMounts = map[string]struct{}{
	"/proc": {}, "/dev": {}, "/dev/pts": {}, "/dev/shm": {}, "/dev/mqueue": {}, "/sys": {}, "/sys/fs/cgroup": {},
	"/etc/hosts": {}, "/etc/hostname": {}, "/etc/resolv.conf": {},
}

// imageCandidates are the references the checkpoint names its image by,
// most exact first.
func (ci *checkpointImport) imageCandidates() []string {
	var out []string
	for _, r := range []string{ci.config.RootfsImage, ci.config.RootfsImageRef, ci.config.RootfsImageName} {
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// restoreConfig is cfg with the checkpoint's image and process: the
// container is made of the image the checkpoint was taken from, and what
// its status shows of the process is what was restored.
func (ci *checkpointImport) restoreConfig(cfg *runtimeapi.ContainerConfig, imageRef string) *runtimeapi.ContainerConfig {
	out := proto.Clone(cfg).(*runtimeapi.ContainerConfig)
	out.Image = &runtimeapi.ImageSpec{Image: imageRef}
	out.Command, out.Args, out.WorkingDir = ci.spec.Process.Args, nil, ci.spec.Process.Cwd
	out.Tty, out.Stdin, out.StdinOnce = false, false, false
	return out
}

// extract writes the checkpoint's CRIU images into dir/checkpoint and
// returns its deleted files, the rootfs diff left in dir/rootfs-diff.tar
// for the caller to open. Only the files a restore reads are taken,
// under names pinrt chooses.
func (ci *checkpointImport) extract(dir string) (deleted []string, err error) {
	images := filepath.Join(dir, checkpointImagesDir)
	if err := os.Mkdir(images, 0o700); err != nil {
		return nil, err
	}
	err = ci.src.each(func(name string, r io.Reader) error {
		var err error
		switch {
		case name == rootfsDiffFile:
			err = copyNew(filepath.Join(dir, rootfsDiffFile), r)
		case name == deletedFilesFile:
			var b []byte
			if b, err = io.ReadAll(io.LimitReader(r, maxCheckpointMetadata)); err == nil {
				if err = json.Unmarshal(b, &deleted); err != nil {
					err = invalid("%s: %v", deletedFilesFile, err)
				}
			}
		case path.Dir(name) == checkpointImagesDir:
			err = copyNew(filepath.Join(images, path.Base(name)), r)
		}
		if err != nil {
			return fmt.Errorf("checkpoint %q: %s: %w", ci.src.name, name, err)
		}
		return nil
	})
	return deleted, err
}

// copyNew writes r to the new file p.
func copyNew(p string, r io.Reader) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// rootfsChanges opens what extract left of the archive's rootfs diff in
// dir; done closes and removes it.
func rootfsChanges(dir string, deleted []string) (_ *image.RootfsChanges, done func(), err error) {
	c := &image.RootfsChanges{Deleted: deleted}
	p := filepath.Join(dir, rootfsDiffFile)
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return c, func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	c.Diff = f
	return c, func() { f.Close(); _ = os.Remove(p) }, nil
}

// writeRestoreCRIUConfig writes CRIU's configuration of a restore into
// dir and names it in spec: established TCP connections come back
// closed, since the new pod has another address.
func writeRestoreCRIUConfig(dir string, spec *specs.Spec) error {
	p := filepath.Join(dir, restoreCRIUConfig)
	if err := os.WriteFile(p, []byte("tcp-close\n"), 0o600); err != nil {
		return err
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	spec.Annotations[criuConfigAnnotation] = p
	return nil
}

// checkpointOf says where the checkpoint is that a CreateContainer's
// image names: an archive's path, or an image in the store carrying the
// checkpoint annotation, refused unless the node restores checkpoint
// images; ok is false for an ordinary image.
func (s *Server) checkpointOf(ref string) (src checkpointSource, ok bool, err error) {
	if isCheckpointArchive(ref) {
		return archiveSource(ref), true, nil
	}
	img, err := s.deps.Images.Get(ref)
	if err != nil || img.Annotations[checkpointImageAnnotation] == "" {
		return checkpointSource{}, false, nil
	}
	if !s.cfg.Runtime.RestoreCheckpointImages {
		return checkpointSource{}, false, fmt.Errorf("image %q is a checkpoint image, and restoring checkpoint images is off on this node (runtime.restore_checkpoint_images): %w", ref, errdefs.ErrFailedPrecondition)
	}
	return checkpointSource{name: ref, each: func(fn func(string, io.Reader) error) error {
		return s.deps.Images.TopLayerFiles(img.ID, fn)
	}}, true, nil
}

// importCheckpoint reads the checkpoint src, which cfg's image names, and
// returns the request to create its container with, in pod sb.
func (s *Server) importCheckpoint(sb *sandbox.Sandbox, cfg *runtimeapi.ContainerConfig, src checkpointSource) (*checkpointImport, *runtimeapi.ContainerConfig, error) {
	ci, err := readCheckpointImport(src)
	if err != nil {
		return nil, nil, err
	}
	var img *image.Image
	ref := ""
	for _, r := range ci.imageCandidates() {
		if img, err = s.deps.Images.Get(r); err == nil {
			ref = r
			break
		}
	}
	if img == nil {
		return nil, nil, fmt.Errorf("checkpoint %q: the image it was taken from (%s) is not present; pull it first: %w",
			ci.src.name, strings.Join(ci.imageCandidates(), ", "), errdefs.ErrNotFound)
	}
	// Shown by name where the name is the same image.
	if n := ci.config.RootfsImageName; n != "" && n != ref {
		if named, err := s.deps.Images.Get(n); err == nil && named.ID == img.ID {
			ref = n
		}
	}
	declared := map[string]struct{}{}
	for v := range img.Config.Volumes {
		declared[path.Clean(v)] = struct{}{}
	}
	if err := ci.check(sb, cfg, declared); err != nil {
		return nil, nil, err
	}
	return ci, ci.restoreConfig(cfg, ref), nil
}

// extractCheckpoint writes the archive's CRIU images into the new
// container's dir and opens its rootfs changes for the rootfs mount;
// done closes them.
func (r *containerRequest) extractCheckpoint(dir string) (done func(), err error) {
	deleted, err := r.checkpoint.extract(dir)
	if err != nil {
		return func() {}, err
	}
	r.changes, done, err = rootfsChanges(dir, deleted)
	if err != nil {
		return func() {}, err
	}
	return done, nil
}

// checkpointRestored drops what the restore of c's checkpoint needed
// once c runs: the images, which hold the checkpointed memory.
func (s *Server) checkpointRestored(ctx context.Context, c *sandbox.Container) {
	if err := os.RemoveAll(filepath.Join(c.Dir, checkpointImagesDir)); err != nil {
		log.G(ctx).WithError(err).WithField("container", c.ID).Warn("removing the restored checkpoint's images")
	}
}
