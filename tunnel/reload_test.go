package tunnel

import (
	"context"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

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

func tenantEdge(t *testing.T) (*testEdge, *liveTokens, ServerConfig) {
	auth := &liveTokens{}
	auth.set(t, []string{reloadPlainToken}, map[string]string{"acme": reloadAcmeToken, "globex": reloadGlobexToken})
	cfg := ServerConfig{Auth: auth, LoadBalancing: true}
	e := startEdge(t, cfg)
	return e, auth, e.cfg // the configuration in force, defaults applied
}

// TestReloadKeepsConnectors: a reload leaves every session and tunnel as it was, and
// reports the settings it cannot change.
func TestReloadKeepsConnectors(t *testing.T) {
	e, _, cfg := tenantEdge(t)
	b := backend(t, "a")
	s := e.connect(WithToken(reloadPlainToken))
	tun, err := s.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	id := tun.ID()

	next := cfg
	next.Limits = TenantLimits{MaxTunnels: 3}
	next.MaxTunnelsPerSession = 4
	notApplied, err := e.Reload(next)
	require.NoError(t, err)
	require.Len(t, notApplied, 2, "%q", notApplied)
	require.Contains(t, notApplied[0], "MaxTunnelsPerSession: cannot change while the edge runs")
	require.Contains(t, notApplied[1], "Limits: cannot change while the edge runs")

	notApplied, err = e.Reload(cfg)
	require.NoError(t, err)
	require.Empty(t, notApplied, "the same configuration changes nothing")

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

	next = cfg
	next.Auth = nil
	notApplied, err = e.Reload(next)
	require.NoError(t, err)
	require.Equal(t, []string{"Auth: cannot change while the edge runs; a restart applies it"}, notApplied)
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
	notApplied, err := e.Reload(cfg)
	require.NoError(t, err)
	require.Empty(t, notApplied)

	_, err = Dial(ctxT(t), e.controlAddr, WithToken(reloadPlainToken), WithReconnect(false))
	require.ErrorIs(t, err, ErrUnauthorized, "the removed token logs in no more")
	s2, err := Dial(ctxT(t), e.controlAddr, WithToken(reloadAcmeToken))
	require.NoError(t, err, "a kept token still does")
	require.NoError(t, s2.Close())

	status, _ := e.get("app", "/")
	require.Equal(t, 200, status, "the connector that logged in with the removed token stays")
	require.Nil(t, s.Err())
}

// TestReloadEndpoint: an endpoint added by a reload reserves its route for its tenant at
// once; one removed becomes an ordinary claim; one that conflicts with a live route of
// another tenant is not applied and says why; an invalid one changes nothing.
func TestReloadEndpoint(t *testing.T) {
	e, _, cfg := tenantEdge(t)
	b := backend(t, "shop")
	globex := e.connect(WithToken(reloadGlobexToken))
	acme := e.connect(WithToken(reloadAcmeToken))

	// globex could take "shop" before the reload; it takes "taken" and keeps it.
	_, err := globex.Forward(ctxT(t), TunnelSpec{Subdomain: "taken"}, hostPort(b.URL))
	require.NoError(t, err)

	next := cfg
	next.Endpoints = []Endpoint{
		{Subdomain: "shop", Tenant: "acme", Group: "web"},
		{Subdomain: "taken", Tenant: "acme", Group: "web"},
	}
	notApplied, err := e.Reload(next)
	require.NoError(t, err)
	require.Len(t, notApplied, 2, "%q", notApplied)
	require.Contains(t, notApplied[0], "endpoint http/shop: reserved; until a restart its route answers 404")
	require.Equal(t, "endpoint http/taken: its route has members of another pool (name or key); it is not reserved", notApplied[1])
	r, err := e.routes.st.Get("http/taken")
	require.NoError(t, err)
	require.Equal(t, "globex", r.Tenant, "the live route keeps its owner")
	require.False(t, r.Reserved)

	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "another tenant cannot take a reserved route")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "shop"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrInUse, "the endpoint takes only its pool")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err, "its tenant's pool registers")
	status, body := e.get("shop", "/")
	require.Equal(t, 200, status)
	require.Equal(t, "shop /", body)

	// Invalid: nothing is applied.
	bad := cfg
	bad.Endpoints = []Endpoint{{Subdomain: "x", Tenant: "acme"}}
	_, err = e.Reload(bad)
	require.ErrorContains(t, err, "a group name is required")
	bad.Endpoints = []Endpoint{{Subdomain: "x", Group: "a"}, {Subdomain: "x", Group: "b"}}
	_, err = e.Reload(bad)
	require.ErrorContains(t, err, "two endpoints reserve the route http/x")

	// A TCP endpoint outside the edge's range is refused as NewServer refuses it.
	bad.Endpoints = []Endpoint{{Proto: ProtoTCP, Group: "db", Port: 1, KeyHash: group.HashKey("k"), Tenant: "acme"}}
	_, err = e.Reload(bad)
	require.ErrorContains(t, err, "outside the TCP port range")

	// Removed: an ordinary claim of acme from now on, which its live pool holds.
	notApplied, err = e.Reload(cfg)
	require.NoError(t, err)
	require.Empty(t, notApplied)
	r, err = e.routes.st.Get("http/shop")
	require.NoError(t, err)
	require.False(t, r.Reserved)
	require.Equal(t, "acme", r.Tenant)
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "acme's claim holds while its pool lives")
}

// TestReloadStartEndpoint: the policy of an endpoint the edge started with is not changed
// by a reload, and releasing it says what stays until a restart.
func TestReloadStartEndpoint(t *testing.T) {
	auth := &liveTokens{}
	auth.set(t, nil, map[string]string{"acme": reloadAcmeToken})
	ep := Endpoint{Subdomain: "shop", Tenant: "acme", Group: "web"}
	e := startEdge(t, ServerConfig{Auth: auth, LoadBalancing: true, Endpoints: []Endpoint{ep}})
	cfg := e.cfg

	next := cfg
	ep.Policy.DenyCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	next.Endpoints = []Endpoint{ep}
	notApplied, err := e.Reload(next)
	require.NoError(t, err)
	require.Equal(t, []string{"endpoint http/shop: its policy change applies after a restart"}, notApplied)

	next.Endpoints = nil
	notApplied, err = e.Reload(next)
	require.NoError(t, err)
	require.Len(t, notApplied, 1)
	require.True(t, strings.HasPrefix(notApplied[0], "endpoint http/shop: released; until a restart its route answers 503"), notApplied[0])
	r, err := e.routes.st.Get("http/shop")
	require.NoError(t, err)
	require.False(t, r.Reserved, "an ordinary claim of acme from now on")
	require.Equal(t, "acme", r.Tenant)

	require.NoError(t, e.Close())
	_, err = e.Reload(cfg)
	require.ErrorIs(t, err, ErrServerClosed)
}
