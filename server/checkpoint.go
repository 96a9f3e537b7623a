package server

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/image"
	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// Checkpointing a container is kubelet's forensic checkpoint (its
// /checkpoint endpoint, crictl checkpoint): CRIU dumps the running
// container through the OCI runtime, which keeps running, and the dump
// goes into one tar archive at the caller's path, laid out as CRI-O and
// containerd lay theirs out so that checkpointctl and the tools built on
// it read it:
//
//	checkpoint/       CRIU's images (pstree.img, core-*.img, pages-*.img)
//	dump.log          CRIU's log of the dump
//	stats-dump        CRIU's statistics of the dump
//	config.dump       the container: id, name, image, runtime, when created and checkpointed
//	spec.dump         its OCI spec (config.json)
//	rootfs-diff.tar   what it changed in its rootfs (the overlay's writable layer)
//	deleted.files     the image's files it deleted, as a JSON list
//
// The images are dumped into a directory of their own under
// <root>/checkpoints, removed once archived, or once the runtime is done
// with it when the caller gave up first (and at the next start after a
// crash, likewise). The archive is written as an unnamed file in the
// target's directory and named only once complete, so a failure or a
// crash at any instant leaves no partial archive; an existing file is
// never overwritten. Restoring a checkpoint (a container created from a
// checkpoint image) and pod checkpoints are not supported.

// checkpointWorkDir holds the dumps in progress, under the state root.
const checkpointWorkDir = "checkpoints"

// checkpointConfig is config.dump, the fields checkpointctl reads of
// the container metadata Podman, CRI-O and containerd write.
type checkpointConfig struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	RootfsImage     string    `json:"rootfsImage,omitempty"`
	RootfsImageRef  string    `json:"rootfsImageRef,omitempty"`
	RootfsImageName string    `json:"rootfsImageName,omitempty"`
	OCIRuntime      string    `json:"runtime,omitempty"`
	CreatedTime     time.Time `json:"createdTime"`
	CheckpointedAt  time.Time `json:"checkpointedTime"`
}

// CheckpointContainer dumps a running container into an archive at
// req.Location, an absolute path whose directory exists and where no
// file is. req.Timeout, when set, bounds the dump in seconds.
func (s *Server) CheckpointContainer(ctx context.Context, req *runtimeapi.CheckpointContainerRequest) (*runtimeapi.CheckpointContainerResponse, error) {
	if err := checkpointLocation(req.Location); err != nil {
		return nil, err
	}
	if req.Timeout < 0 {
		return nil, fmt.Errorf("checkpoint timeout %d s is negative: %w", req.Timeout, errdefs.ErrInvalidArgument)
	}
	c, err := s.containers.Get(req.ContainerId)
	if err != nil {
		return nil, err
	}
	s.observeContainer(ctx, c, true)
	if st := c.Status().State; st != sandbox.ContainerRunning {
		return nil, fmt.Errorf("checkpoint of container %s: it is %s, not running: %w", c.ID, st, errdefs.ErrFailedPrecondition)
	}
	rt, err := s.runtimeFor(c.Handler)
	if err != nil {
		return nil, err
	}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeoutSeconds(req.Timeout))
		defer cancel()
	}
	parent := filepath.Join(s.cfg.Root, checkpointWorkDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(parent, c.ID+"-")
	if err != nil {
		return nil, err
	}
	// A dump the caller gave up on runs on (oci.Checkpoint): its
	// directory goes once the runtime is done, else runc would make it
	// again and fill it.
	defer func() {
		if ctx.Err() != nil {
			go removeDumpWhenDone(context.WithoutCancel(ctx), work)
			return
		}
		removeDump(ctx, work)
	}()
	images := filepath.Join(work, "checkpoint")
	if err := os.Mkdir(images, 0o700); err != nil {
		return nil, err
	}
	started := time.Now()
	if err := rt.Checkpoint(ctx, c.ID, images, work); err != nil {
		return nil, fmt.Errorf("checkpoint of container %s: %w", c.ID, err)
	}
	cfg := checkpointConfig{
		ID: c.ID, Name: c.Name, RootfsImage: c.ImageID, RootfsImageRef: c.ImageRef, RootfsImageName: c.Image,
		OCIRuntime: c.Handler, CreatedTime: c.CreatedAt, CheckpointedAt: started,
	}
	if err := writeArchive(req.Location, func(w io.Writer) error { return checkpointArchive(w, c, work, &cfg) }); err != nil {
		return nil, fmt.Errorf("checkpoint archive of container %s: %w", c.ID, err)
	}
	log.G(ctx).WithField("container", c.ID).WithField("archive", req.Location).Info("container checkpointed")
	return &runtimeapi.CheckpointContainerResponse{}, nil
}

