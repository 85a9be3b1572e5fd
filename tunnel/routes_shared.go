package tunnel

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// Route ownership in a cluster. The routes live in one NATS bucket that every edge updates
// with compare-and-set (natsstore.Store), so the single edge's rules hold across edges: a route
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

// sharedRules are the route rules of an edge of a cluster (routeRules): its store is shared
// with the other edges, which it asks about through its Cluster.
type sharedRules struct {
	b *routeBook
	c Cluster
	// lease is the cluster's lease and edgeID this edge's id, read once.
	lease  time.Duration
	edgeID string
	// resumeOf is what connector session id says of itself: the SHA-256 of its resume token
	// and, when its Hello resumed a session, that session and the SHA-256 of the token it
	// presented (Server.sessionResume).
	resumeOf func(session string) (own [32]byte, resumed string, proof [32]byte, ok bool)
	// stop is closed when the edge begins to stop: a route waiting to be recorded empty is
	// left to the other edges then (they settle it when this edge's records go).
	stop <-chan struct{}
}

func (s *sharedRules) tenantElsewhere(kind, label string) (string, bool) {
	return s.c.ServedElsewhere(kind, label)
}

// conflict: the route may have members on another edge that this edge has not joined yet
// (its link is down, or their records are on their way): answer as if it had.
func (s *sharedRules) conflict(label string, req *group.JoinRequest, grouped bool) error {
	return s.c.Conflict(label, req, grouped)
}

func (s *sharedRules) solo(req *group.JoinRequest, kind string, grouped bool) soloClaim {
	sc := soloClaim{session: req.Session}
	if kind == store.KindHTTP && !grouped {
		sc.own, sc.resumed, sc.proof, _ = s.resumeOf(req.Session)
	}
	return sc
}

// claimSoloPort: a solo TCP tunnel's port is reserved for the whole cluster too.
func (s *sharedRules) claimSoloPort(tk *ticket, req *group.JoinRequest) error {
	if req.Proto != group.ProtoTCP {
		return nil
	}
	return s.clusterSoloPort(tk, req)
}

// holdsLive: a route may be recorded empty while it has members (an edge cut off from NATS
// for longer than the lease, or an emptiness written as another edge's first member
// joined): a live route never lapses, and the sweep clears the record. And members may
// vanish with an edge without a trace: a route recorded with members holds until its
// emptiness is recorded (settleRoute, or the sweep), and lapses a TTL after that.
func (s *sharedRules) holdsLive(r *store.Route, live func() bool) bool {
	return live() || r.EmptySince.IsZero()
}

func (s *sharedRules) reclaim(cur *store.Route, req *group.JoinRequest, grouped bool, sc soloClaim, now time.Time) (bool, error) {
	b := s.b
	kind, label := cur.Kind, cur.Label
	if s.keyHeld(cur, req, grouped, now) {
		return false, group.KeyMismatch(kind == store.KindTCP, label)
	}
	if kind != store.KindHTTP {
		return false, nil
	}
	if cur.Reserved {
		if !grouped || cur.KeyHash != (group.KeyHash{}) {
			return false, nil
		}
		// An endpoint that sets no key: its pool's key is whoever comes first, and the
		// store orders first registrations racing on two edges.
		return s.claimEndpointKey(cur, req, now)
	}
	reshape, err := s.reshape(cur, req, grouped, sc, now)
	if err != nil || !reshape {
		return false, err
	}
	if b.lapsed(cur, now, func() bool { return b.live(kind, label) }) {
		cur.EmptySince = now
	}
	return true, nil
}

func (s *sharedRules) stampNew(r *store.Route, req *group.JoinRequest, grouped bool, sc soloClaim, now time.Time) {
	r.Claimed = now
	if r.Kind == store.KindHTTP && !grouped {
		r.Holder, r.HolderHash = req.Session, hex.EncodeToString(sc.own[:])
	}
}

func (s *sharedRules) holdTicket(tk *ticket, req *group.JoinRequest, grouped bool, sc soloClaim) {
	if tk.kind == store.KindHTTP && !grouped {
		tk.holder, tk.holderHash = req.Session, hex.EncodeToString(sc.own[:])
	}
}

// poolPort: in a cluster the port of a new pool is chosen before the pool exists, once for
// every edge, and every edge binds the pool on it.
func (s *sharedRules) poolPort(tk *ticket, req *group.JoinRequest, port int) (int, error) {
	if port == 0 {
		p, err := s.clusterPort(tk, req)
		if err != nil {
			return 0, err
		}
		port = p
	}
	tk.port = port
	return port, nil
}

