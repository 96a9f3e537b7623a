package oci

import (
	"fmt"
	"path"
	"slices"

	"github.com/containerd/errdefs"
	nriapi "github.com/containerd/nri/pkg/api"
	nrigen "github.com/containerd/nri/pkg/runtime-tools/generate"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-tools/generate"
)

// ApplyNRIAdjustment applies what NRI plugins asked for (annotations,
// env, args, mounts, devices, CDI devices, hooks, rlimits, resources, OOM
// score, cgroups path) to a generated spec, in place. In a pod with its
// own user namespace (u set) the device nodes and bind mounts the
// adjustment adds are rewritten to work there, as CDI's are
// (rewriteForUserNS).
//
// A container's namespaces are the pod's pins, joined by path, and its
// user namespace decides what every ID in the spec means: a plugin moving
// it out of them would break what the pod was promised, so any namespace
// adjustment is refused (the adaptation's validator refuses it first,
// naming the plugin; this is the check that holds whatever it does).
func ApplyNRIAdjustment(s *specs.Spec, adj *nriapi.ContainerAdjustment, cdi *CDIRegistry, u *PodUserNS) error {
	if adj == nil {
		return nil
	}
	if s == nil || s.Linux == nil {
		return fmt.Errorf("NRI adjustment of an empty spec: %w", errdefs.ErrInvalidArgument)
	}
	if n := adj.GetLinux().GetNamespaces(); len(n) > 0 {
		return fmt.Errorf("NRI adjustment changes the namespaces (%s ...): a container stays in its pod's namespaces: %w", n[0].GetType(), errdefs.ErrInvalidArgument)
	}
	if err := validNRIAdjustment(adj); err != nil {
		return fmt.Errorf("NRI adjustment: %w: %w", err, errdefs.ErrInvalidArgument)
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
		return cdi.injectForUserNS(sp, names, u)
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
	if err := nriForUserNS(s, adj, u); err != nil {
		return fmt.Errorf("applying NRI adjustments: %w", err)
	}
	return nil
}

// nriForUserNS rewrites the device nodes and mounts adj added to s for a
// pod with a user namespace: a plugin names a device by its container
// path and numbers only, so its host node is looked up.
func nriForUserNS(s *specs.Spec, adj *nriapi.ContainerAdjustment, u *PodUserNS) error {
	if u == nil {
		return nil
	}
	var nodes []hostNode
	for _, d := range adj.GetLinux().GetDevices() {
		if _, removed := d.IsMarkedForRemoval(); removed {
			continue
		}
		host, err := hostDeviceNode(d.ToOCI())
		if err != nil {
			return err
		}
		nodes = append(nodes, hostNode{Path: d.GetPath(), HostPath: host})
	}
	var dsts []string
	for _, m := range adj.GetMounts() {
		if _, removed := m.IsMarkedForRemoval(); !removed {
			dsts = append(dsts, m.GetDestination())
		}
	}
	return rewriteForUserNS(s, nodes, dsts, u)
}

// rlimitTypes are the resource limits runc knows; runc refuses others
// only once conmon and runc already run.
var rlimitTypes = map[string]bool{
	"RLIMIT_AS": true, "RLIMIT_CORE": true, "RLIMIT_CPU": true, "RLIMIT_DATA": true,
	"RLIMIT_FSIZE": true, "RLIMIT_LOCKS": true, "RLIMIT_MEMLOCK": true, "RLIMIT_MSGQUEUE": true,
	"RLIMIT_NICE": true, "RLIMIT_NOFILE": true, "RLIMIT_NPROC": true, "RLIMIT_RSS": true,
	"RLIMIT_RTPRIO": true, "RLIMIT_RTTIME": true, "RLIMIT_SIGPENDING": true, "RLIMIT_STACK": true,
}

// validNRIAdjustment checks what the generator copies into the spec
// unchecked, so that a bad adjustment is refused before anything runs,
// with the plugin's name (the adaptation's validators call this).
func validNRIAdjustment(adj *nriapi.ContainerAdjustment) error {
	for _, r := range adj.GetRlimits() {
		if !rlimitTypes[r.GetType()] {
			return fmt.Errorf("unknown rlimit %q", r.GetType())
		}
		if r.GetSoft() > r.GetHard() {
			return fmt.Errorf("rlimit %s: soft limit %d above hard limit %d", r.GetType(), r.GetSoft(), r.GetHard())
		}
	}
	for _, m := range adj.GetMounts() {
		if _, removed := m.IsMarkedForRemoval(); !removed && !path.IsAbs(m.GetDestination()) {
			return fmt.Errorf("mount destination %q is not absolute", m.GetDestination())
		}
	}
	for _, d := range adj.GetLinux().GetDevices() {
		if _, removed := d.IsMarkedForRemoval(); removed {
			continue
		}
		if !path.IsAbs(d.GetPath()) {
			return fmt.Errorf("device path %q is not absolute", d.GetPath())
		}
		if !slices.Contains([]string{"c", "b", "u", "p"}, d.GetType()) {
			return fmt.Errorf("device %s: unknown type %q", d.GetPath(), d.GetType())
		}
	}
	h := adj.GetHooks()
	for _, list := range [][]*nriapi.Hook{h.GetPrestart(), h.GetCreateRuntime(), h.GetCreateContainer(), h.GetStartContainer(), h.GetPoststart(), h.GetPoststop()} {
		for _, hk := range list {
			if !path.IsAbs(hk.GetPath()) {
				return fmt.Errorf("hook path %q is not absolute", hk.GetPath())
			}
		}
	}
	return nil
}
