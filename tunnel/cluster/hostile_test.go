package cluster

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// Hostile timings and failures of the cluster (several edges sharing pools through NATS
// JetStream): NATS stopped and started again, or cut off from one edge, for longer than the
// lease; an edge killed while its tunnels move elsewhere; registrations racing on two edges
// for one route; members leaving one edge as others join on another; a key rotation rolling
// across the edges; and another edge flooding a peer link with silent streams. Each test
// states the promise it holds the cluster to and how it provokes the hostile case.

// restartableNATS is one embedded NATS server with JetStream on a fixed port and store
// directory, so that it can be stopped and started again as an operator restarting it
// would.
type restartableNATS struct {
	t    testing.TB
	port int
	dir  string
	ns   *server.Server
}

// startRestartableNATS starts a restartableNATS on a free port, stopped at the end of the test.
func startRestartableNATS(t testing.TB) *restartableNATS {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	n := &restartableNATS{t: t, port: port, dir: t.TempDir()}
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *restartableNATS) start() {
	n.t.Helper()
	opts := &server.Options{ServerName: "restartable", Host: "127.0.0.1", Port: n.port,
		JetStream: true, StoreDir: n.dir, NoLog: true, NoSigs: true}
	ns, err := server.NewServer(opts)
	require.NoError(n.t, err)
	ns.Start()
	require.True(n.t, ns.ReadyForConnections(20*time.Second), "NATS server not ready")
	n.ns = ns
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(n.t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(n.t, err)
	require.Eventually(n.t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "JetStream not ready")
}

func (n *restartableNATS) stop() {
	if n.ns != nil {
		n.ns.Shutdown()
		n.ns.WaitForShutdown()
		n.ns = nil
	}
}

func (n *restartableNATS) nodes() []*server.Server { return []*server.Server{n.ns} }

// NATS stopped for longer than the lease, then started again on the same port and store
// directory (an operator restarting it): the edges renew their leases, see each other's
// members again, and new routes can be claimed again, within seconds. The members, leases and
// alerts buckets are in memory storage, so the restart loses them and the edges must create
// them again (before the fix nothing did, and every lease renewal and member write failed for
// ever).
func TestClusterRecoversFromANATSRestart(t *testing.T) {
	n := startRestartableNATS(t)
	lease := 900 * time.Millisecond
	a := startClusterEdge(t, n.nodes(), "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, n.nodes(), "b", clusterOpts{lease: lease})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	both := map[string]int{"a": 1, "b": 1}
	a.waitMembers(t, "pool", both)
	b.waitMembers(t, "pool", both)

	n.stop()
	// NATS stays down for three leases: the edges cannot reach it, so the only way to
	// have the outage outlast the lease is to let the time pass.
	time.Sleep(3 * lease)
	n.start()

	// Each edge renews its lease again...
	bucketErr := func(name string) error {
		nc, err := nats.Connect(n.ns.ClientURL())
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.KeyValue(ctx, name)
		return err
	}
	for _, e := range []*clusterEdge{a, b} {
		require.Eventually(t, func() bool { return edgeLease(e, e.id) == "held" }, 10*time.Second, 50*time.Millisecond,
			"edge %s never renews its lease after NATS restarted; leases bucket: %v, members bucket: %v",
			e.id, bucketErr("warren_leases"), bucketErr("warren_members"))
	}
	// ...and both see both members, also one registered after the restart.
	a.waitMembers(t, "pool", both)
	b.waitMembers(t, "pool", both)
	require.Eventually(t, func() bool {
		_, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "fresh", Group: "g", GroupKey: "k"},
			hostPort(backend(t, "F").URL))
		return err == nil
	}, 10*time.Second, 200*time.Millisecond)
	b.waitMembers(t, "fresh", map[string]int{"a": 1})
}

// Promise 5 for a solo HTTP tunnel (no group): its edge is killed, the connector moves to
// another edge and registers its subdomain again, and that edge takes it at once, well
// within the dead edge's lease, whose member record it still holds. Before the fix the other
// edge refused the registration "already in use" until the dead edge's lease lapsed, and the
// tunnel was lost meanwhile.
func TestClusterSoloTunnelMovesEdgeAfterKill(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 3 * time.Second // long enough that the connector's retry is within it
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	ta, err := a.connect(failoverDialer(a, b)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "solo"}, hostPort(backend(t, "S").URL))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		b.c.remote.mu.Lock()
		defer b.c.remote.mu.Unlock()
		e := b.c.remote.edges["a"]
		return e != nil && len(e.records) == 1
	}, 5*time.Second, 10*time.Millisecond)
	a.kill()
	// A pool's member comes back on b at once (TestClusterEdgeKilledUnderLoad); the solo
	// tunnel is refused "already in use" until a's lease lapses (3 s here, 10 s by default).
	killed := time.Now()
	require.Eventually(t, func() bool { return b.getCode("solo") == 200 }, 2*lease, 20*time.Millisecond,
		"the solo tunnel did not come back on b; tunnel error: %v", ta.Err())
	require.Less(t, time.Since(killed), lease/2, "the solo tunnel was refused on b until the dead edge's lease lapsed")
	require.NoError(t, ta.Err())
}

