package cluster

// Races and recoveries of a cluster (several edges sharing pools through NATS JetStream)
// that a user relies on without seeing them: two registrations racing on two edges for one
// route (a reserved endpoint without a key, a pool coming back to its route while another
// shape claims it) end with one winner; a solo tunnel's claim goes with its tunnel, is taken
// back only by its own connector (its resume token), and survives the connector moving
// edges; a wiped routes bucket or a vanished members bucket leaves live routes with their
// tenants and members visible on every edge; a TCP pool of an old key and a solo TCP
// tunnel's port keep one tunnel per public port on every edge, also after a NATS cut. Each
// test provokes the situation directly (deleting buckets, cutting NATS through a proxy,
// racing registrations over several rounds) and names, in its comment, what used to go wrong.

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
)

// A NATS whose store was wiped loses the routes bucket; a live route is then still its
// tenant's, protected by its members (docs/reliability.md: "a registration another edge's members
// would refuse is refused"). The test deletes the bucket under acme's live pool and has
// globex register a solo tunnel on it: it is refused, leaves no route record naming globex,
// and acme's next member is admitted. (Once, the refused claim wrote a fresh record naming
// globex, which abandon kept because the route was live: the owner was then refused its own
// route, and the route became globex's once acme's members left.)
func TestClusterWipedRoutesBucketKeepsALiveRouteItsTenants(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: func(c *tunnel.ServerConfig) {
		c.Auth, c.RouteTTL = tenantAuth(), time.Hour
	}})
	acme := a.connect(tunnel.WithToken(acmeToken))
	_, err := acme.Forward(ctxT(t), clusterPool("acme-key"), hostPort(backend(t, "acme").URL))
	require.NoError(t, err)

	js, ctx := jetStreamOn(t, nodes[0])
	require.NoError(t, js.DeleteKeyValue(ctx, "warren_routes"), "the routes bucket wiped")

	globex := a.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false))
	_, err = globex.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "pool"}, hostPort(backend(t, "globex").URL))
	require.Error(t, err, "another tenant's solo tunnel on acme's live pool")

	_, ownerErr := a.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("acme-key"),
		hostPort(backend(t, "acme2").URL))
	r, err := a.c.routes.Get(t.Context(), "http/pool")
	require.NoError(t, err)
	if r != nil {
		assert.Equal(t, "acme", r.Tenant, "the refused tenant's claim was left in the route store")
	}
	require.NoError(t, ownerErr, "the owner is refused a second member of its own live pool")
}

// A solo tunnel's claim is held, within the lease, by its connector session
// (store.Route.Holder, with the SHA-256 of its resume token in HolderHash): only that
// connector, resuming its session with its token, takes the subdomain on another edge.
// docs/cluster.md: "Another connector, or one presenting a wrong token, is still refused." The test
// stops the holder's edge gracefully (so no member record is left for remoteConflict to
// check the proof against) and, within the claim's lease, registers on another edge first a
// connector naming the holder's session with a wrong token, then the real one: the first is
// refused, the second admitted. (Once, reshape let through any session the Hello named
// without checking its token: the impostor took the subdomain and the real connector was
// refused "already in use".)
func TestClusterSoloClaimNotTakenWithAWrongResumeToken(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 5 * time.Second // the test runs within the lease of the solo claim
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	solo := &wire.Register{Req: 1, Proto: group.ProtoHTTP, Label: "solo"}

	_, ctrlA, welcome := rawHello(t, a.ControlAddr, "", "")
	reg, ok := rawRegister(t, ctrlA, solo).(*wire.Registered)
	require.True(t, ok, "solo tunnel refused on a")
	remoteRecord(t, b, "a", reg.TunnelID)
	claimed := time.Now()
	a.close() // graceful: its lease and records are deleted; the route's claim stays
	require.Eventually(t, func() bool {
		b.c.remote.mu.Lock()
		defer b.c.remote.mu.Unlock()
		return len(b.c.remote.edges["a"].records) == 0
	}, 5*time.Second, 10*time.Millisecond)

	_, ctrl, _ := rawHello(t, b.ControlAddr, welcome.SessionID, welcome.ResumeToken+"x")
	m := rawRegister(t, ctrl, solo)
	_, ctrlReal, _ := rawHello(t, b.ControlAddr, welcome.SessionID, welcome.ResumeToken)
	real := rawRegister(t, ctrlReal, solo)
	require.Less(t, time.Since(claimed), lease, "the claim's lease ran out: the test proves nothing")
	assert.IsType(t, &wire.Rejected{}, m, "a connector naming the holder's session with a wrong token took the subdomain")
	require.IsType(t, &wire.Registered{}, real, "the connector that held the session, with its token, was refused")
}

