package tunnel

import (
	"errors"
	"net/netip"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// Endpoint reserves a route for a tenant before any connector registers it, as a hosted
// product reserves an endpoint's URL when it is created: only that tenant's connectors, with
// that pool name (and key hash, when set), may register it; it never lapses; with no healthy
// member it answers 503 (not 404); the admin API lists it with zero members; and its Policy
// applies to every public request or connection it receives. Server.Reload adds, removes
// and changes endpoints while the edge runs.
type Endpoint struct {
	// Subdomain reserves an HTTP(S) route (which a tls passthrough pool may take too); or,
	// with Proto ProtoTCP, Group and Port reserve a TCP pool's name and public port.
	Subdomain string
	// Proto is ProtoHTTP (the default; HTTPS and TLS passthrough tunnels use it too: they
	// share the subdomain's route) or ProtoTCP. ProtoHTTPS and ProtoTLS are accepted and
	// shown by the admin API; the route and the policy are the subdomain's either way.
	Proto Proto
	// Port is the TCP endpoint's public port, inside ServerConfig.TCP.Ports.
	Port int
	// Tenant owns the endpoint ("" is the tenant of connector tokens that belong to none).
	Tenant string
	// Group is the pool's name; required.
	Group string
	// KeyHash, when not zero, is the only group key hash accepted (group.HashKey of the
	// key; configure it as hex, never the key).
	KeyHash group.KeyHash
	// Policy applies to the endpoint's public traffic.
	Policy Policy
}

// Policy is what a reserved endpoint lets through. The zero Policy lets everything through.
type Policy struct {
	// AllowCIDRs, when not empty, are the only client addresses admitted; DenyCIDRs are
	// refused (deny wins). Refused HTTP requests get 403; TCP connections are closed.
	AllowCIDRs, DenyCIDRs []netip.Prefix
	// RateLimit is the requests (HTTP) or connections (TCP) per second one client IP may
	// make, with bursts of RateBurst (default: RateLimit rounded up); 0 means no limit.
	// Past it HTTP gets 429 with Retry-After, TCP connections are closed.
	RateLimit float64
	RateBurst int
	// MaxConcurrent caps the endpoint's in-flight requests and connections (0: no cap);
	// past it HTTP gets 503 with Retry-After, TCP connections are closed.
	MaxConcurrent int
}

// TenantLimits caps what one tenant may hold on the edge; 0 means no cap (in
// ServerConfig.Limits.PerTenant: the ServerConfig.Limits.Tenant value, and a negative value
// lifts the cap for that tenant). Connector tokens that belong to no tenant count as one
// tenant.
//
// Each cap is checked when something new is asked for (a session's Hello, a registration, a
// new event stream), against the limits in force then: Server.Reload can change them, and a
// tenant above a lowered cap keeps what it holds and is refused more until it is under it.
type TenantLimits struct {
	// MaxSessions caps the tenant's connector sessions.
	MaxSessions int
	// MaxTunnels caps the tenant's registered tunnels, over all its sessions.
	MaxTunnels int
	// MaxTCPPorts caps the public TCP ports held for the tenant's pools.
	MaxTCPPorts int
	// MaxEventStreams caps the tenant's open live event streams on the admin API.
	MaxEventStreams int
	// MaxRoutes caps the routes the tenant holds: HTTP subdomains and TCP pool names it
	// claimed, with members or within RouteTTL of their last member leaving (reserved
	// endpoints are not counted). In a cluster it is counted over every edge.
	MaxRoutes int
}

// or returns l with each zero field taken from d.
func (l TenantLimits) or(d TenantLimits) TenantLimits {
	pick := func(a, b int) int {
		if a != 0 {
			return a
		}
		return b
	}
	return TenantLimits{pick(l.MaxSessions, d.MaxSessions), pick(l.MaxTunnels, d.MaxTunnels),
		pick(l.MaxTCPPorts, d.MaxTCPPorts), pick(l.MaxEventStreams, d.MaxEventStreams), pick(l.MaxRoutes, d.MaxRoutes)}
}

func (ep *Endpoint) kind() string {
	if ep.Proto == ProtoTCP {
		return store.KindTCP
	}
	return store.KindHTTP
}

func (ep *Endpoint) label() string {
	if ep.Proto == ProtoTCP {
		return ep.Group
	}
	return ep.Subdomain
}

// route is the store record the endpoint reserves.
func (ep *Endpoint) route() *store.Route {
	r := &store.Route{Kind: ep.kind(), Label: ep.label(), Tenant: ep.Tenant, Group: ep.Group,
		KeyHash: ep.KeyHash, Reserved: true}
	if ep.Proto == ProtoTCP {
		r.Ports = map[string]int{ep.KeyHash.String(): ep.Port}
	}
	return r
}

// validate checks an endpoint against the edge's settings. Its error is a *FieldError per
// field it refuses, naming the endpoint's field, joined.
func (ep *Endpoint) validate(ports group.PortRange) error {
	var errs []error
	add := func(field, format string, args ...any) { errs = append(errs, fieldErr(field, format, args...)) }
	switch ep.Proto {
	case "", ProtoHTTP, ProtoHTTPS, ProtoTLS:
		if p := group.SubdomainProblem(ep.Subdomain); p != "" {
			add("Subdomain", "%s", p)
		}
		if ep.Port != 0 {
			add("Port", "a port is for TCP endpoints (Proto %q)", ProtoTCP)
		}
	case ProtoTCP:
		var zero group.KeyHash
		if ep.Subdomain != "" {
			add("Subdomain", "a subdomain is for HTTP endpoints; a TCP endpoint is a group and a port")
		}
		if ep.Port < ports.Lo || ep.Port > ports.Hi || ep.Port == 0 {
			add("Port", "port %d is outside the TCP port range %d-%d", ep.Port, ports.Lo, ports.Hi)
		}
		if ep.KeyHash == zero {
			add("KeyHash", "%w for a TCP endpoint: a TCP pool is its name and key", ErrRequired)
		}
	default:
		add("Proto", "%q is not an endpoint protocol; use %q, %q, %q or %q", ep.Proto, ProtoHTTP, ProtoHTTPS, ProtoTLS, ProtoTCP)
	}
	if ep.Group == "" {
		add("Group", "%w: the pool's name", ErrRequired)
	}
	p := ep.Policy
	if p.RateLimit < 0 {
		add("Policy.RateLimit", "must be 0 (no limit) or more, got %g", p.RateLimit)
	}
	if p.RateBurst < 0 {
		add("Policy.RateBurst", "must be 0 (RateLimit rounded up) or more, got %d", p.RateBurst)
	}
	if p.MaxConcurrent < 0 {
		add("Policy.MaxConcurrent", "must be 0 (no cap) or more, got %d", p.MaxConcurrent)
	}
	return errors.Join(errs...)
}

// defaultRouteTTL is how long a route's claim outlives its last member.
const defaultRouteTTL = 24 * time.Hour
