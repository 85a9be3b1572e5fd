package cluster

import (
	"fmt"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// edgeGone reports whether edge id is gone from the cluster as far as this edge can tell:
// its lease lapsed (or was deleted) more than after ago, or this edge, running for after
// and a lease, never saw it.
func (c *Cluster) EdgeGone(id string, after time.Duration) bool {
	if id == c.cfg.EdgeID {
		return false
	}
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	e := c.remote.edges[id]
	if e == nil || e.lastSeen.IsZero() {
		return time.Since(c.started) > after+c.cfg.LeaseTTL
	}
	return e.expired && time.Since(e.lastSeen) > after
}

// liveAnywhere reports whether the route kind/label has a member on another edge whose
// lease holds, whether or not this edge can reach it now. It reads a snapshot (the registry
// calls it, through the route book, while the remote view is locked).
func (c *Cluster) liveAnywhere(kind, label string) bool {
	_, ok := c.ServedElsewhere(kind, label)
	return ok
}

// liveTenant returns the tenant of the members of route kind/label on other edges whose
// leases hold, and whether there are any. It reads the snapshot liveAnywhere reads.
func (c *Cluster) ServedElsewhere(kind, label string) (string, bool) {
	live := c.live.Load()
	if live == nil {
		return "", false
	}
	tenant, ok := (*live)[store.Key(kind, label)]
	return tenant, ok
}

// rebuildLiveLocked recomputes the routes with members on other edges; the caller holds
// c.remote.mu.
func (c *Cluster) rebuildLiveLocked() {
	live := map[string]string{}
	for _, e := range c.remote.edges {
		if e.expired {
			continue
		}
		for _, rec := range e.records {
			switch {
			case rec.Proto.BySubdomain():
				live[store.Key(store.KindHTTP, rec.Label)] = rec.Tenant
			case rec.Group != "":
				live[store.Key(store.KindTCP, rec.Group)] = rec.Tenant
			}
		}
	}
	c.live.Store(&live)
}

// recordRoute is the store kind and label of the route rec's member serves; false for a
// solo TCP tunnel, which owns no route.
func recordRoute(rec memberRecord) (kind, label string, ok bool) {
	switch {
	case rec.Proto.BySubdomain():
		return store.KindHTTP, rec.Label, true
	case rec.Group != "":
		return store.KindTCP, rec.Group, true
	}
	return "", "", false
}

// routesOf returns the route keys (kind, label) of recs, each once.
func routesOf(recs ...memberRecord) [][2]string {
	seen := map[[2]string]bool{}
	var out [][2]string
	for _, rec := range recs {
		if kind, label, ok := recordRoute(rec); ok && !seen[[2]string{kind, label}] {
			seen[[2]string{kind, label}] = true
			out = append(out, [2]string{kind, label})
		}
	}
	return out
}

// settleRoutes runs after members of another edge vanished from this edge's view (their
// edge's lease lapsed or was deleted, or their records were deleted): the edge records, for
// each of their routes that no edge has a member of any more, that it is empty from now
// (tunnel.ClusterEdge.SettleRoutes, in the background). The caller holds c.remote.mu, with
// the live snapshot rebuilt.
func (c *Cluster) settleRoutes(routes [][2]string) {
	if len(routes) > 0 {
		c.edge.SettleRoutes(routes)
	}
}

// Conflict implements tunnel.Cluster: the refusal the members of subdomain label on other edges (whose leases
// hold) would give req, as the registry gives it when they are joined: a solo tunnel on a
// route that has members, a pool member on a solo tunnel's route, or a key the pool does not
// admit (poolAdmits: the rule of one edge, rotation included).
//
// The registering connector's own old registrations are no conflict: a session whose Hello
// resumed session X with a token whose SHA-256 is the one X's records carry is the connector
// that held X, moved here (its edge died, or it lost that connection): X is dead to it, and
// its records go when X's edge notices or its lease lapses. A wrong token gets no such pass.
func (c *Cluster) Conflict(label string, req *group.JoinRequest, grouped bool) error {
	sp, ok := c.edge.Session(req.Session)
	resumed, proof, resuming := sp.Resumed, sp.ResumedProof, ok && sp.Resumed != ""
	c.remote.mu.Lock()
	defer c.remote.mu.Unlock()
	var recs []memberRecord
	for _, e := range c.remote.edges {
		if e.expired {
			continue
		}
		for _, rec := range e.records {
			if !rec.Proto.BySubdomain() || rec.Label != label {
				continue
			}
			if resuming && rec.heldBy(resumed, req.Tenant, proof) {
				continue // this connector's own, from before it moved
			}
			if !grouped {
				return &group.Error{Err: group.ErrInUse, Msg: fmt.Sprintf("subdomain '%s' is already in use", label)}
			}
			if rec.Group == "" {
				return group.KeyMismatch(false, label)
			}
			recs = append(recs, rec)
		}
	}
	if len(recs) > 0 && !poolAdmits(recs, req) {
		return group.KeyMismatch(false, label)
	}
	return nil
}
