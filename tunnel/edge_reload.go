package tunnel

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// ReloadChange is one setting of the configuration passed to Reload that differs from what
// the edge runs with: applied, or left as it was and why.
type ReloadChange struct {
	// Setting names the setting: a field of ServerConfig by its path ("Domain",
	// "Timeouts.Drain", "Limits.Tenant.MaxTunnels", "Limits.PerTenant[acme].MaxTunnels"), or
	// a reserved endpoint by its route ("Endpoints[http/shop]", "Endpoints[tcp/db]").
	Setting string
	// From is the value the edge ran with and To the one Reload was given. A plain setting
	// (a string, a number, a bool, a time.Duration, a group.PortRange) has its values; an
	// endpoint has Endpoint values, nil where there was or is none (added, released). Both
	// are nil for any other setting (a function, an interface, a pointer, a slice, a map)
	// and for Alerts.WebhookURL, which may hold a secret.
	From, To any
	// Applied reports whether the edge runs with To from now on.
	Applied bool
	// Reason says why a change was not applied; it is empty for one that was.
	Reason string
}

// String formats c as "Setting (From -> To): Reason", leaving out the values when they are
// nil or endpoints and the reason when there is none.
func (c ReloadChange) String() string {
	line := c.Setting
	if a, b := showValue(c.From), showValue(c.To); a != "" || b != "" {
		line += fmt.Sprintf(" (%s -> %s)", orNone(a), orNone(b))
	}
	if c.Reason != "" {
		line += ": " + c.Reason
	}
	return line
}

// Reasons of the changes Reload does not apply.
const (
	// reasonRestart is the reason of every setting but the live ones.
	reasonRestart = "cannot change while the edge runs; a restart applies it"
)

// Reload applies cfg to the running edge as far as it can without dropping a connector, and
// returns every setting of cfg that differs from what the edge runs with: those it applied
// and those it left as they were, with why. It is meant for a configuration file reloaded on
// SIGHUP: pass the whole new configuration.
//
// What it applies at once:
//
//   - The limits: every field of Limits (Tenant, PerTenant, MaxTunnelsPerSession,
//     RegisterRate and RegisterBurst). They are read where they are used, so a new value
//     applies to what comes next: a session's Hello (MaxSessions), a registration
//     (MaxTunnelsPerSession, MaxTunnels, MaxTCPPorts), a new live event stream
//     (MaxEventStreams), a new session's registration rate. Lowering one never ends a
//     session, a tunnel or a stream already there, nor gives a port back: a tenant over its
//     new cap keeps what it holds and is refused (ErrLimit) until it is under it again. Each
//     field that changed is a change of its own ("Limits.Tenant.MaxTunnels").
//   - The reserved endpoints (Endpoints). An endpoint cfg adds reserves its route for its
//     tenant (pool name, key hash, TCP port) from now on, exactly as at start: its route
//     answers 503 (not 404) while it has no member, the admin API lists it at once, and its
//     Policy applies to the next request or connection. An endpoint whose Policy changed
//     gets a new gate (its rate buckets and in-flight count start empty); one whose Policy
//     did not keeps its gate, buckets and count. An endpoint cfg leaves out becomes an
//     ordinary claim of its tenant, which lapses RouteTTL after its last member left (as at
//     a restart): no 503, no listing, no policy. Registrations are checked against the new
//     reservations at once; connectors already registered stay. An endpoint whose route has
//     members that do not match it, or that another tenant claims, or whose TCP port is
//     taken, is left as it was (not reserved, or reserved as before): a change not applied,
//     whose Reason says why.
//
// What it does not apply: every other field of cfg that differs from the running
// configuration (ports, listeners, Domain, RegionID, TLS, Store, request body limits,
// timeouts, alerts, load balancing, …), each a change not applied, a field of a sub-struct
// by its path ("Timeouts.Drain"). Auth is compared only for nil: an Authenticator that reads
// its tokens live (examples/edge has one) changes them itself.
//
// The changes not applied come first, in the order of ServerConfig's fields, then the
// limits, then the endpoints by route. When cfg is invalid (an endpoint NewServer would
// refuse, two endpoints for one route, a setting NewServer refuses) Reload applies nothing
// and returns the error; after Shutdown or Close it returns ErrServerClosed. Reloads are
// serialised; traffic and registrations are never held up by one.
func (s *Server) Reload(cfg ServerConfig) ([]ReloadChange, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.shuttingDown() {
		return nil, ErrServerClosed
	}
	next := cfg
	next.Endpoints = nil
	if err := next.setDefaults(); err != nil {
		return nil, err
	}
	// The endpoints are checked against the TCP port range the edge runs with.
	check := ServerConfig{TCP: s.cfg.TCP, Endpoints: cfg.Endpoints}
	if err := check.Validate(); err != nil {
		return nil, err // each a *FieldError: "tunnel: Field: ..."
	}
	want := map[string]*Endpoint{}
	for i := range cfg.Endpoints {
		ep := cfg.Endpoints[i].own()
		want[store.Key(ep.kind(), ep.label())] = ep
	}
	current, err := s.routes.st.List(s.routes.ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: reading the route store: %w", err)
	}
	if s.cluster != nil && next.Store == nil {
		// The route store of a cluster's edge is the one it opened in NATS itself, which
		// no configuration names: not a change.
		next.Store = s.cfg.Store
	}
	changes := s.unchangedFields(next)
	changes = append(changes, s.applyLimits(newLiveLimits(&next))...)
	changes = append(changes, s.routes.applyEndpoints(want, current)...)
	return changes, nil
}