// A TCP pool's key is part of its route: after a rotation, a connector presenting only the
// old key makes another pool on another port (docs/load-balancing.md, "Rotating a group key"), and in a
// cluster a TCP pool has the same port on every edge. Here pool db is at k2 with a member
// that still lists k1 as a previous key (docs/load-balancing.md's step 3: it is removed "at your next
// change"), and a connector with k1 alone makes pool db/k1 on its own port on edge a: edge b
// serves both pools, each on its own port. (Once, edge b adopted the k1 member into the k2
// pool, as a member whose key the pool rotated from, then dropped it because the ports
// differed: b never served the k1 pool's port.)
func TestClusterTCPPoolOfAnOldKeyServedOnEveryEdge(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{host: "127.0.0.1"})
	b := startClusterEdge(t, nodes, "b", clusterOpts{host: "127.0.0.2"})
	spec := func(key string, prev ...string) tunnel.TunnelSpec {
		return tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: key, PreviousGroupKeys: prev}
	}
	rotated, err := a.connect().Forward(ctxT(t), spec("k2", "k1"), tcpNamed(t, "new"))
	require.NoError(t, err)
	old, err := a.connect().Forward(ctxT(t), spec("k1"), tcpNamed(t, "old"))
	require.NoError(t, err)
	require.NotEqual(t, rotated.Port(), old.Port(), "the old key makes its own pool, on its own port")

	got, err := readTCP(net.JoinHostPort(a.host, fmt.Sprint(old.Port())))
	require.NoError(t, err)
	require.Equal(t, "old", got, "edge a serves the k1 pool")
	// Edge b learns of the pool from the cluster's records, a moment later.
	require.Eventually(t, func() bool {
		got, err := readTCP(net.JoinHostPort(b.host, fmt.Sprint(rotated.Port())))
		return err == nil && got == "new"
	}, 5*time.Second, 50*time.Millisecond, "edge b serves the k2 pool")
	require.Eventually(t, func() bool {
		got, err := readTCP(net.JoinHostPort(b.host, fmt.Sprint(old.Port())))
		return err == nil && got == "old"
	}, 5*time.Second, 50*time.Millisecond, "edge b never serves the k1 pool's port (its member: %v)", b.members("db"))
}

// Invariant 1 for a reserved endpoint ([[endpoints]]) with no key_sha256, in a cluster: the
// endpoint reserves the route for its tenant and pool name, any key may start the pool, and
// the pool has one key. The test races two first registrations with two keys on two edges,
// for six endpoints: on each, at most one wins (the pool's key is recorded with
// compare-and-set, as TestClusterTwoKeysRaceOnAnExistingRoute checks for other routes).
// (Once, nothing ordered them: both won, the pool had k1 on one edge and k2 on the other, and
// each edge refused the other's member.)
func TestClusterTwoKeysRaceOnAReservedEndpoint(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	const rounds = 6
	var eps []tunnel.Endpoint
	for i := range rounds {
		eps = append(eps, tunnel.Endpoint{Subdomain: fmt.Sprintf("res%d", i), Group: "g"})
	}
	withEps := func(c *tunnel.ServerConfig) { c.Endpoints = eps }
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: withEps})
	b := startClusterEdge(t, nodes, "b", clusterOpts{edit: withEps})
	var both []string
	for round := range rounds {
		sub := fmt.Sprintf("res%d", round)
		errs := raceKeys(t, sub, a, b)
		if errs[0] == nil && errs[1] == nil {
			both = append(both, sub)
		}
	}
	require.Empty(t, both, "reserved routes where both keys won, one on each edge")
}

// A solo tunnel's connector that moves twice within one lease (edge a killed, it moves to
// b; b killed, it moves to c) comes back by itself, at the latest once the first dead edge's
// lease lapses: c's pass for a resumed session covers the session the connector resumed
// (b's), not a's before it, so until a's lease lapses c still counts a's record and refuses
// it "already in use". A known limit (docs/reliability.md): one lease of downtime, not a lost
// tunnel. The connector dials a, b and c in turn; the test kills a, then b once the tunnel is
// on b, and requires it on c within three leases, serving requests there.
func TestClusterSoloTunnelMovedTwiceWithinALeaseComesBack(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 2 * time.Second
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	c := startClusterEdge(t, nodes, "c", clusterOpts{lease: lease})
	_, err := a.connect(dialEdgesInTurn(a, b, c)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "solo"}, hostPort(backend(t, "S").URL))
	require.NoError(t, err)
	c.waitMembers(t, "solo", map[string]int{"a": 1})
	a.kill()
	b.waitMembers(t, "solo", map[string]int{"b": 1})
	c.waitMembers(t, "solo", map[string]int{"b": 1})
	b.kill()
	require.Eventually(t, func() bool { return c.members("solo")["c"] == 1 }, 3*lease, 20*time.Millisecond,
		"the connector that moved twice is not back on c (c: %v)", c.members("solo"))
	code, body := c.get("solo", "/")
	require.Equal(t, 200, code)
	require.Equal(t, "S /", body)
}

