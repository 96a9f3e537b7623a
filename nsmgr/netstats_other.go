//go:build !linux

package nsmgr

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// NetDevStats needs Linux network namespaces.
func NetDevStats(pin string) ([]NetDev, error) {
	return nil, fmt.Errorf("network counters: %w", errdefs.ErrNotImplemented)
}
