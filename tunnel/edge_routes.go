package tunnel

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
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

	// lease is the cluster's lease, 0 on a single edge (edge_cluster_routes.go).
	lease time.Duration
	// spawn runs a function on a goroutine the edge waits for (false: the edge stops).
	spawn func(func()) bool
	// remoteConflict refuses an HTTP registration that the members of its route on other
	// edges would refuse (a solo tunnel on a pool, another key).
	remoteConflict func(label string, req *group.JoinRequest, grouped bool) error
	// edgeID is this edge's id in a cluster; edgeGone reports whether another edge is gone
	// from the cluster (sweepSoloPort).
	edgeID   string
	edgeGone func(id string, after time.Duration) bool
	// liveTenant is, in a cluster, the tenant of a route's members on other edges, and
	// whether it has any there (cluster.liveTenant).
	liveTenant func(kind, label string) (string, bool)
	// stopping is set when the edge begins to stop: its solo tunnels leave then without
	// giving up their claims, which their connectors take back on another edge.
	stopping atomic.Bool
	// soloHolders are, in a cluster, the sessions holding the solo claims of this edge's
	// solo HTTP tunnels, by subdomain: emptied clears the route's Holder when they leave.
	soloHolders map[string]string
	// resumeOf is, in a cluster, what connector session id says of itself: the SHA-256 of
	// its resume token and, when its Hello resumed a session, that session and the SHA-256
	// of the token it presented (Server.sessionResume).
	resumeOf func(session string) (own [32]byte, resumed string, proof [32]byte, ok bool)
	// settleLater records, in a cluster, that a route is empty once no claim can be in
	// flight for it any more, if no edge serves it by then (cluster.settleRoute).
	settleLater func(kind, label string)
	// elsewhere are the ports this edge holds back because a route of another edge
	// reserved them (holdElsewhere), given back by the sweep once that reservation is gone.
	elsewhere map[int]bool
	// soloPorts are the cluster reservations ("solo/<edge id>/<tunnel id>") of this edge's solo TCP
	// tunnels, by port: released when the tunnel's group goes.
	soloPorts map[int]string
}

