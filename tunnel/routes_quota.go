package tunnel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel/store"
)

// routeClaims indexes the route records by tenant: the routes each tenant holds, live or
// lingering for RouteTTL after their last member left, for the max_routes quota and the
// operator's list. A claim outlives its tunnels, so without a quota one tenant could squat
// any number of names, each costing a store write.
//
// The index is rebuilt from the store when the edge starts and on every sweep, and the claims
// this edge makes and drops change it at once. In a cluster it is therefore cluster-wide as
// of the last sweep (at most a minute old) plus this edge's own changes since: a tenant may
// go past its quota by the claims it makes on other edges within one sweep.
type routeClaims struct {
	// byTenant maps tenant → route key → the sweep generation the entry was added in.
	byTenant map[string]map[string]uint64
	// gen counts the rebuilds: an entry added after a rebuild began is kept by it.
	gen uint64
}

// takeRouteSlot records that tenant claims route key, unless that makes more than max
// routes (0: no cap). added reports whether key is new for tenant (to be dropped if the claim
// is not written after all). b.mu is taken.
func (b *routeBook) takeRouteSlot(tenant, key string, max int) (ok, added bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.claims.byTenant[tenant]
	if _, ok := held[key]; ok {
		return true, false
	}
	if max > 0 && len(held) >= max {
		return false, false
	}
	if held == nil {
		held = map[string]uint64{}
		b.claims.byTenant[tenant] = held
	}
	held[key] = b.claims.gen
	return true, true
}

// dropClaim forgets that tenant holds route key.
func (b *routeBook) dropClaim(tenant, key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.claims.byTenant[tenant], key)
	if len(b.claims.byTenant[tenant]) == 0 {
		delete(b.claims.byTenant, tenant)
	}
}

// beginClaimsIndex starts a rebuild of the index: it returns the generation of the entries
// the rebuild may drop (those added before it read the store).
func (b *routeBook) beginClaimsIndex() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.claims.gen++
	return b.claims.gen - 1
}

// indexClaims rebuilds the index from routes, the store's records as read after
// beginClaimsIndex returned before: an entry the records lack is dropped unless it was added
// since (a claim written after the read).
func (b *routeBook) indexClaims(routes []*store.Route, before uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	listed := map[string]map[string]bool{}
	for _, r := range routes {
		if !countsAsClaim(r) {
			continue
		}
		if listed[r.Tenant] == nil {
			listed[r.Tenant] = map[string]bool{}
		}
		listed[r.Tenant][r.Key()] = true
		held := b.claims.byTenant[r.Tenant]
		if held == nil {
			held = map[string]uint64{}
			b.claims.byTenant[r.Tenant] = held
		}
		if _, ok := held[r.Key()]; !ok {
			held[r.Key()] = before
		}
	}
	for tenant, held := range b.claims.byTenant {
		for key, gen := range held {
			if gen <= before && !listed[tenant][key] {
				delete(held, key)
			}
		}
		if len(held) == 0 {
			delete(b.claims.byTenant, tenant)
		}
	}
}

// countsAsClaim reports whether r counts in its tenant's max_routes: a route a tenant
// claimed, not a reserved endpoint (the operator's) nor a cluster's port reservation.
func countsAsClaim(r *store.Route) bool {
	return r.Kind != kindPort && !r.Reserved
}

// holdSoloTCP counts port, taken by a solo TCP tunnel of tenant, in tenant's max_tcp_ports.
func (b *routeBook) holdSoloTCP(tenant string, port int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ports[tenant] == nil {
		b.ports[tenant] = map[int]bool{}
	}
	b.ports[tenant][port] = true
	b.soloTCP[port] = tenant
}

// releaseSoloTCP gives back the port of a solo TCP tunnel that left. The registry calls it
// (emptied) under a route lock: it only changes memory.
func (b *routeBook) releaseSoloTCP(port int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	tenant, ok := b.soloTCP[port]
	if !ok {
		return
	}
	delete(b.soloTCP, port)
	delete(b.ports[tenant], port)
	if len(b.ports[tenant]) == 0 {
		delete(b.ports, tenant)
	}
}

