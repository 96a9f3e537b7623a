package oci

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"github.com/moby/profiles/seccomp"
)

// WithSeccomp applies the seccomp profile. Privileged containers run
// unconfined, as in containerd and CRI-O. RuntimeDefault is moby's default
// profile, which reads the capabilities, so this must follow
// WithCapabilities.
func WithSeccomp(privileged bool, p SecurityProfile) SpecOpt {
	return func(g *Generator) error {
		g.Config.Linux.Seccomp = nil
		if privileged {
			return nil
		}
		switch p.Type {
		case ProfileUnconfined:
			return nil
		case ProfileRuntimeDefault:
			sc, err := seccomp.GetDefaultProfile(g.Config)
			if err != nil {
				return fmt.Errorf("default seccomp profile: %w", err)
			}
			g.Config.Linux.Seccomp = sc
			return nil
		case ProfileLocalhost:
			if !filepath.IsAbs(p.Localhost) {
				return fmt.Errorf("seccomp profile path %q is not absolute: %w", p.Localhost, errdefs.ErrInvalidArgument)
			}
			body, err := os.ReadFile(p.Localhost)
			if err != nil {
				if os.IsNotExist(err) {
					return fmt.Errorf("seccomp profile %s: %w", p.Localhost, errdefs.ErrNotFound)
				}
				return fmt.Errorf("read seccomp profile: %w", err)
			}
			sc, err := seccomp.LoadProfile(string(body), g.Config)
			if err != nil {
				return fmt.Errorf("seccomp profile %s: %w: %w", p.Localhost, err, errdefs.ErrInvalidArgument)
			}
			g.Config.Linux.Seccomp = sc
			return nil
		default:
			return fmt.Errorf("unknown seccomp profile type %d: %w", p.Type, errdefs.ErrInvalidArgument)
		}
	}
}

// WithAppArmor passes a host profile name through. pinrt loads no profile
// of its own, so RuntimeDefault and Unconfined leave the process unconfined
// by AppArmor; a named profile on a host without AppArmor is refused rather
// than silently ignored.
func WithAppArmor(p SecurityProfile, enabled bool) SpecOpt {
	return func(g *Generator) error {
		g.Config.Process.ApparmorProfile = ""
		if p.Type != ProfileLocalhost || p.Localhost == "" || p.Localhost == "unconfined" {
			return nil
		}
		if !enabled {
			return fmt.Errorf("apparmor profile %q requested but AppArmor is not enabled on this host: %w", p.Localhost, errdefs.ErrFailedPrecondition)
		}
		g.Config.Process.ApparmorProfile = p.Localhost
		return nil
	}
}

// WithSELinux sets the process label when the host runs SELinux. On a
// host without it the label is ignored, as containerd and CRI-O ignore
// it (go-selinux labels nothing there): pods and charts made for
// SELinux nodes set seLinuxOptions and run unchanged elsewhere, and
// Kubernetes' own e2e_node specs set them on every distribution. An
// AppArmor profile, which is refused then, is a different matter: it
// names a policy to load, which a host without AppArmor cannot apply.
func WithSELinux(label string, enabled bool) SpecOpt {
	return func(g *Generator) error {
		g.Config.Process.SelinuxLabel = ""
		if enabled {
			g.Config.Process.SelinuxLabel = label
		}
		return nil
	}
}
