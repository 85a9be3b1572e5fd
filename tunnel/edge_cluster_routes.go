package tunnel

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/store"
)

// Route ownership in a cluster. The routes live in one NATS bucket that every edge updates
// with compare-and-set (store.NATS), so the single edge's rules hold across edges: a route
// has one owning tenant, written before a registration is acknowledged. Two more rules make
// the key and the TCP port cluster-wide:
//
//   - An HTTP pool's key hash is written with the route's first claim. A registration with
//     another key is refused ("group key does not match") while the pool has a member on any
//     edge, and for LeaseTTL after the route was last claimed or emptied: long enough for a
//     registration in flight on another edge to be seen. Two first registrations racing on
//     two edges with different keys: the store serialises their claims, the second sees the
//     first's key and is refused.
//   - A TCP pool's port is chosen when its route is claimed, before the pool exists, and
//     reserved cluster-wide under the key "port/<n>" (create-only), so two edges creating two
//     pools at once cannot both take one port; every edge then binds the pool on that port,
//     and refuses the registration (ErrNoPorts) rather than bind another.

// kindPort is the store kind of a cluster's TCP port reservations: "port/<n>" → the route
// ("tcp/<name>") in Group. Reserved, so that it never lapses on its own; it goes when its
// route's claim does.
const kindPort = "port"

// errPortTaken is a port another route reserved.
var errPortTaken = errors.New("port reserved by another route")

func keyMismatch(kind, label string) error {
	if kind == store.KindTCP {
		return &group.Error{Err: group.ErrKeyMismatch, Msg: fmt.Sprintf("group key does not match for group '%s'", label)}
	}
	return &group.Error{Err: group.ErrKeyMismatch, Msg: fmt.Sprintf("group key does not match for subdomain '%s'", label)}
}

// keyHeld reports whether cur's key hash keeps req (of cur's own tenant) out: see above.
// Mid-rotation the route records the pool's newest key while members still hold older ones:
// as on one edge, a key a live member of the pool holds is admitted, whether that member is
// this edge's own or another edge's joined here (remoteConflict answers for the members of
// other edges when the pool has none here).
func (b *routeBook) keyHeld(cur *store.Route, req *group.JoinRequest, grouped bool, now time.Time) bool {
	var zero group.KeyHash
	if cur.Kind != store.KindHTTP || cur.Reserved || !grouped || cur.KeyHash == zero || cur.KeyHash == req.KeyHash ||
		slices.Contains(req.PrevKeyHashes, cur.KeyHash) {
		return false
	}
	if g := b.reg.LookupHTTP(cur.Label); g != nil && !g.Solo() && g.HoldsKey(req.KeyHash) {
		return false // a member not yet rotated: the registry admits it (Join decides)
	}
	if b.live(cur.Kind, cur.Label) {
		return true
	}
	recent := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) < b.lease }
	return recent(cur.Claimed) || recent(cur.EmptySince) || now.Sub(b.startedAt) < b.lease
}

// reshape decides, in a cluster, a registration of the route owner's tenant on an HTTP
// route whose record says another thing: a pool with another key, a solo tunnel where a
// pool was, a pool where a solo tunnel was, or another solo tunnel. keyHeld has refused the
// keys the route's live pool holds. What is left is a route nobody serves that changes
// shape, or a first registration racing another on another edge: the record is rewritten
// with the new shape and Claimed (reshape true), so that the store orders the two and the
// second sees the first's claim and is refused, as on one edge. A change within the lease
// of the record's last claim (or of its emptiness, or of this edge's start) is refused:
// that claim's member may be on its way. Two solo claims are told apart by their connector
// session (Holder) and refused only within the lease of the claim: a solo tunnel that registers
// again later, on any edge, is not (remoteConflict answers for live ones); nor is the same
// connector at once (its session, or resumed, the session its Hello resumed, holds the
// claim).
func (b *routeBook) reshape(cur *store.Route, req *group.JoinRequest, grouped bool, resumed string, now time.Time) (bool, error) {
	var zero group.KeyHash
	kind, label := cur.Kind, cur.Label
	if b.live(kind, label) {
		// Served now, here or on another edge: the registry, remoteConflict and keyHeld
		// answer as the members would.
		return false, nil
	}
	recent := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) < b.lease }
	held := recent(cur.Claimed) || recent(cur.EmptySince) || now.Sub(b.startedAt) < b.lease
	solo := cur.KeyHash == zero && cur.Group == ""
	switch {
	case grouped && solo:
		if held {
			return false, keyMismatch(kind, label)
		}
	case grouped:
		if cur.KeyHash == req.KeyHash || slices.Contains(req.PrevKeyHashes, cur.KeyHash) {
			return false, nil // the same pool
		}
	case !solo:
		if held {
			return false, &group.Error{Err: group.ErrInUse, Msg: fmt.Sprintf("subdomain '%s' is already in use", label)}
		}
	default: // a solo tunnel's claim
		if cur.Holder == req.Session {
			return false, nil
		}
		if cur.Holder != "" && recent(cur.Claimed) && cur.Holder != resumed {
			return false, &group.Error{Err: group.ErrInUse, Msg: fmt.Sprintf("subdomain '%s' is already in use", label)}
		}
	}
	if grouped {
		cur.KeyHash, cur.Group, cur.Holder = req.KeyHash, req.Group, ""
	} else {
		cur.KeyHash, cur.Group, cur.Holder = zero, "", req.Session
	}
	cur.Claimed = now
	return true, nil
}

