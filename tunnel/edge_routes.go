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
var errUnchanged = errors.New("unchanged")

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

	// ctx bounds the book's store calls. It lasts as long as the store: close cancels it as
	// it closes the store, once the edge's last session is gone. (The server's own context
	// ends earlier in Close, while sessions still end and their routes are recorded empty.)
	ctx    context.Context
	cancel context.CancelFunc

	// eps are the reserved endpoints in force and their policies' gates; Reload replaces
	// the set (edge_live.go).
	eps atomic.Pointer[endpointSet]

	mu sync.Mutex
	// ports counts the TCP ports held for each tenant's routes (quota max_tcp_ports).
	ports map[string]map[int]bool
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
	b := &routeBook{st: st, ttl: ttl, now: time.Now, reg: reg, log: log, rules: localRules{},
		ports: map[string]map[int]bool{}, tunnels: map[string]int{}, sessions: map[string]int{},
		pendingPorts: map[string]int{}, soloPorts: map[int]string{}, elsewhere: map[int]bool{},
		soloHolders: map[string]string{}}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	reservedEps := map[string]*Endpoint{}
	for i := range endpoints {
		ep := endpoints[i].own()
		reservedEps[store.Key(ep.kind(), ep.label())] = ep
	}
	b.eps.Store(newEndpointSet(reservedEps, nil))
	routes, err := st.List(b.ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: reading the route store: %w", err)
	}
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

// ticket is one registration's hold on its route between claim and joined (or abandon).
type ticket struct {
	key, tenant string
	kind, label string
	created     *store.Route    // the first claim this registration wrote, if any
	solo        string          // in a cluster: the reservation of a solo TCP tunnel's port
	portSlot    bool            // a max_tcp_ports slot reserved for a new port
	port        int             // in a cluster: the port the TCP pool must have on this edge
	holder      string          // in a cluster: the solo HTTP tunnel's session (store.Route.Holder)
	holderHash  string          // and the hex SHA-256 of its resume token (HolderHash)
	prevKeys    []group.KeyHash // the keys the registration held before (a rotation)
	seenKey     group.KeyHash   // in a cluster: the route's key as the claim left it
}

// claim checks, before a Join, that tenant may register req's route, and records a first
// claim at once so that two tenants racing on a new route cannot both pass. It sets
// req.Port to the port the pool had before, and reserves a max_tcp_ports slot when the pool
// needs a new one. The caller then calls joined (the Join succeeded) or abandon.
func (b *routeBook) claim(tenant string, req *group.JoinRequest, grouped bool, maxPorts int) (*ticket, error) {
	kind, label := routeKey(req, grouped)
	tk := &ticket{tenant: tenant, kind: kind, label: label}
	if kind == "" {
		if err := b.rules.claimSoloPort(tk, req); err != nil {
			return nil, err
		}
		return tk, nil
	}
	tk.key = store.Key(kind, label)
	if kind == store.KindHTTP && b.reg.LookupHTTP(label) == nil {
		if err := b.rules.conflict(label, req, grouped); err != nil {
			return nil, err
		}
	}
	// Read before the store's lock is taken.
	c := &claimDecision{b: b, tk: tk, req: req, grouped: grouped, sc: b.rules.solo(req, kind, grouped)}
	if _, err := b.st.Update(b.ctx, tk.key, c.decide); err != nil && !errors.Is(err, errUnchanged) {
		return nil, refusal(err)
	}
	if c.taken != nil {
		b.log.Info("route claim lapsed; a new tenant claims it", zap.String("route", tk.key))
		b.releasePorts(c.taken)
	}
	b.rules.holdTicket(tk, req, grouped, c.sc)
	tk.prevKeys = req.PrevKeyHashes
	req.Port = c.port
	if kind != store.KindTCP {
		return tk, nil
	}
	if c.port == 0 && maxPorts > 0 {
		if !b.reservePortSlot(tenant, maxPorts) {
			b.abandon(tk)
			return nil, fmt.Errorf("%w: this tenant already holds %d TCP ports (max_tcp_ports)", ErrLimit, maxPorts)
		}
		tk.portSlot = true
	}
	p, err := b.rules.poolPort(tk, req, c.port)
	if err != nil {
		b.abandon(tk)
		return nil, err
	}
	req.Port = p
	return tk, nil
}

