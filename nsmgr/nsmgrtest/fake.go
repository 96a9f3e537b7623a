// Package nsmgrtest provides a hand-written, in-memory fake of
// *nsmgr.Manager for the tests of packages that create pod namespaces
// (sandbox, server). It creates no namespace and touches no file; it
// records every call and fails on demand through typed fields.
package nsmgrtest

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"github.com/containerd/errdefs"

	"github.com/pinrt/pinrt/nsmgr"
)

// Call records one method call on the fake.
type Call struct {
	Method string // "Create", "Open" or "Remove"
	ID     string
	// Request is the full request of a Create call.
	Request nsmgr.CreateRequest
	// Kinds are the kinds asked for by Create or Open.
	Kinds []nsmgr.Kind
}

// Manager has the method set of *nsmgr.Manager. The zero value is not
// usable; call New. Set the error fields before use or under no
// concurrent calls.
type Manager struct {
	// RunDir is the root of the pin paths the fake hands out.
	RunDir string

	// CreateErr, if set, is returned by every Create and nothing is
	// recorded as pinned.
	CreateErr error
	// OpenErr and RemoveErr are returned for the sandbox ID used as key.
	OpenErr   map[string]error
	RemoveErr map[string]error

	mu    sync.Mutex
	pins  map[string]nsmgr.Pins
	calls []Call
}

// New returns a fake whose pin paths lie under runDir.
func New(runDir string) *Manager {
	return &Manager{RunDir: runDir, OpenErr: map[string]error{}, RemoveErr: map[string]error{}, pins: map[string]nsmgr.Pins{}}
}

// Path returns the pin path of kind for id, laid out like the real one.
func (m *Manager) Path(kind nsmgr.Kind, id string) string {
	return filepath.Join(m.RunDir, "ns", string(kind), id)
}

// Create validates the request the way the real Manager does before any
// side effect, then records the pins. Creating an ID that is already
// pinned is errdefs.ErrAlreadyExists, as the real O_EXCL pin would be.
func (m *Manager) Create(_ context.Context, req nsmgr.CreateRequest) (nsmgr.Pins, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, Call{Method: "Create", ID: req.ID, Request: req, Kinds: slices.Clone(req.Kinds)})
	if m.CreateErr != nil {
		return nil, m.CreateErr
	}
	if err := nsmgr.ValidateID(req.ID); err != nil {
		return nil, err
	}
	podNet, podIPC := slices.Contains(req.Kinds, nsmgr.Net), slices.Contains(req.Kinds, nsmgr.IPC)
	if err := nsmgr.ValidateSysctls(req.Sysctls, podNet, podIPC); err != nil {
		return nil, err
	}
	if _, ok := m.pins[req.ID]; ok {
		return nil, fmt.Errorf("namespaces of sandbox %q already pinned: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	pins := nsmgr.Pins{}
	for _, k := range req.Kinds {
		pins[k] = m.Path(k, req.ID)
	}
	m.pins[req.ID] = pins
	return clonePins(pins), nil
}

// Open returns OpenErr[id] if set, errdefs.ErrNotFound for a kind that
// was not created, and the pins otherwise.
func (m *Manager) Open(_ context.Context, id string, kinds []nsmgr.Kind) (nsmgr.Pins, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, Call{Method: "Open", ID: id, Kinds: slices.Clone(kinds)})
	if err := m.OpenErr[id]; err != nil {
		return nil, err
	}
	out := nsmgr.Pins{}
	for _, k := range kinds {
		p, ok := m.pins[id][k]
		if !ok {
			return nil, fmt.Errorf("%s namespace of sandbox %q: pin %s is missing: %w", k, id, m.Path(k, id), errdefs.ErrNotFound)
		}
		out[k] = p
	}
	return out, nil
}

// Remove returns RemoveErr[id] if set (keeping the pins); otherwise it
// forgets the pins. Like the real one it is idempotent.
func (m *Manager) Remove(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, Call{Method: "Remove", ID: id})
	if err := m.RemoveErr[id]; err != nil {
		return err
	}
	delete(m.pins, id)
	return nil
}

// Pinned returns the pins currently held for id, or nil.
func (m *Manager) Pinned(id string) nsmgr.Pins {
	m.mu.Lock()
	defer m.mu.Unlock()
	return clonePins(m.pins[id])
}

// Calls returns a copy of the calls made so far, in order.
func (m *Manager) Calls() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

func clonePins(p nsmgr.Pins) nsmgr.Pins {
	if p == nil {
		return nil
	}
	out := make(nsmgr.Pins, len(p))
	for k, v := range p {
		out[k] = v
	}
	return out
}
