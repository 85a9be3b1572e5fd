package tunnel

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/webhook"
)

// Operator is a read-only view of an edge for its operator plane: package tunnel/admin builds
// the REST API, the live group event streams, the Prometheus metrics and the status page
// from one (admin.New), and an embedder may build its own. It changes nothing on the edge.
type Operator struct{ s *Server }

// Operator returns the edge's operator view.
func (s *Server) Operator() Operator { return Operator{s} }

// Registry is the edge's routing table (Server.Registry).
func (o Operator) Registry() group.View { return o.s.registry.View() }

// URL returns a group's public URL: http(s)://<label>.<domain>[:port] or tcp://<domain>:<port>.
func (o Operator) URL(g group.Info) string {
	if g.Kind == group.KindTCP {
		return fmt.Sprintf("tcp://%s:%d", o.s.cfg.Domain, g.Port)
	}
	return o.s.publicURL(g.Proto, g.Label)
}

// RegionID is the edge's region label (ServerConfig.RegionID).
func (o Operator) RegionID() string { return o.s.cfg.RegionID }

// Counters are the edge's counters that its routing table does not hold.
type Counters struct {
	// HTTPRequests and TCPConnections count the public requests and connections received.
	HTTPRequests, TCPConnections uint64
	// RetriesOpenFailed and RetriesResetUnread count the dispatches sent to one other
	// member: after opening the stream to the first failed, and after its backend reset the
	// connection with a bodyless request unread.
	RetriesOpenFailed, RetriesResetUnread uint64
	// RetriesIdempotent counts idempotent requests sent to one other member after their
	// member failed before answering (the opt-in idempotent retry).
	RetriesIdempotent uint64
	// Deliveries counts alert deliveries by result.
	Deliveries map[webhook.Result]uint64
	// ResponsesCut counts the public responses cut because their client did not keep up,
	// by rule: "stall_timeout", "conn_budget", "ip_budget", "edge_budget" (each has a
	// series, zero or not).
	ResponsesCut map[string]uint64
	// StalledResponseBytes is what the responses whose client is not keeping up are
	// charged now (what they may hold at the edge).
	StalledResponseBytes int64
	// Sessions counts the connector sessions attached now (their Hello accepted), by
	// transport: TransportTCP, TransportWebSocket and TransportQUIC (each has an entry, zero
	// or not).
	Sessions map[string]int64
}

// Counters reads the edge's counters now.
func (o Operator) Counters() Counters {
	s := o.s
	return Counters{
		HTTPRequests:         s.requests.http.Load(),
		TCPConnections:       s.requests.tcp.Load(),
		RetriesOpenFailed:    s.retries.open.Load(),
		RetriesResetUnread:   s.retries.unread.Load(),
		RetriesIdempotent:    s.retries.idempotent.Load(),
		Deliveries:           s.alerts.deliveries(),
		ResponsesCut:         s.cuts.ByReason(),
		StalledResponseBytes: s.ingress.StalledBytes(),
		Sessions: map[string]int64{
			TransportTCP:       s.sessionsBy.tcp.Load(),
			TransportWebSocket: s.sessionsBy.websocket.Load(),
			TransportQUIC:      s.sessionsBy.quic.Load(),
		},
	}
}

// IdleEndpoint is a reserved endpoint (ServerConfig.Endpoints) with no live pool.
type IdleEndpoint struct {
	// Info describes the route (no members).
	Info group.Info
	// Tenant owns it: only that tenant (and the operator) may see it.
	Tenant string
}

// IdleEndpoints lists the reserved endpoints that have no live pool now.
func (o Operator) IdleEndpoints() []IdleEndpoint { return o.s.routes.idleEndpoints() }

// Routes lists every route a tenant holds, by kind and label: the HTTP subdomains and TCP
// pool names claimed, with members now or within RouteTTL of their last member leaving, and
// the reserved endpoints' routes (Reserved). TenantLimits.MaxRoutes counts the first kind. It
// reads the route store (in a cluster, the shared one).
func (o Operator) Routes(ctx context.Context) ([]RouteClaim, error) {
	return o.s.routes.routeClaimsList(ctx)
}

// ReleaseRoute drops the claim on route kind/label ("http" and a subdomain, or "tcp" and a
// pool's name) at once, as if it had lapsed: its tenant's max_routes and max_tcp_ports count
// it no more, its TCP port goes back to the range, and any tenant may claim it. A route with
// members is not released (ErrRouteLive), nor a reserved endpoint's (ErrRouteReserved);
// ErrNoRoute when none is held.
func (o Operator) ReleaseRoute(kind, label string) (RouteClaim, error) {
	r, err := o.s.routes.release(kind, label)
	if err != nil {
		return RouteClaim{}, err
	}
	c := RouteClaim{Kind: r.Kind, Label: r.Label, Tenant: r.Tenant, Group: r.Group, Claimed: r.Claimed, EmptySince: r.EmptySince}
	for _, p := range r.Ports {
		c.Port = p
	}
	return c, nil
}

