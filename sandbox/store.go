package sandbox

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
)

// Names reserves unique names: a second reservation of a name held by
// another ID fails with AlreadyExists until the name is released.
type Names struct {
	mu    sync.Mutex
	names map[string]string // name -> ID
}

// NewNames returns an empty registry.
func NewNames() *Names { return &Names{names: map[string]string{}} }

// Reserve binds name to id. Reserving the same pair twice is fine.
func (n *Names) Reserve(name, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if held, ok := n.names[name]; ok && held != id {
		return fmt.Errorf("name %q is reserved by %s: %w", name, held, errdefs.ErrAlreadyExists)
	}
	n.names[name] = id
	return nil
}

// Release frees name if id holds it.
func (n *Names) Release(name, id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names[name] == id {
		delete(n.names, name)
	}
}

// Store holds items by ID and resolves unique ID prefixes, as crictl
// users type them.
type Store[T any] struct {
	mu    sync.RWMutex
	items map[string]T
	// ids are the items' IDs in order, kept sorted as items come and go:
	// kubelet lists every container each second, and sorting the IDs
	// anew was most of a list.
	ids  []string
	kind string
}

// NewStore returns an empty store; kind names the items in errors.
func NewStore[T any](kind string) *Store[T] {
	return &Store[T]{items: map[string]T{}, kind: kind}
}

// Add stores v under id.
func (s *Store[T]) Add(id string, v T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.items[id]; !ok {
		i, _ := slices.BinarySearch(s.ids, id)
		s.ids = slices.Insert(s.ids, i, id)
	}
	s.items[id] = v
}

// Delete removes id; it is idempotent.
func (s *Store[T]) Delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.items[id]; !ok {
		return
	}
	delete(s.items, id)
	if i, found := slices.BinarySearch(s.ids, id); found {
		s.ids = slices.Delete(s.ids, i, i+1)
	}
}

// Get finds an item by full ID or unique prefix.
func (s *Store[T]) Get(id string) (T, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var zero T
	if id == "" {
		return zero, fmt.Errorf("%s ID is empty: %w", s.kind, errdefs.ErrInvalidArgument)
	}
	if v, ok := s.items[id]; ok {
		return v, nil
	}
	var found []string
	for k := range s.items {
		if strings.HasPrefix(k, id) {
			found = append(found, k)
		}
	}
	switch len(found) {
	case 0:
		return zero, fmt.Errorf("%s %q: %w", s.kind, id, errdefs.ErrNotFound)
	case 1:
		return s.items[found[0]], nil
	default:
		return zero, fmt.Errorf("%s ID prefix %q is ambiguous (%d matches): %w", s.kind, id, len(found), errdefs.ErrInvalidArgument)
	}
}

// List returns every item, ordered by ID for stable output.
func (s *Store[T]) List() []T {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]T, len(s.ids))
	for i, id := range s.ids {
		out[i] = s.items[id]
	}
	return out
}
