package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// Recall is a Store that remembers the last version it saw of every route it read, listed
// or wrote through another Store, for a store that may lose acknowledged writes: a NATS
// cluster whose every node restarted from a store missing its last writes (a power loss
// with the disks' caches lost, a restore from an older copy). Where the store, doubted (see
// below), holds no route that Recall remembers, Update hands fn the remembered route as if it were stored,
// so that what was decided on it stays decided (a route stays its tenant's, with its key
// and ports); and Lost lists such routes, which Restore writes back.
//
// A store that holds no route where Recall remembers one may have lost it, or another writer
// deleted it (its claim lapsed, an operator released it): only the store's history tells,
// and Recall does not read it. So Recall decides on what it remembers only while its owner
// doubts the store (Doubt: from the moment the connection to it was lost until what it may
// have lost is written back, Trust); otherwise the store is right, and a route it does not
// hold (Update, List) is forgotten, or it would be kept for its old tenant for ever.
// A route deleted through Recall is forgotten; one deleted by another writer while the store
// is doubted stays remembered until it is trusted again or its reader forgets it (Forget).
// The routes reserved endpoints hold are not remembered: the configuration reserves them
// again; other reserved records (a cluster's port reservations) are. A route the
// store took back to an older version is not told from one another writer changed: Recall
// remembers the version it read last.
type Recall struct {
	Store
	mu   sync.Mutex
	seen map[string]*Route
	// doubt is set while the store may have lost writes (Doubt, Trust); gen counts the
	// calls to Doubt, so that a List that began before one forgets nothing.
	doubt atomic.Bool
	gen   atomic.Uint64
}

// Doubt tells Recall that the store may have lost writes: from now on until Trust, a route
// it does not hold is taken for lost, not deleted. It returns the doubt's number, for Trust.
func (c *Recall) Doubt() uint64 {
	c.mu.Lock() // a Trust of the doubt before does not undo this one
	defer c.mu.Unlock()
	c.doubt.Store(true)
	return c.gen.Add(1)
}

// Doubts returns the number of the last Doubt (0: none yet).
func (c *Recall) Doubts() uint64 { return c.gen.Load() }

// Trust tells Recall that the store holds again what it was given up to doubt number n
// (Doubts, read before what it lost was written back): a route it does not hold from now on
// was deleted. A Doubt after n keeps the store doubted; Trust reports whether it trusts it.
func (c *Recall) Trust(n uint64) bool {
	c.mu.Lock() // orders it with Doubt
	defer c.mu.Unlock()
	if c.gen.Load() != n {
		return false
	}
	c.doubt.Store(false)
	return true
}

// Doubted reports whether the store is doubted (Doubt) now.
func (c *Recall) Doubted() bool { return c.doubt.Load() }

// trusted returns a function reporting whether the store was trusted all along from this
// call to that one's: only then is a route it does not hold one it deleted.
func (c *Recall) trusted() func() bool {
	gen, doubt := c.gen.Load(), c.doubt.Load()
	return func() bool { return !doubt && !c.doubt.Load() && c.gen.Load() == gen }
}

// NewRecall returns a Recall over st.
func NewRecall(st Store) *Recall { return &Recall{Store: st, seen: map[string]*Route{}} }

// remember records r (nil: the route was deleted) as the last version seen of key.
func (c *Recall) remember(key string, r *Route) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r == nil || r.Reserved && (r.Kind == KindHTTP || r.Kind == KindTCP) {
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
	deleted, absent := false, false
	trusted := c.trusted()
	r, err := c.Store.Update(ctx, key, func(cur *Route) (*Route, error) {
		absent = cur == nil
		if cur == nil && c.doubt.Load() {
			cur = c.recalled(key)
		}
		next, err := fn(cur)
		deleted = err == nil && next == nil
		return next, err
	})
	switch {
	case err == nil && (r != nil || deleted):
		c.remember(key, r)
	case absent && trusted():
		// The store, trusted, holds nothing at key: another writer deleted the route.
		c.remember(key, nil)
	}
	// Else the store held nothing and fn wrote nothing while it was doubted: the remembered
	// route (if any) stays remembered.
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
// A route the store does not hold is forgotten unless the store was doubted meanwhile.
func (c *Recall) List(ctx context.Context) ([]*Route, error) {
	trusted := c.trusted()
	rs, err := c.Store.List(ctx)
	if err != nil {
		return rs, err
	}
	held := make(map[string]bool, len(rs))
	for _, r := range rs {
		held[r.Key()] = true
		c.remember(r.Key(), r)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if trusted() {
		for key := range c.seen {
			if !held[key] {
				delete(c.seen, key)
			}
		}
	}
	return rs, nil
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
