package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// liveParts are the settings the edge reads through the main on every use, so that SIGHUP
// can replace them: the tokens and the TLS certificate. (The limits and endpoints are
// replaced by tunnel.Server.Reload.)
type liveParts struct {
	auth *liveAuth // nil when require_auth is false
	cert *liveCert // nil without TLS
}

// liveAuth is the edge's Authenticator: it checks tokens against the set last loaded.
type liveAuth struct {
	cur atomic.Pointer[tunnel.StaticTokens]
}

func newLiveAuth(st *tunnel.StaticTokens) *liveAuth {
	a := &liveAuth{}
	a.cur.Store(st)
	return a
}

// Authenticate implements tunnel.Authenticator.
func (a *liveAuth) Authenticate(ctx context.Context, token string) (string, error) {
	return a.cur.Load().Authenticate(ctx, token)
}

// liveCert hands out the certificate last loaded (tls.Config.GetCertificate).
type liveCert struct {
	cur atomic.Pointer[tls.Certificate]
}

func newLiveCert(c tls.Certificate) *liveCert {
	l := &liveCert{}
	l.cur.Store(&c)
	return l
}

func (l *liveCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return l.cur.Load(), nil }

// reloader applies server.toml again on SIGHUP.
type reloader struct {
	path  string
	log   *zap.Logger
	srv   *tunnel.Server
	start *config.Server      // the file the edge started with: what runs, but for live parts
	sc    tunnel.ServerConfig // the configuration the edge was created with
	live  *liveParts
	last  *config.Server // the file last applied, for the live parts
}

// reload reads the file again and applies what can change live: tokens and tenants, the TLS
// certificate, the limits and tenant quotas, and the reserved endpoints with their policies
// (tunnel.Server.Reload). Everything else that differs from the running configuration is
// logged as "not applied: …". A file that does not load, or that the edge refuses, changes
// nothing. It returns the lines it logged.
func (r *reloader) reload() (applied, notApplied []string, err error) {
	next, err := config.LoadServer(r.path)
	if err != nil {
		return nil, nil, err
	}
	nsc, nlive, err := buildServerConfig(next, r.log)
	if err != nil {
		return nil, nil, err
	}

	// The edge applies the live settings of the new file, and nothing else: every other
	// field is the configuration it was created with (fileDiff names what differs in the
	// file). It refuses an invalid configuration whole, before anything below changes.
	withLive := r.sc
	withLive.Endpoints = nsc.Endpoints
	withLive.Limits.Tenant = nsc.Limits.Tenant
	withLive.Limits.PerTenant = nsc.Limits.PerTenant
	withLive.Limits.MaxTunnelsPerSession = nsc.Limits.MaxTunnelsPerSession
	changes, err := r.srv.Reload(withLive)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", next.File, err)
	}

	notApplied = fileDiff(r.start, next)
	switch {
	case r.start.Auth.RequireAuth != next.Auth.RequireAuth:
		// fileDiff named it: the edge's Authenticator is on or off for good.
	case nlive.auth != nil:
		if tokensChanged(r.last.Auth, next.Auth) {
			applied = append(applied, fmt.Sprintf("auth.tokens and auth.tenants: %d tokens and %d tenants from now on (connectors already connected stay)", len(next.Auth.Tokens), len(next.Auth.Tenants)))
		}
		r.live.auth.cur.Store(nlive.auth.cur.Load())
	}
	if r.live.cert != nil && nlive.cert != nil {
		r.live.cert.cur.Store(nlive.cert.cur.Load())
		applied = append(applied, "tls: certificate and key loaded again from "+next.TLS.CertPath+" and "+next.TLS.KeyPath)
	}
	applied = append(applied, limitsApplied(r.last, next)...)
	if !reflect.DeepEqual(r.last.Endpoints, next.Endpoints) {
		applied = append(applied, fmt.Sprintf("endpoints: %d reserved routes and their policies from now on (an endpoint left out is an ordinary route again)", len(next.Endpoints)))
	}
	// The file's own keys are compared above; what the edge reports besides are the
	// endpoints it could not reserve.
	for _, c := range changes {
		if route, ok := strings.CutPrefix(c.Setting, "Endpoints["); ok && !c.Applied {
			notApplied = append(notApplied, "endpoint "+strings.TrimSuffix(route, "]")+": "+c.Reason)
		}
	}
	r.last = next
	return applied, notApplied, nil
}

// logReload runs reload and logs its outcome.
func (r *reloader) logReload() {
	r.log.Info("SIGHUP: reloading the configuration", zap.String("file", r.path))
	applied, notApplied, err := r.reload()
	for _, a := range applied {
		r.log.Info("applied: " + a)
	}
	for _, n := range notApplied {
		r.log.Warn("not applied: " + n)
	}
	if err != nil {
		r.log.Error("reload failed; the running configuration is kept", zap.String("errors", err.Error()))
		return
	}
	r.log.Info("configuration reloaded", zap.Int("applied", len(applied)), zap.Int("not_applied", len(notApplied)))
}

