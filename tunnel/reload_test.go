package tunnel

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
)

// liveTokens is an Authenticator whose tokens can be replaced while the edge runs, the way
// examples/edge reloads them.
type liveTokens struct{ cur atomic.Pointer[StaticTokens] }

func (l *liveTokens) Authenticate(ctx context.Context, token string) (string, error) {
	return l.cur.Load().Authenticate(ctx, token)
}

func (l *liveTokens) set(t *testing.T, tokens []string, tenants map[string]string) {
	t.Helper()
	st, err := NewStaticTokens(tokens, tenants)
	require.NoError(t, err)
	l.cur.Store(st)
}

const (
	reloadAcmeToken   = "acme-token-0123456789"
	reloadGlobexToken = "globex-token-0123456789"
	reloadPlainToken  = "plain-token-0123456789"
)

// notApplied returns the lines of the changes Reload did not apply.
func notApplied(changes []ReloadChange) []string {
	var out []string
	for _, c := range changes {
		if !c.Applied {
			out = append(out, c.String())
		}
	}
	return out
}

func tenantEdge(t *testing.T) (*testEdge, *liveTokens, ServerConfig) {
	auth := &liveTokens{}
	auth.set(t, []string{reloadPlainToken}, map[string]string{"acme": reloadAcmeToken, "globex": reloadGlobexToken})
	cfg := ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true}}
	e := startEdge(t, cfg)
	return e, auth, e.cfg // the configuration in force, defaults applied
}

