package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/boltstore"
)

const (
	acmeToken   = "acme-token-0123456789"
	globexToken = "globex-token-0123456789"
	plainToken  = "plain-token-0123456789" // belongs to no tenant
)

func tenantAuth() Authenticator {
	a, err := NewStaticTokens([]string{plainToken}, map[string]string{"acme": acmeToken, "globex": globexToken})
	if err != nil {
		panic(err) // the tokens above are long enough
	}
	return a
}

// A route belongs to the tenant that first claimed it: another tenant is refused while the
// owner serves it, and also after the owner left, until the claim lapses (RouteTTL with no
// member). Before ownership, a tenant that registered a subdomain first (for example right
// after an edge restart) served the other tenant's users.
func TestRouteBelongsToItsFirstTenant(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(), RouteTTL: time.Hour})
	b, thief := backend(t, "acme"), backend(t, "globex")
	acme := e.connect(WithToken(acmeToken))
	tun, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "acme-key"}, hostPort(b.URL))
	require.NoError(t, err)

	globex := e.connect(WithToken(globexToken))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "globex-key"}, hostPort(thief.URL))
	require.ErrorIs(t, err, ErrOwned)
	require.EqualError(t, err, "tunnel: subdomain 'pool' belongs to another tenant")
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "acme-key"}, hostPort(thief.URL))
	require.ErrorIs(t, err, ErrOwned, "knowing the key does not make another tenant a member")
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool"}, hostPort(thief.URL))
	require.ErrorIs(t, err, ErrOwned, "nor does a solo registration")
	plain := e.connect(WithToken(plainToken))
	_, err = plain.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "acme-key"}, hostPort(thief.URL))
	require.ErrorIs(t, err, ErrOwned, "tokens of no tenant form one tenant of their own")

	require.NoError(t, tun.Shutdown(ctxT(t)))
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("pool") == nil }, 5*time.Second, 5*time.Millisecond)
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "globex-key"}, hostPort(thief.URL))
	require.ErrorIs(t, err, ErrOwned, "the claim outlives the owner's last member")
	code, _ := e.get("pool", "/")
	require.Equal(t, http.StatusNotFound, code)

	// The owner comes back, even with another key (it owns the route, not the key).
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "new-acme-key"}, hostPort(b.URL))
	require.NoError(t, err)
	code, body := e.get("pool", "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "acme /", body)
}

// A claim lapses RouteTTL after the route's last member left; then another tenant may take
// the route.
func TestRouteClaimLapsesAfterTTL(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(), RouteTTL: time.Hour})
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	e.routes.now = func() time.Time { return time.Unix(0, clock.Load()) }
	b := backend(t, "b")
	acme := e.connect(WithToken(acmeToken))
	tun, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, tun.Shutdown(ctxT(t)))
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("pool") == nil }, 5*time.Second, 5*time.Millisecond)

	globex := e.connect(WithToken(globexToken))
	clock.Add(int64(59 * time.Minute))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k2"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "not yet lapsed")
	clock.Add(int64(time.Minute))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k2"}, hostPort(b.URL))
	require.NoError(t, err, "lapsed an hour after the last member left")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "the route is globex's now")
}

// A TCP group name belongs to its first tenant too; its pools keep their ports while the
// claim holds, and a held port is never handed to another tenant.
func TestTCPGroupBelongsToItsTenantAndKeepsItsPort(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(), TCP: TCPTunnels{Ports: group.PortRange{Lo: 44700, Hi: 44709}, BindHost: "127.0.0.1"},
		RouteTTL: time.Hour})
	echo := tcpBackend(t, func(net.Conn) {})
	acme := e.connect(WithToken(acmeToken))
	db, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err)
	port := db.Port()

	globex := e.connect(WithToken(globexToken))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "other"}, echo)
	require.ErrorIs(t, err, ErrOwned)
	require.EqualError(t, err, "tunnel: group 'db' belongs to another tenant")

	require.NoError(t, db.Shutdown(ctxT(t)))
	require.Eventually(t, func() bool { return len(e.registry.Groups()) == 0 }, 5*time.Second, 5*time.Millisecond)
	// The port is free of listeners but held for acme: globex's new pools take every other
	// port of the range, and then there is none.
	for i := 0; ; i++ {
		require.Less(t, i, 10, "the range has 10 ports")
		other, err := globex.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "cache", Group: fmt.Sprintf("cache%d", i), GroupKey: "k"}, echo)
		if err != nil {
			require.ErrorIs(t, err, ErrNoPorts, "acme's port is not handed to globex")
			break
		}
		require.NotEqual(t, port, other.Port())
	}

	again, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err)
	require.Equal(t, port, again.Port(), "the pool gets its port back")
}

