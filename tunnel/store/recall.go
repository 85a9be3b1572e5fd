package store

import (
	"context"
	"errors"
	"sync"
)

// Recall is a Store that remembers the last version it saw of every route it read, listed
// or wrote through another Store, for a store that may lose acknowledged writes: a NATS
// cluster whose every node restarted from a store missing its last writes (a power loss
// with the disks' caches lost, a restore from an older copy). Where the store holds no
// route that Recall remembers, Update hands fn the remembered route as if it were stored,
// so that what was decided on it stays decided (a route stays its tenant's, with its key
// and ports); and Lost lists such routes, which Restore writes back.
//
// A route deleted through Recall is forgotten; one deleted by another writer (its claim
// lapsed) stays remembered until its reader forgets it (Forget): only the reader knows when a
// route lapses. Reserved routes are not remembered: the configuration reserves them again.
// A route the store took back to an older version is not told from one another writer
// changed: Recall remembers the version it read last.
type Recall struct {
	Store
	mu   sync.Mutex
	seen map[string]*Route
}

// NewRecall returns a Recall over st.
func NewRecall(st Store) *Recall { return &Recall{Store: st, seen: map[string]*Route{}} }

// remember records r (nil: the route was deleted) as the last version seen of key.
func (c *Recall) remember(key string, r *Route) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r == nil || r.Reserved {
		delete(c.seen, key)
		return
	}
	c.seen[key] = r.Clone()
}

func (c *Recall) recalled(key string) *Route {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[key].Clone()
}

// Update implements Store; where the store holds no route at key, fn gets the remembered one
// (nil if none).
func (c *Recall) Update(ctx context.Context, key string, fn func(cur *Route) (*Route, error)) (*Route, error) {
	deleted := false
	r, err := c.Store.Update(ctx, key, func(cur *Route) (*Route, error) {
		if cur == nil {
			cur = c.recalled(key)
		}
		next, err := fn(cur)
		deleted = err == nil && next == nil
		return next, err
	})
	// A nil route without a deletion: fn wrote nothing where the store holds nothing, and the
	// remembered route (if any) stays remembered.
	if err == nil && (r != nil || deleted) {
		c.remember(key, r)
	}
	return r, err
}

// Get implements Store; a route the store does not hold stays remembered.
func (c *Recall) Get(ctx context.Context, key string) (*Route, error) {
	r, err := c.Store.Get(ctx, key)
	if err == nil && r != nil {
		c.remember(key, r)
	}
	return r, err
}

// List implements Store: it returns what the store holds (not what it lost).
func (c *Recall) List(ctx context.Context) ([]*Route, error) {
	rs, err := c.Store.List(ctx)
	if err == nil {
		for _, r := range rs {
			c.remember(r.Key(), r)
		}
	}
	return rs, err
}

// Lost returns the remembered routes that the store does not hold now, in no order.
func (c *Recall) Lost(ctx context.Context) ([]*Route, error) {
	rs, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	return c.Missing(rs), nil
}

// Missing returns the remembered routes that are not in rs (a List of the store), in no
// order.
func (c *Recall) Missing(rs []*Route) []*Route {
	held := make(map[string]bool, len(rs))
	for _, r := range rs {
		held[r.Key()] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var lost []*Route
	for key, r := range c.seen {
		if !held[key] {
			lost = append(lost, r.Clone())
		}
	}
	return lost
}

// errHeld makes Restore's update write nothing: the store holds the route again.
var errHeld = errors.New("store: held")

// Restore writes the remembered route at key back where the store holds none; it reports
// whether it wrote.
func (c *Recall) Restore(ctx context.Context, key string) (bool, error) {
	rem := c.recalled(key)
	if rem == nil {
		return false, nil
	}
	wrote := false
	_, err := c.Store.Update(ctx, key, func(cur *Route) (*Route, error) {
		if cur != nil {
			return nil, errHeld
		}
		wrote = true
		return rem.Clone(), nil
	})
	if errors.Is(err, errHeld) {
		return false, nil
	}
	return wrote && err == nil, err
}

// Forget forgets the route at key (its claim lapsed).
func (c *Recall) Forget(key string) { c.remember(key, nil) }