// TestReloadKeepsConnectors: reloads that change limits, endpoints and settings that cannot
// change live leave every session and tunnel as it was, and report only the latter, with
// their old and new values.
func TestReloadKeepsConnectors(t *testing.T) {
	e, _, cfg := tenantEdge(t)
	b := backend(t, "a")
	s := e.connect(WithToken(reloadPlainToken))
	tun, err := s.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	id := tun.ID()

	next := cfg
	next.Limits.Tenant = TenantLimits{MaxTunnels: 3}
	next.Limits.MaxTunnelsPerSession = 4
	next.Endpoints = []Endpoint{{Subdomain: "shop", Tenant: "acme", Group: "web",
		Policy: Policy{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}}
	next.Domain = "other.test"
	next.Timeouts.Drain = time.Minute
	changes, err := e.Reload(next)
	require.NoError(t, err)
	require.Equal(t, []ReloadChange{
		{Setting: "Domain", From: "warren.test", To: "other.test", Reason: "cannot change while the edge runs; a restart applies it"},
		{Setting: "Timeouts.Drain", From: 30 * time.Second, To: time.Minute, Reason: "cannot change while the edge runs; a restart applies it"},
		{Setting: "Limits.MaxTunnelsPerSession", From: 16, To: 4, Applied: true},
		{Setting: "Limits.Tenant.MaxTunnels", From: 0, To: 3, Applied: true},
		{Setting: "Endpoints[http/shop]", To: next.Endpoints[0], Applied: true},
	}, changes)
	require.Equal(t, []string{
		`Domain ("warren.test" -> "other.test"): cannot change while the edge runs; a restart applies it`,
		"Timeouts.Drain (30s -> 1m0s): cannot change while the edge runs; a restart applies it",
	}, notApplied(changes))
	require.Equal(t, 4, e.limits.Load().perSession, "the limits are live")
	require.True(t, e.routes.reserved("shop"), "the endpoint is live")

	changes, err = e.Reload(cfg)
	require.NoError(t, err)
	require.Equal(t, []ReloadChange{
		{Setting: "Limits.MaxTunnelsPerSession", From: 4, To: 16, Applied: true},
		{Setting: "Limits.Tenant.MaxTunnels", From: 3, To: 0, Applied: true},
		{Setting: "Endpoints[http/shop]", From: next.Endpoints[0], Applied: true},
	}, changes, "the configuration the edge started with: what the previous reload applied is undone, nothing else changes")
	require.Equal(t, 16, e.limits.Load().perSession)
	require.False(t, e.routes.reserved("shop"))

	require.Equal(t, id, tun.ID(), "the tunnel was not registered again")
	select {
	case <-s.Done():
		t.Fatal("the session ended")
	case <-tun.Done():
		t.Fatal("the tunnel ended")
	default:
	}
	status, body := e.get("app", "/x")
	require.Equal(t, 200, status)
	require.Equal(t, "a /x", body)
	require.Len(t, e.Registry().Groups(), 1)

	next = cfg
	next.Auth = nil
	next.Alerts.WebhookURL = "https://alerts.example.com/hook?secret=s3cret"
	changes, err = e.Reload(next)
	require.NoError(t, err)
	require.Equal(t, []string{
		"Auth: cannot change while the edge runs; a restart applies it",
		"Alerts.WebhookURL: cannot change while the edge runs; a restart applies it",
	}, notApplied(changes), "no value of a setting that is not plain, nor of a secret")
}

// TestReloadTenantQuota: lowering a tenant's max_tunnels refuses its next registration as
// the quota always does, while the tunnels it has keep serving; raising it lets the tenant
// register again. Other tenants keep the default.
func TestReloadTenantQuota(t *testing.T) {
	e, _, cfg := tenantEdge(t)
	b := backend(t, "a")
	acme := e.connect(WithToken(reloadAcmeToken))
	globex := e.connect(WithToken(reloadGlobexToken))
	var tuns []*Tunnel
	for _, sub := range []string{"a1", "a2"} {
		tun, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: sub}, hostPort(b.URL))
		require.NoError(t, err)
		tuns = append(tuns, tun)
	}

	lower := cfg
	lower.Limits.Tenant = TenantLimits{MaxTunnels: 5}
	lower.Limits.PerTenant = map[string]TenantLimits{"acme": {MaxTunnels: 1}}
	changes, err := e.Reload(lower)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))

	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "a3"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorContains(t, err, "this tenant already has 1 tunnels (max_tunnels)")
	for _, sub := range []string{"a1", "a2"} {
		status, body := e.get(sub, "/")
		require.Equal(t, 200, status, "%s keeps serving over its tenant's new quota", sub)
		require.Equal(t, "a /", body)
	}
	for _, tun := range tuns {
		select {
		case <-tun.Done():
			t.Fatal("a tunnel over the new quota was ended")
		default:
		}
	}
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "g1"}, hostPort(b.URL))
	require.NoError(t, err, "another tenant has the default quota")

	raise := lower
	raise.Limits.PerTenant = map[string]TenantLimits{"acme": {MaxTunnels: 3}}
	changes, err = e.Reload(raise)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "a3"}, hostPort(b.URL))
	require.NoError(t, err, "the raised quota admits one more")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "a4"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit, "and no more")

	// The per-session cap and the session quota are live too.
	perSession := raise
	perSession.Limits.PerTenant = nil
	perSession.Limits.MaxTunnelsPerSession = 1
	perSession.Limits.Tenant.MaxSessions = 1
	changes, err = e.Reload(perSession)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "g2"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorContains(t, err, "max_tunnels_per_session")
	_, err = Dial(ctxT(t), e.controlAddr, WithToken(reloadAcmeToken), WithReconnect(false))
	require.ErrorIs(t, err, ErrLimit, "acme has a session: max_sessions is 1 now")
	require.Nil(t, acme.Err(), "the session it has stays")
	status, _ := e.get("a3", "/")
	require.Equal(t, 200, status)
}

// TestReloadRemovedTokenStopsNewLogins: with a live Authenticator (as examples/edge has),
// a token removed at a reload refuses new logins while the session that used it stays.
func TestReloadRemovedTokenStopsNewLogins(t *testing.T) {
	e, auth, cfg := tenantEdge(t)
	b := backend(t, "a")
	s := e.connect(WithToken(reloadPlainToken))
	_, err := s.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken})
	changes, err := e.Reload(cfg)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))

	_, err = Dial(ctxT(t), e.controlAddr, WithToken(reloadPlainToken), WithReconnect(false))
	require.ErrorIs(t, err, ErrUnauthorized, "the removed token logs in no more")
	s2, err := Dial(ctxT(t), e.controlAddr, WithToken(reloadAcmeToken))
	require.NoError(t, err, "a kept token still does")
	require.NoError(t, s2.Close())

	status, _ := e.get("app", "/")
	require.Equal(t, 200, status, "the connector that logged in with the removed token stays")
	require.Nil(t, s.Err())
}