// MaxEventStreams is how many live event streams tenant may have open at once under the
// limits in force (TenantLimits.MaxEventStreams; 0: no cap).
func (o Operator) MaxEventStreams(tenant string) int {
	return o.s.limits.Load().of(tenant).MaxEventStreams
}

// Authenticator is the edge's ServerConfig.Auth (nil: none): an operator plane scopes a
// tenant's token to that tenant's members with it.
func (o Operator) Authenticator() Authenticator { return o.s.cfg.Auth }

// AuthThrottle is the edge's limiter of failed authentications per source address, which the
// control listener counts on: an operator plane that checks tokens shares it, so that a
// guesser is held back on both.
func (o Operator) AuthThrottle() *throttle.Auth { return o.s.authLimit }

// ShuttingDown reports whether Shutdown or Close has begun.
func (o Operator) ShuttingDown() bool { return o.s.shuttingDown() }

// Done is closed when Shutdown or Close begins.
func (o Operator) Done() <-chan struct{} { return o.s.done }

// Cluster describes the edge's cluster now; ok is false outside one.
func (o Operator) Cluster() (info ClusterStatus, ok bool) {
	if o.s.cluster == nil {
		return ClusterStatus{}, false
	}
	return o.s.cluster.Status(), true
}

// EdgeID is the edge's id in its cluster; "" outside one.
func (o Operator) EdgeID() string {
	if o.s.cluster == nil {
		return ""
	}
	return o.s.cluster.EdgeID()
}

// Subscribe calls f with every group membership and health change from now on, in order per
// group, until stop is called, as ServerConfig.OnEvent. f runs on the goroutine that made
// the change, with no lock of the edge held: it must not block (queue what it needs).
func (o Operator) Subscribe(f func(group.Event)) (stop func()) { return o.s.events.add(f) }

// ClusterEdgeStatus is one edge of a cluster as an edge sees it.
type ClusterEdgeStatus struct {
	// ID is the edge's edge_id; Advertise the address other edges reach it on.
	ID        string `json:"edge_id"`
	Advertise string `json:"advertise"`
	// Self marks the edge that answered.
	Self bool `json:"self,omitempty"`
	// Lease is "held" while the edge renews its lease, "expired" once it stopped (its
	// members have left this edge's view), "unreachable" while its lease holds and it has
	// members but this edge cannot open its edge-to-edge link (an edge with no member is not
	// linked to: its lease alone says "held").
	Lease string `json:"lease"`
	// LastRenewal is when this edge last saw the lease renewed (zero for Self).
	LastRenewal time.Time `json:"last_renewal,omitzero"`
	// Members counts the members whose connectors are attached to it, as this edge sees them.
	Members int `json:"members"`
}

// ClusterStatus is a cluster as one of its edges sees it (the JSON of GET /api/cluster).
type ClusterStatus struct {
	// Enabled is false on an edge outside a cluster (Edges is then empty).
	Enabled bool `json:"enabled"`
	// Self is the answering edge's id; NATS says whether it is connected to NATS now.
	Self string `json:"self,omitempty"`
	NATS bool   `json:"nats_connected"`
	// Edges lists the edges this edge knows of, itself first, then by id.
	Edges []ClusterEdgeStatus `json:"edges"`
	// Warnings are problems of the cluster's set-up this edge sees now, e.g. another edge
	// with its edge_id.
	Warnings []string `json:"warnings,omitempty"`
}

// onGroupEvent receives every membership and health change from the registry, in order per
// group, with no registry lock held. Everything it calls only records and queues.
func (s *Server) onGroupEvent(ev group.Event) {
	if s.cluster != nil {
		s.cluster.Observe(ev)
	}
	s.alerts.observe(ev)
	s.events.publish(ev)
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
	if ev.Kind == group.EventHealth || ev.GroupRemoved {
		s.log.Debug("group changed", zap.String("event", ev.Kind.String()), zap.String("group", ev.Group.Name),
			zap.String("label", ev.Group.Label), zap.Int("members", ev.MemberCount), zap.Int("healthy", ev.SelectableCount))
	}
}

// eventSubscribers are the functions every group event goes to (Operator.Subscribe). The
// list is copied on change, so that publish calls them outside the lock.
type eventSubscribers struct {
	mu   sync.Mutex
	list []*eventSubscriber
}

type eventSubscriber struct{ f func(group.Event) }

// add subscribes f and returns the function that unsubscribes it.
func (e *eventSubscribers) add(f func(group.Event)) (stop func()) {
	sub := &eventSubscriber{f: f}
	e.mu.Lock()
	e.list = append(slices.Clip(e.list), sub)
	e.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.list = slices.DeleteFunc(slices.Clone(e.list), func(x *eventSubscriber) bool { return x == sub })
		})
	}
}

// publish calls every subscriber with ev.
func (e *eventSubscribers) publish(ev group.Event) {
	e.mu.Lock()
	subs := e.list
	e.mu.Unlock()
	for _, sub := range subs {
		sub.f(ev)
	}
}
