package tunnel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// errUnchanged makes a store update write nothing.
var errUnchanged = errors.New("tunnel: unchanged")

// routeBook keeps route ownership: which tenant may register a route, the public ports of
// TCP pools, and the reserved endpoints. A route belongs to the tenant that first claimed it
// (or that an endpoint reserves it for) until the claim lapses, RouteTTL after its last
// member left. Every change is written through the store before the registration it belongs
// to is acknowledged, and the store is read back when the edge starts.
type routeBook struct {
	st  store.Store
	ttl time.Duration
	now func() time.Time
	reg *group.Registry
	log *zap.Logger

	// writes orders the book's store writes per route (routes_writes.go); closing is closed
	// (stop) when the edge begins to close: a write the store refused is not tried again
	// then, for the store may be gone for good (a cluster's, once the edge left it), and the
	// edge's Close waits for the writes.
	writes    routeWrites
	closing   chan struct{}
	closeOnce sync.Once
	// ctx bounds the book's store calls. It lasts as long as the store: close cancels it as
	// it closes the store, once the edge's last session is gone. (The server's own context
	// ends earlier in Close, while sessions still end and their routes are recorded empty.)
	ctx    context.Context
	cancel context.CancelFunc

	// eps are the reserved endpoints in force and their policies' gates; Reload replaces
	// the set (edge_live.go).
	eps atomic.Pointer[endpointSet]

	mu sync.Mutex
	// ports counts the TCP ports held for each tenant's routes and solo TCP tunnels (quota
	// max_tcp_ports); soloTCP are the tenants of this edge's solo TCP tunnels, by port.
	ports   map[string]map[int]bool
	soloTCP map[int]string
	// claims indexes the routes each tenant holds (quota max_routes; routes_quota.go).
	claims routeClaims
	// tunnels and sessions count each tenant's live tunnels and sessions (quotas).
	tunnels, sessions map[string]int
	// startedAt is when this edge started: no claim lapses within RouteTTL of it.
	startedAt time.Time
	// pendingPorts counts the ports being taken for each tenant's new TCP pools, between
	// claim and joined (quota max_tcp_ports).
	pendingPorts map[string]int

	// rules are what differs on an edge of a cluster: localRules, or sharedRules.
	rules routeRules
	// spawn runs a function on a goroutine the edge waits for (false: the edge stops).
	spawn func(func()) bool
	// stopping is set when the edge begins to stop: its solo tunnels leave then without
	// giving up their claims, which their connectors take back on another edge.
	stopping atomic.Bool
	// soloHolders are, in a cluster, the sessions holding the solo claims of this edge's
	// solo HTTP tunnels, by subdomain: emptied clears the route's Holder when they leave.
	soloHolders map[string]string
	// elsewhere are the ports this edge holds back because a route of another edge
	// reserved them (holdElsewhere), given back by the sweep once that reservation is gone.
	elsewhere map[int]bool
	// restoring is, in a cluster, until when (Unix ns) first claims wait after NATS came
	// back: the routes the store may have lost are written back meanwhile (routes_restore.go).
	restoring atomic.Int64
	// soloPorts are the cluster reservations ("solo/<edge id>/<tunnel id>") of this edge's solo TCP
	// tunnels, by port: released when the tunnel's group goes.
	soloPorts map[int]string
}

// servedElsewhere reports whether, in a cluster, route kind/label has members on another edge.
func (b *routeBook) servedElsewhere(kind, label string) bool {
	_, ok := b.rules.tenantElsewhere(kind, label)
	return ok
}

// take counts one more tunnel or session of tenant in counts, unless that makes more than
// max (0: no cap).
func (b *routeBook) take(counts map[string]int, tenant string, max int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if max > 0 && counts[tenant] >= max {
		return false
	}
	counts[tenant]++
	return true
}

// give undoes take.
func (b *routeBook) give(counts map[string]int, tenant string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if counts[tenant]--; counts[tenant] <= 0 {
		delete(counts, tenant)
	}
}

// routeKey returns the store key of a registration's route, and "" for a solo TCP tunnel,
// which owns nothing.
func routeKey(req *group.JoinRequest, grouped bool) (kind, label string) {
	switch {
	case req.Proto.BySubdomain(): // http, https and tls
		return store.KindHTTP, req.Label
	case grouped:
		return store.KindTCP, req.Group
	}
	return "", ""
}

// ownedError is the refusal of a route that belongs to another tenant.
func ownedError(kind, label string) error {
	if kind == store.KindTCP {
		return &group.Error{Err: ErrOwned, Msg: fmt.Sprintf("group '%s' belongs to another tenant", label)}
	}
	return &group.Error{Err: ErrOwned, Msg: fmt.Sprintf("subdomain '%s' belongs to another tenant", label)}
}

