//go:build !linux

package nsmgr

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
)

// Manager needs Linux namespaces; elsewhere every method fails.
type Manager struct{ runDir string }

// NewManager returns a Manager whose operations are not implemented.
func NewManager(runDir string) (*Manager, error) { return &Manager{runDir: runDir}, nil }

func (m *Manager) Create(ctx context.Context, req CreateRequest) (Pins, error) {
	return nil, fmt.Errorf("pod namespaces: %w", errdefs.ErrNotImplemented)
}

func (m *Manager) Open(ctx context.Context, id string, kinds []Kind) (Pins, error) {
	return nil, fmt.Errorf("pod namespaces: %w", errdefs.ErrNotImplemented)
}

func (m *Manager) Remove(ctx context.Context, id string) error {
	return fmt.Errorf("pod namespaces: %w", errdefs.ErrNotImplemented)
}

func (m *Manager) Path(kind Kind, id string) string { return pinPath(m.runDir, kind, id) }
