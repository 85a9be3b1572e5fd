package tunnel

import (
	"maps"
	"slices"

	"golang.org/x/time/rate"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/policy"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// The settings Reload changes while the edge runs. Each is an immutable value behind an
// atomic pointer, loaded where it is used, so that a reload replaces it at once and no
// reader takes a lock.

// liveLimits are the limits of ServerConfig that Reload can change (Server.limits). They are
// read when a session says hello (MaxSessions), when a session is created (the registration
// rate), when a tunnel registers (MaxTunnelsPerSession, MaxTunnels, MaxTCPPorts) and when a
// live event stream opens (MaxEventStreams): what a new value caps is what comes next;
// nothing already held is taken back.
type liveLimits struct {
	def           TenantLimits            // ServerConfig.Limits.Tenant
	tenants       map[string]TenantLimits // ServerConfig.Limits.PerTenant; never written
	perSession    int                     // ServerConfig.Limits.MaxTunnelsPerSession
	registerRate  float64                 // ServerConfig.Limits.RegisterRate, per new session
	registerBurst int                     // ServerConfig.Limits.RegisterBurst, per new session
}

// newLiveLimits takes the live limits of c (defaults applied).
func newLiveLimits(c *ServerConfig) *liveLimits {
	return &liveLimits{def: c.Limits.Tenant, tenants: maps.Clone(c.Limits.PerTenant), perSession: c.Limits.MaxTunnelsPerSession,
		registerRate: c.Limits.RegisterRate, registerBurst: c.Limits.RegisterBurst}
}

// of returns tenant's limits: its own, each zero field taken from the defaults.
func (l *liveLimits) of(tenant string) TenantLimits { return l.tenants[tenant].or(l.def) }

// registrations is a new session's limiter of registrations.
func (l *liveLimits) registrations() *rate.Limiter {
	return rate.NewLimiter(rate.Limit(l.registerRate), l.registerBurst)
}

// equal reports whether l and o set the same limits.
func (l *liveLimits) equal(o *liveLimits) bool {
	return l.def == o.def && maps.Equal(l.tenants, o.tenants) && l.perSession == o.perSession &&
		l.registerRate == o.registerRate && l.registerBurst == o.registerBurst
}

// config returns the limits as the ServerConfig field that sets them.
func (l *liveLimits) config() Limits {
	return Limits{MaxTunnelsPerSession: l.perSession, RegisterRate: l.registerRate, RegisterBurst: l.registerBurst,
		Tenant: l.def, PerTenant: l.tenants}
}

// endpointSet is the reserved endpoints in force and the gates of their policies
// (routeBook.eps). A reload builds a new set; a set is never written once published.
type endpointSet struct {
	// byKey are the endpoints by store key.
	byKey map[string]*Endpoint
	// gates are the policies' gates by gateKey; an endpoint whose policy restricts nothing
	// has none.
	gates map[string]*policy.Gate
}

// gateKey is the key of ep's gate in an endpointSet: its store key, and for a TCP endpoint
// its key hash too (a TCP pool is its name and key).
func gateKey(ep *Endpoint) string {
	key := store.Key(ep.kind(), ep.label())
	if ep.Proto == ProtoTCP {
		key += "/" + ep.KeyHash.String()
	}
	return key
}

// newEndpointSet builds the set of eps (by store key). An endpoint whose policy is the same
// as its namesake's in prev keeps prev's gate, so its in-flight count and its clients' rate
// buckets carry over; a new or changed policy gets a new gate, which starts empty.
func newEndpointSet(eps map[string]*Endpoint, prev *endpointSet) *endpointSet {
	set := &endpointSet{byKey: eps, gates: map[string]*policy.Gate{}}
	for key, ep := range eps {
		p := ep.Policy
		if !p.active() {
			continue
		}
		if prev != nil {
			if old := prev.byKey[key]; old != nil && old.Policy.equal(p) {
				if g := prev.gates[gateKey(old)]; g != nil {
					set.gates[gateKey(ep)] = g
					continue
				}
			}
		}
		set.gates[gateKey(ep)] = policy.New(policy.Rules{Allow: p.AllowCIDRs, Deny: p.DenyCIDRs, Rate: p.RateLimit,
			Burst: p.RateBurst, MaxConcurrent: p.MaxConcurrent})
	}
	return set
}

// active reports whether the policy restricts anything (the edge keeps a gate for it).
func (p Policy) active() bool {
	return len(p.AllowCIDRs)+len(p.DenyCIDRs) > 0 || p.RateLimit > 0 || p.MaxConcurrent > 0
}

// equal reports whether p and o admit the same traffic (an empty and a nil list are equal).
func (p Policy) equal(o Policy) bool {
	return slices.Equal(p.AllowCIDRs, o.AllowCIDRs) && slices.Equal(p.DenyCIDRs, o.DenyCIDRs) &&
		p.RateLimit == o.RateLimit && p.RateBurst == o.RateBurst && p.MaxConcurrent == o.MaxConcurrent
}

// same reports whether ep and o reserve the same route for the same pool with the same
// policy.
func (ep *Endpoint) same(o *Endpoint) bool {
	return ep.Subdomain == o.Subdomain && ep.Proto == o.Proto && ep.Port == o.Port && ep.Tenant == o.Tenant &&
		ep.Group == o.Group && ep.KeyHash == o.KeyHash && ep.Policy.equal(o.Policy)
}

// own returns a copy of ep that shares no list with the caller's configuration.
func (ep Endpoint) own() *Endpoint {
	ep.Policy.AllowCIDRs = slices.Clone(ep.Policy.AllowCIDRs)
	ep.Policy.DenyCIDRs = slices.Clone(ep.Policy.DenyCIDRs)
	return &ep
}

// httpGate is the gate of the reserved HTTP endpoint sub, or nil.
func (b *routeBook) httpGate(sub string) *policy.Gate {
	return b.eps.Load().gates[store.Key(store.KindHTTP, sub)]
}

// tcpGate is the gate of the reserved TCP endpoint g is the pool of, or nil.
func (b *routeBook) tcpGate(g *group.Group) *policy.Gate {
	return b.eps.Load().gates[store.Key(store.KindTCP, g.Label)+"/"+g.KeyHash().String()]
}

// reserved reports whether an HTTP subdomain with no member here answers 503, not 404: a
// reserved endpoint, or in a cluster a route whose members other edges' records still list
// (during a failover, an edge that died keeps its records until its lease lapses, while its
// connectors are on their way to another edge).
func (b *routeBook) reserved(sub string) bool {
	key := store.Key(store.KindHTTP, sub)
	if _, ok := b.eps.Load().byKey[key]; ok {
		return true
	}
	return b.servedElsewhere(store.KindHTTP, sub)
}
