package server

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/pinrt/pinrt/oci"
	"github.com/pinrt/pinrt/sandbox"
)

// The infra process of a shared-PID pod is pinrt's small helper binary
// (Deps.Pause, pinrt-exec) or, without it, pinrt itself, run as `pause`
// from a rootfs holding nothing but a copy of the binary (package
// internal/pause). It is PID 1 of the pod's PID namespace, which the
// pod's containers join; it needs no image and no pull.

// pauseRootfs guards the one-time preparation of the pause rootfs.
type pauseRootfs struct {
	mu   sync.Mutex
	path string
}

// pauseRootfsDir prepares <root>/pause/rootfs once per daemon run: a
// fresh copy of the pause binary, so an upgraded pinrt runs its own
// pause. The binary must be static, since the rootfs has no libc. It
// lives under the root, not the runroot: /run is noexec where an
// initramfs mounted it (Debian's does), and a bind mount keeps noexec
// locked in a user namespace, so a userns pod's pause could not be run
// from there (critest's NamespaceMode_POD in the VM found it).
func (s *Server) pauseRootfsDir() (string, error) {
	s.pause.mu.Lock()
	defer s.pause.mu.Unlock()
	if s.pause.path != "" {
		return s.pause.path, nil
	}
	exe := s.deps.Pause
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return "", err
		}
	}
	if err := checkStatic(exe); err != nil {
		return "", err
	}
	root := filepath.Join(s.cfg.Root, "pause", "rootfs")
	// The mount points must exist: a userns pod's mapped root cannot
	// create them in a directory owned by the host's root.
	for _, d := range []string{"proc", "dev", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Dir(root), 0o755); err != nil {
		return "", err
	}
	if err := copyFile(exe, filepath.Join(root, "pause"), 0o755); err != nil {
		return "", fmt.Errorf("preparing the pause rootfs: %w", err)
	}
	s.pause.path = root
	return root, nil
}

// checkStatic refuses a dynamically linked binary (one with an ELF
// interpreter): it could not run from the pause rootfs.
func checkStatic(exe string) error {
	f, err := elf.Open(exe)
	if err != nil {
		return fmt.Errorf("reading %s: %w", exe, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("a shared PID namespace (pid POD) needs the pause process, which runs %s from a rootfs without libc, "+
				"but it is dynamically linked; build it with CGO_ENABLED=0: %w", exe, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// copyFile replaces dst with a copy of src, atomically: a running pause
// keeps its old inode.
func copyFile(src, dst string, mode os.FileMode) (retErr error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.CreateTemp(filepath.Dir(dst), ".pause-*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			out.Close()
			os.Remove(out.Name())
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if err := out.Chmod(mode); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(out.Name(), dst)
}

func infraBundle(sandboxDir string) string { return filepath.Join(sandboxDir, "infra") }

// startInfra runs the pod's pause process in the pod's pinned namespaces
// and a new PID namespace, and records its ID in md. Its container ID is
// the sandbox ID: unique, and nothing else in the runtime uses it.
func (s *Server) startInfra(ctx context.Context, md *sandbox.Metadata) (retErr error) {
	rt, err := s.runtimeFor(md.Handler)
	if err != nil {
		return err
	}
	rootfs, err := s.pauseRootfsDir()
	if err != nil {
		return err
	}
	host := oci.ProbeHost()
	cgPath, err := s.placeContainerCgroup(ctx, md.CgroupParent, md.ID, md.ID)
	if err != nil {
		return err
	}
	ns := oci.Namespaces{User: md.Pins["user"], Net: md.Pins["net"], IPC: md.Pins["ipc"], UTS: md.Pins["uts"], PIDMode: oci.PIDContainer}
	spec, err := oci.GenerateSpec(ctx,
		oci.WithRootfs(rootfs, true),
		oci.WithNamespaces(ns, host.CgroupNS),
		oci.WithProcessArgs([]string{"/pause", "pause"}, nil, nil, nil),
		oci.WithCapabilities(false, nil, []string{"ALL"}, host.BoundingCaps),
		oci.WithNoNewPrivileges(true),
		oci.WithMaskedPaths(false, nil, nil),
		oci.WithSeccomp(false, oci.SecurityProfile{Type: oci.ProfileRuntimeDefault}),
		oci.WithSysfs(ns.User != "", ns.Net != "", false),
		oci.WithOOMScoreAdj(-998, host.OOMFloor),
		oci.WithFixedCgroupsPath(cgPath),
		oci.WithAnnotations(map[string]string{annContainerType: "sandbox", annSandboxID: md.ID}),
	)
	if err != nil {
		return err
	}
	bundle := infraBundle(s.sandboxDir(md.ID))
	pid, err := rt.Create(ctx, oci.CreateOptions{ID: md.ID, Bundle: bundle, Spec: spec, ExitDir: s.exitDir()})
	if err != nil {
		return fmt.Errorf("creating the infra process: %w", err)
	}
	defer func() {
		if retErr != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if err := s.removeInfra(cctx, md); err != nil {
				log.G(ctx).WithError(err).Warn("rollback: remove infra process")
			}
		}
	}()
	if err := rt.Start(ctx, md.ID); err != nil {
		return fmt.Errorf("starting the infra process: %w", err)
	}
	md.InfraID, md.InfraPid = md.ID, pid
	return nil
}

// stopInfra ends the pause process; SIGTERM is its clean exit.
func (s *Server) stopInfra(ctx context.Context, md *sandbox.Metadata) error {
	if md.InfraID == "" {
		return nil
	}
	rt, err := s.runtimeFor(md.Handler)
	if err != nil {
		return err
	}
	if err := rt.Stop(ctx, md.InfraID, syscall.SIGTERM, 2*time.Second); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("stopping the infra process: %w", err)
	}
	return nil
}

// removeInfra stops and deletes the pause process. It is idempotent.
func (s *Server) removeInfra(ctx context.Context, md *sandbox.Metadata) error {
	rt, err := s.runtimeFor(md.Handler)
	if err != nil {
		return err
	}
	if err := rt.Stop(ctx, md.ID, syscall.SIGKILL, 0); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("killing the infra process: %w", err)
	}
	if err := rt.Delete(ctx, md.ID, true); err != nil {
		return fmt.Errorf("deleting the infra process: %w", err)
	}
	if err := os.RemoveAll(infraBundle(s.sandboxDir(md.ID))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