func (s *sharedRules) joinedRecord(cur *store.Route, g *group.Group, tk *ticket, lastClaim, now time.Time) (handled, changed bool, err error) {
	// Every join is a claim: the other edges judge by it whether a member may be on its way.
	cur.Claimed, changed = now, true
	if tk.kind == store.KindTCP {
		return false, changed, nil
	}
	k, zero := g.KeyHash(), group.KeyHash{}
	switch {
	case cur.Reserved && cur.KeyHash == zero && g.Name != "":
		// An endpoint that sets no key (claimEndpointKey): a pool with another key that
		// joined on another edge within the lease keeps it.
		if cur.LiveKey != k {
			if cur.LiveKey != zero && !g.HoldsKey(cur.LiveKey) && !slices.Contains(tk.prevKeys, cur.LiveKey) &&
				now.Sub(lastClaim) < s.lease {
				return true, changed, group.KeyMismatch(false, tk.label)
			}
			cur.LiveKey = k
		}
		return true, changed, nil
	case !cur.Reserved && !g.Solo() && cur.KeyHash != zero && cur.KeyHash != k && !g.HoldsKey(cur.KeyHash) &&
		!slices.Contains(tk.prevKeys, cur.KeyHash) && cur.KeyHash != tk.seenKey:
		// Another key claimed the route after this registration's claim (a race between
		// edges the claim did not see): it lost. A key the route already had at the claim
		// is no race (the claim admitted this key beside it: a rotation in progress).
		return true, changed, group.KeyMismatch(false, tk.label)
	}
	return false, changed, nil
}

// emptiedRecord: the route is empty only if no edge serves it: not while another edge's
// member is known, and not within the lease of the route's last claim (a member may have
// joined elsewhere whose record is on its way; the emptiness is then recorded later, by
// settleLater). An emptiness recorded earlier (by an edge that took the route for empty
// while this edge served it) is moved to now.
func (s *sharedRules) emptiedRecord(cur *store.Route, kind, label string, now time.Time) (keep, later bool) {
	switch {
	case s.b.servedElsewhere(kind, label):
		return true, false
	case now.Sub(cur.Claimed) < s.lease:
		return true, true
	case !cur.EmptySince.IsZero() && !cur.EmptySince.Before(now):
		return true, false
	}
	return false, false
}

func (s *sharedRules) settleLater(kind, label string) { s.c.SettleLater(kind, label) }

func (s *sharedRules) sweepRecord(r *store.Route, now time.Time, live func() bool, reserved map[int]bool) bool {
	switch {
	case r.Kind == kindPort:
		if p, err := strconv.Atoi(r.Label); err == nil && !s.sweepSoloPort(r, now) {
			reserved[p] = true
		}
		return true
	case r.EmptySince.IsZero() && !r.Reserved && (r.Kind == store.KindHTTP || r.Kind == store.KindTCP) &&
		!live() && now.Sub(r.Claimed) >= s.lease:
		s.markEmpty(r.Key(), r.Kind, r.Label)
		return true
	case !r.EmptySince.IsZero() && live():
		s.markLive(r.Key(), r.Kind, r.Label)
		return true
	}
	return false
}

func (s *sharedRules) sweepDone(reserved map[int]bool) { s.b.releaseElsewhere(reserved) }

func (s *sharedRules) dropped(r *store.Route) { s.dropPortKeys(r) }

// keyHeld reports whether cur's key hash keeps req (of cur's own tenant) out: see above.
// Mid-rotation the route records the pool's newest key while members still hold older ones:
// as on one edge, a key a live member of the pool holds is admitted, whether that member is
// this edge's own or another edge's joined here (remoteConflict answers for the members of
// other edges when the pool has none here).
func (s *sharedRules) keyHeld(cur *store.Route, req *group.JoinRequest, grouped bool, now time.Time) bool {
	b := s.b
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
	recent := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) < s.lease }
	return recent(cur.Claimed) || recent(cur.EmptySince) || now.Sub(b.startedAt) < s.lease
}

// soloClaim is what a solo HTTP registration's session says of itself for reshape: its id,
// the SHA-256 of the resume token it was welcomed with, and, when its Hello resumed a
// session, that session's id and the SHA-256 of the token it presented.
type soloClaim struct {
	session, resumed string
	own, proof       [32]byte
}

