package server

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/internal/validate"
	"github.com/pinrt/pinrt/sandbox"
)

// lookupForRemoval finds id for a Stop or Remove RPC. api.proto says
// stopping or removing something that does not exist (or no longer does)
// must succeed, so an unknown ID reports gone rather than NotFound:
// kubelet retries a removal whose answer it lost, and the object is gone
// by then. An ID that could never name anything (empty, or not in ID
// syntax) is still InvalidArgument: that is a caller bug, not a retry.
func lookupForRemoval[T any](store *sandbox.Store[T], id string) (v T, gone bool, err error) {
	if err := validate.ID("", id); err != nil {
		return v, false, err
	}
	v, err = store.Get(id)
	if errdefs.IsNotFound(err) {
		return v, true, nil
	}
	return v, false, err
}

// validName checks a pod or container name, namespace or uid against the
// one shared rule.
func validName(what, v string) error { return validate.Name(what, v) }

// lockReadyPod finds a pod and takes its lifecycle lock for a
// CreateContainer. Under the lock, the pod must still be in the store and
// Ready: a StopPodSandbox or RemovePodSandbox that got the lock first has
// stopped or removed it, and a container created after that would outlive
// its pod, holding its rootfs mount and its cgroup directories. The caller
// holds the lock until the container is recorded, so a Stop or Remove that
// comes later sees it and cleans it up.
func (s *Server) lockReadyPod(id string) (*sandbox.Sandbox, func(), error) {
	sb, err := s.sandboxes.Get(id)
	if err != nil {
		return nil, nil, err
	}
	unlock := sb.Lock()
	if cur, err := s.sandboxes.Get(sb.ID); err != nil || cur != sb {
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s was removed: %w", sb.ID, errdefs.ErrNotFound)
	}
	if st := sb.Status().State; st != sandbox.StateReady {
		unlock()
		return nil, nil, fmt.Errorf("sandbox %s is not ready: %w", sb.ID, errdefs.ErrFailedPrecondition)
	}
	return sb, unlock, nil
}

// makeContainerDir creates <root>/containers/<id>, which holds the
// container's rootfs mount. Any host user who could reach the rootfs could
// run its setuid binaries or read its files, so the directory is 0700. A
// userns container's runc init resolves the rootfs path after joining the
// pod's user namespace, as the pod's root, which has no rights over files
// of the host's root: for it the directory is 0710 with the group of the
// pod's root (the host GID of container GID 0), as Docker does for its
// remapped root (CVE-2021-41091). Other users still cannot enter.
func makeContainerDir(dir string, sb *sandbox.Sandbox) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if sb.Modes.User != sandbox.ModePod {
		return os.Chmod(dir, 0o700)
	}
	// The daemon runs as root; unit tests may not, and cannot chown.
	if err := os.Chown(dir, -1, int(rootOf(sb.GIDMappings))); err != nil && os.Geteuid() == 0 {
		return fmt.Errorf("giving the pod's root access to %s: %w", dir, err)
	}
	return os.Chmod(dir, 0o710)
}