// requireListedEndpoints checks what the operator plane lists to tenant (its GET /api/groups):
// the routes with a live group holding one of its members, and its reserved endpoints with
// no group (Operator.IdleEndpoints), each with zero members; want are their labels.
func requireListedEndpoints(t *testing.T, e *testEdge, tenant string, want ...string) {
	t.Helper()
	var got []string
	for _, g := range e.Registry().Groups() {
		if slices.ContainsFunc(g.Members, func(m group.MemberInfo) bool { return m.Tenant == tenant }) {
			got = append(got, g.Label)
		}
	}
	for _, ep := range e.Operator().IdleEndpoints() {
		if ep.Tenant == tenant {
			require.Empty(t, ep.Info.Members)
			got = append(got, ep.Info.Label)
		}
	}
	require.ElementsMatch(t, want, got)
}

// TestReloadEndpoint: an endpoint added by a reload reserves its route for its tenant at
// once, answers 503 while empty and is listed by the admin API at once; one that conflicts
// with a live route of another tenant is not applied and says why; an invalid one changes
// nothing; one removed is an ordinary route again: 404 when empty, unlisted, and another
// tenant's once its claim lapses.
func TestReloadEndpoint(t *testing.T) {
	auth := &liveTokens{}
	auth.set(t, []string{reloadPlainToken}, map[string]string{"acme": reloadAcmeToken, "globex": reloadGlobexToken})
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true}, RouteTTL: 300 * time.Millisecond})
	cfg := e.cfg
	b := backend(t, "shop")
	globex := e.connect(WithToken(reloadGlobexToken))
	acme := e.connect(WithToken(reloadAcmeToken))

	// globex could take "shop" before the reload; it takes "taken" and keeps it.
	_, err := globex.Forward(ctxT(t), TunnelSpec{Subdomain: "taken"}, hostPort(b.URL))
	require.NoError(t, err)
	status, _ := e.get("shop", "/")
	require.Equal(t, http.StatusNotFound, status)

	next := cfg
	next.Endpoints = []Endpoint{
		{Subdomain: "shop", Tenant: "acme", Group: "web"},
		{Subdomain: "taken", Tenant: "acme", Group: "web"},
	}
	changes, err := e.Reload(next)
	require.NoError(t, err)
	require.Equal(t, []string{"Endpoints[http/taken]: its route has members of another pool (name or key); it is not reserved"}, notApplied(changes))
	r, err := e.routes.st.Get(t.Context(), "http/taken")
	require.NoError(t, err)
	require.Equal(t, "globex", r.Tenant, "the live route keeps its owner")
	require.False(t, r.Reserved)
	status, _ = e.get("taken", "/")
	require.Equal(t, http.StatusOK, status)

	status, body := e.get("shop", "/")
	require.Equal(t, http.StatusServiceUnavailable, status, "an empty endpoint added by a reload: %s", body)
	requireListedEndpoints(t, e, "acme", "shop")

	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "another tenant cannot take a reserved route")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "shop"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrInUse, "the endpoint takes only its pool")
	tun, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err, "its tenant's pool registers")
	status, body = e.get("shop", "/")
	require.Equal(t, 200, status)
	require.Equal(t, "shop /", body)

	// Invalid: nothing is applied.
	bad := cfg
	bad.Endpoints = []Endpoint{{Subdomain: "x", Tenant: "acme"}}
	bad.Limits.Tenant.MaxTunnels = 1
	_, err = e.Reload(bad)
	require.ErrorContains(t, err, "Endpoints[0].Group: required: the pool's name")
	require.Zero(t, e.limits.Load().def.MaxTunnels, "an invalid configuration applies nothing")
	bad.Endpoints = []Endpoint{{Subdomain: "x", Group: "a"}, {Subdomain: "x", Group: "b"}}
	_, err = e.Reload(bad)
	require.ErrorContains(t, err, "Endpoints[1]: reserves the route http/x, as Endpoints[0] does")

	// A TCP endpoint outside the edge's range is refused as NewServer refuses it.
	bad.Endpoints = []Endpoint{{Proto: ProtoTCP, Group: "db", Port: 1, KeyHash: group.HashKey("k"), Tenant: "acme"}}
	_, err = e.Reload(bad)
	require.ErrorContains(t, err, "outside the TCP port range")
	require.True(t, e.routes.reserved("shop"))

	// Removed: an ordinary claim of acme from now on, which its live pool holds.
	changes, err = e.Reload(cfg)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	r, err = e.routes.st.Get(t.Context(), "http/shop")
	require.NoError(t, err)
	require.False(t, r.Reserved)
	require.Equal(t, "acme", r.Tenant)
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "acme's claim holds while its pool lives")

	require.NoError(t, tun.Shutdown(ctxT(t)))
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("shop") == nil }, 5*time.Second, 5*time.Millisecond)
	status, _ = e.get("shop", "/")
	require.Equal(t, http.StatusNotFound, status, "an empty route that is no endpoint any more")
	requireListedEndpoints(t, e, "acme") // nor listed
	require.Eventually(t, func() bool {
		_, err := globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "g"}, hostPort(b.URL))
		return err == nil
	}, 5*time.Second, 50*time.Millisecond, "another tenant claims the route once acme's claim lapsed")
	r, err = e.routes.st.Get(t.Context(), "http/shop")
	require.NoError(t, err)
	require.Equal(t, "globex", r.Tenant)
}