func newRouteBook(st store.Store, ttl time.Duration, reg *group.Registry, endpoints []Endpoint, log *zap.Logger) (*routeBook, error) {
	b := &routeBook{st: st, ttl: ttl, now: time.Now, reg: reg, log: log, rules: localRules{}, closing: make(chan struct{}),
		ports: map[string]map[int]bool{}, tunnels: map[string]int{}, sessions: map[string]int{},
		pendingPorts: map[string]int{}, soloPorts: map[int]string{}, elsewhere: map[int]bool{},
		soloHolders: map[string]string{}, soloTCP: map[int]string{}, claims: routeClaims{byTenant: map[string]map[string]uint64{}}}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	reservedEps := map[string]*Endpoint{}
	for i := range endpoints {
		ep := endpoints[i].own()
		reservedEps[store.Key(ep.kind(), ep.label())] = ep
	}
	b.eps.Store(newEndpointSet(reservedEps, nil))
	before := b.beginClaimsIndex()
	routes, err := st.List(b.ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: reading the route store: %w", err)
	}
	b.indexClaims(routes, before)
	// The edge starts with no member: every route is empty from now on, and its owner has a
	// full RouteTTL from startedAt to come back (however long the edge was down). That
	// takes no write (lapsed reads startedAt), so a start costs no fsync per route.
	now := b.now()
	b.startedAt = now
	for _, r := range routes {
		if r.Kind == kindPort {
			b.holdPorts(r) // a cluster's port reservation (edge_cluster_routes.go)
			continue
		}
		if _, reserved := reservedEps[r.Key()]; reserved {
			continue
		}
		if r.Reserved { // no endpoint reserves it any more: an ordinary claim from now on
			r, err = st.Update(b.ctx, r.Key(), func(cur *store.Route) (*store.Route, error) {
				if cur == nil {
					return nil, errUnchanged
				}
				cur.Reserved = false
				return cur, nil
			})
			if err != nil && !errors.Is(err, errUnchanged) {
				return nil, fmt.Errorf("tunnel: writing the route store: %w", err)
			}
		}
		if r != nil {
			b.holdPorts(r)
		}
	}
	for key, ep := range reservedEps {
		r, err := st.Update(b.ctx, key, func(cur *store.Route) (*store.Route, error) {
			next := ep.route()
			next.EmptySince = now
			if cur != nil && cur.Tenant != next.Tenant {
				log.Warn("endpoint reserves a route another tenant owned", zap.String("route", key),
					zap.String("tenant", next.Tenant), zap.String("previous", cur.Tenant))
			}
			return next, nil
		})
		if err != nil {
			return nil, fmt.Errorf("tunnel: writing the route store: %w", err)
		}
		b.holdPorts(r)
	}
	return b, nil
}

// holdPorts keeps r's TCP ports for its owner.
func (b *routeBook) holdPorts(r *store.Route) {
	if len(r.Ports) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	held := b.ports[r.Tenant]
	if held == nil {
		held = map[int]bool{}
		b.ports[r.Tenant] = held
	}
	for _, p := range r.Ports {
		held[p] = true
		b.reg.HoldPorts(p)
	}
}

// releasePorts gives r's TCP ports back to the range.
func (b *routeBook) releasePorts(r *store.Route) {
	if r == nil || len(r.Ports) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range r.Ports {
		delete(b.ports[r.Tenant], p)
		b.reg.ReleasePorts(p)
	}
	if len(b.ports[r.Tenant]) == 0 {
		delete(b.ports, r.Tenant)
	}
}

// tenantPorts is the number of TCP ports held for tenant's routes.
func (b *routeBook) tenantPorts(tenant string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.ports[tenant])
}

// lapsed reports whether r's claim has lapsed at now: RouteTTL after its last member left,
// and never within RouteTTL of this edge's start, nor while the rules hold it live
// (routeRules.holdsLive; live reports whether the route has members now). A route recorded
// with members that has none lost them when the edge restarted: it lapses RouteTTL after the
// start.
func (b *routeBook) lapsed(r *store.Route, now time.Time, live func() bool) bool {
	if r.Reserved || b.rules.holdsLive(r, live) {
		return false
	}
	since := r.EmptySince
	if since.IsZero() || since.Before(b.startedAt) {
		since = b.startedAt
	}
	return now.Sub(since) >= b.ttl
}

// membersTenant returns the tenant of the members serving route kind/label now, on this
// edge or (in a cluster) another, and whether any does.
func (b *routeBook) membersTenant(kind, label string) (string, bool) {
	var groups []*group.Group
	if kind == store.KindHTTP {
		if g := b.reg.LookupHTTP(label); g != nil {
			groups = append(groups, g)
		}
	} else {
		for _, g := range b.reg.Groups() {
			if g.Kind == group.KindTCP && g.Label == label && !g.Solo() {
				groups = append(groups, g)
			}
		}
	}
	for _, g := range groups {
		for _, m := range g.Members() {
			return m.Tenant, true
		}
	}
	return b.rules.tenantElsewhere(kind, label)
}

