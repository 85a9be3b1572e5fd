package store

import (
	"context"
	"maps"
	"slices"
	"sync"
)

// Memory is a Store that keeps routes in memory only: ownership holds while the process runs.
// The zero value is ready to use. Its calls never wait for anything but each other, so the
// context they take is only checked as they begin.
type Memory struct {
	mu     sync.Mutex
	routes map[string]*Route
	closed bool
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory { return &Memory{} }

// Update implements Store.
func (m *Memory) Update(ctx context.Context, key string, fn func(cur *Route) (*Route, error)) (*Route, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	next, err := fn(m.routes[key].Clone())
	if err != nil {
		return nil, err
	}
	if next == nil {
		delete(m.routes, key)
		return nil, nil
	}
	if m.routes == nil {
		m.routes = map[string]*Route{}
	}
	m.routes[key] = next.Clone()
	return next.Clone(), nil
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, key string) (*Route, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	return m.routes[key].Clone(), nil
}

// List implements Store.
func (m *Memory) List(ctx context.Context) ([]*Route, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	// Sort by the store key (what Update was given), as Bolt does, not by Route.Key: the two
	// differ only for a route stored under a key other than its own, but then too List must
	// give one order whichever store is behind it.
	keys := slices.Sorted(maps.Keys(m.routes))
	out := make([]*Route, 0, len(keys))
	for _, k := range keys {
		out = append(out, m.routes[k].Clone())
	}
	return out, nil
}

// Close implements Store.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
