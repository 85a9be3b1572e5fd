package group

import "time"

// Info is a copy of one group's state at one moment. Changing it changes nothing.
type Info struct {
	// ID is unique per group instance on this edge, also across re-creations of a route.
	ID string
	// Kind is the route kind; Proto the members' protocol.
	Kind  Kind
	Proto Proto
	// Label is the subdomain (http, https) or the TCP group name or tunnel label.
	Label string
	// Name is the pool's display name; "" for a solo tunnel.
	Name string
	// KeyHash is the pool's key hash (zero for a solo tunnel).
	KeyHash KeyHash
	// Port is the public TCP port (tcp only).
	Port int
	// Dispatches counts the streams handed to the group's members so far.
	Dispatches uint64
	// Affinity and RetryIdempotent are the pool's settings (JoinRequest).
	Affinity        string
	RetryIdempotent bool
	// Members are the group's members in join order (nil in an Event).
	Members []MemberInfo
}

// Solo reports whether the group is a single, ungrouped tunnel.
func (i Info) Solo() bool { return i.Name == "" }

// Counts returns the number of members, how many have their health bit set, and how many are
// selectable (healthy and not draining).
func (i Info) Counts() (members, healthy, selectable int) {
	for _, m := range i.Members {
		if m.Healthy {
			healthy++
			if !m.Draining {
				selectable++
			}
		}
	}
	return len(i.Members), healthy, selectable
}

// MemberInfo is a copy of one member's state at one moment. Changing it changes nothing.
type MemberInfo struct {
	// ID is the tunnel id the edge assigned.
	ID string
	// Tenant is the identity the member's connector authenticated as ("" for none).
	Tenant string
	// Name and Host are the member's tunnel name and its connector's host, "" when unknown
	// (JoinRequest).
	Name, Host string
	// Transport is how the member's connector reaches the edge: "tcp", "websocket" or
	// "quic"; "" when unknown (JoinRequest).
	Transport string
	// HealthKind is the probe type reporting on the member: "tcp", "http", "func" or "none".
	HealthKind string
	// HasAlertWebhook says whether the member registered a tenant alert URL.
	HasAlertWebhook bool
	// Healthy says the member's probe passes (or it has none) and it is not ejected;
	// Draining says it takes no new work.
	Healthy, Draining bool
	// Ejected says passive outlier ejection keeps it out of dispatch for now.
	Ejected bool
	// Weight (1–100) and Priority (tier, 0 first) are its load-balancing settings; Ramping
	// says it is still in its slow start.
	Weight, Priority int
	Ramping          bool
	// Active is its number of active streams: for a member of this edge all of them,
	// those other edges of a cluster forward to it included; for another edge's member the
	// ones this edge has open to it and those its own edge last published.
	Active int64
	// Joined is when the member joined.
	Joined time.Time
	// Edge is the cluster edge the member's connector is attached to; "" for this edge.
	Edge string
}

func (m *Member) info() MemberInfo {
	return MemberInfo{
		ID:              m.ID,
		Tenant:          m.Tenant,
		Name:            m.Name,
		Host:            m.Host,
		Transport:       m.Transport,
		HealthKind:      m.HealthKind,
		HasAlertWebhook: m.AlertWebhook != "",
		Healthy:         m.Healthy(),
		Draining:        m.Draining(),
		Ejected:         m.Ejected(),
		Weight:          m.Weight,
		Priority:        m.Priority,
		Ramping:         m.Ramping(),
		Active:          m.streams(),
		Edge:            m.Edge,
		Joined:          m.Joined,
	}
}

// infoLocked copies g, with its members when withMembers; the caller holds g.mu.
func (g *Group) infoLocked(withMembers bool) Info {
	i := Info{
		ID: g.ID, Kind: g.Kind, Proto: g.Proto, Label: g.Label, Name: g.Name,
		KeyHash: g.KeyHash(), Port: g.Port, Dispatches: g.dispatches.Load(),
		Affinity: g.Affinity, RetryIdempotent: g.RetryIdempotent,
	}
	if withMembers {
		i.Members = make([]MemberInfo, len(g.members))
		for k, m := range g.members {
			i.Members[k] = m.info()
		}
	}
	return i
}

// Info returns a copy of the group with its members.
func (g *Group) Info() Info {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.infoLocked(true)
}

// View reads a Registry and cannot change it: everything it returns is a copy. It is what an
// embedder of the edge is given; its zero value sees an empty registry.
type View struct{ r *Registry }

// View returns a read-only view of r.
func (r *Registry) View() View { return View{r} }

// Groups returns every live group with its members, in no particular order.
func (v View) Groups() []Info {
	if v.r == nil {
		return nil
	}
	gs := v.r.Groups()
	out := make([]Info, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.Info())
	}
	return out
}

// LookupHTTP returns the HTTP(S) group serving a subdomain.
func (v View) LookupHTTP(subdomain string) (Info, bool) {
	if v.r == nil {
		return Info{}, false
	}
	g := v.r.LookupHTTP(subdomain)
	if g == nil {
		return Info{}, false
	}
	return g.Info(), true
}

// Member returns the live member with this tunnel id and its group.
func (v View) Member(id string) (MemberInfo, Info, bool) {
	m := v.member(id)
	if m == nil {
		return MemberInfo{}, Info{}, false
	}
	g := m.group.Info()
	for _, mi := range g.Members {
		if mi.ID == id {
			return mi, g, true
		}
	}
	return MemberInfo{}, Info{}, false // it left meanwhile
}

// History returns the last HistoryLen health transitions of the live member with this
// tunnel id, oldest first.
func (v View) History(id string) ([]Transition, bool) {
	m := v.member(id)
	if m == nil {
		return nil, false
	}
	return m.History(), true
}

// Dispatches returns, per pool name, the requests and connections dispatched to the pools of
// that name so far, the pools that are gone included: each total only ever grows (a pick
// that acquired a member just before its pool was removed may go uncounted). Solo tunnels
// are not pools and are not counted.
func (v View) Dispatches() map[string]uint64 {
	out := map[string]uint64{}
	if v.r == nil {
		return out
	}
	v.r.retiredMu.Lock()
	defer v.r.retiredMu.Unlock()
	for name, n := range v.r.retired {
		out[name] += n
	}
	for _, g := range v.r.Groups() {
		if !g.Solo() {
			out[g.Name] += g.dispatches.Load()
		}
	}
	return out
}

// PortsInUse returns the number of TCP ports currently taken.
func (v View) PortsInUse() int {
	if v.r == nil {
		return 0
	}
	return v.r.PortsInUse()
}

func (v View) member(id string) *Member {
	if v.r == nil {
		return nil
	}
	return v.r.Member(id)
}

// Member returns the live member with this tunnel id, or nil.
func (r *Registry) Member(id string) *Member {
	x, ok := r.byID.Load(id)
	if !ok {
		return nil
	}
	return x.(*Member)
}
