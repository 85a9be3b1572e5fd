package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/warren-tunnel/warren/tunnel"
)

// Change is one key of a server.toml that differs from what the edge runs with: applied by
// a reload, or kept at its running value until a restart, and why.
type Change struct {
	// Key is the file's key ("limits.max_tunnels_per_session", "auth.tenants[acme].max_tunnels",
	// "cluster"), or what a reload replaced as a whole ("auth.tokens and auth.tenants", "tls",
	// "endpoints", "endpoint http/shop").
	Key string
	// From and To are the running and the new value as the file writes them; both are empty
	// when the change does not show them (a secret, a set of tokens, an endpoint).
	From, To string
	// Applied reports whether the edge runs with the new value from now on.
	Applied bool
	// Reason says, for a change not applied, why and what applies it; for one applied, when
	// it takes effect or what was done.
	Reason string
}

// String formats c as the example edge logs it: "key (from -> to): reason".
func (c Change) String() string {
	line := c.Key
	if c.From != "" || c.To != "" {
		line += fmt.Sprintf(" (%s -> %s)", c.From, c.To)
	}
	if c.Reason != "" {
		line += ": " + c.Reason
	}
	return line
}

// Reload applies next, a new version of the file e was made from, to srv, the edge made
// from e, without dropping a connector, and returns every key that differs: applied, or not
// and why. It applies the connector tokens and tenants and the TLS certificate and key (read
// by the edge through e), the limits and tenant quotas, and the [[endpoints]] with their
// policies (tunnel.Server.Reload); every other key keeps its running value until a restart.
// A file the edge refuses changes nothing: Reload returns its error, naming the file.
func (e *Edge) Reload(srv *tunnel.Server, next *Server) ([]Change, error) {
	ne, err := next.Edge(e.Config.Logger)
	if err != nil {
		return nil, err
	}
	// The edge applies the live settings of the new file, and nothing else: every other
	// field is the configuration it runs with (fileDiff names what differs in the file). It
	// refuses an invalid configuration whole, before anything below changes.
	live := e.Config
	live.Endpoints = ne.Config.Endpoints
	live.Limits = ne.Config.Limits
	edgeChanges, err := srv.Reload(live)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", next.File, err)
	}

	changes := fileDiff(e.start, next)
	switch {
	case e.start.Auth.RequireAuth != next.Auth.RequireAuth:
		// fileDiff named it: the edge's Authenticator is on or off for good.
	case ne.auth != nil:
		if tokensChanged(e.last.Auth, next.Auth) {
			changes = append(changes, Change{Key: "auth.tokens and auth.tenants", Applied: true,
				Reason: fmt.Sprintf("%d tokens and %d tenants from now on (connectors already connected stay)", len(next.Auth.Tokens), len(next.Auth.Tenants))})
		}
		e.auth.cur.Store(ne.auth.cur.Load())
	}
	if e.cert != nil && ne.cert != nil {
		e.cert.cur.Store(ne.cert.cur.Load())
		changes = append(changes, Change{Key: "tls", Applied: true,
			Reason: "certificate and key loaded again from " + next.TLS.CertPath + " and " + next.TLS.KeyPath})
	}
	changes = append(changes, limitsApplied(e.last, next)...)
	if !reflect.DeepEqual(e.last.Endpoints, next.Endpoints) {
		changes = append(changes, Change{Key: "endpoints", Applied: true,
			Reason: fmt.Sprintf("%d reserved routes and their policies from now on (an endpoint left out is an ordinary route again)", len(next.Endpoints))})
	}
	// The file's keys are compared above; what the edge reports besides are the endpoints
	// it could not reserve.
	for _, c := range edgeChanges {
		if route, ok := strings.CutPrefix(c.Setting, "Endpoints["); ok && !c.Applied {
			changes = append(changes, Change{Key: "endpoint " + strings.TrimSuffix(route, "]"), Reason: c.Reason})
		}
	}
	e.last = next
	return changes, nil
}

