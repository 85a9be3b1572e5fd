package cluster

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// A route the operator released on one edge is free on every edge: the edge that last
// wrote it (and remembers it, should NATS lose writes) does not keep it for its old tenant
// once the store says it was deleted, nor write it back when its NATS connection returns.
func TestReleasedRouteIsFreeOnEveryEdge(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = time.Hour
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: tenants})
	b := startClusterEdge(t, nodes, "b", clusterOpts{edit: tenants})
	first, err := b.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	a.waitMembers(t, "pool", map[string]int{"b": 1})
	require.NoError(t, first.Close())
	a.waitMembers(t, "pool", map[string]int{})
	require.Eventually(t, func() bool {
		_, err := a.Operator().ReleaseRoute(store.KindHTTP, "pool")
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "the operator releases the empty route on a")
	r, err := b.c.routes.Get(ctxT(t), "http/pool")
	require.NoError(t, err)
	require.Nil(t, r, "released")

	_, err = b.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("g"), hostPort(backend(t, "G").URL))
	require.NoError(t, err, "another tenant claims the released route on b")
}

// A TCP pool's route that NATS lost is written back with its port's reservation: without it
// another pool could reserve the port the route still records, and one public port would
// lead to two pools.
func TestRestoredTCPRouteKeepsItsPort(t *testing.T) {
	n := startRestartableNATS(t)
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = time.Hour
	}
	lease := time.Second
	a := startClusterEdge(t, n.nodes(), "a", clusterOpts{host: "127.0.0.2", lease: lease, edit: tenants})
	b := startClusterEdge(t, n.nodes(), "b", clusterOpts{lease: lease, edit: tenants})
	db, err := b.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t),
		tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, tcpNamed(t, "db"))
	require.NoError(t, err)
	port := db.Port()
	portKey := fmt.Sprintf("port/%d", port)
	a.waitMembers(t, "db", map[string]int{"b": 1})
	require.NoError(t, db.Close())
	a.waitMembers(t, "db", map[string]int{})

	// NATS loses the route and its port's reservation (restarted from an older copy of its
	// store): emulated by deleting them behind the edges' backs just before a restart, b
	// doubting the store already as it does from the loss of its connection.
	b.c.edge.HoldNewRoutes(lease)
	for _, k := range []string{"tcp/db", portKey} {
		_, err := b.c.routes.Update(ctxT(t), k, func(*store.Route) (*store.Route, error) { return nil, nil })
		require.NoError(t, err)
	}
	n.stop()
	n.start()
	require.Eventually(t, func() bool {
		r, err := a.c.routes.Get(ctxT(t), "tcp/db")
		return err == nil && r != nil
	}, 10*time.Second, 50*time.Millisecond, "b writes the route back")
	require.Eventually(t, func() bool {
		r, err := a.c.routes.Get(ctxT(t), portKey)
		return err == nil && r != nil && r.Group == "tcp/db"
	}, 10*time.Second, 50*time.Millisecond, "b writes the route's port reservation back")
}

// NATS restarted as a whole from a store missing a route (claimed on b, whose connector is
// away): while b has not written it back yet, a, which never saw the route, does not give
// it to another tenant, even in a cluster with no member anywhere (no member record went
// missing to tell a that NATS lost writes: its members bucket, in memory storage, was
// created anew).
func TestLostRouteWaitsForTheEdgeThatRemembersIt(t *testing.T) {
	n := startRestartableNATS(t)
	const lease = 6 * time.Second
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = time.Hour
	}
	reconnectAfter := func(d time.Duration) func(*Config) {
		return func(c *Config) {
			c.NATSOptions = append(c.NATSOptions, nats.ReconnectWait(d), nats.ReconnectJitter(0, 0))
		}
	}
	a := startClusterEdge(t, n.nodes(), "a", clusterOpts{host: "127.0.0.2", lease: lease, edit: tenants, cluster: reconnectAfter(20 * time.Millisecond)})
	b := startClusterEdge(t, n.nodes(), "b", clusterOpts{lease: lease, edit: tenants, cluster: reconnectAfter(lease / 4)})
	s, err := b.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	a.waitMembers(t, "pool", map[string]int{})

	// NATS loses the route: deleted behind the edges' backs just before NATS restarts. A
	// NATS loses writes only across a restart, which b sees first as its connection lost:
	// that is when it starts to doubt the store (else a route the store does not hold was
	// deleted, and b forgets it).
	b.c.edge.HoldNewRoutes(lease)
	_, err = b.c.routes.Update(ctxT(t), "http/pool", func(*store.Route) (*store.Route, error) { return nil, nil })
	require.NoError(t, err)
	n.stop()
	n.start()
	var got error
	require.Eventually(t, func() bool {
		_, got = a.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("g"), hostPort(backend(t, "G").URL))
		return !errors.Is(got, tunnel.ErrUnavailable)
	}, 20*time.Second, 50*time.Millisecond)
	require.ErrorIs(t, got, tunnel.ErrOwned, "another tenant took the route b remembers before b wrote it back")
}