// A route served on some edge never lapses, however its members move between edges: a
// route's last member leaves edge a just as a member of the same route registers on edge c,
// before c's member record reaches a (up to 60 rounds of that race). RouteTTL later every
// route, live with the owner's member on c all along, is still the owner's: another tenant
// registering it is refused tunnel.ErrOwned. Before the fix a's emptiness could overwrite c's
// fresh claim, and the live route lapsed a RouteTTL later (another tenant with the same key
// even joined the owner's pool on c).
func TestClusterLiveRouteNeverLapsesAsMembersMoveEdges(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	const ttl = 1500 * time.Millisecond
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = ttl
		c.Limits.RegisterRate, c.Limits.RegisterBurst = 1000, 1000
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: tenants})
	c := startClusterEdge(t, nodes, "c", clusterOpts{edit: tenants})
	sa := a.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false))
	var subs []string
	empty := map[string]bool{}
	for round := range 60 {
		sub := fmt.Sprintf("race%d", round)
		subs = append(subs, sub)
		spec := tunnel.TunnelSpec{Subdomain: sub, Group: "g", GroupKey: "k"}
		ta, err := sa.Forward(ctxT(t), spec, hostPort(backend(t, "A").URL))
		require.NoError(t, err)
		c.waitMembers(t, sub, map[string]int{"a": 1})
		_, err = c.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t), spec, hostPort(backend(t, "C").URL))
		require.NoError(t, err)
		require.NoError(t, ta.Close()) // a's last member leaves as c's joins
		a.waitMembers(t, sub, map[string]int{"c": 1})
		// a's emptiness, if it wrote one, is written as its member leaves, after a's view
		// has lost it; it must not land over c's claim, and nothing observable marks that it
		// did not: give it a moment before reading the route.
		time.Sleep(50 * time.Millisecond)
		r, err := a.c.routes.Get(t.Context(), "http/"+sub)
		require.NoError(t, err)
		require.NotNil(t, r)
		empty[sub] = !r.EmptySince.IsZero()
		if empty[sub] {
			break // the race is hit: enough rounds
		}
	}
	// Every route has had a live member on c all along: none is another tenant's to take,
	// even once RouteTTL has run out (a claim recorded empty would lapse by then).
	time.Sleep(ttl + 200*time.Millisecond)
	for _, sub := range subs {
		require.Equal(t, map[string]int{"c": 1}, a.members(sub), "the owner's member is still live")
		_, err := a.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false)).Forward(ctxT(t),
			tunnel.TunnelSpec{Subdomain: sub, Group: "g", GroupKey: "k"}, hostPort(backend(t, "G").URL))
		require.ErrorIs(t, err, tunnel.ErrOwned, "route %s, live with acme's member on c (recorded empty: %v), was taken by globex",
			sub, empty[sub])
	}
}