// tokensChanged reports whether the connector tokens or the tenants' names and tokens differ.
func tokensChanged(a, b Auth) bool {
	if !slices.Equal(a.Tokens, b.Tokens) || len(a.Tenants) != len(b.Tenants) {
		return true
	}
	for i := range a.Tenants {
		if a.Tenants[i].Name != b.Tenants[i].Name || a.Tenants[i].Token != b.Tenants[i].Token {
			return true
		}
	}
	return false
}

// liveLimits are the [limits] keys the edge applies on a reload (its quotas included): the
// fields of tunnel.Limits.
var liveLimits = map[string]bool{"max_tunnels_per_session": true, "max_sessions": true, "max_tunnels": true,
	"max_tcp_ports": true, "max_event_streams": true, "max_routes": true}

// quotaApplies says when a changed limit applies.
const quotaApplies = "from the next session, registration or event stream; what is held stays"

// limitsApplied lists the live limits and tenant quotas that differ between last (the file
// last applied) and next, by their keys.
func limitsApplied(last, next *Server) []Change {
	var out []Change
	for _, d := range structDiff("limits", last.Limits, next.Limits) {
		if liveLimits[d.field] {
			out = append(out, d.change(true, quotaApplies))
		}
	}
	for _, d := range quotaDiff(last.Auth.Tenants, next.Auth.Tenants) {
		out = append(out, d.change(true, quotaApplies))
	}
	return out
}

// quotaDiff compares the tenants' own quotas of two files, by tenant name.
func quotaDiff(a, b []Tenant) []settingDiff {
	quotas := map[string]Quotas{}
	for _, t := range a {
		quotas[t.Name] = t.Quotas
	}
	var out []settingDiff
	for _, t := range b {
		if q, ok := quotas[t.Name]; ok || t.Quotas != (Quotas{}) {
			out = append(out, structDiff(fmt.Sprintf("auth.tenants[%s]", t.Name), q, t.Quotas)...)
		}
	}
	return out
}

// fileDiff lists the keys of next that differ from what the edge runs with (start) and
// cannot change while it runs. Tokens, tenants' tokens and quotas, the TLS files, the live
// limits and the endpoints are left out: Reload applies them.
func fileDiff(start, next *Server) []Change {
	var out []Change
	const restart = "; restart the edge to apply it"
	const listener = "listeners and ports are fixed while the edge runs"
	s, n := start.Server, next.Server
	for _, f := range []struct {
		key  string
		a, b any
		why  string
	}{
		{"server.domain", s.Domain, n.Domain, "tunnel URLs are made with it"},
		{"server.bind", s.Bind, n.Bind, listener},
		{"server.http_port", s.HTTPPort, n.HTTPPort, listener},
		{"server.https_port", s.HTTPSPort, n.HTTPSPort, listener},
		{"server.control_port", s.ControlPort, n.ControlPort, listener},
		{"server.quic_port", s.QUICPort, n.QUICPort, listener},
		{"server.admin_port", s.AdminPort, n.AdminPort, listener},
		{"server.admin_bind", s.AdminHost(), n.AdminHost(), listener},
		{"server.allow_open_admin", s.AllowOpenAdmin, n.AllowOpenAdmin, "the admin listener keeps the rule it started with"},
		{"server.region_id", s.RegionID, n.RegionID, "alerts and metrics name the edge with it"},
		{"server.state_dir", s.StateDir, n.StateDir, "the route store stays open where it is"},
		{"server.data_read_buffer", s.DataReadBuffer, n.DataReadBuffer, "data connections are accepted with the value the edge started with"},
		{"server.websocket_path", s.WebSocketPath, n.WebSocketPath, "the public listeners serve the path they started with"},
		{"server.websocket_on_http", s.WebSocketOnHTTP, n.WebSocketOnHTTP, "the public listeners serve the path they started with"},
		{"tls", start.TLS.Enabled(), next.TLS.Enabled(), "TLS on the control listener is on or off for good (changed files are loaded again while it stays on)"},
		{"auth.require_auth", start.Auth.RequireAuth, next.Auth.RequireAuth, "authentication is on or off for good"},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			out = append(out, Change{Key: f.key, From: fmt.Sprint(f.a), To: fmt.Sprint(f.b), Reason: f.why + restart})
		}
	}
	if start.Auth.AdminToken != next.Auth.AdminToken {
		out = append(out, Change{Key: "auth.admin_token", Reason: "the admin API keeps the token it started with" + restart})
	}
	for _, d := range structDiff("limits", start.Limits, next.Limits) {
		if !liveLimits[d.field] {
			out = append(out, d.change(false, "the edge reads it only when it starts"+restart))
		}
	}
	for _, d := range structDiff("load_balancing", start.LoadBalancing, next.LoadBalancing) {
		out = append(out, d.change(false, "the routing table is built with these"+restart))
	}
	return append(out, clusterDiff(start.Cluster, next.Cluster)...)
}

