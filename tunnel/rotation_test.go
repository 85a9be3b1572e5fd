package tunnel

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/webhook"
)

func tcpPool(key string, prev ...string) TunnelSpec {
	return TunnelSpec{Proto: ProtoTCP, Name: "db", Group: "db", GroupKey: key, PreviousGroupKeys: prev}
}

// A TCP pool's key rotation needs no new port, so a tenant at its max_tcp_ports quota can
// rotate, and its members still on the old key can reconnect meanwhile.
func TestTCPRotationUnderPortQuota(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(),
		TCP:    TCPTunnels{Ports: group.PortRange{Lo: 44790, Hi: 44799}, BindHost: "127.0.0.1"},
		Limits: Limits{Tenant: TenantLimits{MaxTCPPorts: 1}}})
	echo := tcpBackend(t, func(net.Conn) {})
	acme := e.connect(WithToken(acmeToken))
	a, err := acme.Forward(ctxT(t), tcpPool("k1"), echo)
	require.NoError(t, err)
	b, err := acme.Forward(ctxT(t), tcpPool("k2", "k1"), echo)
	require.NoError(t, err, "rotating an existing pool needs no new port")
	require.Equal(t, a.Port(), b.Port())
	c, err := acme.Forward(ctxT(t), tcpPool("k1"), echo)
	require.NoError(t, err, "a member still on the old key rejoins mid-rotation")
	require.Equal(t, a.Port(), c.Port())
}

// A restart in the middle of a rotation: whichever member comes back first, the pool keeps
// its public port; once no member holds the old key, the record forgets it.
func TestTCPRotationSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	cfg := ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Auth: tenantAuth(), Store: openBoltStore(t, dir),
		TCP: TCPTunnels{Ports: group.PortRange{Lo: 44780, Hi: 44789}, BindHost: "127.0.0.1"}}
	echo := tcpBackend(t, func(net.Conn) {})
	first := startEdge(t, cfg)
	acme := first.connect(WithToken(acmeToken), WithReconnect(false))
	a, err := acme.Forward(ctxT(t), tcpPool("k1"), echo)
	require.NoError(t, err)
	port := a.Port()
	_, err = acme.Forward(ctxT(t), tcpPool("k2", "k1"), echo)
	require.NoError(t, err)
	require.NoError(t, first.Close())

	cfg.Store = openBoltStore(t, dir) // the first edge closed its store
	second := startEdge(t, cfg)
	acme2 := second.connect(WithToken(acmeToken))
	a2, err := acme2.Forward(ctxT(t), tcpPool("k1"), echo)
	require.NoError(t, err)
	b2, err := acme2.Forward(ctxT(t), tcpPool("k2", "k1"), echo)
	require.NoError(t, err)
	require.Equal(t, port, a2.Port(), "the pool keeps its public port across a restart mid-rotation")
	require.Equal(t, port, b2.Port())

	// The old-key member leaves: the rotation is over, the record keeps only the new key.
	require.NoError(t, a2.Shutdown(ctxT(t)))
	require.Eventually(t, func() bool {
		r, err := second.routes.st.Get(t.Context(), "tcp/db")
		return err == nil && r != nil && len(r.Ports) == 1 && r.Ports[group.HashKey("k2").String()] == port
	}, 5*time.Second, 10*time.Millisecond)
}

// A pool at zero healthy members rescued by a member that rotates the key is alerted as
// recovered (recovery alerts asked for), like any other pool.
func TestRecoveryAlertAfterRotation(t *testing.T) {
	op := newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, OnRecovery: true}})
	b := backend(t, "b")
	var h switchable
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k1", Health: h.spec()}, hostPort(b.URL))
	require.NoError(t, err)
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	h.down.Store(true)
	require.Eventually(t, func() bool { return len(op.alerts()) == 1 }, 5*time.Second, 5*time.Millisecond)

	_, err = e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k2", PreviousGroupKeys: []string{"k1"}}, hostPort(b.URL))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return len(op.events()) == 2
	}, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{webhook.EventGroupZeroHealthy, webhook.EventGroupRecovered}, op.events())
}
