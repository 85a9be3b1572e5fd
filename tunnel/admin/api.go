package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
)

// TunnelInfo is one tunnel in the JSON of GET /api/tunnels and GET /api/tunnels/{id}.
type TunnelInfo struct {
	// ID is the tunnel id the edge assigned at registration.
	ID string `json:"id"`
	// Proto is "http", "https" or "tcp".
	Proto group.Proto `json:"proto"`
	// Label is the subdomain (http, https), the group name (grouped tcp) or the display
	// name of a solo TCP tunnel.
	Label string `json:"label"`
	// Group is the name of the tunnel's pool; "" for a solo tunnel.
	Group string `json:"group"`
	// KeyHashShort is the first 8 hex digits of the pool's key hash; "" for a solo tunnel.
	KeyHashShort string `json:"key_hash_short,omitempty"`
	// Tenant is the identity the tunnel's connector authenticated as ("" for none).
	Tenant string `json:"tenant"`
	// Name is the tunnel's own name in its connector (the key of its entry in the
	// connector's file, tunnel.TunnelSpec.Name) and Host the name of the machine its
	// connector runs on (tunnel.WithHostname): with the id they tell the members of a pool
	// apart. "" when the connector did not say (an older one). Only letters, digits, '.',
	// '-' and '_'; at most 63 and 253 bytes.
	Name string `json:"name"`
	Host string `json:"host"`
	// Transport is how the tunnel's connector session reaches the edge: "tcp" (the control
	// listener), "websocket" (the public HTTPS listener's WebSocket path) or "quic" (the
	// QUIC UDP port); absent when unknown (another edge's member).
	Transport string `json:"transport,omitempty"`
	// Healthy is the tunnel's health bit.
	Healthy bool `json:"healthy"`
	// Draining is set once the tunnel takes no new requests.
	Draining bool `json:"draining"`
	// ActiveStreams counts the requests and connections the tunnel is carrying now.
	ActiveStreams int64 `json:"active_streams"`
	// HealthKind is the probe type reporting on the tunnel: "tcp", "http", "func" or "none".
	HealthKind string `json:"health_kind"`
	// URL is the public URL: http(s)://<subdomain>.<domain>[:port] or tcp://<domain>:<port>.
	URL string `json:"url"`
	// Port is the public TCP port (tcp only).
	Port int `json:"port,omitempty"`
	// JoinedAt is when the tunnel registered.
	JoinedAt time.Time `json:"joined_at"`
	// EdgeID names the cluster edge the connector is attached to (this edge's id for its
	// own members); absent on an edge outside a cluster.
	EdgeID string `json:"edge_id,omitempty"`
	LoadBalancing
}

// GroupInfo is one load-balancing group in the JSON of GET /api/groups. For a tenant the
// counts and the member list cover only that tenant's members.
type GroupInfo struct {
	// Protocol is "http", "https" or "tcp".
	Protocol group.Proto `json:"protocol"`
	// Label is the subdomain (http, https) or the group name (tcp). With Protocol it names
	// the group's event stream: /api/groups/{protocol}/{label}/events.
	Label string `json:"label"`
	// Name is the group's display name, as its first member set it.
	Name string `json:"name"`
	// KeyHashShort is the first 8 hex digits of the group's key hash. TCP pools that share a
	// name differ in it; "{label}~{key_hash_short}" names exactly one of them.
	KeyHashShort string `json:"key_hash_short"`
	// URL is the group's public URL.
	URL string `json:"url"`
	// Port is the public TCP port (tcp only).
	Port int `json:"port,omitempty"`
	// Affinity is the pool's affinity ("cookie", "client_ip" or "header:<Name>"; absent for
	// none) and RetryIdempotent its opt-in idempotent retry, as its members declare them.
	Affinity        string `json:"affinity,omitempty"`
	RetryIdempotent bool   `json:"retry_idempotent,omitempty"`
	// MemberCount and HealthyCount count the members and those with the health bit set.
	MemberCount  int `json:"member_count"`
	HealthyCount int `json:"healthy_count"`
	// Members are the group's members in the order they joined.
	Members []GroupMember `json:"members"`
	// Reserved marks an endpoint reserved by the edge's configuration that has no member
	// now (it answers 503 until one registers).
	Reserved bool `json:"reserved,omitempty"`
	// Dispatches counts the requests and connections dispatched to this pool's members so
	// far (the status page derives a rate from it). It is shown only to a caller that sees
	// every member of the pool; absent for a reserved endpoint.
	Dispatches *uint64 `json:"dispatches,omitempty"`

	// key is the full key hash: pools may share a short one, pages must not.
	key string
}