// clusterPort picks the port of a new TCP pool of tk's route and reserves it for every edge;
// when another edge set the pool's port first, that one is returned.
func (b *routeBook) clusterPort(tk *ticket, req *group.JoinRequest) (int, error) {
	k := req.KeyHash.String()
	skip := map[int]bool{}
	for range 256 {
		p, ok := b.reg.FreePort(skip)
		if !ok {
			return 0, &group.Error{Err: group.ErrNoPorts, Msg: "no free TCP port on this edge"}
		}
		skip[p] = true
		if err := b.reservePort(p, tk); errors.Is(err, errPortTaken) {
			b.reg.HoldPorts(p) // another route's: not offered here again
			continue
		} else if err != nil {
			return 0, fmt.Errorf("%w: cannot reserve a port: %v", ErrUnavailable, err)
		}
		var final int
		_, err := b.st.Update(tk.key, func(cur *store.Route) (*store.Route, error) {
			final = 0
			if cur == nil || cur.Tenant != tk.tenant {
				return nil, ownedError(tk.kind, tk.label)
			}
			if q := cur.Ports[k]; q != 0 {
				final = q // another edge chose first
				return nil, errUnchanged
			}
			if cur.Ports == nil {
				cur.Ports = map[string]int{}
			}
			cur.Ports[k], final = p, p
			cur.Claimed = b.now()
			return cur, nil
		})
		if err != nil && !errors.Is(err, errUnchanged) {
			b.unreservePort(p, tk.key)
			var ge *group.Error
			if errors.As(err, &ge) {
				return 0, err
			}
			return 0, fmt.Errorf("%w: cannot record the route: %v", ErrUnavailable, err)
		}
		if final != p {
			b.unreservePort(p, tk.key)
		}
		b.holdPorts(&store.Route{Tenant: tk.tenant, Ports: map[string]int{k: final}})
		return final, nil
	}
	return 0, &group.Error{Err: group.ErrNoPorts, Msg: "no free TCP port in the cluster"}
}

// clusterSoloPort picks and reserves, for the whole cluster, the port of a new solo TCP
// tunnel, under "solo/<edge id>/<tunnel id>": no pool of another edge can take it, and the
// tunnel's copies on the other edges bind the same port.
func (b *routeBook) clusterSoloPort(tk *ticket, req *group.JoinRequest) error {
	tk.solo = "solo/" + b.edgeID + "/" + req.ID
	res := &ticket{key: tk.solo, tenant: tk.tenant}
	skip := map[int]bool{}
	for range 256 {
		p, ok := b.reg.FreePort(skip)
		if !ok {
			tk.solo = ""
			return &group.Error{Err: group.ErrNoPorts, Msg: "no TCP ports available"}
		}
		skip[p] = true
		switch err := b.reservePort(p, res); {
		case errors.Is(err, errPortTaken):
			b.reg.HoldPorts(p)
			continue
		case err != nil:
			tk.solo = ""
			return fmt.Errorf("%w: cannot reserve a port: %v", ErrUnavailable, err)
		}
		req.Port, tk.port = p, p
		return nil
	}
	tk.solo = ""
	return &group.Error{Err: group.ErrNoPorts, Msg: "no TCP ports available"}
}

// releaseSoloPort deletes the reservation of a solo TCP tunnel of this edge whose group
// went (its copies on other edges hold none).
func (b *routeBook) releaseSoloPort(port int) {
	b.mu.Lock()
	key, ok := b.soloPorts[port]
	delete(b.soloPorts, port)
	b.mu.Unlock()
	if ok {
		b.unreservePort(port, key)
	}
}

