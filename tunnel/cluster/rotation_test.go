package cluster

// Key rotations in a cluster that the checks against races between edges must let through
// (docs/load-balancing.md, "Rotating a group key": a member may present its new key with the old one in
// previous_group_keys; an old-key member may reconnect as long as a member on any edge
// still holds the old key).

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
)

// A pool on a reserved endpoint that sets no key_sha256 rotates its key as any pool does:
// its connector comes back with group_key k2 and previous_group_keys [k1]. On one edge this
// is admitted, and in a cluster too (joined's check for a key that lost a race between
// edges once refused it for ever: it did not look at the previous keys).
func TestClusterReservedEndpointPoolRotatesItsKey(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 500 * time.Millisecond
	withEp := func(c *tunnel.ServerConfig) { c.Endpoints = []tunnel.Endpoint{{Subdomain: "res", Group: "g"}} }
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease, edit: withEp})

	old := a.connect(tunnel.WithReconnect(false))
	_, err := old.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "res", Group: "g", GroupKey: "k1"}, hostPort(backend(t, "OLD").URL))
	require.NoError(t, err)
	require.NoError(t, old.Close())
	require.Eventually(t, func() bool { return len(a.members("res")) == 0 }, 5*time.Second, 10*time.Millisecond)

	rotated := tunnel.TunnelSpec{Subdomain: "res", Group: "g", GroupKey: "k2", PreviousGroupKeys: []string{"k1"}}
	// At once (within the lease of the last claim), and again after two leases (the claim
	// is then renewed by claimEndpointKey itself).
	for _, wait := range []time.Duration{0, 2 * lease} {
		time.Sleep(wait) // the lease must pass on the clock: there is no event to await
		_, err = a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), rotated, hostPort(backend(t, "NEW").URL))
		require.NoError(t, err, "the pool's connector rotating its key (k1 -> k2) refused after %v", wait)
	}
}

// An old-key member reconnecting mid-rotation is admitted while a member on any edge holds
// the old key (docs/load-balancing.md, "Rotating a group key"). Here m1 (k1) lives on edge a; a rotated
// member (k2, previous k1) joined on a and left, so the route records k2 and a's pool is at
// k2. Edge b starts afterwards: it joins m1 only, its pool is at k1. A k1 connector on b is
// admitted, as on edge a (joined once took the route's k2, which the claim had already
// seen, for a key that won a race).
func TestClusterOldKeyMemberJoinsOnAnEdgeThatNeverSawTheRotation(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{host: "127.0.0.1"})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "M1").URL))
	require.NoError(t, err)
	rotated := clusterPool("k2")
	rotated.PreviousGroupKeys = []string{"k1"}
	x := a.connect(tunnel.WithReconnect(false))
	_, err = x.Forward(ctxT(t), rotated, hostPort(backend(t, "X").URL))
	require.NoError(t, err)
	require.NoError(t, x.Close())
	a.waitMembers(t, "pool", map[string]int{"a": 1})

	b := startClusterEdge(t, nodes, "b", clusterOpts{host: "127.0.0.2"})
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	_, err = a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "M2a").URL))
	require.NoError(t, err, "edge a admits another k1 member: m1 still holds k1")
	_, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "M2b").URL))
	require.NoError(t, err, "edge b refuses a k1 member while m1 (on a) still holds k1")
}
