package tunnel

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// Solo TCP tunnels take public ports like pools do, and count in max_tcp_ports with them:
// with max_tcp_ports 3 a tenant holds 3 ports whatever mix of solo tunnels and pools it
// registers, and the next is refused while another tenant still gets its ports. Before, solo
// TCP tunnels were counted nowhere (a tenant held 10 ports with max_tcp_ports 3, and could
// empty the range for everyone).
func TestSoloTCPTunnelsCountInMaxTCPPorts(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(),
		TCP:    TCPTunnels{Ports: group.PortRange{Lo: 44800, Hi: 44809}, BindHost: "127.0.0.1"},
		Limits: Limits{Tenant: TenantLimits{MaxTCPPorts: 3}}})
	echo := tcpBackend(t, func(net.Conn) {})
	acme := e.connect(WithToken(acmeToken))
	var solos []*Tunnel
	for i := range 2 {
		tun, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: fmt.Sprintf("solo%d", i)}, echo)
		require.NoError(t, err)
		solos = append(solos, tun)
	}
	_, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: "k"}, echo)
	require.NoError(t, err, "a pool's port is the third")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "solo9"}, echo)
	require.ErrorIs(t, err, ErrLimit, "a fourth port, for a solo tunnel")
	require.ErrorContains(t, err, "max_tcp_ports")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "cache", Group: "cache", GroupKey: "k"}, echo)
	require.ErrorIs(t, err, ErrLimit, "a fourth port, for a pool")

	globex := e.connect(WithToken(globexToken))
	for i := range 3 {
		_, err := globex.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: fmt.Sprintf("g%d", i)}, echo)
		require.NoError(t, err, "another tenant has its own 3")
	}

	// A solo tunnel that leaves gives its port back.
	require.NoError(t, solos[0].Close())
	require.Eventually(t, func() bool {
		_, err := acme.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "solo9"}, echo)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
}

// A tenant holds at most max_routes routes (subdomains and TCP pool names), with members or
// lingering after their last member left: a tenant that registers and closes tunnel after
// tunnel on new names is refused once it holds max_routes of them, its own routes still come
// back, and reserved endpoints are not counted. The operator sees the claims (Routes) and
// releases one (ReleaseRoute), which frees a place in the quota and gives the name to anyone.
// Before, claims counted in no quota, were listed nowhere, and held for route_ttl_secs.
func TestMaxRoutesAndTheOperatorsRouteList(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(), RouteTTL: time.Hour,
		Limits:    Limits{Tenant: TenantLimits{MaxRoutes: 3}},
		Endpoints: []Endpoint{{Subdomain: "shop", Group: "web", Tenant: "acme"}}})
	b := backend(t, "b")
	acme := e.connect(WithToken(acmeToken))
	for i := range 3 {
		tun, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: fmt.Sprintf("r%d", i)}, hostPort(b.URL))
		require.NoError(t, err)
		require.NoError(t, tun.Close()) // the claim stays for RouteTTL
	}
	// Closing is asynchronous at the edge: the members leave a moment later.
	require.Eventually(t, func() bool {
		return e.registry.LookupHTTP("r0") == nil && e.registry.LookupHTTP("r1") == nil && e.registry.LookupHTTP("r2") == nil
	}, 5*time.Second, 5*time.Millisecond)
	_, err := acme.Forward(ctxT(t), TunnelSpec{Subdomain: "r3"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorContains(t, err, "this tenant already holds 3 routes (max_routes)")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "r1"}, hostPort(b.URL))
	require.NoError(t, err, "a route it holds comes back within the quota")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "shop", Group: "web", GroupKey: "k"}, hostPort(b.URL))
	require.NoError(t, err, "a reserved endpoint is the operator's: not counted")
	globex := e.connect(WithToken(globexToken))
	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "g0"}, hostPort(b.URL))
	require.NoError(t, err, "another tenant has its own quota")

	claims, err := e.Operator().Routes(context.Background())
	require.NoError(t, err)
	type row struct {
		key, tenant    string
		live, reserved bool
		lapses         bool
	}
	var rows []row
	for _, c := range claims {
		rows = append(rows, row{store.Key(c.Kind, c.Label), c.Tenant, c.Live, c.Reserved, !c.Expires.IsZero()})
	}
	require.Equal(t, []row{
		{"http/g0", "globex", true, false, false},
		{"http/r0", "acme", false, false, true},
		{"http/r1", "acme", true, false, false},
		{"http/r2", "acme", false, false, true},
		{"http/shop", "acme", true, true, false},
	}, rows)

	_, err = e.Operator().ReleaseRoute(store.KindHTTP, "r1")
	require.ErrorIs(t, err, ErrRouteLive)
	_, err = e.Operator().ReleaseRoute(store.KindHTTP, "shop")
	require.ErrorIs(t, err, ErrRouteReserved)
	_, err = e.Operator().ReleaseRoute(store.KindHTTP, "nobody")
	require.ErrorIs(t, err, ErrNoRoute)
	released, err := e.Operator().ReleaseRoute(store.KindHTTP, "r0")
	require.NoError(t, err)
	require.Equal(t, "acme", released.Tenant)

	_, err = globex.Forward(ctxT(t), TunnelSpec{Subdomain: "r0"}, hostPort(b.URL))
	require.NoError(t, err, "a released route is anyone's")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "r3"}, hostPort(b.URL))
	require.NoError(t, err, "the release freed a place in acme's quota")
	_, err = acme.Forward(ctxT(t), TunnelSpec{Subdomain: "r4"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrLimit)
}