// GroupMember is one member of a GroupInfo. A member's alert webhook URL is never shown,
// only whether it has one.
type GroupMember struct {
	// ID is the member's tunnel id.
	ID string `json:"id"`
	// Tenant is the identity the member's connector authenticated as ("" for none).
	Tenant string `json:"tenant"`
	// Name and Host are the member's tunnel name and its connector's host, as in
	// TunnelInfo ("" when the connector did not say).
	Name string `json:"name"`
	Host string `json:"host"`
	// Transport is how the member's connector session reaches the edge, as in TunnelInfo.
	Transport string `json:"transport,omitempty"`
	// Healthy is the member's health bit.
	Healthy bool `json:"healthy"`
	// Draining is set once the member takes no new requests.
	Draining bool `json:"draining"`
	// ActiveStreams counts the requests and connections the member is carrying now.
	ActiveStreams int64 `json:"active_streams"`
	// HealthKind is the member's probe type: "tcp", "http", "func" or "none".
	HealthKind string `json:"health_kind"`
	// HasAlertWebhook reports whether the member registered an alert webhook URL.
	HasAlertWebhook bool `json:"has_alert_webhook"`
	// JoinedAt is when the member joined.
	JoinedAt time.Time `json:"joined_at"`
	// EdgeID names the cluster edge the connector is attached to (this edge's id for its
	// own members); absent on an edge outside a cluster.
	EdgeID string `json:"edge_id,omitempty"`
	LoadBalancing
}

// LoadBalancing is a member's load-balancing state in the API.
type LoadBalancing struct {
	// Weight (1–100) is the member's share of new work relative to its tier; Priority its
	// tier (0 first: only the lowest tier with a healthy member takes new work).
	Weight   int `json:"weight"`
	Priority int `json:"priority"`
	// Ejected is set while passive outlier ejection keeps the member out of dispatch (it
	// is then not healthy either); Ramping while it is still in its slow start.
	Ejected bool `json:"ejected"`
	Ramping bool `json:"ramping"`
}

func loadBalancing(m group.MemberInfo) LoadBalancing {
	return LoadBalancing{Weight: m.Weight, Priority: m.Priority, Ejected: m.Ejected, Ramping: m.Ramping}
}

// HealthEvent is one health transition of a tunnel in the JSON of
// GET /api/tunnels/{id}/health-events. Only changes are recorded, not every probe; the first
// entry is the registration.
type HealthEvent struct {
	// At is when the edge recorded the change.
	At time.Time `json:"at"`
	// Healthy is the tunnel's health bit after the change.
	Healthy bool `json:"healthy"`
	// Reason says why, e.g. "probe succeeded" or "3 consecutive probe failures: …".
	Reason string `json:"reason"`
}

// APIHandler returns the JSON admin API as an http.Handler. It serves these paths (mount it
// at the root of a mux, or under "/api/"):
//
//	GET /api/tunnels                              every visible tunnel ([]TunnelInfo)
//	GET /api/tunnels/{id}                         one tunnel (TunnelInfo)
//	GET /api/tunnels/{id}/health-events           its last 50 health transitions, oldest first
//	GET /api/groups                               every visible load-balancing group ([]GroupInfo)
//	GET /api/groups/{protocol}/{label}/events     Server-Sent Events: GroupEvent per health transition
//	GET /api/routes                               every visible route a tenant holds ([]RouteInfo)
//	DELETE /api/routes/{kind}/{label}             release a claim nobody serves (admin only; RouteInfo)
//
// Every request needs "Authorization: Bearer <token>" (401 without a valid one) unless the
// API is open: Options.Token empty and ServerConfig.Auth nil. The admin token sees
// everything. A token Auth accepts as a tenant sees only the tunnels its connectors
// registered and the groups that hold at least one of them, with counts over those members
// alone; a token Auth accepts with no tenant sees nothing. Whatever a caller cannot see is
// 404, exactly as if it did not exist.
func (p *Plane) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/tunnels", p.apiTunnels)
	mux.HandleFunc("GET /api/tunnels/{id}", p.apiTunnel)
	mux.HandleFunc("GET /api/tunnels/{id}/health-events", p.apiHealthEvents)
	mux.HandleFunc("GET /api/groups", p.apiGroups)
	mux.HandleFunc("GET /api/groups/{protocol}/{label}/events", p.apiGroupEvents)
	mux.HandleFunc("GET /api/cluster", p.apiCluster)
	mux.HandleFunc("GET /api/routes", p.apiRoutes)
	mux.HandleFunc("DELETE /api/routes/{kind}/{label}", p.apiReleaseRoute)
	return p.requireAuth(mux)
}

