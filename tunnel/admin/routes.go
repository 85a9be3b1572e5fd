package admin

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/warren-tunnel/warren/tunnel"
)

// RouteInfo is one route in the JSON of GET /api/routes: an HTTP subdomain or a TCP pool's
// name that a tenant holds, with members now or until its claim lapses (route_ttl_secs after
// its last member left). The tenant's max_routes counts the routes that are not reserved.
type RouteInfo struct {
	// Kind is "http" (a subdomain: http, https and tls tunnels) or "tcp" (a pool's name).
	Kind  string `json:"kind"`
	Label string `json:"label"`
	// Tenant holds the route; empty for the connectors of tokens with no tenant.
	Tenant string `json:"tenant,omitempty"`
	// Group is the pool's name; empty for a solo tunnel's route.
	Group string `json:"group,omitempty"`
	// Port is a TCP pool's public port.
	Port int `json:"port,omitempty"`
	// Live is true while the route has members, on this edge or another of its cluster.
	Live bool `json:"live"`
	// Reserved is true for a reserved endpoint's route (the operator's configuration).
	Reserved bool `json:"reserved"`
	// ClaimedAt is when it was last claimed; EmptySince when its last member left;
	// ExpiresAt when the claim lapses unless a member comes back.
	ClaimedAt  *time.Time `json:"claimed_at,omitempty"`
	EmptySince *time.Time `json:"empty_since,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
}

func routeInfo(c tunnel.RouteClaim) RouteInfo {
	at := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	return RouteInfo{Kind: c.Kind, Label: c.Label, Tenant: c.Tenant, Group: c.Group, Port: c.Port, Live: c.Live,
		Reserved: c.Reserved, ClaimedAt: at(c.Claimed), EmptySince: at(c.EmptySince), ExpiresAt: at(c.Expires)}
}

// apiRoutes lists the routes the caller may see: every one for the admin token, a tenant's
// own for its token.
func (p *Plane) apiRoutes(w http.ResponseWriter, r *http.Request) {
	sc := scopeOf(r)
	out := []RouteInfo{}
	if p.cfg.Routes != nil && (sc.admin || sc.tenant != "") {
		claims, err := p.cfg.Routes(r.Context())
		if err != nil {
			p.log.Warn("admin API: reading the routes failed: " + err.Error())
			writeError(w, http.StatusServiceUnavailable, "cannot read the routes now")
			return
		}
		for _, c := range claims {
			if sc.admin || c.Tenant == sc.tenant {
				out = append(out, routeInfo(c))
			}
		}
	}
	writePage(w, r, out, func(ri RouteInfo) []string { return []string{ri.Kind, ri.Label} }, nil)
}

// apiReleaseRoute releases a route's claim at once (tunnel.Operator.ReleaseRoute): the admin
// token's, never a tenant's.
func (p *Plane) apiReleaseRoute(w http.ResponseWriter, r *http.Request) {
	if !scopeOf(r).admin {
		writeError(w, http.StatusForbidden, "only the admin token may release a route")
		return
	}
	kind, label := r.PathValue("kind"), r.PathValue("label")
	if p.cfg.ReleaseRoute == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s/%s is held", kind, label))
		return
	}
	c, err := p.cfg.ReleaseRoute(kind, label)
	switch {
	case errors.Is(err, tunnel.ErrNoRoute):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s/%s is held", kind, label))
	case errors.Is(err, tunnel.ErrRouteLive):
		writeError(w, http.StatusConflict, fmt.Sprintf("route %s/%s has members: it is released when they leave and its claim lapses", kind, label))
	case errors.Is(err, tunnel.ErrRouteReserved):
		writeError(w, http.StatusConflict, fmt.Sprintf("route %s/%s is a reserved endpoint's: remove the endpoint from the configuration", kind, label))
	case err != nil:
		p.log.Warn("admin API: releasing a route failed: " + err.Error())
		writeError(w, http.StatusServiceUnavailable, "cannot release the route now")
	default:
		p.log.Info("route released through the admin API: " + kind + "/" + label)
		writeJSON(w, http.StatusOK, routeInfo(c))
	}
}