// clusterDiff lists the [cluster] keys that differ: the edge joined the cluster with the
// ones it started with and keeps them (its NATS connection, lease, links and their TLS
// files) until a restart. The token's values are left out.
func clusterDiff(start, next *Cluster) []Change {
	const why = "the edge joined the cluster with it; restart the edge to apply it"
	switch {
	case start == nil && next == nil:
		return nil
	case start == nil:
		return []Change{{Key: "cluster", From: "off", To: "on", Reason: "the edge runs alone; restart the edge to join the cluster"}}
	case next == nil:
		return []Change{{Key: "cluster", From: "on", To: "off", Reason: "the edge stays in the cluster; restart the edge to run it alone"}}
	}
	var out []Change
	for _, d := range structDiff("cluster", *start, *next) {
		switch d.field {
		case "token":
			out = append(out, Change{Key: "cluster.token", Reason: why})
		case "tls": // compared key by key below
		default:
			out = append(out, d.change(false, why))
		}
	}
	for _, d := range structDiff("cluster.tls", start.TLS, next.TLS) {
		out = append(out, d.change(false, why))
	}
	return out
}

// settingDiff is one setting that differs between two files.
type settingDiff struct {
	prefix, field string // the table ("limits", "auth.tenants[acme]") and the key in it
	a, b          string // the values, as the file writes them
}

// change is the Change of d.
func (d settingDiff) change(applied bool, reason string) Change {
	return Change{Key: d.prefix + "." + d.field, From: d.a, To: d.b, Applied: applied, Reason: reason}
}

// structDiff lists the fields of a and b (two values of one struct type of this package)
// that differ, as keys under prefix.
func structDiff(prefix string, a, b any) []settingDiff {
	var out []settingDiff
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	for i := range va.NumField() {
		f := va.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		fa, fb := va.Field(i), vb.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, structDiff(prefix, fa.Interface(), fb.Interface())...)
			continue
		}
		if reflect.DeepEqual(fa.Interface(), fb.Interface()) {
			continue
		}
		out = append(out, settingDiff{prefix, tomlKey(f), show(fa.Interface()), show(fb.Interface())})
	}
	return out
}

// tomlKey is the key of a field of this package: its toml tag, or for a field decoded by
// hand (tag "-") its name in snake case, with _secs for a duration.
func tomlKey(f reflect.StructField) string {
	if tag, _, _ := strings.Cut(f.Tag.Get("toml"), ","); tag != "" && tag != "-" {
		return tag
	}
	switch f.Name {
	case "AuthBlock":
		return "auth_block_secs"
	case "RouteTTL":
		return "route_ttl_secs"
	case "LeaseTTL":
		return "lease_secs"
	case "TCPPortRange":
		return "tcp_port_range"
	}
	var b strings.Builder
	for i, r := range f.Name {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	if f.Type == reflect.TypeFor[time.Duration]() {
		b.WriteString("_secs")
	}
	return b.String()
}

// show formats a setting's value as the file writes it.
func show(v any) string {
	switch x := v.(type) {
	case time.Duration:
		return fmt.Sprintf("%gs", x.Seconds())
	case PortRange:
		return fmt.Sprintf("[%d, %d]", x.Low, x.High)
	}
	return fmt.Sprint(v)
}