// holds reports whether the route's solo claim is this connector's: made by its session, or
// by the session it resumed with that session's token.
func (sc soloClaim) holds(cur *store.Route) bool {
	if cur.Holder == sc.session {
		return true
	}
	if sc.resumed == "" || cur.Holder != sc.resumed || len(cur.HolderHash) != 2*sha256.Size {
		return false
	}
	want, err := hex.DecodeString(cur.HolderHash)
	return err == nil && subtle.ConstantTimeCompare(want, sc.proof[:]) == 1
}

// reshape decides, in a cluster, a registration of the route owner's tenant on an HTTP
// route whose record says another thing: a pool with another key, a solo tunnel where a
// pool was, a pool where a solo tunnel was, or another solo tunnel. keyHeld has refused the
// keys the route's live pool holds. What is left is a route nobody serves that changes
// shape, or a first registration racing another on another edge: the record is rewritten
// with the new shape and Claimed (reshape true), so that the store orders the two and the
// second sees the first's claim and is refused, as on one edge. A change within the lease
// of the record's last claim (or of its emptiness, or of this edge's start) is refused:
// that claim's member may be on its way. A live route (served here or on another edge) is
// not reshaped: the registry, remoteConflict and keyHeld answer as its members would.
//
// Two solo claims are told apart by their connector session (Holder, with the SHA-256 of
// its resume token): another session's claim is refused within the lease of the claim or of
// this edge's start (its record may not have arrived yet), unless the registering
// connector resumed that session with its token (the same connector, moved or back).
func (s *sharedRules) reshape(cur *store.Route, req *group.JoinRequest, grouped bool, sc soloClaim, now time.Time) (bool, error) {
	b := s.b
	var zero group.KeyHash
	kind, label := cur.Kind, cur.Label
	recent := func(t time.Time) bool { return !t.IsZero() && now.Sub(t) < s.lease }
	fresh := now.Sub(b.startedAt) < s.lease
	held := recent(cur.Claimed) || recent(cur.EmptySince) || fresh
	solo := cur.KeyHash == zero && cur.Group == ""
	inUse := &group.Error{Err: group.ErrInUse, Msg: fmt.Sprintf("subdomain '%s' is already in use", label)}
	switch {
	case grouped && solo:
		if held {
			return false, group.KeyMismatch(kind == store.KindTCP, label)
		}
	case grouped:
		if cur.KeyHash == req.KeyHash || slices.Contains(req.PrevKeyHashes, cur.KeyHash) {
			// The same pool. Coming back to a route nobody serves, it claims it afresh,
			// so that a change racing on another edge sees the claim and is refused.
			if recent(cur.Claimed) {
				return false, nil
			}
			cur.Claimed = now
			return true, nil
		}
	case !solo:
		if held {
			return false, inUse
		}
	default: // a solo tunnel's claim on a solo record
		if cur.Holder == sc.session {
			return false, nil
		}
		if cur.Holder != "" && (recent(cur.Claimed) || fresh) && !sc.holds(cur) {
			return false, inUse
		}
	}
	if b.live(kind, label) {
		// The registry and remoteConflict answer as the members would; the claim is still
		// written, so that a record read before the members appeared fails the store's
		// compare-and-set and is read again (then held, and refused above).
		cur.Claimed = now
		return true, nil
	}
	if grouped {
		cur.KeyHash, cur.Group, cur.Holder, cur.HolderHash = req.KeyHash, req.Group, "", ""
	} else {
		cur.KeyHash, cur.Group, cur.Holder, cur.HolderHash = zero, "", sc.session, hex.EncodeToString(sc.own[:])
	}
	cur.Claimed = now
	return true, nil
}

// claimEndpointKey orders, in a cluster, the pools on a reserved HTTP endpoint that sets no
// key: the pool's key is recorded (LiveKey) with the claim, and a registration with another
// key within the lease of that claim is refused, as keyHeld does for other routes (the
// live pool's members refuse other keys themselves, on their edge and through
// remoteConflict). It reports whether cur was changed.
func (s *sharedRules) claimEndpointKey(cur *store.Route, req *group.JoinRequest, now time.Time) (bool, error) {
	b := s.b
	var zero group.KeyHash
	if cur.LiveKey == req.KeyHash || slices.Contains(req.PrevKeyHashes, cur.LiveKey) {
		if now.Sub(cur.Claimed) < s.lease || b.live(cur.Kind, cur.Label) {
			return false, nil
		}
		cur.Claimed = now
		return true, nil
	}
	live := b.live(cur.Kind, cur.Label)
	if cur.LiveKey != zero {
		if g := b.reg.LookupHTTP(cur.Label); g != nil && g.HoldsKey(req.KeyHash) {
			return false, nil // a member not yet rotated holds it: the pool admits it
		}
		if live || now.Sub(cur.Claimed) < s.lease || now.Sub(b.startedAt) < s.lease {
			return false, group.KeyMismatch(cur.Kind == store.KindTCP, cur.Label)
		}
	}
	if live {
		// The registry and remoteConflict answer as its members would; the claim is still
		// written, so that a record read before the members appeared is read again.
		cur.Claimed = now
		return true, nil
	}
	cur.LiveKey, cur.Claimed = req.KeyHash, now
	return true, nil
}