// refusal is the error of a registration whose route could not be claimed or recorded: a
// *group.Error as it is, anything else (the store failed) ErrUnavailable, wrapping it.
func refusal(err error) error {
	var ge *group.Error
	if errors.As(err, &ge) {
		return err
	}
	return fmt.Errorf("%w: cannot record the route: %w", ErrUnavailable, err)
}

// claimDecision is one claim's decision, made in the store's Update (which may call decide
// more than once: it only computes, and what it decided is read after).
type claimDecision struct {
	b       *routeBook
	tk      *ticket
	req     *group.JoinRequest
	grouped bool
	sc      soloClaim
	// taken is a lapsed claim of another tenant that the decision replaces; port the port
	// the route's pool had before (0: none).
	taken *store.Route
	port  int
}

func (c *claimDecision) decide(cur *store.Route) (*store.Route, error) {
	c.taken, c.tk.created, c.port = nil, nil, 0
	r, err := c.decideOn(cur, c.b.now())
	switch {
	case err == nil && r != nil:
		c.tk.seenKey = r.KeyHash
	case errors.Is(err, errUnchanged) && cur != nil:
		c.tk.seenKey = cur.KeyHash
	}
	return r, err
}

func (c *claimDecision) decideOn(cur *store.Route, now time.Time) (*store.Route, error) {
	b, tk := c.b, c.tk
	live := func() bool { return b.live(tk.kind, tk.label) }
	if cur != nil && (cur.Tenant == tk.tenant || cur.Reserved) {
		return c.reclaim(cur, now, live)
	}
	if cur != nil && !b.lapsed(cur, now, live) {
		return nil, ownedError(tk.kind, tk.label)
	}
	if other, ok := b.membersTenant(tk.kind, tk.label); ok && other != tk.tenant {
		// No record (a wiped store) or a lapsed one, but another tenant's members serve
		// the route: it is theirs.
		return nil, ownedError(tk.kind, tk.label)
	}
	c.taken = cur
	tk.created = &store.Route{Kind: tk.kind, Label: tk.label, Tenant: tk.tenant, Group: c.req.Group, EmptySince: now}
	if tk.kind == store.KindHTTP && c.grouped {
		tk.created.KeyHash = c.req.KeyHash
	}
	b.rules.stampNew(tk.created, c.req, c.grouped, c.sc, now)
	return tk.created, nil
}

// reclaim decides a claim on cur, a route of the claiming tenant or one an endpoint reserves.
func (c *claimDecision) reclaim(cur *store.Route, now time.Time, live func() bool) (*store.Route, error) {
	b, tk := c.b, c.tk
	if cur.Tenant != tk.tenant {
		return nil, ownedError(tk.kind, tk.label)
	}
	if cur.Reserved {
		if err := reservedAdmits(cur, c.req); err != nil {
			return nil, err
		}
	}
	c.port = routePort(cur, c.req)
	switch write, err := b.rules.reclaim(cur, c.req, c.grouped, c.sc, now); {
	case err != nil:
		return nil, err
	case write:
		return cur, nil
	}
	if b.lapsed(cur, now, live) {
		// The owner is back just as its claim lapses: it holds again, for a full TTL, so
		// that no sweep or other tenant takes it before joined runs.
		cur.EmptySince = now
		return cur, nil
	}
	return nil, errUnchanged
}

// reservePortSlot counts one more port being taken for tenant unless its held ports and
// those being taken reach max.
func (b *routeBook) reservePortSlot(tenant string, max int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.ports[tenant])+b.pendingPorts[tenant] >= max {
		return false
	}
	b.pendingPorts[tenant]++
	return true
}

func (b *routeBook) releasePortSlot(tk *ticket) {
	if !tk.portSlot {
		return
	}
	tk.portSlot = false
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pendingPorts[tk.tenant]--; b.pendingPorts[tk.tenant] <= 0 {
		delete(b.pendingPorts, tk.tenant)
	}
}

