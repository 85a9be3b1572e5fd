package tunnel

import (
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// A Cluster makes an edge one of several that share their routes and pools: any edge of it
// reaches any healthy member of a pool, whichever edge the member's connector is attached to.
// Package tunnel/cluster makes one on NATS JetStream (cluster.New); set it as
// ServerConfig.Cluster. Nil is a single edge, which runs no cluster code at all.
//
// The edge asks its cluster narrow questions (who else serves a route, would its members
// refuse a registration, is another edge gone, may this edge send an alert) and tells it
// what changes (group events, a connector that moved here); route ownership itself stays the
// edge's, written with compare-and-set to the store the cluster shares (Join). A Cluster
// serves one Server, which starts it in NewServer and stops it in Shutdown or Close.
type Cluster interface {
	// Join connects the cluster for edge (NewServer calls it once) and returns the store of
	// route ownership that the cluster's edges share. The edge closes that store.
	Join(edge ClusterEdge) (store.Store, error)
	// Start starts the cluster's workers once the edge's routing table and routes exist
	// (NewServer); it announces this edge to the others.
	Start() error
	// Leave stops the cluster's part of the edge. Graceful tells the other edges at once,
	// so that they drop this edge's members without waiting for its lease to lapse. Only
	// the first call counts.
	Leave(graceful bool)

	// EdgeID is this edge's id in the cluster; Lease how long an edge that stopped renewing
	// its lease still counts as alive.
	EdgeID() string
	Lease() time.Duration

	// ServedElsewhere returns the tenant of the members of route kind/label (store.KindHTTP
	// and a subdomain, or store.KindTCP and a group name) on other edges whose leases hold,
	// and whether there are any, reachable from here or not.
	ServedElsewhere(kind, label string) (tenant string, ok bool)
	// Conflict returns the refusal that the members of HTTP route label on other edges would
	// give req (a solo tunnel on a pool, a key the pool does not admit), or nil.
	Conflict(label string, req *group.JoinRequest, grouped bool) error
	// EdgeGone reports whether edge id has been gone from the cluster for longer than after.
	EdgeGone(id string, after time.Duration) bool
	// SettleLater asks the cluster to record route kind/label empty (ClusterEdge.SettleRoutes)
	// once no claim of it can be in flight on another edge, unless an edge serves it by then.
	SettleLater(kind, label string)
	// MovedHere tells the cluster that a connector that held session, of tenant, on
	// another edge registers here, with proof the SHA-256 of that session's resume token:
	// its members on the other edge leave this edge's pools.
	MovedHere(session, tenant string, proof [32]byte)
	// ClaimAlert reports whether this edge is the one of the cluster to send alert event
	// for pool.
	ClaimAlert(pool, event string) bool

	// Observe takes every group event of the edge, in order per group. It must not block.
	Observe(ev group.Event)
	// AnnounceDraining tells the other edges, as Shutdown begins, that this edge's members
	// drain.
	AnnounceDraining()
	// ServePeers serves the other edges' links on l until Leave; PeerAddr is the address
	// ListenAndServe listens on for them.
	ServePeers(l net.Listener) error
	PeerAddr() string
	// Status describes the cluster as this edge sees it.
	Status() ClusterStatus
}

// ClusterEdge is what a Cluster may use of its edge: the routing table, its sessions' resume
// proofs, the routes, the limits. NewServer hands it to Cluster.Join.
type ClusterEdge struct{ s *Server }

// Registry is the edge's routing table: a cluster joins the members of other edges to it
// and publishes this edge's own.
func (e ClusterEdge) Registry() *group.Registry { return e.s.registry }

// Logger is the edge's logger.
func (e ClusterEdge) Logger() *zap.Logger { return e.s.log }

// OpenTimeout is the edge's ServerConfig.Timeouts.Open: the deadline of a data stream's open.
func (e ClusterEdge) OpenTimeout() time.Duration { return e.s.cfg.Timeouts.Open }

// PreAuthLimits are the edge's caps on connections waiting to authenticate, in all and per
// source address (ServerConfig.PreAuth.MaxConns, PreAuth.MaxConnsPerIP).
func (e ClusterEdge) PreAuthLimits() (total, perAddr int) {
	return e.s.cfg.PreAuth.MaxConns, e.s.cfg.PreAuth.MaxConnsPerIP
}

// AuthThrottle is the edge's limiter of failed authentications per source address: a wrong
// cluster token counts on it, as a wrong connector token does.
func (e ClusterEdge) AuthThrottle() *throttle.Auth { return e.s.authLimit }

// SessionProof is what a connector session says of itself, for the records of its members
// that other edges read.
type SessionProof struct {
	// ResumeHash is the SHA-256 of the resume token the session was welcomed with.
	ResumeHash [32]byte
	// Resumed is the session its Hello resumed, if any, and ResumedProof the SHA-256 of the
	// token it presented for it.
	Resumed      string
	ResumedProof [32]byte
}

// Session returns what connector session id says of itself; false when no such session
// lives on this edge.
func (e ClusterEdge) Session(id string) (SessionProof, bool) {
	h, resumed, proof, ok := e.s.sessions.resumeOf(id)
	return SessionProof{ResumeHash: h, Resumed: resumed, ResumedProof: proof}, ok
}

// EndSession ends connector session id on this edge, logging why.
func (e ClusterEdge) EndSession(id, why string) { e.s.sessions.end(id, why) }

// EndMovedSession ends session id, of tenant, when proof is the SHA-256 of its resume
// token: its connector proved on edge to that it held it, and registered there.
func (e ClusterEdge) EndMovedSession(id, tenant string, proof [32]byte, to string) {
	e.s.sessions.endMoved(id, tenant, proof, to)
}

// LeftPool is called after a member of another edge left pool g here.
func (e ClusterEdge) LeftPool(g *group.Group) { e.s.leftPool(g) }

// SettleRoutes records, in the background, each route (kind, label) that no edge serves any
// more as empty from now on, once no claim of it can be in flight: its claim then lapses
// RouteTTL later, as on a single edge.
func (e ClusterEdge) SettleRoutes(routes [][2]string) { e.s.shared.settleRoutes(routes) }

// ReclaimSoloPorts reserves again the ports of this edge's solo TCP tunnels after it was cut
// off from the cluster, and ends the sessions of those whose port went to another tunnel
// meanwhile.
func (e ClusterEdge) ReclaimSoloPorts() { e.s.shared.reclaimSoloPorts(e.s.registry, e.s.sessions.end) }

// RestoreLostRoutes writes back the routes this edge remembers that the store lost (a NATS
// cluster restarted from stores missing their last writes); called when the edge's NATS
// connection came back.
func (e ClusterEdge) RestoreLostRoutes() {
	if e.s != nil && e.s.shared != nil {
		e.s.shared.restoreLost()
	}
}

// HoldNewRoutes makes first claims of routes this edge does not know wait (refused as
// unavailable) for d from now, while the edges write back what NATS may have lost; 0 ends
// the hold.
func (e ClusterEdge) HoldNewRoutes(d time.Duration) {
	if e.s != nil && e.s.shared != nil {
		e.s.shared.holdNewRoutes(d)
	}
}