// Invariant 1 for a route that has been empty for longer than the lease, recorded as pool g
// with key k0 (a pool redeployed before its claim lapsed): the subdomain has one shape on
// every edge. On edge a its old pool comes back (key k0) while on edge b the route is
// registered anew, with another key (k1) or as a solo tunnel, b's registration landing at
// various points of a's (30 rounds): at most one of the two wins. (Once, a registration with
// the recorded key wrote nothing, so the change on the other edge did not see it: both won,
// one shape per edge.)
func TestClusterReturningPoolRacesAChangeOnItsRoute(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 400 * time.Millisecond
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	const rounds = 30
	staleRoutes(t, a, rounds, lease)
	var both []string
	for round := range rounds {
		sub := fmt.Sprintf("old%d", round)
		change := tunnel.TunnelSpec{Subdomain: sub, Group: "g", GroupKey: "k1"}
		if round%2 == 1 {
			change = tunnel.TunnelSpec{Subdomain: sub} // a solo tunnel
		}
		specs := []tunnel.TunnelSpec{{Subdomain: sub, Group: "g", GroupKey: "k0"}, change}
		sessions := []*tunnel.Session{a.connect(tunnel.WithReconnect(false)), b.connect(tunnel.WithReconnect(false))}
		errs := make([]error, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range sessions {
			wg.Go(func() {
				<-start
				if i == 1 {
					// b's registration lands at various points of a's claim and joined.
					time.Sleep(time.Duration(round%6) * 500 * time.Microsecond)
				}
				_, errs[i] = sessions[i].Forward(ctxT(t), specs[i], hostPort(backend(t, fmt.Sprint(i)).URL))
			})
		}
		close(start)
		wg.Wait()
		if errs[0] == nil && errs[1] == nil {
			both = append(both, fmt.Sprintf("%s (%s)", sub, map[bool]string{true: "solo", false: "k1"}[round%2 == 1]))
		}
	}
	require.Empty(t, both, "routes where the recorded key and a change both won, one on each edge")
}

// The members bucket alone vanishes under a running cluster (NATS stays up; here deleted by
// hand): the edges create it again and write their members again, and a member registered
// afterwards is seen by the other edge, as when all three buckets vanish
// (TestClusterRecreatesMissingBuckets).
func TestClusterMembersBucketAloneRecreated(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 900 * time.Millisecond
	a, b := twoEdgesWithAMemberEach(t, nodes, lease)

	js, ctx := jetStreamOn(t, nodes[0])
	require.NoError(t, js.DeleteKeyValue(ctx, "warren_members"))

	_, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "fresh", Group: "g", GroupKey: "k"},
		hostPort(backend(t, "F").URL))
	require.NoError(t, err)
	b.waitMembers(t, "fresh", map[string]int{"a": 1})
	require.Eventually(t, func() bool {
		members, err := js.KeyValue(ctx, "warren_members")
		if err != nil {
			return false
		}
		keys, err := members.Keys(ctx)
		return err == nil && len(keys) == 3
	}, 10*time.Second, 50*time.Millisecond, "the members' records were not written again")
}

// The members bucket vanishes and another writer (an edge, or the operator) creates it again
// at once, with the edges' configuration: edge b's members watch, whose revision counter is
// the old bucket's, must still learn the members written to the new bucket.
func TestClusterMembersBucketRecreatedByAnotherWriter(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 900 * time.Millisecond
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	// Some history in the members bucket: tunnels come and go.
	for i := range 20 {
		sub := fmt.Sprintf("churn%d", i)
		tun, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: sub}, hostPort(backend(t, "C").URL))
		require.NoError(t, err)
		b.waitMembers(t, sub, map[string]int{"a": 1})
		require.NoError(t, tun.Shutdown(ctxT(t)))
		b.waitMembers(t, sub, map[string]int{})
	}

	js, ctx := jetStreamOn(t, nodes[0])
	require.NoError(t, js.DeleteKeyValue(ctx, "warren_members"))
	_, err := js.CreateKeyValue(ctx, a.c.bucketConfigs()[0])
	require.NoError(t, err)

	fresh, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "fresh", Group: "g", GroupKey: "k"},
		hostPort(backend(t, "F").URL))
	require.NoError(t, err)
	members, err := js.KeyValue(ctx, "warren_members")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := members.Get(ctx, "a."+fresh.ID())
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "a did not write the new member's record to the new bucket")
	b.waitMembers(t, "fresh", map[string]int{"a": 1})
}