// TestReloadRemovedEmptyEndpoint: an endpoint that never had a member, removed by a reload,
// answers 404 and is not listed at once; its route is another tenant's once the claim its
// removal left lapses.
func TestReloadRemovedEmptyEndpoint(t *testing.T) {
	auth := &liveTokens{}
	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken, "globex": reloadGlobexToken})
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true}, RouteTTL: 300 * time.Millisecond,
		Endpoints: []Endpoint{{Subdomain: "shop", Tenant: "acme", Group: "web"}}})
	cfg := e.cfg
	b := backend(t, "globex")
	globex := e.connect(WithToken(reloadGlobexToken))
	status, _ := e.get("shop", "/")
	require.Equal(t, http.StatusServiceUnavailable, status)
	_, err := globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned)

	next := cfg
	next.Endpoints = nil
	changes, err := e.Reload(next)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	status, _ = e.get("shop", "/")
	require.Equal(t, http.StatusNotFound, status)
	requireListedEndpoints(t, e, "acme")
	require.Eventually(t, func() bool {
		_, err := globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop"}, hostPort(b.URL))
		return err == nil
	}, 5*time.Second, 50*time.Millisecond, "the route is claimable once the claim lapsed")
	status, body := e.get("shop", "/")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "globex /", body)
}

// policyEdge starts an edge with acme's endpoint "shop" under policy p, with a member.
func policyEdge(t *testing.T, p Policy) (*testEdge, ServerConfig) {
	auth := &liveTokens{}
	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken})
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true},
		Endpoints: []Endpoint{{Subdomain: "shop", Tenant: "acme", Group: "web", Policy: p}}})
	b := backend(t, "shop")
	acme := e.connect(WithToken(reloadAcmeToken))
	_, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)
	return e, e.cfg
}

// withPolicy is cfg with its one endpoint under policy p.
func withPolicy(cfg ServerConfig, p Policy) ServerConfig {
	ep := cfg.Endpoints[0]
	ep.Policy = p
	cfg.Endpoints = []Endpoint{ep}
	return cfg
}