// Quotas: per tenant, with defaults in Limits and overrides in TenantLimits.
func TestTenantQuotas(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(),
		TCP:    TCPTunnels{Ports: group.PortRange{Lo: 44710, Hi: 44719}, BindHost: "127.0.0.1"},
		Limits: Limits{Tenant: TenantLimits{MaxSessions: 2, MaxTunnels: 3, MaxTCPPorts: 1}, PerTenant: map[string]TenantLimits{"globex": {MaxTunnels: 1}}},
	})
	b := backend(t, "b")
	echo := tcpBackend(t, func(net.Conn) {})
	acme := e.connect(WithToken(acmeToken))
	for i := range 2 {
		_, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: fmt.Sprintf("a%d", i)}, hostPort(b.URL))
		require.NoError(t, err)
	}
	_, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err)
	acme2 := e.connect(WithToken(acmeToken))
	_, err = acme2.Forward(ctxT(t), TunnelSpec{Subdomain: "a9"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit, "max_tunnels counts over all the tenant's sessions")
	require.ErrorContains(t, err, "max_tunnels")

	_, err = Dial(ctxT(t), e.controlAddr, WithToken(acmeToken), WithReconnect(false))
	require.ErrorIs(t, err, ErrLimit, "a third session")
	require.ErrorContains(t, err, "max_sessions")

	globex := e.connect(WithToken(globexToken))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "g0"}, hostPort(b.URL))
	require.NoError(t, err)
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "g1"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit, "globex's own cap is 1")

	require.NoError(t, acme2.Close())
	require.NoError(t, acme.Close())
	acme3 := e.connect(WithToken(acmeToken))
	_, err = acme3.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "cache", Group: "cache", GroupKey: "k"}, echo)
	require.ErrorIs(t, err, ErrLimit, "db's port is still held for acme: max_tcp_ports 1")
	require.ErrorContains(t, err, "max_tcp_ports")
	_, err = acme3.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err, "its own pool comes back within the quota")
}

// Ownership and ports survive an edge restart with a state directory: the tenant that loops
// on registering another tenant's subdomain right after the restart is refused, and the
// owner's TCP pool gets its port back. Before, the first to register after a restart won.
func TestOwnershipAndPortsSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	cfg := ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(), Store: openBoltStore(t, dir),
		TCP: TCPTunnels{Ports: group.PortRange{Lo: 44720, Hi: 44729}, BindHost: "127.0.0.1"}}
	echo := tcpBackend(t, func(net.Conn) {})
	b := backend(t, "acme")

	first := startEdge(t, cfg)
	acme := first.connect(WithToken(acmeToken), WithReconnect(false))
	_, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)
	db, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err)
	port := db.Port()
	// Move the range's cursor past the port, so a plain next-free choice would differ.
	_, err = acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "other", Group: "other", GroupKey: "k"}, echo)
	require.NoError(t, err)
	require.NoError(t, first.Close(), "the first edge stops (its sessions are cut)")

	cfg.Store = openBoltStore(t, dir) // the first edge closed its store
	second := startEdge(t, cfg)
	globex := second.connect(WithToken(globexToken))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "globex"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned, "the restarted edge remembers who owns pool")
	_, err = globex.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "globex"}, echo)
	require.ErrorIs(t, err, ErrOwned)
	for range 8 { // globex's own pools never get acme's held ports
		g, err := globex.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "x" + newID(), Group: "x" + newID()[:6], GroupKey: "k"}, echo)
		if err != nil {
			require.ErrorIs(t, err, ErrNoPorts)
			break
		}
		require.NotEqual(t, port, g.Port())
	}

	acme2 := second.connect(WithToken(acmeToken))
	again, err := acme2.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err)
	require.Equal(t, port, again.Port(), "the TCP pool has the same public port after the restart")
	_, err = acme2.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)
	code, body := second.get("pool", "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "acme /", body)
}

