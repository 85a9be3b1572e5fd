package cluster

import (
	"testing"
	"time"

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
