package cluster

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
)

// An edge killed with members: its routes stay their owner's for RouteTTL from the moment the
// members vanished, on every surviving edge, so that the owner's connectors can fail over
// and no other tenant takes the route (or its port) meanwhile. Before the fix, the surviving
// edge (up longer than RouteTTL) treated the route as lapsed at once: the link loss removed
// the pool while the dead edge's lease still held (emptied skipped the write), the lease
// lapse then removed nothing more, so EmptySince was never written.
func TestClusterReviewKilledEdgeKeepsRouteOwner(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	const ttl = 3 * time.Second
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = ttl
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: tenants})
	b := startClusterEdge(t, nodes, "b", clusterOpts{edit: tenants})
	bStarted := time.Now()
	_, err := a.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	// b has run longer than RouteTTL (an edge in production has run for days).
	require.Eventually(t, func() bool { return time.Since(bStarted) > ttl+200*time.Millisecond }, 2*ttl, 50*time.Millisecond)
	a.kill()
	require.Eventually(t, func() bool { return edgeLease(b, "a") == "expired" }, 5*time.Second, 10*time.Millisecond)
	// Well within RouteTTL of the members vanishing: the route is still acme's.
	_, err = b.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("other"), hostPort(backend(t, "G").URL))
	require.ErrorIs(t, err, tunnel.ErrOwned, "another tenant took the dead edge's route at once")
}

// A pool that fell to zero healthy members, was removed and came back, alerts again when it
// falls again. Before the fix the alerts bucket still said "group_zero_healthy" from the
// first fall, so every edge took the second fall for one another edge had already sent.
func TestClusterReviewAlertAfterPoolRecreated(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	rcv := newReceiver(t)
	alerting := func(c *tunnel.ServerConfig) {
		c.Alerts.WebhookURL = rcv.URL
		c.Alerts.AllowPrivateWebhooks = true
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: alerting})
	b := startClusterEdge(t, nodes, "b", clusterOpts{edit: alerting})
	zeros := func() int {
		n := 0
		for _, al := range rcv.alerts() {
			if al.Event == "group_zero_healthy" {
				n++
			}
		}
		return n
	}

	// First life: healthy, then its only member leaves: one zero-healthy alert.
	var sw1 switchable
	spec := clusterPool("k")
	spec.Health = sw1.spec()
	sess := a.connect(tunnel.WithReconnect(false))
	tun, err := sess.Forward(ctxT(t), spec, hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	require.NoError(t, tun.Close())
	require.Eventually(t, func() bool { return zeros() == 1 }, 10*time.Second, 10*time.Millisecond, "%+v", rcv.alerts())
	firstFall := time.Now()
	for _, e := range []*clusterEdge{a, b} {
		require.Eventually(t, func() bool { return len(e.members("pool")) == 0 && !lookupHTTP(e, "pool") },
			10*time.Second, 10*time.Millisecond)
	}

	// Second life: the debouncers forgot the first when the pool was removed (no interval).
	var sw2 switchable
	spec.Health = sw2.spec()
	_, err = sess.Forward(ctxT(t), spec, hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	// A redeploy takes longer than the edges need to learn a change (the lease, 1 s here).
	require.Eventually(t, func() bool { return time.Since(firstFall) > 1200*time.Millisecond }, 3*time.Second, 20*time.Millisecond)
	sw2.down.Store(true)
	for _, e := range []*clusterEdge{a, b} {
		require.Eventually(t, func() bool { n, _ := e.alerts.decided("group_zero_healthy"); return n == 2 }, 10*time.Second, 10*time.Millisecond,
			"edge %s", e.id)
	}
	require.Eventually(t, func() bool { return zeros() == 2 }, 5*time.Second, 10*time.Millisecond,
		"the second fall was decided on every edge but sent by none: %+v", rcv.alerts())
}

// A TCP pool's port is reserved for it cluster-wide: a solo TCP tunnel on another edge must
// not take it, or the pool cannot be served on that edge (nor, here, re-registered on its
// own edge, whose registry binds the solo tunnel's remote copy on the pool's held port).
func TestClusterReviewSoloTCPDoesNotTakeAPoolPort(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{host: "127.0.0.1"})
	b := startClusterEdge(t, nodes, "b", clusterOpts{host: "127.0.0.2"})
	dbSpec := tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}
	sb := b.connect(tunnel.WithReconnect(false))
	tdb, err := sb.Forward(ctxT(t), dbSpec, tcpNamed(t, "db"))
	require.NoError(t, err)
	port := tdb.Port()
	a.waitMembers(t, "db", map[string]int{"b": 1})
	// The pool's member goes away for a moment (a redeploy): the route and its port stay.
	require.NoError(t, tdb.Close())
	require.Eventually(t, func() bool {
		for _, g := range a.Registry().Groups() {
			if g.Label == "db" {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)

	solo, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP}, tcpNamed(t, "solo"))
	require.NoError(t, err)
	require.NotEqual(t, port, solo.Port(), "the solo tunnel took port %d, reserved for pool db", port)

	tdb, err = sb.Forward(ctxT(t), dbSpec, tcpNamed(t, "db"))
	require.NoError(t, err)
	require.Equal(t, port, tdb.Port())
	for _, e := range []*clusterEdge{a, b} {
		e.waitMembers(t, "db", map[string]int{"b": 1})
		got, err := readTCP(net.JoinHostPort(e.host, fmt.Sprint(port)))
		require.NoError(t, err)
		require.Equal(t, "db", got, "edge %s", e.id)
	}
}

