package server

import (
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pinrt/pinrt/oci"
)

// validRunAs enforces api.proto's rule for both pods and containers:
// run_as_group "should only be specified when run_as_user or
// run_as_username is specified; otherwise, the runtime MUST error". A
// group alone would otherwise silently pair with the image's USER.
func validRunAs(what string, user *runtimeapi.Int64Value, username string, group *runtimeapi.Int64Value) error {
	if group != nil && user == nil && username == "" {
		return invalid("%s: run_as_group %d without run_as_user or run_as_username", what, group.Value)
	}
	return nil
}

// seccompProfile is the container's seccomp choice. The CRI defines an
// unset profile as Unconfined (kubelet sends RuntimeDefault itself when the
// pod asks for it); operators who want the opposite default set
// runtime.seccomp_default_when_unset.
func (s *Server) seccompProfile(p *runtimeapi.SecurityProfile) (oci.SecurityProfile, error) {
	if p == nil {
		if s.cfg.Runtime.SeccompDefaultWhenUnset {
			return oci.SecurityProfile{Type: oci.ProfileRuntimeDefault}, nil
		}
		return oci.SecurityProfile{Type: oci.ProfileUnconfined}, nil
	}
	return securityProfile(p)
}

// groupsPolicy converts the CRI's SupplementalGroupsPolicy. Merge (the
// default) keeps the image's /etc/group memberships of the user; Strict
// uses only the groups the request names.
func groupsPolicy(p runtimeapi.SupplementalGroupsPolicy) (oci.GroupsPolicy, error) {
	switch p {
	case runtimeapi.SupplementalGroupsPolicy_Merge:
		return oci.GroupsMerge, nil
	case runtimeapi.SupplementalGroupsPolicy_Strict:
		return oci.GroupsStrict, nil
	}
	return 0, invalid("unknown supplemental groups policy %v", p)
}