// applyLimits puts l in force, unless it is what is in force, and returns the fields that
// changed.
func (s *Server) applyLimits(l *liveLimits) []ReloadChange {
	prev := s.limits.Load()
	if prev.equal(l) {
		return nil
	}
	s.limits.Store(l)
	s.log.Info("limits changed by a reload; they apply to the next sessions, registrations and event streams",
		zap.Any("limits", l.def), zap.Any("tenant_limits", l.tenants), zap.Int("max_tunnels_per_session", l.perSession),
		zap.Float64("register_rate", l.registerRate), zap.Int("register_burst", l.registerBurst))
	return diffLimits(prev.config(), l.config())
}

// diffLimits lists the fields of two Limits that differ, a tenant's own limits field by
// field, in the order of the fields and of the tenants' names.
func diffLimits(a, b Limits) []ReloadChange {
	var out []ReloadChange
	add := func(setting string, x, y any) {
		if x != y {
			out = append(out, ReloadChange{Setting: setting, From: x, To: y, Applied: true})
		}
	}
	add("Limits.MaxTunnelsPerSession", a.MaxTunnelsPerSession, b.MaxTunnelsPerSession)
	add("Limits.RegisterRate", a.RegisterRate, b.RegisterRate)
	add("Limits.RegisterBurst", a.RegisterBurst, b.RegisterBurst)
	tenant := func(prefix string, x, y TenantLimits) {
		add(prefix+".MaxSessions", x.MaxSessions, y.MaxSessions)
		add(prefix+".MaxTunnels", x.MaxTunnels, y.MaxTunnels)
		add(prefix+".MaxTCPPorts", x.MaxTCPPorts, y.MaxTCPPorts)
		add(prefix+".MaxEventStreams", x.MaxEventStreams, y.MaxEventStreams)
	}
	tenant("Limits.Tenant", a.Tenant, b.Tenant)
	names := slices.Sorted(maps.Keys(a.PerTenant))
	for name := range b.PerTenant {
		if _, ok := a.PerTenant[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		tenant("Limits.PerTenant["+name+"]", a.PerTenant[name], b.PerTenant[name])
	}
	return out
}

// applyEndpoints reserves the endpoints of want (by store key), releases the reserved routes
// of current (the store's routes) that want leaves out, and puts the new set in force. It
// returns the endpoints added, changed and released, and those it could not apply.
func (b *routeBook) applyEndpoints(want map[string]*Endpoint, current []*store.Route) (changes []ReloadChange) {
	prev := b.eps.Load()
	eps := map[string]*Endpoint{}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		ep := want[key]
		old := prev.byKey[key]
		change := ReloadChange{Setting: "Endpoints[" + key + "]", From: endpointValue(old), To: *ep}
		if why := b.reserve(key, ep); why != "" {
			if old != nil {
				// Its reservation on record is the old one: so are its 503, listing and policy.
				eps[key] = old
				change.Reason = why + "; it stays as it was"
			} else {
				change.Reason = why + "; it is not reserved"
			}
			changes = append(changes, change)
			continue
		}
		eps[key] = ep
		if old != nil && old.same(ep) {
			continue
		}
		if old != nil && !old.Policy.equal(ep.Policy) {
			b.log.Info("endpoint policy changed by a reload", zap.String("route", key))
		}
		change.Applied = true
		changes = append(changes, change)
	}
	for _, key := range slices.Sorted(maps.Keys(prev.byKey)) {
		if eps[key] == nil {
			changes = append(changes, ReloadChange{Setting: "Endpoints[" + key + "]", From: *prev.byKey[key], Applied: true})
		}
	}
	slices.SortStableFunc(changes, func(x, y ReloadChange) int { return strings.Compare(x.Setting, y.Setting) })
	// Published before the releases below: a released route is an ordinary one for traffic
	// at once, and its record is released right after.
	b.eps.Store(newEndpointSet(eps, prev))
	for _, r := range current {
		if r.Reserved && eps[r.Key()] == nil {
			b.unreserve(r.Key())
		}
	}
	return changes
}