// reservePort reserves port p for tk's route, or fails with errPortTaken.
func (b *routeBook) reservePort(p int, tk *ticket) error {
	_, err := b.st.Update(store.Key(kindPort, strconv.Itoa(p)), func(cur *store.Route) (*store.Route, error) {
		if cur != nil {
			if cur.Group == tk.key {
				return nil, errUnchanged
			}
			return nil, errPortTaken
		}
		return &store.Route{Kind: kindPort, Label: strconv.Itoa(p), Tenant: tk.tenant, Group: tk.key,
			Reserved: true, Ports: map[string]int{"": p}, Claimed: b.now()}, nil
	})
	if errors.Is(err, errUnchanged) {
		return nil
	}
	return err
}

// unreservePort deletes port p's reservation if route still holds it.
func (b *routeBook) unreservePort(p int, route string) {
	_, err := b.st.Update(store.Key(kindPort, strconv.Itoa(p)), func(cur *store.Route) (*store.Route, error) {
		if cur == nil || cur.Group != route {
			return nil, errUnchanged
		}
		return nil, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		b.log.Warn("cannot delete a port reservation", zap.Int("port", p), zap.Error(err))
	}
}

// sweepSoloPort deletes the reservation r ("port/<n>") of a solo TCP tunnel that no edge has
// any more: its edge ("solo/<edge>/<tunnel id>") is gone (its lease lapsed, or was never
// seen by an edge that has run for two leases), or is this edge and the tunnel is not one of
// its own (a previous incarnation's). Only the edge holding a solo tunnel releases its
// reservation otherwise, so without this every edge that died would keep its solo tunnels'
// ports from the cluster for ever. A reservation younger than the lease is left alone: its
// tunnel may be joining.
func (b *routeBook) sweepSoloPort(r *store.Route, now time.Time) {
	edge, _, ok := strings.Cut(strings.TrimPrefix(r.Group, "solo/"), "/")
	if !ok || !strings.HasPrefix(r.Group, "solo/") || now.Sub(r.Claimed) < b.lease {
		return
	}
	port, err := strconv.Atoi(r.Label)
	if err != nil {
		return
	}
	switch {
	case edge == b.edgeID:
		b.mu.Lock()
		mine := b.soloPorts[port] == r.Group
		b.mu.Unlock()
		if mine {
			return
		}
	case b.edgeGone == nil || !b.edgeGone(edge):
		return
	}
	b.log.Info("releasing the port of a solo TCP tunnel whose edge is gone", zap.Int("port", port), zap.String("edge", edge))
	b.unreservePort(port, r.Group)
}

// dropPortKeys deletes the port reservations of a route whose claim lapsed.
func (b *routeBook) dropPortKeys(r *store.Route) {
	if b.lease == 0 || r.Kind != store.KindTCP {
		return
	}
	for _, p := range r.Ports {
		b.unreservePort(p, r.Key())
	}
}

// edgeGone reports whether edge id is gone from the cluster as far as this edge can tell:
// its lease lapsed (or was deleted) more than a lease ago, or this edge, running for two
// leases, never saw it.
func (c *cluster) edgeGone(id string) bool {
	if id == c.cfg.EdgeID {
		return false
	}
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	e := c.remote.edges[id]
	if e == nil || e.lastSeen.IsZero() {
		return time.Since(c.started) > 2*c.cfg.LeaseTTL
	}
	return e.expired && time.Since(e.lastSeen) > c.cfg.LeaseTTL
}

// liveAnywhere reports whether the route kind/label has a member on another edge whose
// lease holds, whether or not this edge can reach it now. It reads a snapshot (the registry
// calls it, through the route book, while the remote view is locked).
func (c *cluster) liveAnywhere(kind, label string) bool {
	live := c.live.Load()
	return live != nil && (*live)[store.Key(kind, label)]
}

// rebuildLiveLocked recomputes the routes with members on other edges; the caller holds
// c.remote.mu.
func (c *cluster) rebuildLiveLocked() {
	live := map[string]bool{}
	for _, e := range c.remote.edges {
		if e.expired {
			continue
		}
		for _, rec := range e.records {
			switch {
			case rec.Proto.BySubdomain():
				live[store.Key(store.KindHTTP, rec.Label)] = true
			case rec.Group != "":
				live[store.Key(store.KindTCP, rec.Group)] = true
			}
		}
	}
	c.live.Store(&live)
}

// recordRoute is the store kind and label of the route rec's member serves; false for a
// solo TCP tunnel, which owns no route.
func recordRoute(rec memberRecord) (kind, label string, ok bool) {
	switch {
	case rec.Proto.BySubdomain():
		return store.KindHTTP, rec.Label, true
	case rec.Group != "":
		return store.KindTCP, rec.Group, true
	}
	return "", "", false
}

// routesOf returns the route keys (kind, label) of recs, each once.
func routesOf(recs ...memberRecord) [][2]string {
	seen := map[[2]string]bool{}
	var out [][2]string
	for _, rec := range recs {
		if kind, label, ok := recordRoute(rec); ok && !seen[[2]string{kind, label}] {
			seen[[2]string{kind, label}] = true
			out = append(out, [2]string{kind, label})
		}
	}
	return out
}

// settleRoutes runs after members of another edge vanished from this edge's view (their
// edge's lease lapsed or was deleted, or their records were deleted) and records, for each
// of their routes that no edge has a member of any more, that it is empty from now: its
// claim then lapses RouteTTL later, as on a single edge. Without it nobody may write it:
// the pool left this edge's registry when the link dropped, while the dead edge's lease
// still made the route live (emptied writes nothing then), and a route recorded with
// members but live nowhere is taken for lapsed at once by every edge that has run longer
// than RouteTTL, so another tenant could take it while its connectors fail over. The
// caller holds c.remote.mu, with the live snapshot rebuilt; the store is written in a
// goroutine.
func (c *cluster) settleRoutes(routes [][2]string) {
	if len(routes) == 0 || c.srv.routes == nil {
		return
	}
	c.spawn(func() {
		for _, r := range routes {
			c.settleRoute(r[0], r[1])
		}
	})
}

func (c *cluster) settleRoute(kind, label string) {
	b := c.srv.routes
	for c.ctx.Err() == nil {
		if b.live(kind, label) {
			return
		}
		var wait time.Duration
		_, err := b.st.Update(store.Key(kind, label), func(cur *store.Route) (*store.Route, error) {
			wait = 0
			if cur == nil || cur.Reserved || !cur.EmptySince.IsZero() {
				return nil, errUnchanged
			}
			now := b.now()
			if d := cur.Claimed.Add(c.cfg.LeaseTTL).Sub(now); d > 0 {
				// Claimed or joined on some edge a moment ago: its member's record may
				// not have arrived here yet. Look again when it must have.
				wait = d
				return nil, errUnchanged
			}
			cur.EmptySince = now
			return cur, nil
		})
		if err != nil && !errors.Is(err, errUnchanged) {
			c.log.Warn("cannot record that a route is empty", zap.String("route", store.Key(kind, label)), zap.Error(err))
			return
		}
		if wait == 0 {
			return
		}
		select {
		case <-c.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// remoteConflict is the refusal the members of subdomain label on other edges (whose leases
// hold) would give req, as the registry gives it when they are joined: a solo tunnel on a
// route that has members, a pool member on a solo tunnel's route, or a key the pool does not
// admit (poolAdmits: the rule of one edge, rotation included).
//
// The registering connector's own old registrations are no conflict: a session whose Hello
// resumed session X with a token whose SHA-256 is the one X's records carry is the connector
// that held X, moved here (its edge died, or it lost that connection): X is dead to it, and
// its records go when X's edge notices or its lease lapses. A wrong token gets no such pass.
func (c *cluster) remoteConflict(label string, req *group.JoinRequest, grouped bool) error {
	resumed, proof, resuming := c.srv.resumeClaim(req.Session)
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	var recs []memberRecord
	for _, e := range c.remote.edges {
		if e.expired {
			continue
		}
		for _, rec := range e.records {
			if !rec.Proto.BySubdomain() || rec.Label != label {
				continue
			}
			if resuming && rec.heldBy(resumed, req.Tenant, proof) {
				continue // this connector's own, from before it moved
			}
			if !grouped {
				return &group.Error{Err: group.ErrInUse, Msg: fmt.Sprintf("subdomain '%s' is already in use", label)}
			}
			if rec.Group == "" {
				return keyMismatch(store.KindHTTP, label)
			}
			recs = append(recs, rec)
		}
	}
	if len(recs) > 0 && !poolAdmits(recs, req) {
		return keyMismatch(store.KindHTTP, label)
	}
	return nil
}
