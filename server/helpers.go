package server

import (
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
	if err := sandbox.ValidateID(id); err != nil {
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