// endpointValue is ep as a ReloadChange value: nil for none.
func endpointValue(ep *Endpoint) any {
	if ep == nil {
		return nil
	}
	return *ep
}

// liveFields are the fields of ServerConfig that Reload applies (or compares by itself).
var liveFields = map[string]bool{"Endpoints": true, "Limits": true}

// secretFields are the fields whose values a change leaves out.
var secretFields = map[string]bool{"Alerts.WebhookURL": true}

// settingGroups are the sub-structs of ServerConfig whose fields are compared one by one.
var settingGroups = map[reflect.Type]bool{
	reflect.TypeFor[PublicHTTP](): true, reflect.TypeFor[RequestBodyLimits](): true,
	reflect.TypeFor[StalledResponseLimits](): true, reflect.TypeFor[TCPTunnels](): true,
	reflect.TypeFor[LoadBalancing](): true, reflect.TypeFor[Timeouts](): true,
	reflect.TypeFor[PreAuthLimits](): true, reflect.TypeFor[Alerts](): true,
}

// unchangedFields lists the fields of next (defaults applied) that differ from the running
// configuration and that Reload leaves as they are. The live fields are left out.
func (s *Server) unchangedFields(next ServerConfig) []ReloadChange {
	return diffSettings("", reflect.ValueOf(s.cfg), reflect.ValueOf(next))
}

// diffSettings lists the fields of the structs cur and nv that differ, named under prefix,
// the fields of a settings group one by one.
func diffSettings(prefix string, cur, nv reflect.Value) []ReloadChange {
	var out []ReloadChange
	for i := range cur.NumField() {
		f := cur.Type().Field(i)
		name := prefix + f.Name
		if !f.IsExported() || liveFields[name] {
			continue
		}
		if settingGroups[f.Type] {
			out = append(out, diffSettings(name+".", cur.Field(i), nv.Field(i))...)
			continue
		}
		if sameSetting(cur.Field(i), nv.Field(i)) {
			continue
		}
		c := ReloadChange{Setting: name, Reason: reasonRestart}
		if plainSetting(cur.Field(i)) && !secretFields[name] {
			c.From, c.To = cur.Field(i).Interface(), nv.Field(i).Interface()
		}
		out = append(out, c)
	}
	return out
}