// checkpointLocation checks the archive's path: absolute and clean, in
// a directory that exists, with nothing there yet.
func checkpointLocation(p string) error {
	if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("checkpoint location %q: want the clean absolute path of the archive to write: %w", p, errdefs.ErrInvalidArgument)
	}
	if fi, err := os.Stat(filepath.Dir(p)); err != nil || !fi.IsDir() {
		return fmt.Errorf("checkpoint location %q: its directory does not exist: %w", p, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(p); err == nil {
		return fmt.Errorf("checkpoint location %q: a file is there already: %w", p, errdefs.ErrAlreadyExists)
	}
	return nil
}

// writeArchive writes a new file at p with fill: into an unnamed file in
// p's directory, synced, then linked at p, so that p is complete or
// absent whatever happens meanwhile. A file that appeared at p meanwhile
// is AlreadyExists and is left alone.
func writeArchive(p string, fill func(io.Writer) error) (retErr error) {
	f, err := os.OpenFile(filepath.Dir(p), os.O_WRONLY|unixTmpfile, 0o600)
	if err != nil {
		return fmt.Errorf("create the archive in %s: %w", filepath.Dir(p), err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := fill(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := linkFd(f, p); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("checkpoint location %q: a file appeared there during the dump: %w", p, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("name the archive %s: %w", p, err)
	}
	return nil
}

// checkpointArchive writes the archive's entries: CRIU's images and log
// from work, the container's metadata and spec, its rootfs diff.
func checkpointArchive(w io.Writer, c *sandbox.Container, work string, cfg *checkpointConfig) error {
	tw := tar.NewWriter(w)
	if err := addTree(tw, filepath.Join(work, "checkpoint"), "checkpoint"); err != nil {
		return err
	}
	// CRIU's log and statistics (checkpointctl inspect --stats reads
	// them at the top, where Podman puts them).
	for _, name := range []string{"dump.log", "stats-dump"} {
		if err := addFile(tw, filepath.Join(work, name), name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := addFile(tw, filepath.Join(c.Dir, "config.json"), "spec.dump"); err != nil {
		return err
	}
	cj, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := addBytes(tw, "config.dump", cj); err != nil {
		return err
	}
	diff, err := os.CreateTemp(work, "rootfs-diff-")
	if err != nil {
		return err
	}
	defer diff.Close()
	deleted, err := image.WriteRootfsDiff(c.Dir, diff)
	if err != nil {
		return err
	}
	if err := addOpenFile(tw, diff, "rootfs-diff.tar"); err != nil {
		return err
	}
	if len(deleted) > 0 {
		dj, err := json.Marshal(deleted)
		if err != nil {
			return err
		}
		if err := addBytes(tw, "deleted.files", dj); err != nil {
			return err
		}
	}
	return tw.Close()
}

// addTree adds the regular files of dir (CRIU's images: one level, no
// links) under name/.
func addTree(tw *tar.Writer, dir, name string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o700, ModTime: time.Now()}); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if err := addFile(tw, filepath.Join(dir, e.Name()), name+"/"+e.Name()); err != nil {
			return err
		}
	}
	return nil
}

func addFile(tw *tar.Writer, p, name string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return addOpenFile(tw, f, name)
}

// addOpenFile adds f's whole content, from its start, as name.
func addOpenFile(tw *tar.Writer, f *os.File, name string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func addBytes(tw *tar.Writer, name string, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(b)), ModTime: time.Now()}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}

// sweepCheckpoints removes the dumps a crash left behind. A dump whose
// runtime is still at work (it outlives pinrt, see oci.Checkpoint) keeps
// its directory until the runtime exits: removed now, the runtime would
// make it again and fill it.
func (s *Server) sweepCheckpoints(ctx context.Context) {
	parent := filepath.Join(s.cfg.Root, checkpointWorkDir)
	ents, err := os.ReadDir(parent)
	if err != nil || len(ents) == 0 {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(parent, e.Name())
		if !dumping(dir) {
			removeDump(ctx, dir)
			continue
		}
		log.G(ctx).WithField("dir", dir).Info("restore: a checkpoint is still being dumped; its directory goes when it ends")
		go removeDumpWhenDone(ctx, dir)
	}
}

// removeDumpWhenDone removes a dump's directory once no runtime dumps
// into it any more.
func removeDumpWhenDone(ctx context.Context, dir string) {
	for deadline := time.Now().Add(dumpWait); dumping(dir) && time.Now().Before(deadline); {
		time.Sleep(time.Second)
	}
	removeDump(ctx, dir)
}

// dumpWait bounds the wait for a dump that outlived pinrt.
const dumpWait = 30 * time.Minute

func removeDump(ctx context.Context, dir string) {
	if err := os.RemoveAll(dir); err != nil {
		log.G(ctx).WithError(err).WithField("dir", dir).Warn("removing a checkpoint's dump")
	}
}

// dumping reports whether a process's command line names dir: the
// runtime dumping into it (its --image-path and --work-path).
func dumping(dir string) bool {
	want := []byte(dir + "/")
	return oci.AnyProcess(func(cmdline []byte) bool { return bytes.Contains(cmdline, want) })
}

// unixTmpfile opens an unnamed file in a directory (O_TMPFILE); linkFd
// names it. Both need a file system with O_TMPFILE (ext4, xfs, btrfs,
// tmpfs), as kubelet's /var/lib/kubelet/checkpoints is on.
const unixTmpfile = unix.O_TMPFILE

// linkFd gives the unnamed file f the name p; fs.ErrExist if p exists.
func linkFd(f *os.File, p string) error {
	return os.NewSyscallError("linkat", unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW))
}

// CheckpointPod is not supported.
func (s *Server) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	return nil, fmt.Errorf("checkpointing pod %s: pinrt checkpoints containers (CheckpointContainer), not pods with their pinned namespaces: %w", req.GetPodSandboxId(), errdefs.ErrNotImplemented)
}

// RestorePod is not supported.
func (s *Server) RestorePod(ctx context.Context, req *runtimeapi.RestorePodRequest) (*runtimeapi.RestorePodResponse, error) {
	return nil, fmt.Errorf("restoring a pod from %q: pinrt has no checkpoint restore: %w", req.CheckpointPath, errdefs.ErrNotImplemented)
}