// tokensChanged reports whether the connector tokens or the tenants' names and tokens differ.
func tokensChanged(a, b config.Auth) bool {
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

// liveLimits are the [limits] keys the edge applies on a reload (its quotas included).
var liveLimits = map[string]bool{"max_tunnels_per_session": true, "max_sessions": true, "max_tunnels": true,
	"max_tcp_ports": true, "max_event_streams": true}

// quotaApplies says when a changed limit applies.
const quotaApplies = "from the next session, registration or event stream; what is held stays"

// limitsApplied names, as file keys, the live limits and tenant quotas that differ between
// last (the file last applied) and next.
func limitsApplied(last, next *config.Server) []string {
	var out []string
	for _, d := range structDiff("limits", last.Limits, next.Limits) {
		if liveLimits[d.field] {
			out = append(out, d.line(quotaApplies))
		}
	}
	for _, d := range quotaDiff(last.Auth.Tenants, next.Auth.Tenants) {
		out = append(out, d.line(quotaApplies))
	}
	return out
}

// quotaDiff compares the tenants' own quotas of two files, by tenant name.
func quotaDiff(a, b []config.Tenant) []settingDiff {
	quotas := map[string]config.Quotas{}
	for _, t := range a {
		quotas[t.Name] = t.Quotas
	}
	var out []settingDiff
	for _, t := range b {
		if q, ok := quotas[t.Name]; ok || t.Quotas != (config.Quotas{}) {
			out = append(out, structDiff(fmt.Sprintf("auth.tenants[%s]", t.Name), q, t.Quotas)...)
		}
	}
	return out
}

// fileDiff names, as file keys, the settings of next that differ from what the edge runs
// with (start) and cannot change while it runs. Tokens, tenants' tokens and quotas, the TLS
// files, the live limits and the endpoints are left out: reload applies them.
func fileDiff(start, next *config.Server) []string {
	var out []string
	add := func(key, why string, a, b any) {
		out = append(out, fmt.Sprintf("%s (%v -> %v): %s; restart the edge to apply it", key, a, b, why))
	}
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
		{"server.admin_port", s.AdminPort, n.AdminPort, listener},
		{"server.region_id", s.RegionID, n.RegionID, "alerts and metrics name the edge with it"},
		{"server.state_dir", s.StateDir, n.StateDir, "the route store stays open where it is"},
		{"server.data_read_buffer", s.DataReadBuffer, n.DataReadBuffer, "data connections are accepted with the value the edge started with"},
		{"tls", start.TLS.Enabled(), next.TLS.Enabled(), "TLS on the control listener is on or off for good (changed files are loaded again while it stays on)"},
		{"auth.require_auth", start.Auth.RequireAuth, next.Auth.RequireAuth, "authentication is on or off for good"},
	} {
		if !reflect.DeepEqual(f.a, f.b) {
			add(f.key, f.why, f.a, f.b)
		}
	}
	if start.Auth.AdminToken != next.Auth.AdminToken {
		out = append(out, "auth.admin_token: the admin API keeps the token it started with; restart the edge to apply it")
	}
	for _, d := range structDiff("limits", start.Limits, next.Limits) {
		if !liveLimits[d.field] {
			out = append(out, d.line("the edge reads it only when it starts; restart the edge to apply it"))
		}
	}
	for _, d := range structDiff("load_balancing", start.LoadBalancing, next.LoadBalancing) {
		out = append(out, d.line("the routing table is built with these; restart the edge to apply it"))
	}
	return append(out, clusterDiff(start.Cluster, next.Cluster)...)
}

// clusterDiff names the [cluster] settings that differ: the edge joined the cluster with
// the ones it started with and keeps them (its NATS connection, lease, links and their TLS
// files) until a restart. The token's values are left out.
func clusterDiff(start, next *config.Cluster) []string {
	const why = "the edge joined the cluster with it; restart the edge to apply it"
	switch {
	case start == nil && next == nil:
		return nil
	case start == nil:
		return []string{"cluster (off -> on): the edge runs alone; restart the edge to join the cluster"}
	case next == nil:
		return []string{"cluster (on -> off): the edge stays in the cluster; restart the edge to run it alone"}
	}
	var out []string
	for _, d := range structDiff("cluster", *start, *next) {
		switch d.field {
		case "token":
			out = append(out, "cluster.token: "+why)
		case "tls": // compared key by key below
		default:
			out = append(out, d.line(why))
		}
	}
	for _, d := range structDiff("cluster.tls", start.TLS, next.TLS) {
		out = append(out, d.line(why))
	}
	return out
}

// settingDiff is one setting that differs between two files.
type settingDiff struct {
	prefix, field string // the table ("limits", "auth.tenants[acme]") and the key in it
	a, b          string // the values, as the file writes them
}

// line is "key (a -> b): why".
func (d settingDiff) line(why string) string {
	return fmt.Sprintf("%s.%s (%s -> %s): %s", d.prefix, d.field, d.a, d.b, why)
}

// structDiff lists the fields of a and b (two values of one struct type of the config
// package) that differ, as file keys under prefix.
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

// tomlKey is the key of a config field: its toml tag, or for a field decoded by hand
// (tag "-") its name in snake case, with _secs for a duration.
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
	case config.PortRange:
		return fmt.Sprintf("[%d, %d]", x.Low, x.High)
	}
	return fmt.Sprint(v)
}

// runCheck is "edge -check": it loads the file as the edge would (the TLS key pair and the
// tokens included) without listening or opening the state directory.
func runCheck(path string, stdout, stderr io.Writer) int {
	cfg, err := config.LoadServer(path)
	if err == nil {
		_, _, err = buildServerConfig(cfg, zap.NewNop())
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	return 0
}

// shutdownCounting is srv.Shutdown(ctx), logging the streams still open as they finish.
func shutdownCounting(ctx context.Context, srv *tunnel.Server, log *zap.Logger) error {
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	count := func() int64 {
		var n int64
		for _, g := range srv.Registry().Groups() {
			for _, m := range g.Members {
				n += m.Active
			}
		}
		return n
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := int64(-1)
	for {
		if n := count(); n != last {
			last = n
			log.Info(fmt.Sprintf("draining: %d %s left", n, plural(n, "stream", "streams")), zap.Int64("streams_left", n))
		}
		select {
		case err := <-done:
			if err == nil && last != 0 {
				log.Info("draining: 0 streams left", zap.Int64("streams_left", 0))
			}
			return err
		case <-tick.C:
		}
	}
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
