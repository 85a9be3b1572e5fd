package tunnel

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel/store"
)

// Routes a NATS cluster lost. The cluster asks JetStream to fsync before it acknowledges a
// write (sync_interval: always) and keeps the routes in 3 replicas, but every node of a
// NATS cluster may still come back from a store missing its last writes (a power loss with
// the disks' caches lost, a restore from an older copy): a route claimed just before is then
// not in the bucket, and while its connectors come back another tenant could claim it. So an
// edge of a cluster keeps its routes through store.Recall, which remembers the last version
// of every route the edge read, listed or wrote; a claim on a route the store lost decides
// on the remembered route, and when the edge's NATS connection comes back it writes the
// routes it remembers that the store no longer holds back (unless their claims lapsed).
// When NATS restarted as a whole (its members bucket, in memory storage, was created anew or
// lost records the edge knew: the only way the route bucket can have lost writes too), the
// edge also refuses, for a lease, the first claims of routes that neither the store nor its
// memory knows (unavailable: connectors try again), so that the other edges, whose NATS
// connections come back within that time, write back the routes they remember first. From
// the connection's loss until its members watch, started again, has delivered the bucket's
// records, it holds them too. (A route whose emptiness or claim this edge was still to
// write when NATS went away is written back by that write: it decides on the remembered
// route.) The remembered routes decide only from the connection's loss until they are
// written back (store.Recall's Doubt and Trust): otherwise a route the store does not hold
// was deleted, and is forgotten.

// errRestoring refuses a new route while the routes the store may have lost are written
// back.
var errRestoring = errors.New("tunnel: new routes wait until the routes NATS may have lost are written back (its connection came back)")

// holdNew reports why a first claim of a route is refused now; nil when it may go on.
func (b *routeBook) holdNew(now time.Time) error {
	if until := b.restoring.Load(); until != 0 && now.UnixNano() < until {
		return errRestoring
	}
	return nil
}

// holdNewRoutes makes first claims of routes this edge does not know wait for d from now (0:
// they wait no more).
func (s *sharedRules) holdNewRoutes(d time.Duration) {
	if d <= 0 {
		s.b.restoring.Store(0)
		return
	}
	// The store may have lost writes: what this edge remembers decides until it is written
	// back (restoreLost).
	if rc, ok := s.b.st.(*store.Recall); ok {
		rc.Doubt()
	}
	s.b.restoring.Store(s.b.now().Add(d).UnixNano())
}

// restoreLost runs after the edge's NATS connection came back: it writes back the routes
// this edge remembers that the store lost, trying until the store answers, for up to a
// lease.
func (s *sharedRules) restoreLost() {
	b := s.b
	rc, ok := b.st.(*store.Recall)
	if !ok {
		return
	}
	deadline := time.Now().Add(s.lease)
	for {
		doubt := rc.Doubts()
		err := s.restoreOnce(rc)
		if err == nil {
			// The store holds again what this edge remembers of it: a route it does not
			// hold from now on was deleted (an operator released it, another edge swept
			// it), not lost.
			rc.Trust(doubt)
			return
		}
		if time.Now().After(deadline) {
			b.log.Warn("cannot write back the routes the store may have lost; a lease went by", zap.Error(err))
			return
		}
		select {
		case <-s.stop:
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// restoreOnce writes back, once, each remembered route the store does not hold whose claim
// has not lapsed, and forgets the others.
func (s *sharedRules) restoreOnce(rc *store.Recall) error {
	b := s.b
	lost, err := rc.Lost(b.ctx)
	if err != nil {
		return err
	}
	forgetLapsed(b, rc, lost)
	// The routes first, then the port reservations (reserved: they never lapse) of those
	// the store holds, back or not lost; one whose route's claim lapsed is left lost.
	slices.SortStableFunc(lost, func(x, y *store.Route) int {
		return cmp.Compare(boolInt(x.Kind == kindPort), boolInt(y.Kind == kindPort))
	})
	var errs []error
	for _, r := range lost {
		if b.lapsed(r, b.now(), func() bool { return b.live(r.Kind, r.Label) }) {
			continue
		}
		if r.Kind == kindPort && !strings.HasPrefix(r.Group, "solo/") {
			owner, err := rc.Get(b.ctx, r.Group)
			if err != nil {
				errs = append(errs, fmt.Errorf("tunnel: write back port reservation %s: %w", r.Key(), err))
				continue
			}
			if owner == nil || !slices.Contains(slices.Collect(maps.Values(owner.Ports)), reservedPort(r)) {
				rc.Forget(r.Key())
				continue
			}
		}
		var wrote bool
		var werr error
		b.writes.now(r.Key(), func() { wrote, werr = rc.Restore(b.ctx, r.Key()) })
		switch {
		case werr != nil:
			errs = append(errs, fmt.Errorf("tunnel: write back route %s: %w", r.Key(), werr))
		case wrote:
			b.log.Warn("route missing from the store written back as this edge last saw it (the store lost writes)",
				zap.String("route", r.Key()), zap.String("tenant", r.Tenant))
		}
	}
	return errors.Join(errs...)
}

// forgetLapsed forgets the remembered routes of lost whose claims lapsed (deleted by another
// edge's sweep, or lost for good).
func forgetLapsed(b *routeBook, rc *store.Recall, lost []*store.Route) {
	now := b.now()
	for _, r := range lost {
		if b.lapsed(r, now, func() bool { return b.live(r.Kind, r.Label) }) {
			rc.Forget(r.Key())
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reservedPort is the port a port reservation ("port/<n>") reserves (0 if its label is not one).
func reservedPort(r *store.Route) int {
	p, _ := strconv.Atoi(r.Label)
	return p
}