// RouteClaim is a route a tenant holds: an HTTP subdomain or a TCP pool's name, with or
// without members now. Operator.Routes lists them.
type RouteClaim struct {
	// Kind is "http" (a subdomain, also of https and tls tunnels) or "tcp" (a pool's name).
	Kind string
	// Label is the subdomain or the TCP pool's name.
	Label string
	// Tenant holds it ("" for the connectors of tokens with no tenant).
	Tenant string
	// Group is the pool's name; "" for a solo tunnel's route.
	Group string
	// Port is a TCP pool's public port, 0 if none is held.
	Port int
	// Live reports whether it has members now, on this edge or (in a cluster) another.
	Live bool
	// Reserved reports a reserved endpoint's route (the operator's, counted in no quota).
	Reserved bool
	// Claimed is when it was last claimed (in a cluster: by a registration on any edge); zero
	// when not recorded.
	Claimed time.Time
	// EmptySince is when its last member left, zero while it has members; Expires is when
	// the claim lapses if no member comes back (EmptySince + RouteTTL), zero while live.
	EmptySince, Expires time.Time
}

// routeClaimsList reads every route record and returns them as RouteClaims, by key.
func (b *routeBook) routeClaimsList(ctx context.Context) ([]RouteClaim, error) {
	routes, err := b.st.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: reading the route store: %w", err)
	}
	live := b.liveIndex()
	out := make([]RouteClaim, 0, len(routes))
	for _, r := range routes {
		if r.Kind == kindPort {
			continue
		}
		c := RouteClaim{Kind: r.Kind, Label: r.Label, Tenant: r.Tenant, Group: r.Group, Reserved: r.Reserved,
			Claimed: r.Claimed, Live: live(r)}
		for _, p := range r.Ports {
			c.Port = p
		}
		if !c.Live && !r.Reserved {
			c.EmptySince = r.EmptySince
			if !b.rules.holdsLive(r, func() bool { return false }) {
				// As lapsed reads it: RouteTTL after the emptiness, and never within RouteTTL
				// of this edge's start.
				c.Expires = latest(r.EmptySince, b.startedAt).Add(b.ttl)
			}
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b RouteClaim) int {
		return strings.Compare(store.Key(a.Kind, a.Label), store.Key(b.Kind, b.Label))
	})
	return out, nil
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Errors of ReleaseRoute.
var (
	// ErrRouteLive: the route has members; it is released when they have left.
	ErrRouteLive = errors.New("tunnel: the route has members")
	// ErrRouteReserved: the route is a reserved endpoint's; remove the endpoint instead.
	ErrRouteReserved = errors.New("tunnel: the route is a reserved endpoint's")
	// ErrNoRoute: no tenant holds the route.
	ErrNoRoute = errors.New("tunnel: no tenant holds the route")
)

// release drops the claim on route kind/label now, as if it had lapsed: its tenant's quota
// and its TCP port are freed, and any tenant may claim it. A route with members, or a
// reserved endpoint's, is not released.
func (b *routeBook) release(kind, label string) (*store.Route, error) {
	if kind != store.KindHTTP && kind != store.KindTCP {
		return nil, fmt.Errorf("%w: kind %q is neither %q nor %q", ErrNoRoute, kind, store.KindHTTP, store.KindTCP)
	}
	key := store.Key(kind, label)
	var gone *store.Route
	_, err := b.update(key, func(cur *store.Route) (*store.Route, error) {
		gone = nil
		switch {
		case cur == nil:
			return nil, ErrNoRoute
		case cur.Reserved:
			return nil, ErrRouteReserved
		case b.live(kind, label):
			return nil, ErrRouteLive
		}
		gone = cur
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	b.log.Info("route claim released by the operator", zap.String("route", key), zap.String("tenant", gone.Tenant))
	b.dropClaim(gone.Tenant, key)
	b.releasePorts(gone)
	b.rules.dropped(gone)
	return gone, nil
}
