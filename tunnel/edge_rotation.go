package tunnel

import (
	"errors"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// A TCP pool's route records its port per key hash. While the pool's key rotates, members
// hold the old and the new key: both keys keep the pool's port in the record, so that after a
// restart whichever member comes first takes the pool's port back. An old key's entry is
// dropped once no member holds that key.

// routePort is the port recorded for req's pool: under its key, or under a previous key when it
// rotates.
func routePort(r *store.Route, req *group.JoinRequest) int {
	if port := r.Ports[req.KeyHash.String()]; port != 0 {
		return port
	}
	for _, k := range req.PrevKeyHashes {
		if port := r.Ports[k.String()]; port != 0 {
			return port
		}
	}
	return 0
}

// forgetRotatedKeys drops the entries of r for g's port under keys that no member of g holds
// any more; it reports whether it dropped any.
func forgetRotatedKeys(r *store.Route, g *group.Group) bool {
	cur, dropped := g.KeyHash().String(), false
	for k, port := range r.Ports {
		if k == cur || port != g.Port {
			continue
		}
		if h, err := group.ParseKeyHash(k); err == nil && g.HoldsKey(h) {
			continue
		}
		delete(r.Ports, k)
		dropped = true
	}
	return dropped
}

// left runs after a member of g left: when g is a live TCP pool whose record still lists
// other keys for its port (a rotation), the keys no member holds are dropped. The write waits
// in the route's line (routeWrites): a cluster calls this with its remote view locked.
func (b *routeBook) left(g *group.Group) {
	if g.Kind != group.KindTCP || g.Solo() || g.Removed() {
		return
	}
	key := store.Key(store.KindTCP, g.Label)
	b.writes.later(key, func() {
		if r, err := b.st.Get(b.ctx, key); err != nil || r == nil || len(r.Ports) < 2 {
			return // nothing rotated here: no write
		}
		_, err := b.st.Update(b.ctx, key, func(cur *store.Route) (*store.Route, error) {
			if cur == nil || len(cur.Ports) < 2 || !forgetRotatedKeys(cur, g) {
				return nil, errUnchanged
			}
			return cur, nil
		})
		if err != nil && !errors.Is(err, errUnchanged) {
			b.log.Warn("cannot record the end of a key rotation; the old key keeps the port until the next change")
		}
	})
}

// leftPool runs after a member of g left its pool; a shutdown's leaves end no rotation.
func (s *Server) leftPool(g *group.Group) {
	if !s.shuttingDown() {
		s.routes.left(g)
	}
}
