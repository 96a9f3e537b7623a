package oci

import (
	"fmt"
	"slices"

	"github.com/containerd/errdefs"
	nriapi "github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-tools/generate"
)

// ApplyNRIAdjustment applies what NRI plugins asked for (annotations,
// env, args, mounts, devices, CDI devices, hooks, rlimits, resources, OOM
// score, cgroups path) to a generated spec, in place.
//
// A container's namespaces are the pod's pins, joined by path, and its
// user namespace decides what every ID in the spec means: a plugin moving
// it out of them would break what the pod was promised, so any namespace
// adjustment is refused (the adaptation's validator refuses it first,
// naming the plugin; this is the check that holds whatever it does).
func ApplyNRIAdjustment(s *specs.Spec, adj *nriapi.ContainerAdjustment, cdi *CDIRegistry) error {
	if adj == nil {
		return nil
	}
	if s == nil || s.Linux == nil {
		return fmt.Errorf("NRI adjustment of an empty spec: %w", errdefs.ErrInvalidArgument)
	}
	if n := adj.GetLinux().GetNamespaces(); len(n) > 0 {
		return fmt.Errorf("NRI adjustment changes the namespaces (%s ...): a container stays in its pod's namespaces: %w", n[0].GetType(), errdefs.ErrInvalidArgument)
	}
	before := slices.Clone(s.Linux.Namespaces)
	g := generate.NewFromSpec(s)
	ng := nrigen.SpecGenerator(&g, nrigen.WithCDIDeviceInjector(func(sp *specs.Spec, names []string) error {
		if cdi == nil {
			return fmt.Errorf("CDI devices %s requested by an NRI plugin, but CDI is not configured: %w", quoteAll(names), errdefs.ErrFailedPrecondition)
		}
		if err := cdi.Resolve(names); err != nil {
			return err
		}
		_, _, err := cdi.inject(sp, names)
		return err
	}))
	if err := ng.Adjust(adj); err != nil {
		if errdefs.IsFailedPrecondition(err) {
			return fmt.Errorf("applying NRI adjustments: %w", err)
		}
		return fmt.Errorf("applying NRI adjustments: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if !slices.Equal(before, s.Linux.Namespaces) {
		return fmt.Errorf("NRI adjustment changed the namespaces: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