// cutProxy is a TCP proxy to target that can be cut (every connection closed, new ones
// refused) and restored on the same address: an edge's network path to NATS.
type cutProxy struct {
	t      testing.TB
	addr   string
	target string
	mu     sync.Mutex
	l      net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = l.Addr().String()
	p.serve(l)
	t.Cleanup(func() { p.cut(); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve(l net.Listener) {
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = struct{}{}, struct{}{}
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			p.wg.Go(func() { pipe(up, c) })
			p.wg.Go(func() { pipe(c, up) })
		}
	})
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.l != nil {
		_ = p.l.Close()
		p.l = nil
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

func (p *cutProxy) restore() {
	var l net.Listener
	require.Eventually(p.t, func() bool {
		var err error
		l, err = net.Listen("tcp", p.addr)
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
	p.serve(l)
}

// viaProxy makes an edge reach NATS through p only.
func viaProxy(p *cutProxy) func(*Config) {
	return func(c *Config) {
		c.NATSURLs = []string{"nats://" + p.addr}
		c.NATSOptions = append(c.NATSOptions, nats.IgnoreDiscoveredServers(), nats.DontRandomize())
	}
}

// A route stays its owner's through an edge's NATS cut longer than the lease: edge a is cut
// off from NATS (through a proxy) while it keeps its members and serves them; edge b takes
// a's lease for lapsed, drops a's members and records the route empty. When a's NATS
// connection returns, b serves a's members again, and RouteTTL later the route is still
// there, no longer recorded empty, and another tenant registering it is refused tunnel.ErrOwned.
// Before the fix nothing cleared the emptiness, and the live route's claim lapsed.
func TestClusterLiveRouteNeverLapsesThroughANATSCut(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	p := newCutProxy(t, strings.TrimPrefix(nodes[0].ClientURL(), "nats://"))
	const ttl = 2 * time.Second
	lease := 600 * time.Millisecond
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = ttl
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease, edit: tenants, cluster: viaProxy(p)})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease, edit: tenants})
	_, err := a.connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})

	p.cut()
	require.Eventually(t, func() bool { return edgeLease(b, "a") == "expired" }, 5*time.Second, 10*time.Millisecond)
	// The cut lasts until b has dropped a's members and recorded the route empty.
	b.waitMembers(t, "pool", map[string]int{})
	require.Eventually(t, func() bool {
		r, err := b.c.routes.Get(t.Context(), "http/pool")
		return err == nil && r != nil && !r.EmptySince.IsZero()
	}, 5*time.Second, 10*time.Millisecond, "b never recorded the route empty while a was cut off")
	p.restore()
	// a is back: b sees its member again, and a serves it all along.
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	code, body := b.get("pool", "/")
	require.Equal(t, 200, code, body)

	// The route has had a live member all along: it is acme's, however long we wait. Let
	// RouteTTL run out (a claim still recorded empty would lapse by then), with a sweep.
	time.Sleep(ttl + 500*time.Millisecond)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	r, err := b.c.routes.Get(t.Context(), "http/pool")
	require.NoError(t, err)
	require.NotNil(t, r, "the live route was swept")
	require.True(t, r.EmptySince.IsZero(), "the live route is recorded empty since %v", r.EmptySince)
	_, err = b.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "G").URL))
	require.ErrorIs(t, err, tunnel.ErrOwned, "globex took acme's live route")
}

// A rolling key rotation works across edges as on one edge: members of pool "pool" with key
// k1 on a and b; a new member on a rotates the pool to k2 (previous key k1). Every edge's
// pool takes the rotated member, and a connector still on the old key may join on the other
// edge while old-key members remain. Before the fix b refused a's rotated member (its record
// carried no previous keys), splitting the pool by edge, and refused the old key on b.
func TestClusterRollingKeyRotation(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "A1").URL))
	require.NoError(t, err)
	_, err = b.connect().Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "B1").URL))
	require.NoError(t, err)
	a.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
	b.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})

	rotated := clusterPool("k2")
	rotated.PreviousGroupKeys = []string{"k1"}
	_, err = a.connect().Forward(ctxT(t), rotated, hostPort(backend(t, "A2").URL))
	require.NoError(t, err)
	// Every edge serves the whole pool: a's two members and b's one.
	a.waitMembers(t, "pool", map[string]int{"a": 2, "b": 1})
	whole := func() bool { return b.members("pool")["a"] == 2 }
	spread := assert.Eventually(t, whole, 5*time.Second, 10*time.Millisecond,
		"b's view of the pool lacks a's rotated member: %v", b.members("pool"))
	// A connector not yet rotated may still join, on either edge, as on one edge.
	_, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), clusterPool("k1"), hostPort(backend(t, "B2").URL))
	assert.NoError(t, err, "an old-key member refused on b mid-rotation")
	require.True(t, spread && err == nil)
}

// soloTCPPort is TestClusterDeadEdgeReleasesSoloTCPPorts' one-port range: inside the cluster
// harness's range (below the ephemeral ports, so no client socket holds it), and no other
// test in the package configures a range of this port alone (none runs in parallel).
const soloTCPPort = 31377