// edgeOf is the edge id shown for member m: its remote edge's, or this edge's own.
func (p *Plane) edgeOf(m group.MemberInfo) string {
	if m.Edge != "" {
		return m.Edge
	}
	return p.cfg.EdgeID
}

// ClusterEdge is one edge of a cluster in the JSON of GET /api/cluster.
type ClusterEdge = tunnel.ClusterEdgeStatus

// ClusterInfo is the JSON of GET /api/cluster.
type ClusterInfo = tunnel.ClusterStatus

// apiCluster lists the cluster's edges. Tenants see it too: it names edges, not routes.
func (p *Plane) apiCluster(w http.ResponseWriter, _ *http.Request) {
	info := ClusterInfo{Edges: []ClusterEdge{}}
	if p.cfg.Cluster != nil {
		info = p.cfg.Cluster()
		if info.Edges == nil {
			info.Edges = []ClusterEdge{}
		}
	}
	writeJSON(w, http.StatusOK, info)
}

func (p *Plane) tunnelInfo(g group.Info, m group.MemberInfo) TunnelInfo {
	t := TunnelInfo{
		ID:            m.ID,
		Proto:         g.Proto,
		Label:         g.Label,
		Group:         g.Name,
		Tenant:        m.Tenant,
		Name:          m.Name,
		Host:          m.Host,
		Transport:     m.Transport,
		Healthy:       m.Healthy,
		Draining:      m.Draining,
		ActiveStreams: m.Active,
		HealthKind:    healthKindLabel(m.HealthKind),
		URL:           p.cfg.URL(g),
		JoinedAt:      m.Joined,
		EdgeID:        p.edgeOf(m),
		LoadBalancing: loadBalancing(m),
	}
	if !g.Solo() {
		t.KeyHashShort = g.KeyHash.Short()
	}
	if g.Kind == group.KindTCP {
		t.Port = g.Port
	}
	return t
}

// visibleTunnel returns the live member with tunnel id id, if the caller may see it.
func (p *Plane) visibleTunnel(sc scope, id string) (group.Info, group.MemberInfo, bool) {
	m, g, ok := p.cfg.View.Member(id)
	if !ok || !sc.sees(m) {
		return group.Info{}, group.MemberInfo{}, false
	}
	return g, m, true
}

func (p *Plane) apiTunnels(w http.ResponseWriter, r *http.Request) {
	sc := scopeOf(r)
	out := []TunnelInfo{}
	for _, g := range p.cfg.View.Groups() {
		for _, m := range g.Members {
			if sc.sees(m) {
				out = append(out, p.tunnelInfo(g, m))
			}
		}
	}
	key := func(t TunnelInfo) []string {
		return []string{string(t.Proto), t.Label, fmt.Sprintf("%020d", t.JoinedAt.UnixNano()), t.ID}
	}
	writePage(w, r, out, key, nil)
}

func (p *Plane) apiTunnel(w http.ResponseWriter, r *http.Request) {
	g, m, ok := p.visibleTunnel(scopeOf(r), r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no tunnel with id %q", r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, p.tunnelInfo(g, m))
}

func (p *Plane) apiHealthEvents(w http.ResponseWriter, r *http.Request) {
	var hist []group.Transition
	_, m, ok := p.visibleTunnel(scopeOf(r), r.PathValue("id"))
	if ok {
		hist, ok = p.cfg.View.History(m.ID)
	}
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no tunnel with id %q", r.PathValue("id")))
		return
	}
	out := make([]HealthEvent, len(hist))
	for i, t := range hist {
		out[i] = HealthEvent(t)
	}
	writeJSON(w, http.StatusOK, out)
}