// openBoltStore opens a file store in dir for an edge, which closes it; the test closes it
// too, at its end, in case no edge did.
func openBoltStore(t *testing.T, dir string) store.Store {
	t.Helper()
	st, err := boltstore.Open(dir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// A cluster keeps its routes in its own store (Cluster.Join returns it): an edge given a
// Store as well is refused, before it joins the cluster.
func TestStoreWithClusterIsRefused(t *testing.T) {
	st := store.NewMemory()
	c := &refusedCluster{t: t}
	_, err := NewServer(ServerConfig{Store: st, Cluster: c})
	require.ErrorContains(t, err, "do not set Store with Cluster")
}

// refusedCluster is a Cluster an edge must refuse before it calls it: Join fails the test
// (and Leave, which follows a failed Join, does nothing); any other method panics (the nil
// interface it embeds).
type refusedCluster struct {
	Cluster
	t *testing.T
}

func (c *refusedCluster) Join(ClusterEdge) (store.Store, error) {
	c.t.Error("the edge joined a cluster though it was given a Store as well")
	return nil, errors.New("refusedCluster: not to be joined")
}

func (c *refusedCluster) Leave(bool) {}

// clientFrom returns an HTTP client whose connections to the edge's public listener come
// from the loopback address local (127.0.0.0/8 holds many).
func clientFrom(e *testEdge, local string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, e.publicAddr)
		},
	}}
}

// A reserved endpoint exists before any connector: 503 (not 404) while it has no member,
// listed with zero members as its tenant's (the operator plane lists it to that tenant
// only: tunnel/admin's TestReservedEndpointIsListedToItsTenant); only its tenant, with its
// group name, may register it; and its policy applies to every public request: deny_cidrs
// (403), a per-client rate (429 with Retry-After).
func TestReservedEndpointAndPolicy(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(),
		Endpoints: []Endpoint{{Subdomain: "pool", Tenant: "acme", Group: "web", Policy: Policy{
			DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
			RateLimit: 1, RateBurst: 3,
		}}}})
	code, body := e.get("pool", "/")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	code, _ = e.get("other", "/")
	require.Equal(t, http.StatusNotFound, code)
	idle := e.Operator().IdleEndpoints()
	require.Len(t, idle, 1)
	require.Equal(t, "pool", idle[0].Info.Label)
	require.Empty(t, idle[0].Info.Members)
	require.Equal(t, "acme", idle[0].Tenant, "listed as acme's: another tenant does not see it")
	require.Empty(t, e.Registry().Groups())

	b := backend(t, "acme")
	globex := e.connect(WithToken(globexToken))
	_, err := globex.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrOwned)
	acme := e.connect(WithToken(acmeToken))
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "other", GroupKey: "k"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrKeyMismatch, "the endpoint's pool is \"web\"")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrInUse, "a solo tunnel cannot take a reserved pool")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err)

	denied := clientFrom(e, "127.0.0.2")
	resp, err := denied.Get("http://pool." + testDomain + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	// The 503 above spent one token of 127.0.0.1's burst of 3.
	allowed := clientFrom(e, "127.0.0.1")
	var codes []int
	var retry string
	for range 4 {
		resp, err := allowed.Get("http://pool." + testDomain + "/")
		require.NoError(t, err)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		retry = resp.Header.Get("Retry-After")
	}
	require.Equal(t, []int{200, 200, 429, 429}, codes)
	require.Equal(t, "1", retry)
	resp, err = clientFrom(e, "127.0.0.3").Get("http://pool." + testDomain + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "each client IP has its own rate")
}

// A reserved TCP endpoint keeps its configured port for its tenant and key, and its policy
// closes connections from denied clients before they reach a member.
func TestReservedTCPEndpointPortAndPolicy(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(),
		TCP: TCPTunnels{Ports: group.PortRange{Lo: 44730, Hi: 44739}, BindHost: "127.0.0.1"},
		Endpoints: []Endpoint{{Proto: ProtoTCP, Group: "db", Port: 44735, Tenant: "acme", KeyHash: group.HashKey("db-key"),
			Policy: Policy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}}}})
	banner := tcpBackend(t, func(c net.Conn) { _, _ = c.Write([]byte("db\n")) })
	acme := e.connect(WithToken(acmeToken))
	db, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "db-key"}, banner)
	require.NoError(t, err)
	require.Equal(t, 44735, db.Port())

	read := func(local string) (string, error) {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		c, err := d.Dial("tcp", "127.0.0.1:44735")
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 3)
		n, err := io.ReadFull(c, b)
		return string(b[:n]), err
	}
	got, err := read("127.0.0.1")
	require.NoError(t, err)
	require.Equal(t, "db\n", got)
	got, err = read("127.0.0.2")
	require.Error(t, err, "a denied client is closed before any byte")
	require.Empty(t, got)
}