// One route, one pool: while a grouped pool of a subdomain lives on one edge, the same tenant
// cannot register the subdomain as a solo tunnel on another edge (on one edge that is
// "already in use"). Here the other edge cannot reach the pool's edge (the link is down, as
// in a partition between edges, or in the moment before a member's record arrives): the
// registration passes the route book (keyHeld ignores solo registrations) and the registry
// (the remote member is not joined), and the subdomain ends up served by two different
// backends, one per edge.
func TestClusterReviewSoloAndPoolOnOneSubdomain(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{cluster: func(c *Config) {
		c.Advertise = "127.0.0.1:1" // nobody listens: b cannot link to a
	}})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.c.liveAnywhere("http", "pool") }, 5*time.Second, 10*time.Millisecond)
	_, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "pool"}, hostPort(backend(t, "B").URL))
	// b cannot reach a's member, and refuses as if it could, rather than split the
	// subdomain between a pool on a and a solo tunnel on b.
	require.ErrorIs(t, err, group.ErrInUse, "a solo tunnel took a subdomain whose pool lives on another edge")
	require.Empty(t, b.members("pool"))
}

// Two live edges started with one edge_id each report it (an error in the log and a warning
// in /api/cluster), while an edge restarted with its own edge_id does not.
func TestClusterDuplicateEdgeIDIsReported(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 600 * time.Millisecond
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	require.Eventually(t, a.c.ownSeen.Load, 5*time.Second, 10*time.Millisecond)
	// A restart with the same edge_id: no warning.
	a.close()
	a = startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	require.Eventually(t, a.c.ownSeen.Load, 5*time.Second, 10*time.Millisecond)
	time.Sleep(3 * lease) // renewals of the restarted edge only
	var ci admin.ClusterInfo
	a.adminJSON(t, "/api/cluster", &ci)
	require.Empty(t, ci.Warnings)

	twin := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease, host: "127.0.0.2"})
	for _, e := range []*clusterEdge{a, twin} {
		require.Eventually(t, func() bool {
			ci := e.info()
			return len(ci.Warnings) == 1 && strings.Contains(ci.Warnings[0], "two edges share one edge_id")
		}, 5*time.Second, 20*time.Millisecond, "edge at %s", e.host)
		var ci admin.ClusterInfo
		e.adminJSON(t, "/api/cluster", &ci)
		require.Len(t, ci.Warnings, 1, "edge at %s", e.host)
		require.Contains(t, ci.Warnings[0], "two edges share one edge_id", "edge at %s", e.host)
	}
}

// lookupHTTP reports whether edge e has a group for subdomain sub in its routing table.
func lookupHTTP(e *clusterEdge, sub string) bool {
	_, ok := e.Registry().LookupHTTP(sub)
	return ok
}