// TestReloadEndpointCIDRs: an endpoint's allow_cidrs changed by a reload decide the next
// public request: from loopback allowed (200) to denied (403), and back.
func TestReloadEndpointCIDRs(t *testing.T) {
	loopback := Policy{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	e, cfg := policyEdge(t, loopback)
	status, _ := e.get("shop", "/")
	require.Equal(t, http.StatusOK, status)

	changes, err := e.Reload(withPolicy(cfg, Policy{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}))
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	status, body := e.get("shop", "/")
	require.Equal(t, http.StatusForbidden, status, body)

	changes, err = e.Reload(withPolicy(cfg, loopback))
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	status, _ = e.get("shop", "/")
	require.Equal(t, http.StatusOK, status)

	changes, err = e.Reload(withPolicy(cfg, Policy{}))
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	require.Nil(t, e.routes.httpGate("shop"), "a policy that restricts nothing has no gate")
	status, _ = e.get("shop", "/")
	require.Equal(t, http.StatusOK, status)
}

// TestReloadEndpointRateLimit: a rate limit added by a reload applies to the next requests;
// a reload that leaves it as it is keeps the clients' buckets; one that changes it starts
// them anew.
func TestReloadEndpointRateLimit(t *testing.T) {
	e, cfg := policyEdge(t, Policy{})
	for range 5 {
		status, _ := e.get("shop", "/")
		require.Equal(t, http.StatusOK, status, "no rate limit yet")
	}

	limited := Policy{RateLimit: 0.001, RateBurst: 2}
	changes, err := e.Reload(withPolicy(cfg, limited))
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	gate := e.routes.httpGate("shop")
	require.NotNil(t, gate)
	var codes []int
	for range 3 {
		status, _ := e.get("shop", "/")
		codes = append(codes, status)
	}
	require.Equal(t, []int{200, 200, 429}, codes)

	// The same policy again (and a token change elsewhere): the bucket is still empty.
	_, err = e.Reload(withPolicy(cfg, limited))
	require.NoError(t, err)
	require.Same(t, gate, e.routes.httpGate("shop"), "an unchanged policy keeps its gate")
	status, _ := e.get("shop", "/")
	require.Equal(t, http.StatusTooManyRequests, status)

	_, err = e.Reload(withPolicy(cfg, Policy{RateLimit: 0.001, RateBurst: 1}))
	require.NoError(t, err)
	require.NotSame(t, gate, e.routes.httpGate("shop"), "a changed policy gets a new gate")
	codes = codes[:0]
	for range 2 {
		status, _ := e.get("shop", "/")
		codes = append(codes, status)
	}
	require.Equal(t, []int{200, 429}, codes)
}

// TestReloadEndpointConcurrency: an unchanged max_concurrent keeps counting the requests in
// flight through a reload that changes another endpoint.
func TestReloadEndpointConcurrency(t *testing.T) {
	auth := &liveTokens{}
	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken})
	p := Policy{MaxConcurrent: 1}
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true},
		Endpoints: []Endpoint{{Subdomain: "slow", Tenant: "acme", Group: "web", Policy: p}}})
	cfg := e.cfg
	started, release := make(chan struct{}, 2), make(chan struct{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		started <- struct{}{}
		<-release
	}))
	t.Cleanup(b.Close)
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before b.Close, if the test fails first
	acme := e.connect(WithToken(reloadAcmeToken))
	_, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "slow", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)

	done := make(chan int, 1)
	go func() {
		resp, err := e.client.Get(e.url("slow", "/"))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-started

	next := cfg
	next.Endpoints = append(slices.Clone(cfg.Endpoints), Endpoint{Subdomain: "other", Tenant: "acme", Group: "web",
		Policy: Policy{MaxConcurrent: 5}})
	changes, err := e.Reload(next)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	probe := publicClient(e.publicAddr)
	probe.Timeout = 3 * time.Second // a request let through would wait for release
	resp, err := probe.Get(e.url("slow", "/"))
	require.NoError(t, err, "the request in flight still counts: a second one is refused at once")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	probe.CloseIdleConnections()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), "limit of 1 concurrent requests")
	unblock()
	require.Equal(t, http.StatusOK, <-done)
}

