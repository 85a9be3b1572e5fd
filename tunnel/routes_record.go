package tunnel

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// joined records, after a successful Join and before it is acknowledged, that g's route has
// a member: its owner, key hash and port, and that it is not empty. If the route was taken by
// another tenant meanwhile (its claim lapsed between claim and Join), the registration is
// refused: the caller removes the member.
func (b *routeBook) joined(tk *ticket, g *group.Group) error {
	defer b.releasePortSlot(tk)
	if tk.port != 0 && g.Port != tk.port {
		// Every edge of a cluster gives a TCP pool the same port: one that is busy here
		// cannot be replaced by another.
		return &group.Error{Err: group.ErrNoPorts, Msg: fmt.Sprintf("port %d of group '%s' is not available on this edge", tk.port, tk.label)}
	}
	if tk.solo != "" {
		b.mu.Lock()
		b.soloPorts[tk.port] = tk.solo
		b.mu.Unlock()
	}
	if tk.soloTCP {
		b.holdSoloTCP(tk.tenant, g.Port)
	}
	if tk.kind == "" {
		return nil
	}
	if tk.holder != "" {
		b.mu.Lock()
		b.soloHolders[tk.label] = tk.holder
		b.mu.Unlock()
	}
	var oldPort int
	r, err := b.update(tk.key, func(cur *store.Route) (*store.Route, error) {
		oldPort = 0
		if cur == nil {
			// Swept or undone meanwhile: the live owner records it again.
			cur = &store.Route{Kind: tk.kind, Label: tk.label, Tenant: tk.tenant, Group: g.Name}
		}
		if cur.Tenant != tk.tenant {
			return nil, ownedError(tk.kind, tk.label)
		}
		lastClaim := cur.Claimed
		changed := !cur.EmptySince.IsZero() || cur.Group == "" && g.Name != ""
		cur.EmptySince = time.Time{}
		handled, ruled, err := b.rules.joinedRecord(cur, g, tk, lastClaim, b.now())
		if err != nil {
			return nil, err
		}
		changed = changed || ruled
		switch k := g.KeyHash(); {
		case tk.kind == store.KindTCP:
			var moved bool
			oldPort, moved = recordPoolPort(cur, g)
			changed = changed || moved
		case !handled && !cur.Reserved && (cur.KeyHash != k || cur.Group != g.Name || cur.Holder != tk.holder):
			cur.KeyHash, cur.Group, cur.Holder, cur.HolderHash, changed = k, g.Name, tk.holder, tk.holderHash, true
		}
		if !changed {
			return nil, errUnchanged
		}
		return cur, nil
	})
	switch {
	case errors.Is(err, errUnchanged):
		return nil
	case err != nil:
		return refusal(err)
	}
	if oldPort != 0 {
		// The pool could not bind its old port and took another: the old one goes back.
		b.releasePorts(&store.Route{Tenant: tk.tenant, Ports: map[string]int{"": oldPort}})
	}
	b.holdPorts(r)
	return nil
}

// recordPoolPort writes the port of TCP pool g into its route's record cur, and returns the
// port the pool had before when that changed (it could not bind it and took another).
func recordPoolPort(cur *store.Route, g *group.Group) (oldPort int, changed bool) {
	k := g.KeyHash().String()
	if old := cur.Ports[k]; old != g.Port {
		if cur.Ports == nil {
			cur.Ports = map[string]int{}
		}
		oldPort, cur.Ports[k], changed = old, g.Port, true
	}
	forgetRotatedKeys(cur, g)
	if cur.Group == "" {
		cur.Group = g.Name
	}
	return oldPort, changed
}

// emptied records that g's last member left. The registry calls it under the route's shard
// lock, which other routes share: it only queues the write (routeWrites), so that the record
// changes in the order the registry changed without a store call under the lock. The rules
// decide whether the route is empty now, later or not (routeRules.emptiedRecord: in a
// cluster another edge may serve it).
func (b *routeBook) emptied(g *group.Group) {
	kind := store.KindHTTP
	if g.Kind == group.KindTCP {
		if g.Solo() {
			b.releaseSoloTCP(g.Port)
			b.releaseSoloPort(g.Port)
			return
		}
		kind = store.KindTCP
	}
	now := b.now()
	var holder string // the session of this edge's solo claim on the route, if any
	if kind == store.KindHTTP && g.Solo() && !b.stopping.Load() {
		b.mu.Lock()
		holder = b.soloHolders[g.Label]
		delete(b.soloHolders, g.Label)
		b.mu.Unlock()
	}
	key := store.Key(kind, g.Label)
	b.writes.later(key, func() { b.recordEmpty(key, kind, g, holder, now) })
}

// recordEmpty writes that route key (kind, g's label) emptied at now, unless it has members
// again or the rules keep it (emptied); holder is the session of the solo claim that left.
// A store that does not answer (a disk error, NATS away) is tried again, backing off, until it
// does or the edge stops: the record must converge, and the route's later writes wait in line
// behind this one meanwhile, as they would wait for the store themselves.
func (b *routeBook) recordEmpty(key, kind string, g *group.Group, holder string, now time.Time) {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		err := b.writeEmpty(key, kind, g, holder, now)
		if err == nil {
			return
		}
		if wait == 100*time.Millisecond {
			b.log.Warn("cannot record that a route is empty yet; trying again until the store answers",
				zap.String("route", g.Label), zap.Error(err))
		}
		select {
		case <-b.closing:
			b.log.Error("cannot record that a route is empty; its claim will not lapse", zap.String("route", g.Label), zap.Error(err))
			return
		case <-time.After(wait):
		}
	}
}

// writeEmpty is one attempt of recordEmpty.
func (b *routeBook) writeEmpty(key, kind string, g *group.Group, holder string, now time.Time) error {
	later := false
	_, err := b.st.Update(b.ctx, key, func(cur *store.Route) (*store.Route, error) {
		later = false
		if cur == nil {
			return nil, errUnchanged
		}
		// The solo tunnel that held the claim left: another session may claim at once.
		clear := holder != "" && cur.Holder == holder
		if clear {
			cur.Holder, cur.HolderHash = "", ""
		}
		unchanged := func() (*store.Route, error) {
			if clear {
				return cur, nil
			}
			return nil, errUnchanged
		}
		var keep bool
		if keep, later = b.rules.emptiedRecord(cur, kind, g.Label, now); keep {
			return unchanged()
		}
		if b.live(kind, g.Label) {
			// Members joined the route again (on this edge, or another pool of the TCP
			// name) since it emptied: the registry removes pools one at a time, and this
			// write runs after the registry's change.
			return unchanged()
		}
		cur.EmptySince = now
		return cur, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		return err
	}
	if later {
		b.rules.settleLater(kind, g.Label)
	}
	return nil
}