func (p *Plane) apiGroups(w http.ResponseWriter, r *http.Request) {
	sc := scopeOf(r)
	out := []GroupInfo{}
	for _, g := range p.cfg.View.Groups() {
		if g.Solo() {
			continue
		}
		gi := GroupInfo{
			Protocol:     g.Proto,
			Label:        g.Label,
			Name:         g.Name,
			KeyHashShort: g.KeyHash.Short(),
			URL:          p.cfg.URL(g),
			Members:      []GroupMember{},
			key:          g.KeyHash.String(),

			Affinity:        g.Affinity,
			RetryIdempotent: g.RetryIdempotent,
		}
		if g.Kind == group.KindTCP {
			gi.Port = g.Port
		}
		for _, m := range g.Members {
			if !sc.sees(m) {
				continue
			}
			gm := GroupMember{
				ID:              m.ID,
				Tenant:          m.Tenant,
				Name:            m.Name,
				Host:            m.Host,
				Transport:       m.Transport,
				Healthy:         m.Healthy,
				Draining:        m.Draining,
				ActiveStreams:   m.Active,
				HealthKind:      healthKindLabel(m.HealthKind),
				HasAlertWebhook: m.HasAlertWebhook,
				JoinedAt:        m.Joined,
				EdgeID:          p.edgeOf(m),
				LoadBalancing:   loadBalancing(m),
			}
			gi.MemberCount++
			if gm.Healthy {
				gi.HealthyCount++
			}
			gi.Members = append(gi.Members, gm)
		}
		if gi.MemberCount == len(g.Members) {
			gi.Dispatches = &g.Dispatches
		}
		if gi.MemberCount > 0 {
			out = append(out, gi)
		}
	}
	for _, ep := range p.endpoints() {
		if !sc.admin && (sc.tenant == "" || sc.tenant != ep.Tenant) {
			continue
		}
		g := ep.Info
		gi := GroupInfo{Protocol: g.Proto, Label: g.Label, Name: g.Name, KeyHashShort: g.KeyHash.Short(),
			URL: p.cfg.URL(g), Members: []GroupMember{}, Reserved: true, key: g.KeyHash.String()}
		if g.Kind == group.KindTCP {
			gi.Port = g.Port
		}
		out = append(out, gi)
	}
	writePage(w, r, out, func(g GroupInfo) []string { return []string{string(g.Protocol), g.Label, g.KeyHashShort, g.key} },
		func(g GroupInfo) int { return len(g.Members) })
}

// endpoints are the reserved routes with no live group, to list with zero members.
func (p *Plane) endpoints() []Endpoint {
	if p.cfg.Endpoints == nil {
		return nil
	}
	return p.cfg.Endpoints()
}

// groupRef names the group(s) of an event stream: /api/groups/{protocol}/{label}. For http,
// https and tls the label is the subdomain; for tcp it is the group name, which every TCP pool of
// that name answers to, or "name~hash8" for the one pool whose key hash starts with hash8.
type groupRef struct {
	proto     group.Proto
	label     string
	base, key string // label split at its last '~' when 8 hex digits follow
}

func parseGroupRef(p, label string) (groupRef, bool) {
	proto := group.Proto(p)
	switch proto {
	case group.ProtoHTTP, group.ProtoHTTPS, group.ProtoTLS:
		label = strings.ToLower(label)
	case group.ProtoTCP:
	default:
		return groupRef{}, false
	}
	if label == "" {
		return groupRef{}, false
	}
	ref := groupRef{proto: proto, label: label}
	if i := strings.LastIndexByte(label, '~'); i > 0 && isHex(label[i+1:], 8) {
		ref.base, ref.key = label[:i], strings.ToLower(label[i+1:])
	}
	return ref, true
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := range len(s) {
		c := s[i] | 0x20 // ASCII lower case
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// matches reports whether g is a pool the reference names.
func (ref groupRef) matches(g group.Info) bool {
	if g.Solo() || g.Proto != ref.proto {
		return false
	}
	return g.Label == ref.label || ref.key != "" && g.Label == ref.base && g.KeyHash.Short() == ref.key
}

// groupVisible reports whether a live pool that ref names holds a member the caller may see.
func (p *Plane) groupVisible(ref groupRef, sc scope) bool {
	for _, g := range p.cfg.View.Groups() {
		if !ref.matches(g) {
			continue
		}
		if slices.ContainsFunc(g.Members, sc.sees) {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encoding the answer failed")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError answers {"error": msg} with status.
func writeError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