// A solo tunnel's subdomain, once its tunnel has closed, is the tenant's to register again
// at once, by any connector of the tenant: a connector process restarted (a new session, no
// resume token) gets its subdomain back immediately, on one edge (the control) as on an edge
// of a cluster, well within the lease of its first claim. (Once, the route's solo claim kept
// the closed tunnel's session as its Holder and refused any other session "already in use"
// for a lease, though no edge served the subdomain: a crash loop or a quick redeploy lost
// its subdomain for that long.)
func TestClusterSoloSubdomainFreeOnceItsTunnelClosed(t *testing.T) {
	again := func(t *testing.T, e *tunneltest.Edge) error {
		first, err := tunneltest.Connect(t, e, tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "solo"},
			hostPort(backend(t, "1").URL))
		require.NoError(t, err)
		require.NoError(t, first.Shutdown(ctxT(t)))
		require.Eventually(t, func() bool { _, ok := e.Registry().LookupHTTP("solo"); return !ok }, 5*time.Second, 5*time.Millisecond)
		_, err = tunneltest.Connect(t, e, tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "solo"},
			hostPort(backend(t, "2").URL))
		return err
	}
	require.NoError(t, again(t, tunneltest.NewEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}})), "one edge")
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: 5 * time.Second})
	require.NoError(t, again(t, a.Edge), "an edge of a cluster")
}

// natsCutSoloPort is TestClusterSoloTCPPortLeadsToOneTunnelAfterANATSCut's one-port range
// (inside the harness's range; no other test configures this port alone).
const natsCutSoloPort = 31378

// A solo TCP tunnel's port is reserved cluster-wide ("port/<n>") so that its copies on every
// edge answer on one port: a public port leads to one tunnel, whichever edge a client
// reaches. The test cuts edge a off from NATS (through a proxy) for longer than
// route_ttl_secs (it lives and serves its tunnel all along); edge b takes it for dead,
// releases the reservation and gives the port to a new tunnel of its own. When a's NATS
// returns, a reserves its solo ports again, finds this one taken and ends its own tunnel's
// session: both edges then answer the port with the same tunnel. (Once, nothing settled the
// clash: a answered the port with its tunnel and b with its own, for good.)
func TestClusterSoloTCPPortLeadsToOneTunnelAfterANATSCut(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	p := newCutProxy(t, strings.TrimPrefix(nodes[0].ClientURL(), "nats://"))
	const port = natsCutSoloPort
	lease := 600 * time.Millisecond
	one := func(c *tunnel.ServerConfig) {
		c.TCP.Ports = group.PortRange{Lo: port, Hi: port}
		c.RouteTTL = time.Second
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{host: "127.0.0.1", lease: lease, edit: one, cluster: viaProxy(p)})
	b := startClusterEdge(t, nodes, "b", clusterOpts{host: "127.0.0.2", lease: lease, edit: one})
	ta, err := a.connect().Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "solo"}, tcpNamed(t, "a-solo"))
	require.NoError(t, err)
	require.Equal(t, port, ta.Port())
	at := func(e *clusterEdge) string {
		got, _ := readTCP(net.JoinHostPort(e.host, fmt.Sprint(port)))
		return got
	}
	require.Eventually(t, func() bool { return at(b) == "a-solo" }, 5*time.Second, 20*time.Millisecond, "b does not serve a's solo TCP tunnel")

	p.cut()
	require.Eventually(t, func() bool { return edgeLease(b, "a") == "expired" }, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		r, err := b.c.routes.Get(t.Context(), fmt.Sprintf("port/%d", port))
		return err == nil && r == nil
	}, 5*time.Second, 20*time.Millisecond, "b never released the cut edge's port (the test proves nothing)")
	tb, err := b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "other"}, tcpNamed(t, "b-other"))
	require.NoError(t, err)
	require.Equal(t, port, tb.Port())
	require.Equal(t, "a-solo", at(a), "a serves its tunnel all through the cut")
	p.restore()
	require.Eventually(t, func() bool { return edgeLease(b, "a") == "held" }, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return at(a) == at(b) }, 5*time.Second, 50*time.Millisecond,
		"port %d answers with two tunnels: a %q, b %q", port, at(a), at(b))
}
