package oci

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// Features is what pinrt needs from `<runtime> features`.
type Features struct {
	// IDMapMounts is linux.mountExtensions.idmap.enabled.
	IDMapMounts bool
	// RecursiveReadOnly is true when mountOptions lists "rro".
	RecursiveReadOnly bool
	MountOptions      []string
	// Raw is the parsed output; nil when the runtime has no features command.
	Raw *features.Features
}

// ParseFeatures parses the JSON printed by `runc features`.
func ParseFeatures(b []byte) (*Features, error) {
	var raw features.Features
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("parse runtime features: %w", err)
	}
	f := &Features{Raw: &raw, MountOptions: raw.MountOptions}
	f.RecursiveReadOnly = slices.Contains(raw.MountOptions, "rro")
	if l := raw.Linux; l != nil && l.MountExtensions != nil && l.MountExtensions.IDMap != nil &&
		l.MountExtensions.IDMap.Enabled != nil {
		f.IDMapMounts = *l.MountExtensions.IDMap.Enabled
	}
	return f, nil
}