// settleRoutes records, in the background, each of routes (kind, label) that no edge serves
// any more as empty from now on: its claim then lapses RouteTTL later, as on a single edge.
// The cluster calls it after members of another edge vanished from this edge's view (their
// edge's lease lapsed or was deleted, or their records were deleted). Without it nobody may
// write it: the pool left this edge's registry when the link dropped, while the dead edge's
// lease still made the route live (emptied writes nothing then), and a route recorded with
// members but live nowhere is taken for lapsed at once by every edge that has run longer than
// RouteTTL, so another tenant could take it while its connectors fail over.
func (s *sharedRules) settleRoutes(routes [][2]string) {
	b := s.b
	if len(routes) == 0 {
		return
	}
	b.spawn(func() {
		for _, r := range routes {
			s.settleRoute(r[0], r[1])
		}
	})
}

// settleRoute records route kind/label empty once no claim of it can be in flight (a lease
// after its last claim), unless an edge serves it by then.
func (s *sharedRules) settleRoute(kind, label string) {
	b := s.b
	retry := 100 * time.Millisecond // after a store that did not answer, backing off to 5 s
	for b.ctx.Err() == nil {
		if b.live(kind, label) {
			return
		}
		var wait time.Duration
		_, err := b.update(store.Key(kind, label), func(cur *store.Route) (*store.Route, error) {
			wait = 0
			if cur == nil || cur.Reserved || !cur.EmptySince.IsZero() {
				return nil, errUnchanged
			}
			now := b.now()
			if d := cur.Claimed.Add(s.lease).Sub(now); d > 0 {
				// Claimed or joined on some edge a moment ago: its member's record may
				// not have arrived here yet. Look again when it must have.
				wait = d
				return nil, errUnchanged
			}
			cur.EmptySince = now
			return cur, nil
		})
		switch {
		case err != nil && !errors.Is(err, errUnchanged):
			// The store does not answer (NATS away): the route must still converge once it
			// does; the sweep would catch it only a minute later.
			if retry == 100*time.Millisecond {
				b.log.Warn("cannot record that a route is empty yet; trying again until the store answers",
					zap.String("route", store.Key(kind, label)), zap.Error(err))
			}
			wait, retry = retry, min(2*retry, 5*time.Second)
		case wait == 0:
			return
		}
		select {
		case <-s.stop:
			return
		case <-b.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// markLive clears, in a cluster, the emptiness recorded for a route that some edge serves:
// an edge cut off from NATS for longer than the lease kept serving it while the others
// recorded it empty, or an emptiness was written as another edge's first member joined.
// Without it the claim would lapse a TTL after the route's next member left, without its
// grace period.
func (s *sharedRules) markLive(key, kind, label string) {
	b := s.b
	_, err := b.update(key, func(cur *store.Route) (*store.Route, error) {
		if cur == nil || cur.EmptySince.IsZero() || !b.live(kind, label) {
			return nil, errUnchanged
		}
		cur.EmptySince, cur.Claimed = time.Time{}, b.now()
		return cur, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		b.log.Warn("cannot record that a route has members", zap.String("route", key), zap.Error(err))
	} else if err == nil {
		b.log.Info("a route recorded empty has members: recorded again", zap.String("route", key))
	}
}

// markEmpty records, in a cluster, that a route no edge serves is empty from now on (its
// members vanished with an edge, or every edge restarted since): its claim lapses a TTL later.
func (s *sharedRules) markEmpty(key, kind, label string) {
	b := s.b
	_, err := b.update(key, func(cur *store.Route) (*store.Route, error) {
		now := b.now()
		if cur == nil || cur.Reserved || !cur.EmptySince.IsZero() || now.Sub(cur.Claimed) < s.lease || b.live(kind, label) {
			return nil, errUnchanged
		}
		cur.EmptySince = now
		return cur, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		b.log.Warn("cannot record that a route is empty", zap.String("route", key), zap.Error(err))
	}
}