// live reports whether the route has a pool with members in the registry now.
func (b *routeBook) live(kind, label string) bool {
	if b.servedElsewhere(kind, label) {
		return true
	}
	if kind == store.KindHTTP {
		return b.reg.LookupHTTP(label) != nil
	}
	for _, g := range b.reg.View().Groups() {
		if g.Kind == group.KindTCP && g.Label == label && !g.Solo() && len(g.Members) > 0 {
			return true
		}
	}
	return false
}

// sweep deletes the claims that lapsed and gives their ports back.
func (b *routeBook) sweep() {
	before := b.beginClaimsIndex()
	routes, err := b.st.List(b.ctx)
	if err != nil {
		return
	}
	b.indexClaims(routes, before)
	if rc, ok := b.st.(*store.Recall); ok {
		forgetLapsed(b, rc, rc.Missing(routes))
	}
	now := b.now()
	live := b.liveIndex()
	reserved := map[int]bool{} // in a cluster: the ports reserved now
	defer b.rules.sweepDone(reserved)
	for _, r := range routes {
		isLive := func() bool { return live(r) }
		if b.rules.sweepRecord(r, now, isLive, reserved) || !b.lapsed(r, now, isLive) {
			continue
		}
		var gone *store.Route
		_, err := b.update(r.Key(), func(cur *store.Route) (*store.Route, error) {
			if cur == nil || !b.lapsed(cur, now, func() bool { return b.live(r.Kind, r.Label) }) {
				return nil, errUnchanged
			}
			gone = cur
			return nil, nil
		})
		if err == nil && gone != nil {
			b.log.Info("route claim lapsed", zap.String("route", r.Key()), zap.String("tenant", gone.Tenant))
			b.dropClaim(gone.Tenant, r.Key())
			b.releasePorts(gone)
			b.rules.dropped(gone)
		}
	}
}

// liveIndex returns a function reporting whether a route has members now, here or on
// another edge, for a sweep over many routes: the TCP pools with members are listed once,
// when first needed.
func (b *routeBook) liveIndex() func(r *store.Route) bool {
	var tcpLive map[string]bool
	return func(r *store.Route) bool {
		if b.servedElsewhere(r.Kind, r.Label) {
			return true
		}
		if r.Kind == store.KindHTTP {
			return b.reg.LookupHTTP(r.Label) != nil
		}
		if tcpLive == nil {
			tcpLive = map[string]bool{}
			for _, g := range b.reg.View().Groups() {
				if g.Kind == group.KindTCP && !g.Solo() && len(g.Members) > 0 {
					tcpLive[g.Label] = true
				}
			}
		}
		return tcpLive[r.Label]
	}
}

// openRouteBook opens the configured store and reads the routes back.
func openRouteBook(cfg *ServerConfig, reg *group.Registry, log *zap.Logger) (*routeBook, error) {
	for i := range cfg.Endpoints {
		if err := cfg.Endpoints[i].validate(cfg.TCP.Ports); err != nil {
			return nil, err
		}
	}
	st := cfg.Store
	if st == nil {
		st = store.NewMemory()
	}
	ttl := cfg.RouteTTL
	if ttl <= 0 {
		ttl = defaultRouteTTL
	}
	b, err := newRouteBook(st, ttl, reg, cfg.Endpoints, log.Named("routes"))
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return b, nil
}

// stop tells the book that the edge is closing: a write the store refuses from now on is
// not tried again.
func (b *routeBook) stop() {
	b.stopping.Store(true)
	b.closeOnce.Do(func() { close(b.closing) })
}

// close ends the book's store calls still under way and closes the store.
func (b *routeBook) close() error {
	// The writes queued as the last members left are tried once more, not again and again:
	// each is bounded by the store's timeouts.
	b.stop()
	b.writes.wait()
	b.cancel()
	return b.st.Close()
}

// sweeper deletes lapsed claims every interval until done is closed.
func (b *routeBook) sweeper(done <-chan struct{}) {
	every := min(b.ttl/4, time.Minute)
	t := time.NewTicker(max(every, time.Second))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			b.sweep()
		case <-done:
			return
		}
	}
}

// idleEndpoints are the reserved routes with no live pool, for the admin API to list with
// zero members.
func (b *routeBook) idleEndpoints() []IdleEndpoint {
	var out []IdleEndpoint
	var groups []group.Info // listed once, if a TCP endpoint needs it
	for _, ep := range b.eps.Load().byKey {
		info := group.Info{Kind: group.KindHTTP, Proto: ep.Proto, Label: ep.label(), Name: ep.Group, KeyHash: ep.KeyHash}
		if info.Proto == "" {
			info.Proto = ProtoHTTP
		}
		live := false
		if ep.Proto == ProtoTCP {
			info.Kind, info.Port = group.KindTCP, ep.Port
			if groups == nil {
				groups = b.reg.View().Groups()
			}
			for _, g := range groups {
				live = live || g.Kind == group.KindTCP && g.Label == ep.Group && g.KeyHash == ep.KeyHash
			}
		} else {
			live = b.reg.LookupHTTP(ep.Subdomain) != nil
		}
		if !live {
			out = append(out, IdleEndpoint{Info: info, Tenant: ep.Tenant})
		}
	}
	return out
}