// plainSetting reports whether v is a plain setting's value: a string, a number, a bool, a
// duration or a port range.
func plainSetting(v reflect.Value) bool {
	if v.Type() == reflect.TypeFor[group.PortRange]() {
		return true
	}
	switch v.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// showValue formats a plain setting's value for ReloadChange.String: strings quoted,
// durations as time.Duration prints them, port ranges as lo-hi; "" for nil and endpoints.
func showValue(v any) string {
	switch x := v.(type) {
	case nil, Endpoint:
		return ""
	case string:
		return fmt.Sprintf("%q", x)
	case group.PortRange:
		return fmt.Sprintf("%d-%d", x.Lo, x.Hi)
	}
	return fmt.Sprint(v)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// sameSetting compares two values of one ServerConfig field: functions by whether they are
// set, pointers and interfaces by identity first (a Logger or Authenticator passed again is
// the same setting), the rest deeply.
func sameSetting(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Func:
		return a.IsNil() == b.IsNil()
	case reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		if a.Elem().Type() != b.Elem().Type() {
			return false
		}
		return sameSetting(a.Elem(), b.Elem())
	case reflect.Pointer:
		if a.Pointer() == b.Pointer() {
			return true
		}
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// reserve writes the reservation of ep for the route key, unless the route is in use in a
// way the endpoint does not admit; it returns why not, or "".
func (b *routeBook) reserve(key string, ep *Endpoint) string {
	kind, label := ep.kind(), ep.label()
	if why := b.liveMismatch(ep); why != "" {
		return why
	}
	next := ep.route()
	var why string
	var replaced *store.Route
	r, err := b.update(key, func(cur *store.Route) (*store.Route, error) {
		// fn may run more than once: it only computes; what it decides is read after.
		why, replaced = "", nil
		now := b.now()
		live := b.live(kind, label)
		switch {
		case cur != nil && cur.Reserved && sameReservation(cur, next):
			return nil, errUnchanged
		case cur == nil && live:
			why = "its route has members but no owner on record"
			return nil, errUnchanged
		case cur != nil && cur.Tenant != ep.Tenant && !cur.Reserved && !b.lapsed(cur, now, func() bool { return live }):
			why = fmt.Sprintf("its route is claimed by another tenant (%q) until its claim lapses", cur.Tenant)
			return nil, errUnchanged
		}
		if ep.Proto == ProtoTCP {
			if other := b.portHolder(ep.Port, cur); other != "" {
				why = fmt.Sprintf("its port %d is held by %s", ep.Port, other)
				return nil, errUnchanged
			}
		}
		r := *next
		if live {
			r.EmptySince = time.Time{}
		} else {
			r.EmptySince = now
		}
		replaced = cur
		return &r, nil
	})
	switch {
	case errors.Is(err, errUnchanged):
		return why
	case err != nil:
		return fmt.Sprintf("cannot record the route: %v", err)
	}
	if replaced != nil {
		b.releasePorts(replaced)
	}
	b.holdPorts(r)
	b.log.Info("endpoint reserved by a reload", zap.String("route", key), zap.String("tenant", ep.Tenant))
	return ""
}

// sameReservation reports whether the reserved route cur is what next reserves.
func sameReservation(cur, next *store.Route) bool {
	return cur.Tenant == next.Tenant && cur.Group == next.Group && cur.KeyHash == next.KeyHash &&
		maps.Equal(cur.Ports, next.Ports)
}

// liveMismatch says why the members ep's route has now do not fit ep, or returns "".
func (b *routeBook) liveMismatch(ep *Endpoint) string {
	var zero group.KeyHash
	for _, g := range b.reg.View().Groups() {
		switch {
		case ep.Proto != ProtoTCP && g.Kind == group.KindHTTP && g.Label == ep.Subdomain:
			if g.Name != ep.Group || (ep.KeyHash != zero && g.KeyHash != ep.KeyHash) {
				return "its route has members of another pool (name or key)"
			}
			for _, m := range g.Members {
				if m.Tenant != ep.Tenant {
					return fmt.Sprintf("its route has members of another tenant (%q)", m.Tenant)
				}
			}
		case ep.Proto == ProtoTCP && g.Kind == group.KindTCP && g.Label == ep.Group && !g.Solo():
			if g.KeyHash != ep.KeyHash || g.Port != ep.Port {
				return "its group has members with another key or port"
			}
			for _, m := range g.Members {
				if m.Tenant != ep.Tenant {
					return fmt.Sprintf("its group has members of another tenant (%q)", m.Tenant)
				}
			}
		case ep.Proto == ProtoTCP && g.Kind == group.KindTCP && g.Port == ep.Port:
			return fmt.Sprintf("its port %d is in use by tunnel %q", ep.Port, g.Label)
		}
	}
	return ""
}

// portHolder names the tenant whose other route holds port, or returns "" when no route but
// cur holds it.
func (b *routeBook) portHolder(port int, cur *store.Route) string {
	if cur != nil {
		for _, p := range cur.Ports {
			if p == port {
				return ""
			}
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for tenant, ports := range b.ports {
		if ports[port] {
			return fmt.Sprintf("a route of tenant %q", tenant)
		}
	}
	return ""
}

// unreserve turns the reserved route key into an ordinary claim of its tenant; an empty one
// gets a full RouteTTL from now.
func (b *routeBook) unreserve(key string) {
	_, err := b.update(key, func(cur *store.Route) (*store.Route, error) {
		if cur == nil || !cur.Reserved {
			return nil, errUnchanged
		}
		r := *cur
		r.Reserved = false
		if !r.EmptySince.IsZero() {
			r.EmptySince = b.now()
		}
		return &r, nil
	})
	switch {
	case err == nil:
		b.log.Info("endpoint released by a reload", zap.String("route", key))
	case !errors.Is(err, errUnchanged):
		b.log.Error("cannot release an endpoint", zap.String("route", key), zap.Error(err))
	}
}