// abandon undoes a claim whose Join failed: a first claim it wrote is removed again unless
// the route has a live pool (another registration of the tenant may have joined on it).
func (b *routeBook) abandon(tk *ticket) {
	b.releasePortSlot(tk)
	if tk.solo != "" {
		b.unreservePort(tk.port, tk.solo)
	}
	if tk.created == nil {
		return
	}
	created := tk.created
	_, _ = b.st.Update(b.ctx, tk.key, func(cur *store.Route) (*store.Route, error) {
		if cur == nil || cur.Tenant != created.Tenant || !cur.EmptySince.Equal(created.EmptySince) ||
			len(cur.Ports) > 0 || b.live(tk.kind, tk.label) {
			return nil, errUnchanged // someone has used it since
		}
		return nil, nil
	})
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

// reservedAdmits checks a registration of the owning tenant against its endpoint: the
// endpoint's pool name and, when it sets one, its key hash.
func reservedAdmits(r *store.Route, req *group.JoinRequest) error {
	var zero group.KeyHash
	switch {
	case req.Group == "" && r.Kind == store.KindHTTP:
		return &group.Error{Err: group.ErrInUse, Msg: fmt.Sprintf("subdomain '%s' is already in use", r.Label)}
	case r.KeyHash != zero && r.KeyHash != req.KeyHash,
		r.Kind == store.KindHTTP && r.Group != "" && req.Group != r.Group:
		return group.KeyMismatch(r.Kind == store.KindTCP, r.Label)
	}
	return nil
}

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
	if tk.kind == "" {
		return nil
	}
	if tk.holder != "" {
		b.mu.Lock()
		b.soloHolders[tk.label] = tk.holder
		b.mu.Unlock()
	}
	var oldPort int
	r, err := b.st.Update(b.ctx, tk.key, func(cur *store.Route) (*store.Route, error) {
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

// emptied records that g's last member left; it runs under the route's lock, so that it is
// ordered with the next first member's joined. The rules decide whether the route is empty
// now, later or not (routeRules.emptiedRecord: in a cluster another edge may serve it).
func (b *routeBook) emptied(g *group.Group) {
	kind := store.KindHTTP
	if g.Kind == group.KindTCP {
		if g.Solo() {
			b.releaseSoloPort(g.Port)
			return
		}
		kind = store.KindTCP
	}
	now := b.now()
	later := false
	var holder string // the session of this edge's solo claim on the route, if any
	if kind == store.KindHTTP && g.Solo() && !b.stopping.Load() {
		b.mu.Lock()
		holder = b.soloHolders[g.Label]
		delete(b.soloHolders, g.Label)
		b.mu.Unlock()
	}
	_, err := b.st.Update(b.ctx, store.Key(kind, g.Label), func(cur *store.Route) (*store.Route, error) {
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
		if kind == store.KindTCP && g.KeyHash().String() != "" {
			// Another pool of this name may still have members; the route is empty only
			// when none does (the registry removes pools one at a time).
			for _, other := range b.reg.View().Groups() {
				if other.Kind == group.KindTCP && other.Label == g.Label && other.ID != g.ID && len(other.Members) > 0 {
					return unchanged()
				}
			}
		}
		cur.EmptySince = now
		return cur, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		b.log.Error("cannot record that a route is empty; its claim will not lapse", zap.String("route", g.Label), zap.Error(err))
	}
	if later {
		b.rules.settleLater(kind, g.Label)
	}
}

// sweep deletes the claims that lapsed and gives their ports back.
func (b *routeBook) sweep() {
	routes, err := b.st.List(b.ctx)
	if err != nil {
		return
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
		_, err := b.st.Update(b.ctx, r.Key(), func(cur *store.Route) (*store.Route, error) {
			if cur == nil || !b.lapsed(cur, now, func() bool { return b.live(r.Kind, r.Label) }) {
				return nil, errUnchanged
			}
			gone = cur
			return nil, nil
		})
		if err == nil && gone != nil {
			b.log.Info("route claim lapsed", zap.String("route", r.Key()), zap.String("tenant", gone.Tenant))
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

// close ends the book's store calls still under way and closes the store.
func (b *routeBook) close() error {
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
