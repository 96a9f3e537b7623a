//go:build !linux

package nsmgr

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// NetDev needs Linux network namespaces.
func (c *Counters) NetDev(pin string) ([]NetDev, error) {
	return nil, fmt.Errorf("network counters: %w", errdefs.ErrNotImplemented)
}

// Close does nothing: no socket is ever opened.
func (c *Counters) Close() error { return nil }
