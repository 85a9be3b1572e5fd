package tunnel

import (
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// ticket is one registration's hold on its route between claim and joined (or abandon).
type ticket struct {
	key, tenant string
	kind, label string
	created     *store.Route    // the first claim this registration wrote, if any
	solo        string          // in a cluster: the reservation of a solo TCP tunnel's port
	portSlot    bool            // a max_tcp_ports slot reserved for a new port
	soloTCP     bool            // a solo TCP tunnel: its port counts in max_tcp_ports
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
func (b *routeBook) claim(tenant string, req *group.JoinRequest, grouped bool, lim TenantLimits) (*ticket, error) {
	kind, label := routeKey(req, grouped)
	tk := &ticket{tenant: tenant, kind: kind, label: label}
	if kind == "" {
		// A solo TCP tunnel owns no route, but its port counts in max_tcp_ports.
		tk.soloTCP = true
		if lim.MaxTCPPorts > 0 {
			if !b.reservePortSlot(tenant, lim.MaxTCPPorts) {
				return nil, fmt.Errorf("%w: this tenant already holds %d TCP ports (max_tcp_ports)", ErrLimit, lim.MaxTCPPorts)
			}
			tk.portSlot = true
		}
		if err := b.rules.claimSoloPort(tk, req); err != nil {
			b.releasePortSlot(tk)
			return nil, err
		}
		return tk, nil
	}
	tk.key = store.Key(kind, label)
	if kind == store.KindHTTP && b.reg.LookupHTTP(label) == nil {
		// Another tenant's members elsewhere refuse it as theirs before anything is said of
		// its key: a refusal that told a wrong key from the right one would let a tenant
		// guess another's key.
		if other, ok := b.rules.tenantElsewhere(kind, label); ok && other != tenant {
			return nil, ownedError(kind, label)
		}
		if err := b.rules.conflict(label, req, grouped); err != nil {
			return nil, err
		}
	}
	// Read before the store's lock is taken.
	c := &claimDecision{b: b, tk: tk, req: req, grouped: grouped, sc: b.rules.solo(req, kind, grouped), maxRoutes: lim.MaxRoutes}
	if _, err := b.update(tk.key, c.decide); err != nil && !errors.Is(err, errUnchanged) {
		if c.slotAdded {
			b.dropClaim(tenant, tk.key) // the claim was not written
		}
		return nil, refusal(err)
	}
	if c.taken != nil {
		b.log.Info("route claim lapsed; a new tenant claims it", zap.String("route", tk.key))
		b.releasePorts(c.taken)
		if c.taken.Tenant != tenant {
			b.dropClaim(c.taken.Tenant, tk.key)
		}
	}
	maxPorts := lim.MaxTCPPorts
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
	// maxRoutes is the tenant's max_routes (0: no cap); slotAdded reports that a decision
	// counted the route for the tenant anew (takeRouteSlot).
	maxRoutes int
	slotAdded bool
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
	if cur == nil {
		if err := b.holdNew(now); err != nil {
			return nil, err
		}
	}
	ok, added := b.takeRouteSlot(tk.tenant, tk.key, c.maxRoutes)
	c.slotAdded = c.slotAdded || added
	if !ok {
		return nil, fmt.Errorf("%w: this tenant already holds %d routes (max_routes); a route is held until route_ttl_secs after its last member left, or an operator releases it",
			ErrLimit, c.maxRoutes)
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
	_, err := b.update(tk.key, func(cur *store.Route) (*store.Route, error) {
		if cur == nil || cur.Tenant != created.Tenant || !cur.EmptySince.Equal(created.EmptySince) ||
			len(cur.Ports) > 0 || b.live(tk.kind, tk.label) {
			return nil, errUnchanged // someone has used it since
		}
		return nil, nil
	})
	if err == nil {
		b.dropClaim(tk.tenant, tk.key)
	}
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
