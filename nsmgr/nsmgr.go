package nsmgr

import (
	"fmt"
	"path/filepath"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/pinrt/pinrt/internal/validate"
)

// Kind names a namespace type that nsmgr can create and pin. The value is
// both the directory under <runDir>/ns and the name under /proc/<pid>/ns.
type Kind string

// The namespace kinds a pod can own. PID and mount namespaces belong to
// containers, not to the sandbox, so they are not pinned here.
const (
	User Kind = "user"
	Net  Kind = "net"
	IPC  Kind = "ipc"
	UTS  Kind = "uts"
)

// allKinds is the order in which pins are made and removed. The user
// namespace comes first so that a half-made pod never has an owned
// namespace pinned without its owner.
var allKinds = []Kind{User, Net, IPC, UTS}

// CreateRequest describes the namespaces of one pod.
type CreateRequest struct {
	// ID is the sandbox ID; it becomes the pin file name.
	ID string
	// Kinds lists the namespaces to create. A kind that is absent stays
	// in host mode and is simply not created.
	Kinds []Kind
	// UIDMappings and GIDMappings are required if and only if Kinds
	// contains User. Container ID 0 must be mapped: the pod's root is
	// the one inside who may administer the namespaces it owns.
	UIDMappings []specs.LinuxIDMapping
	GIDMappings []specs.LinuxIDMapping
	// Sysctls are applied inside the new namespaces, see ValidateSysctls.
	Sysctls map[string]string
	// Hostname is set in the new UTS namespace, so the pod has its name
	// before any container exists. It needs UTS in Kinds.
	Hostname string
}

// Pins maps each created namespace kind to its pin path.
type Pins map[Kind]string

// ValidateID reports whether id can be used as a sandbox ID in a pin path;
// the rule is the one shared by every package (internal/validate).
func ValidateID(id string) error { return validate.ID("sandbox", id) }

func validKind(k Kind) bool {
	switch k {
	case User, Net, IPC, UTS:
		return true
	}
	return false
}

// kindSet validates kinds and returns them as a set.
func kindSet(kinds []Kind) (map[Kind]bool, error) {
	set := make(map[Kind]bool, len(kinds))
	for _, k := range kinds {
		if !validKind(k) {
			return nil, fmt.Errorf("unknown namespace kind %q: %w", k, errdefs.ErrInvalidArgument)
		}
		if set[k] {
			return nil, fmt.Errorf("namespace kind %q listed twice: %w", k, errdefs.ErrInvalidArgument)
		}
		set[k] = true
	}
	return set, nil
}

// pinPath joins a pin path; callers validate kind and id first.
func pinPath(runDir string, kind Kind, id string) string {
	return filepath.Join(runDir, "ns", string(kind), id)
}
