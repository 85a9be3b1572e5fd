package tunnel

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/store"
)

// reloadMu serialises Reload calls (of every Server: they are rare).
var reloadMu sync.Mutex

// Reload applies cfg to the running edge as far as it can without dropping a connector, and
// returns, one line each, what it left as it was. It is meant for a configuration file
// reloaded on SIGHUP: pass the whole new configuration.
//
// What it applies is the reserved endpoints' ownership: an endpoint cfg adds reserves its
// route for its tenant (pool name, key hash, TCP port) from now on, as at start, and one cfg
// leaves out becomes an ordinary claim of its tenant, which lapses RouteTTL after its last
// member left (as at a restart). Registrations are checked against the new reservations at
// once; connectors already registered stay. An endpoint whose route has members that do not
// match it, or that another tenant claims, or whose TCP port is taken, is left out and named
// in notApplied.
//
// What it does not apply, and names in notApplied: every other field of cfg that differs from
// the running configuration (ports, listeners, TLS, limits, quotas, load balancing, …), and
// the parts of endpoints fixed when the edge started: their traffic Policy, and for an
// endpoint added or removed here, whether its empty route answers 503 rather than 404 and
// whether the admin API lists it while empty. Auth is compared only for nil: an
// Authenticator that reads its tokens live (examples/edge has one) changes them itself.
//
// When cfg is invalid (an endpoint NewServer would refuse, two endpoints for one route, a
// setting NewServer refuses) Reload applies nothing and returns the error; after Shutdown or
// Close it returns ErrServerClosed.
func (s *Server) Reload(cfg ServerConfig) (notApplied []string, err error) {
	reloadMu.Lock()
	defer reloadMu.Unlock()
	if s.shuttingDown() {
		return nil, ErrServerClosed
	}
	next := cfg
	next.Endpoints = nil
	if err := next.setDefaults(); err != nil {
		return nil, err
	}
	want := map[string]*Endpoint{}
	for i := range cfg.Endpoints {
		ep := cfg.Endpoints[i]
		if err := ep.validate(s.cfg.TCPPorts); err != nil {
			return nil, err
		}
		key := store.Key(ep.kind(), ep.label())
		if want[key] != nil {
			return nil, fmt.Errorf("tunnel: two endpoints reserve the route %s", key)
		}
		want[key] = &ep
	}
	notApplied = s.unchangedFields(next)

	b := s.routes
	current, err := b.st.List()
	if err != nil {
		return notApplied, fmt.Errorf("tunnel: reading the route store: %w", err)
	}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		ep := want[key]
		if why := b.reserve(key, ep); why != "" {
			notApplied = append(notApplied, fmt.Sprintf("endpoint %s: %s; it is not reserved", key, why))
			continue
		}
		if started := b.endpoints[key]; started == nil {
			notApplied = append(notApplied, fmt.Sprintf("endpoint %s: reserved; until a restart its route answers 404 (not 503) while it has no member and the admin API does not list it while empty", key))
			if ep.Policy.active() {
				notApplied = append(notApplied, fmt.Sprintf("endpoint %s: its policy applies after a restart", key))
			}
		} else if !reflect.DeepEqual(started.Policy, ep.Policy) || (ep.Proto == ProtoTCP && started.KeyHash != ep.KeyHash && started.Policy.active()) {
			notApplied = append(notApplied, fmt.Sprintf("endpoint %s: its policy change applies after a restart", key))
		}
	}
	for _, r := range current {
		if r.Reserved && want[r.Key()] == nil {
			b.unreserve(r.Key())
		}
	}
	for _, key := range slices.Sorted(maps.Keys(b.endpoints)) {
		if want[key] == nil {
			notApplied = append(notApplied, fmt.Sprintf("endpoint %s: released; until a restart its route answers 503 while it has no member, the admin API lists it while empty, and its policy applies", key))
		}
	}
	return notApplied, nil
}

// active reports whether the policy restricts anything (the edge keeps a gate for it).
func (p Policy) active() bool {
	return len(p.AllowCIDRs)+len(p.DenyCIDRs) > 0 || p.RateLimit > 0 || p.MaxConcurrent > 0
}

// unchangedFields names the fields of next (defaults applied) that differ from the running
// configuration: Reload leaves them as they are. Endpoints are left out.
func (s *Server) unchangedFields(next ServerConfig) []string {
	var out []string
	cur, nv := reflect.ValueOf(s.cfg), reflect.ValueOf(next)
	for i := range cur.NumField() {
		f := cur.Type().Field(i)
		if !f.IsExported() || f.Name == "Endpoints" {
			continue
		}
		if !sameSetting(cur.Field(i), nv.Field(i)) {
			out = append(out, fmt.Sprintf("%s: cannot change while the edge runs; a restart applies it", f.Name))
		}
	}
	return out
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
	r, err := b.st.Update(key, func(cur *store.Route) (*store.Route, error) {
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
	_, err := b.st.Update(key, func(cur *store.Route) (*store.Route, error) {
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