// A solo TCP tunnel's port, reserved cluster-wide under "port/<n>", is released when its
// edge dies: with a one-port range, a solo TCP tunnel on the dead edge's port, then the
// edge killed, another edge drops the reservation within 2 s of the dead edge's lease
// lapsing (a lease later, and a sweep) and gives the port to a new solo TCP tunnel. Before
// the fix only the holding edge ever deleted the reservation, so every edge that died
// leaked its solo tunnels' ports for good.
func TestClusterDeadEdgeReleasesSoloTCPPorts(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	const port = soloTCPPort
	lease := 600 * time.Millisecond
	one := func(c *tunnel.ServerConfig) {
		c.TCP.Ports = group.PortRange{Lo: port, Hi: port}
		c.RouteTTL = time.Second
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease, edit: one})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease, edit: one})
	ta, err := a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "solo"}, tcpNamed(t, "solo"))
	require.NoError(t, err)
	require.Equal(t, port, ta.Port())
	// While a holds it, b has no port to give: the registration is refused, and b holds
	// the port back (until the reservation goes).
	_, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "early"}, tcpNamed(t, "early"))
	require.ErrorIs(t, err, group.ErrNoPorts)
	a.kill()
	require.Eventually(t, func() bool { return edgeLease(b, "a") == "expired" }, 5*time.Second, 10*time.Millisecond)
	// The dead edge's reservation goes within 2 s (a lease after the lapse, and a sweep)...
	require.Eventually(t, func() bool {
		r, err := b.c.routes.Get(t.Context(), fmt.Sprintf("port/%d", port))
		return err == nil && r == nil
	}, 2*time.Second, 20*time.Millisecond, "port %d is still reserved for a tunnel of the dead edge", port)
	// ...and the port is b's again to give to a new solo TCP tunnel (the sweep that deleted
	// the reservation gives back the port b held back).
	var tb *tunnel.Tunnel
	require.Eventually(t, func() bool {
		tb, err = b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "again"}, tcpNamed(t, "again"))
		return err == nil
	}, 3*time.Second, 100*time.Millisecond, "b never offers port %d again: %v", port, err)
	require.Equal(t, port, tb.Port())
}

// peerDial links to e's peer port as another edge would, with token.
func peerDial(t testing.TB, e *clusterEdge, token string) (net.Conn, byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", e.peerAddr, 2*time.Second)
	require.NoError(t, err)
	h := sha256.Sum256([]byte(token))
	hello := append([]byte(peerMagic), byte(len("x")))
	hello = append(hello, "x"...)
	hello = append(hello, h[:]...)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = conn.Write(hello)
	require.NoError(t, err)
	var ans [1]byte
	_, err = io.ReadFull(conn, ans[:])
	require.NoError(t, err)
	_ = conn.SetDeadline(time.Time{})
	return conn, ans[0]
}

// Bounded resources on the peer port: an edge holding the token (a compromised or buggy
// one) opens 3,000 streams on its link and never sends an envelope; the accepting edge
// spends fewer than 750 goroutines on them (its caps on a link's streams refuse the rest at
// once). Before the fix each such stream cost the edge a goroutine until OpenTimeout.
func TestClusterPeerLinkBoundsAStreamFlood(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	conn, ans := peerDial(t, b, clusterToken)
	require.Equal(t, byte(peerOK), ans)
	sess, err := yamux.Server(conn, yamux.DefaultConfig())
	require.NoError(t, err)
	defer sess.Close()
	before := runtime.NumGoroutine()
	const streams = 3000
	var opened []*yamux.Stream
	for range streams {
		st, err := sess.OpenStream()
		if err != nil {
			break
		}
		opened = append(opened, st)
	}
	// The edge accepts a link's streams one at a time, in the order they were opened: once
	// it answers one more stream opened after the flood (refused, the link being at its cap
	// of streams awaiting their envelope), it has taken every stream of the flood and
	// started a goroutine for each it forwards.
	probe, err := sess.OpenStream()
	require.NoError(t, err)
	_ = probe.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ack [1]byte
	_, err = io.ReadFull(probe, ack[:])
	require.NoError(t, err, "the edge never answered a stream opened after %d silent ones", len(opened))
	grew := runtime.NumGoroutine() - before
	for _, st := range append(opened, probe) {
		_ = st.Close()
	}
	require.Less(t, grew, streams/4, "%d streams opened on one link, none sending an envelope: the edge holds %d more goroutines", len(opened), grew)
}

// Invariant 1 for a route that exists but has been empty for longer than the lease (a pool
// redeployed with a new key before its claim lapsed): two registrations with two keys racing
// on two edges, at most one wins (5 routes, one race each). Before the fix both usually won,
// the route's pool having one key on one edge and the other on the other.
func TestClusterTwoKeysRaceOnAnExistingRoute(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 400 * time.Millisecond
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	const rounds = 5
	staleRoutes(t, a, rounds, lease)
	var both []string
	for round := range rounds {
		sub := fmt.Sprintf("old%d", round)
		errs := raceKeys(t, sub, a, b)
		if errs[0] == nil && errs[1] == nil {
			both = append(both, sub)
		}
	}
	require.Empty(t, both, "routes where both keys won, one on each edge")
}