// TestReloadTCPEndpointPolicy: a TCP endpoint's policy changed by a reload applies to the
// next connection.
func TestReloadTCPEndpointPolicy(t *testing.T) {
	auth := &liveTokens{}
	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken})
	ep := Endpoint{Proto: ProtoTCP, Group: "db", Port: 44765, Tenant: "acme", KeyHash: group.HashKey("db-key")}
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true},
		TCP: TCPTunnels{Ports: group.PortRange{Lo: 44760, Hi: 44769}, BindHost: "127.0.0.1"}, Endpoints: []Endpoint{ep}})
	cfg := e.cfg
	banner := tcpBackend(t, func(c net.Conn) { _, _ = c.Write([]byte("db\n")) })
	acme := e.connect(WithToken(reloadAcmeToken))
	_, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "db-key"}, banner)
	require.NoError(t, err)
	read := func() (string, error) {
		c, err := net.DialTimeout("tcp", "127.0.0.1:44765", 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 3)
		n, err := io.ReadFull(c, b)
		return string(b[:n]), err
	}
	got, err := read()
	require.NoError(t, err)
	require.Equal(t, "db\n", got)

	changes, err := e.Reload(withPolicy(cfg, Policy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}))
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	got, err = read()
	require.Error(t, err, "a denied client is closed before any byte")
	require.Empty(t, got)

	changes, err = e.Reload(cfg)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	got, err = read()
	require.NoError(t, err)
	require.Equal(t, "db\n", got)
}

// TestReloadRace: reloads that flip a policy and the limits while requests and
// registrations run (for the race detector); every request gets one of the two policies'
// answers.
func TestReloadRace(t *testing.T) {
	allow := Policy{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	deny := Policy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, MaxConcurrent: 100}
	e, cfg := policyEdge(t, allow)
	b := backend(t, "x")
	acme := e.connect(WithToken(reloadAcmeToken))
	ctx := ctxT(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p, next := allow, cfg
			if i%2 == 1 {
				p = deny
				next.Limits.Tenant.MaxTunnels = 1 + i%3
			}
			_, err := e.Reload(withPolicy(next, p))
			assert.NoError(t, err)
			time.Sleep(time.Millisecond)
		}
	})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tun, err := acme.Forward(ctx, TunnelSpec{Subdomain: fmt.Sprintf("r%d", i%4)}, hostPort(b.URL))
			if err == nil {
				_ = tun.Close()
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	for range 50 {
		status, _ := e.get("shop", "/")
		require.Contains(t, []int{http.StatusOK, http.StatusForbidden}, status)
	}
	close(stop)
	wg.Wait()
}

// TestReloadStartEndpoint: an endpoint the edge started with, released by a reload, is an
// ordinary route at once; after Close a reload is refused.
func TestReloadStartEndpoint(t *testing.T) {
	auth := &liveTokens{}
	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken})
	ep := Endpoint{Subdomain: "shop", Tenant: "acme", Group: "web",
		Policy: Policy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: LoadBalancing{Enabled: true}, Endpoints: []Endpoint{ep}})
	cfg := e.cfg
	status, _ := e.get("shop", "/")
	require.Equal(t, http.StatusForbidden, status)

	next := cfg
	next.Endpoints = nil
	changes, err := e.Reload(next)
	require.NoError(t, err)
	require.Empty(t, notApplied(changes))
	status, _ = e.get("shop", "/")
	require.Equal(t, http.StatusNotFound, status, "no policy, no 503: an ordinary route")
	r, err := e.routes.st.Get(t.Context(), "http/shop")
	require.NoError(t, err)
	require.False(t, r.Reserved, "an ordinary claim of acme from now on")
	require.Equal(t, "acme", r.Tenant)

	require.NoError(t, e.Close())
	_, err = e.Reload(cfg)
	require.ErrorIs(t, err, ErrServerClosed)
}
