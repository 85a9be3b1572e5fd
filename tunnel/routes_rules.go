package tunnel

import (
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// routeRules are the parts of route ownership that depend on whether other edges write the
// route store too. A single edge's book (localRules) is alone with its store: what it does
// not serve nobody serves, and a route is empty when its last member here leaves. An edge of
// a cluster (sharedRules, routes_shared.go) shares the store with edges whose members and
// claims it learns of a lease late, and asks its Cluster about them. The route book is the
// same otherwise: each method is one question it asks at one point of a claim, a join, an
// emptiness or a sweep.
type routeRules interface {
	// tenantElsewhere returns the tenant of route kind/label's members on other edges, and
	// whether there are any.
	tenantElsewhere(kind, label string) (string, bool)
	// conflict is the refusal the members of HTTP route label on other edges would give
	// req, or nil (asked when the route has no pool here).
	conflict(label string, req *group.JoinRequest, grouped bool) error
	// solo returns what req's connector session says of itself, for a solo HTTP claim.
	solo(req *group.JoinRequest, kind string, grouped bool) soloClaim
	// claimSoloPort reserves the port of a solo TCP tunnel, which owns no route.
	claimSoloPort(tk *ticket, req *group.JoinRequest) error
	// holdsLive reports whether r, owned or not, may not lapse because it is live (live
	// reports whether it has members now) or may have members nobody recorded.
	holdsLive(r *store.Route, live func() bool) bool
	// reclaim decides a claim by the route owner's tenant on its own route cur, after the
	// single edge's checks passed: write reports that cur was changed and is to be written.
	reclaim(cur *store.Route, req *group.JoinRequest, grouped bool, sc soloClaim, now time.Time) (write bool, err error)
	// stampNew completes r, the first claim of a route, written for req.
	stampNew(r *store.Route, req *group.JoinRequest, grouped bool, sc soloClaim, now time.Time)
	// holdTicket records on tk what joined must write for req's claim.
	holdTicket(tk *ticket, req *group.JoinRequest, grouped bool, sc soloClaim)
	// poolPort returns the port of tk's TCP pool: port, the one it had before (0: none), or
	// one reserved for it now.
	poolPort(tk *ticket, req *group.JoinRequest, port int) (int, error)
	// joinedRecord updates cur, the record of a route whose pool g just got tk's member,
	// beyond what a single edge writes; handled reports that it decided the record's key,
	// and changed that it changed cur.
	joinedRecord(cur *store.Route, g *group.Group, tk *ticket, lastClaim, now time.Time) (handled, changed bool, err error)
	// emptiedRecord decides whether cur, the record of route kind/label whose last member
	// here left, stays as it is (keep) instead of being recorded empty, and whether the
	// emptiness is to be recorded later (SettleLater) instead.
	emptiedRecord(cur *store.Route, kind, label string, now time.Time) (keep, later bool)
	// settleLater records route kind/label empty once no claim can be in flight for it.
	settleLater(kind, label string)
	// sweepRecord handles r in a sweep when it is not an ordinary claim to lapse (a port
	// reservation, a route recorded empty or live wrongly) and reports whether it did;
	// reserved gathers the ports reserved now, for sweepDone.
	sweepRecord(r *store.Route, now time.Time, live func() bool, reserved map[int]bool) bool
	// sweepDone ends a sweep that found the reserved ports.
	sweepDone(reserved map[int]bool)
	// dropped is called after the claim r lapsed and was deleted.
	dropped(r *store.Route)
}

// localRules are a single edge's: it alone writes its store.
type localRules struct{}

func (localRules) tenantElsewhere(string, string) (string, bool)                         { return "", false }
func (localRules) conflict(string, *group.JoinRequest, bool) error                       { return nil }
func (localRules) claimSoloPort(*ticket, *group.JoinRequest) error                       { return nil }
func (localRules) holdTicket(*ticket, *group.JoinRequest, bool, soloClaim)               {}
func (localRules) settleLater(string, string)                                            {}
func (localRules) sweepDone(map[int]bool)                                                {}
func (localRules) dropped(*store.Route)                                                  {}
func (localRules) stampNew(*store.Route, *group.JoinRequest, bool, soloClaim, time.Time) {}

func (localRules) solo(req *group.JoinRequest, _ string, _ bool) soloClaim {
	return soloClaim{session: req.Session}
}

// holdsLive: a route recorded with members (no EmptySince) holds while it has them here; one
// recorded empty lapses by its time.
func (localRules) holdsLive(r *store.Route, live func() bool) bool {
	return r.EmptySince.IsZero() && live()
}

func (localRules) reclaim(*store.Route, *group.JoinRequest, bool, soloClaim, time.Time) (bool, error) {
	return false, nil
}

func (localRules) poolPort(_ *ticket, _ *group.JoinRequest, port int) (int, error) { return port, nil }

func (localRules) joinedRecord(*store.Route, *group.Group, *ticket, time.Time, time.Time) (bool, bool, error) {
	return false, false, nil
}

// emptiedRecord: an emptiness already recorded stays (its time is when the route emptied).
func (localRules) emptiedRecord(cur *store.Route, _, _ string, _ time.Time) (keep, later bool) {
	return !cur.EmptySince.IsZero(), false
}

func (localRules) sweepRecord(*store.Route, time.Time, func() bool, map[int]bool) bool {
	return false
}