// Two solo HTTP tunnels (no group) of one tenant registering one new subdomain at once on
// two edges: at most one wins, as on one edge where the second is refused "already in use"
// (20 subdomains, one race each). Before the fix both sometimes won, each edge serving its
// own tunnel for the subdomain.
func TestClusterTwoSoloTunnelsRace(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	var both []string
	for round := range 20 {
		sub := fmt.Sprintf("solo%d", round)
		sessions := []*tunnel.Session{a.connect(tunnel.WithReconnect(false)), b.connect(tunnel.WithReconnect(false))}
		errs := make([]error, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range sessions {
			wg.Go(func() {
				<-start
				_, errs[i] = sessions[i].Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: sub}, hostPort(backend(t, fmt.Sprint(i)).URL))
			})
		}
		close(start)
		wg.Wait()
		if errs[0] == nil && errs[1] == nil {
			both = append(both, sub)
		}
	}
	require.Empty(t, both, "subdomains where two solo tunnels won, one on each edge")
}

// Another tenant cannot learn a pool's key by guessing: its registration of a route whose
// pool is served on another edge is refused as another tenant's, with the same answer for a
// wrong key, the right key and no key, while that edge lives and for the lease after it died
// (its member records stay until then). Before, a wrong key was told "group key does not
// match" and the right one "belongs to another tenant".
func TestClusterRefusalOfAnotherTenantDoesNotDependOnTheKey(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	const lease = 3 * time.Second
	tenants := func(c *tunnel.ServerConfig) { c.Auth = tenantAuth() }
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease, edit: tenants})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease, edit: tenants})
	_, err := a.connect(tunnel.WithToken(acmeToken), tunnel.WithReconnect(false)).Forward(ctxT(t),
		tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "right-key"}, hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})

	guesses := func(when string) {
		t.Helper()
		globex := b.connect(tunnel.WithToken(globexToken), tunnel.WithReconnect(false))
		var msgs []string
		for _, spec := range []tunnel.TunnelSpec{
			{Subdomain: "pool", Group: "web", GroupKey: "wrong-key"},
			{Subdomain: "pool", Group: "web", GroupKey: "right-key"},
			{Subdomain: "pool", Group: "other", GroupKey: "right-key"},
			{Subdomain: "pool"},
		} {
			_, err := globex.Forward(ctxT(t), spec, hostPort(backend(t, "G").URL))
			require.ErrorIs(t, err, tunnel.ErrOwned, "%s: group %q key %q", when, spec.Group, spec.GroupKey)
			msgs = append(msgs, err.Error())
		}
		for _, m := range msgs {
			require.Equal(t, msgs[0], m, "%s: the refusals differ", when)
		}
	}
	guesses("edge a serving the pool")
	a.kill()
	guesses("edge a just died")
	tenant, held := b.c.ServedElsewhere(store.KindHTTP, "pool")
	require.True(t, held && tenant == "acme", "a's member records were gone before the guesses: the refusals came from the route's record")
}

// max_routes counts a tenant's routes over the whole cluster: claims made on another edge
// count once this edge's sweep has read them (every RouteTTL/4, at most a minute; 1 s here),
// and this edge's own at once. max_tunnels, by contrast, counts per edge: with max_tunnels 1
// the tenant holds a tunnel on each edge.
func TestClusterMaxRoutesCountsEveryEdgesClaims(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	quota := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
		c.RouteTTL = 4 * time.Second // the sweep runs every second
		c.Limits.Tenant = tunnel.TenantLimits{MaxRoutes: 2, MaxTunnels: 1}
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: quota})
	b := startClusterEdge(t, nodes, "b", clusterOpts{edit: quota})
	c := startClusterEdge(t, nodes, "c", clusterOpts{edit: quota})
	be := hostPort(backend(t, "A").URL)
	_, err := a.connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "r0"}, be)
	require.NoError(t, err)
	sb := b.connect(tunnel.WithToken(acmeToken))
	_, err = sb.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "r1"}, be)
	require.NoError(t, err, "max_tunnels 1 counts on each edge: one here too")
	time.Sleep(2500 * time.Millisecond) // two sweeps on each edge

	_, err = c.connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "r2"}, be)
	require.ErrorIs(t, err, tunnel.ErrLimit, "r0 on a and r1 on b make acme's 2 routes")
	require.ErrorContains(t, err, "max_routes")
	_, err = c.connect(tunnel.WithToken(globexToken)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "g0"}, be)
	require.NoError(t, err, "another tenant's quota is its own")
}