// servedElsewhere reports whether, in a cluster, route kind/label has members on another edge.
func (b *routeBook) servedElsewhere(kind, label string) bool {
	if b.liveTenant == nil {
		return false
	}
	_, ok := b.liveTenant(kind, label)
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
	b := &routeBook{st: st, ttl: ttl, now: time.Now, reg: reg, log: log,
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
// and never within RouteTTL of this edge's start. live reports whether the route has members
// now; on a single edge it is asked only about a route recorded with members (no
// EmptySince), which lost them if the edge restarted since; in a cluster a live route never
// lapses, whatever its record says.
func (b *routeBook) lapsed(r *store.Route, now time.Time, live func() bool) bool {
	if r.Reserved {
		return false
	}
	if b.lease > 0 && live() {
		// In a cluster a route may be recorded empty while it has members: an edge cut off
		// from NATS for longer than the lease, or an emptiness written as another edge's
		// first member joined. A live route never lapses; the sweep clears the record.
		return false
	}
	since := r.EmptySince
	if since.IsZero() {
		if live() || b.lease > 0 {
			// In a cluster, members may vanish with an edge without a trace: the emptiness
			// is recorded first (settleRoute, or the sweep), and the claim lapses a TTL later.
			return false
		}
		since = b.startedAt
	}
	if since.Before(b.startedAt) {
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
		if b.lease > 0 && req.Proto == group.ProtoTCP {
			// A solo TCP tunnel's port is reserved for the whole cluster too.
			if err := b.clusterSoloPort(tk, req); err != nil {
				return nil, err
			}
		}
		return tk, nil
	}
	tk.key = store.Key(kind, label)
	if b.remoteConflict != nil && kind == store.KindHTTP && b.reg.LookupHTTP(label) == nil {
		// The route may have members on another edge that this edge has not joined yet
		// (its link is down, or their records are on their way): answer as if it had.
		if err := b.remoteConflict(label, req, grouped); err != nil {
			return nil, err
		}
	}
	var taken *store.Route // a lapsed claim of another tenant, replaced
	var port int
	sc := soloClaim{session: req.Session} // read before the store's lock is taken
	if b.resumeOf != nil && kind == store.KindHTTP && !grouped {
		sc.own, sc.resumed, sc.proof, _ = b.resumeOf(req.Session)
	}
	decide := func(cur *store.Route) (*store.Route, error) {
		// fn may run more than once: it only computes; what it decides is read after.
		taken, tk.created, port = nil, nil, 0
		now := b.now()
		if cur != nil && (cur.Tenant == tenant || cur.Reserved) {
			if cur.Tenant != tenant {
				return nil, ownedError(kind, label)
			}
			if cur.Reserved {
				if err := reservedAdmits(cur, req); err != nil {
					return nil, err
				}
			}
			port = routePort(cur, req)
			if b.lease > 0 && b.keyHeld(cur, req, grouped, now) {
				return nil, group.KeyMismatch(kind == store.KindTCP, label)
			}
			if b.lease > 0 && kind == store.KindHTTP && cur.Reserved && grouped && cur.KeyHash == (group.KeyHash{}) {
				// An endpoint that sets no key: its pool's key is whoever comes first, and
				// the store orders first registrations racing on two edges.
				switch claimed, err := b.claimEndpointKey(cur, req, now); {
				case err != nil:
					return nil, err
				case claimed:
					return cur, nil
				}
			}
			if b.lease > 0 && kind == store.KindHTTP && !cur.Reserved {
				switch reshape, err := b.reshape(cur, req, grouped, sc, now); {
				case err != nil:
					return nil, err
				case reshape:
					if b.lapsed(cur, now, func() bool { return b.live(kind, label) }) {
						cur.EmptySince = now
					}
					return cur, nil
				}
			}
			if b.lapsed(cur, now, func() bool { return b.live(kind, label) }) {
				// The owner is back just as its claim lapses: it holds again, for a full
				// TTL, so that no sweep or other tenant takes it before joined runs.
				cur.EmptySince = now
				return cur, nil
			}
			return nil, errUnchanged
		}
		if cur != nil && !b.lapsed(cur, now, func() bool { return b.live(kind, label) }) {
			return nil, ownedError(kind, label)
		}
		if other, ok := b.membersTenant(kind, label); ok && other != tenant {
			// No record (a wiped store) or a lapsed one, but another tenant's members
			// serve the route: it is theirs.
			return nil, ownedError(kind, label)
		}
		taken = cur
		tk.created = &store.Route{Kind: kind, Label: label, Tenant: tenant, Group: req.Group, EmptySince: now}
		if b.lease > 0 {
			tk.created.Claimed = now
		}
		if kind == store.KindHTTP && grouped {
			tk.created.KeyHash = req.KeyHash
		}
		if b.lease > 0 && kind == store.KindHTTP && !grouped {
			tk.created.Holder, tk.created.HolderHash = req.Session, hex.EncodeToString(sc.own[:])
		}
		return tk.created, nil
	}
	_, err := b.st.Update(b.ctx, tk.key, func(cur *store.Route) (*store.Route, error) {
		r, err := decide(cur)
		switch {
		case err == nil && r != nil:
			tk.seenKey = r.KeyHash
		case errors.Is(err, errUnchanged) && cur != nil:
			tk.seenKey = cur.KeyHash
		}
		return r, err
	})
	switch {
	case errors.Is(err, errUnchanged):
	case err != nil:
		var ge *group.Error
		if errors.As(err, &ge) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: cannot record the route: %w", ErrUnavailable, err)
	}
	if taken != nil {
		b.log.Info("route claim lapsed; a new tenant claims it", zap.String("route", tk.key))
		b.releasePorts(taken)
	}
	if b.lease > 0 && kind == store.KindHTTP && !grouped {
		tk.holder, tk.holderHash = req.Session, hex.EncodeToString(sc.own[:])
	}
	tk.prevKeys = req.PrevKeyHashes
	req.Port = port
	if kind == store.KindTCP && port == 0 && maxPorts > 0 {
		if !b.reservePortSlot(tenant, maxPorts) {
			b.abandon(tk)
			return nil, fmt.Errorf("%w: this tenant already holds %d TCP ports (max_tcp_ports)", ErrLimit, maxPorts)
		}
		tk.portSlot = true
	}
	if b.lease > 0 && kind == store.KindTCP && port == 0 {
		// In a cluster the port is chosen before the pool exists, once for every edge.
		p, err := b.clusterPort(tk, req)
		if err != nil {
			b.abandon(tk)
			return nil, err
		}
		req.Port, tk.port = p, p
	} else if b.lease > 0 && kind == store.KindTCP {
		tk.port = port
	}
	return tk, nil
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
	if b.liveTenant != nil {
		return b.liveTenant(kind, label)
	}
	return "", false
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
		if b.lease > 0 {
			cur.Claimed, changed = b.now(), true
		}
		if tk.kind == store.KindTCP {
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
		} else if k, zero := g.KeyHash(), (group.KeyHash{}); cur.Reserved && b.lease > 0 && cur.KeyHash == zero && g.Name != "" {
			// An endpoint that sets no key (claimEndpointKey): a pool with another key
			// that joined on another edge within the lease keeps it.
			if cur.LiveKey != k {
				if cur.LiveKey != zero && !g.HoldsKey(cur.LiveKey) && !slices.Contains(tk.prevKeys, cur.LiveKey) &&
					b.now().Sub(lastClaim) < b.lease {
					return nil, group.KeyMismatch(tk.kind == store.KindTCP, tk.label)
				}
				cur.LiveKey, changed = k, true
			}
		} else if b.lease > 0 && !cur.Reserved && !g.Solo() && cur.KeyHash != zero && cur.KeyHash != k && !g.HoldsKey(cur.KeyHash) &&
			!slices.Contains(tk.prevKeys, cur.KeyHash) && cur.KeyHash != tk.seenKey {
			// Another key claimed the route after this registration's claim (a race between
			// edges the claim did not see): it lost. A key the route already had at the claim
			// is no race (the claim admitted this key beside it: a rotation in progress).
			return nil, group.KeyMismatch(tk.kind == store.KindTCP, tk.label)
		} else if !cur.Reserved && (cur.KeyHash != k || cur.Group != g.Name || cur.Holder != tk.holder) {
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
		var ge *group.Error
		if errors.As(err, &ge) {
			return err
		}
		return fmt.Errorf("%w: cannot record the route: %w", ErrUnavailable, err)
	}
	if oldPort != 0 {
		// The pool could not bind its old port and took another: the old one goes back.
		b.releasePorts(&store.Route{Tenant: tk.tenant, Ports: map[string]int{"": oldPort}})
	}
	b.holdPorts(r)
	return nil
}

// emptied records that g's last member left; it runs under the route's lock, so that it is
// ordered with the next first member's joined. In a cluster the route is empty only if no
// edge serves it: not while another edge's member is known, and not within the lease of the
// route's last claim (a member may have joined elsewhere whose record is on its way; the
// emptiness is then recorded later, by settleLater). An emptiness recorded earlier (by an
// edge that took the route for empty while this edge served it) is moved to now.
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
		if b.lease == 0 && !cur.EmptySince.IsZero() || b.servedElsewhere(kind, g.Label) {
			return unchanged()
		}
		if b.lease > 0 && now.Sub(cur.Claimed) < b.lease {
			// Claimed or joined on some edge a moment ago: that member's record may not
			// have reached this edge yet. settleRoute records the emptiness once it must
			// have, if no edge serves the route by then.
			later = true
			return unchanged()
		}
		if b.lease > 0 && !cur.EmptySince.IsZero() && !cur.EmptySince.Before(now) {
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
	if later && b.settleLater != nil {
		b.settleLater(kind, g.Label)
	}
}

// sweep deletes the claims that lapsed and gives their ports back.
func (b *routeBook) sweep() {
	routes, err := b.st.List(b.ctx)
	if err != nil {
		return
	}
	now := b.now()
	var tcpLive map[string]bool // TCP names with members, listed once if needed
	reserved := map[int]bool{}  // in a cluster: the ports reserved now
	if b.lease > 0 {
		defer b.releaseElsewhere(reserved)
	}
	for _, r := range routes {
		if b.lease > 0 && r.Kind == kindPort {
			if p, err := strconv.Atoi(r.Label); err == nil && !b.sweepSoloPort(r, now) {
				reserved[p] = true
			}
			continue
		}
		live := func() bool {
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
		if b.lease > 0 && r.EmptySince.IsZero() && !r.Reserved && (r.Kind == store.KindHTTP || r.Kind == store.KindTCP) &&
			!live() && now.Sub(r.Claimed) >= b.lease {
			b.markEmpty(r.Key(), r.Kind, r.Label)
			continue
		}
		if b.lease > 0 && !r.EmptySince.IsZero() && live() {
			b.markLive(r.Key(), r.Kind, r.Label)
			continue
		}
		if !b.lapsed(r, now, live) {
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
			b.dropPortKeys(gone)
		}
	}
}

// openRouteBook opens the configured store and reads the routes back.
func openRouteBook(cfg *ServerConfig, reg *group.Registry, log *zap.Logger) (*routeBook, error) {
	for i := range cfg.Endpoints {
		if err := cfg.Endpoints[i].validate(cfg.TCPPorts); err != nil {
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

// markLive clears, in a cluster, the emptiness recorded for a route that some edge serves:
// an edge cut off from NATS for longer than the lease kept serving it while the others
// recorded it empty, or an emptiness was written as another edge's first member joined.
// Without it the claim would lapse a TTL after the route's next member left, without its
// grace period.
func (b *routeBook) markLive(key, kind, label string) {
	_, err := b.st.Update(b.ctx, key, func(cur *store.Route) (*store.Route, error) {
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
func (b *routeBook) markEmpty(key, kind, label string) {
	_, err := b.st.Update(b.ctx, key, func(cur *store.Route) (*store.Route, error) {
		now := b.now()
		if cur == nil || cur.Reserved || !cur.EmptySince.IsZero() || now.Sub(cur.Claimed) < b.lease || b.live(kind, label) {
			return nil, errUnchanged
		}
		cur.EmptySince = now
		return cur, nil
	})
	if err != nil && !errors.Is(err, errUnchanged) {
		b.log.Warn("cannot record that a route is empty", zap.String("route", key), zap.Error(err))
	}
}
