//go:build !linux

package cni

import "github.com/containernetworking/cni/pkg/invoke"

// newPluginExec is libcni's own exec where there is no PR_SET_PDEATHSIG.
func newPluginExec() invoke.Exec { return nil }
