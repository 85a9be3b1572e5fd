package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
)

// A pool whose members are attached to two edges of three is one pool on all three: each
// edge dispatches to both members, another edge's over the edge-to-edge link, and lists both
// with their edge ids (three edges, each on its own node of a 3-node NATS cluster).
func TestClusterPoolSpansEdges(t *testing.T) {
	_, edges := startThreeEdges(t, nil)
	a, b := edges[0], edges[1]
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(slowBackend(t, "A").URL))
	require.NoError(t, err)
	_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(slowBackend(t, "B").URL))
	require.NoError(t, err)
	both := map[string]int{"a": 1, "b": 1}
	for _, e := range edges {
		e.waitMembers(t, "pool", both)
	}

	// Edge c has no member of its own: every request it takes crosses a link.
	for _, e := range edges {
		// Concurrent requests load the local member: least streams sends the others over.
		var seen counter
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 5 {
					code, body := e.get("pool", "/x")
					require.Equal(t, 200, code, body)
					seen.add(strings.Fields(body)[0])
				}
			})
		}
		wg.Wait()
		got := seen.get()
		require.Greater(t, got["A"], 3, "edge %s: %v", e.id, got)
		require.Greater(t, got["B"], 3, "edge %s: %v", e.id, got)

		// Its operator plane lists the pool once, with both members and their edge ids.
		gs := e.groups(t)
		require.Len(t, gs, 1)
		require.Equal(t, 2, gs[0].MemberCount)
		require.Equal(t, 2, gs[0].HealthyCount)
		var ids []string
		for _, m := range gs[0].Members {
			ids = append(ids, m.EdgeID)
		}
		require.ElementsMatch(t, []string{"a", "b"}, ids)

		// The metrics count the pool cluster-wide too.
		metrics := e.scrape(t)
		require.Contains(t, metrics, `warren_group_members{group="web",healthy="true",region="local"} 2`)
		for _, id := range []string{"a", "b"} {
			require.Contains(t, metrics, `warren_cluster_members{edge_id="`+id+`",group="web",healthy="true",region="local"} 1`)
		}
		require.Contains(t, metrics, `warren_cluster_edges{lease="held"} 3`)
		require.Contains(t, metrics, "warren_cluster_nats_connected 1")

		var ci admin.ClusterInfo
		e.adminJSON(t, "/api/cluster", &ci)
		require.True(t, ci.NATS)
		require.True(t, ci.Enabled)
		require.Equal(t, e.id, ci.Self)
		require.Len(t, ci.Edges, 3)
		for _, ce := range ci.Edges {
			require.Equal(t, "held", ce.Lease, "%+v", ce)
			require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 0}[ce.ID], ce.Members, "%+v", ce)
		}
	}
}

// A pool of two members, each attached to another edge of two: sequential requests through
// either edge (every pick a tie) rotate over both members, as on one edge, not all to the
// edge's own member. With PreferLocalStreams 1 (an opt-in), ties go to the local member.
func TestClusterTiesRotateOverThePool(t *testing.T) {
	for _, prefer := range []int{0, 1} {
		t.Run(fmt.Sprintf("prefer_local_streams=%d", prefer), func(t *testing.T) {
			nodes := startNATSCluster(t, 1)
			opts := clusterOpts{edit: func(c *tunnel.ServerConfig) { c.LoadBalancing.PreferLocalStreams = prefer }}
			a := startClusterEdge(t, nodes, "a", opts)
			b := startClusterEdge(t, nodes, "b", opts)
			_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
			require.NoError(t, err)
			_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
			require.NoError(t, err)
			for _, e := range []*clusterEdge{a, b} {
				e.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
				// The requests through the other edge carried streams of its own member: until
				// their end reaches this edge in the other's published load, that member looks
				// busy and no pick is a tie. On a loaded machine that takes a moment.
				require.Eventually(t, func() bool {
					for _, g := range e.Registry().Groups() {
						for _, m := range g.Members {
							if g.Label == "pool" && m.Edge != "" && m.Active != 0 {
								return false
							}
						}
					}
					return true
				}, 10*time.Second, 10*time.Millisecond, "edge %s: the other edge's member idle: %+v", e.id, e.Registry().Groups())
				var seen counter
				for range 40 {
					code, body := e.get("pool", "/")
					require.Equal(t, 200, code)
					seen.add(strings.Fields(body)[0])
				}
				got, local := seen.get(), strings.ToUpper(e.id)
				if prefer == 0 {
					// Each pick is a tie unless the other edge's last published load of its
					// member lags a request behind: a few may go the same way twice.
					require.InDelta(t, 20, got["A"], 4, "through edge %s: %v", e.id, got)
					require.InDelta(t, 20, got["B"], 4, "through edge %s: %v", e.id, got)
				} else {
					require.Equal(t, 40, got[local], "through edge %s: %v", e.id, got)
				}
			}
		})
	}
}

// Two first registrations of one route, racing on three edges with three keys: exactly one
// wins everywhere; the others get the usual refusal, and the winner's pool is the route on
// every edge.
func TestClusterConflictingFirstRegistrations(t *testing.T) {
	// Three edges, each on its own node of a 3-node NATS cluster, buckets with 3 replicas.
	_, edges := startThreeEdges(t, nil)
	for round := range 5 {
		sub := fmt.Sprintf("race%d", round)
		sessions := make([]*tunnel.Session, len(edges))
		for i, e := range edges {
			sessions[i] = e.connect(tunnel.WithReconnect(false))
		}
		var wg sync.WaitGroup
		errs := make([]error, len(edges))
		start := make(chan struct{})
		for i := range edges {
			wg.Go(func() {
				<-start
				_, errs[i] = sessions[i].Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: sub, Group: "g", GroupKey: fmt.Sprintf("key-%d", i)},
					hostPort(backend(t, fmt.Sprintf("E%d", i)).URL))
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				require.Equal(t, -1, winner, "round %d: two registrations won: %v", round, errs)
				winner = i
				continue
			}
			require.ErrorIs(t, err, group.ErrKeyMismatch, "round %d", round)
			require.Contains(t, err.Error(), "group key does not match for subdomain '"+sub+"'")
		}
		require.NotEqual(t, -1, winner, "round %d: nobody won: %v", round, errs)
		want := fmt.Sprintf("E%d /", winner)
		for _, e := range edges {
			e.waitMembers(t, sub, map[string]int{edges[winner].id: 1})
			code, body := e.get(sub, "/")
			require.Equal(t, 200, code)
			require.Equal(t, want, body)
		}
		for _, s := range sessions {
			_ = s.Close()
		}
	}
}

// A TCP pool has one public port on every edge, so that DNS can name all of them; two pools
// created at once on two edges get two different ports.
func TestClusterTCPPortOnEveryEdge(t *testing.T) {
	// Edges on 127.0.0.1, .2 and .3, each on its own NATS node, 3 replicas.
	_, edges := startThreeEdges(t, nil)
	var wg sync.WaitGroup
	tunnels := make([]*tunnel.Tunnel, 2)
	errs := make([]error, 2)
	for i, name := range []string{"db", "cache"} {
		sess, backendAddr := edges[i].connect(), tcpNamed(t, name)
		wg.Go(func() {
			tunnels[i], errs[i] = sess.Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: name, GroupKey: "k"}, backendAddr)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.NotZero(t, tunnels[0].Port())
	require.NotEqual(t, tunnels[0].Port(), tunnels[1].Port())
	for i, name := range []string{"db", "cache"} {
		for _, e := range edges {
			e.waitMembers(t, name, map[string]int{edges[i].id: 1})
			got, err := readTCP(net.JoinHostPort(e.host, fmt.Sprint(tunnels[i].Port())))
			require.NoError(t, err)
			require.Equal(t, name, got, "edge %s", e.id)
		}
	}
	// A second member on another edge joins the same pool on the same port.
	t2, err := edges[2].connect().Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, tcpNamed(t, "db2"))
	require.NoError(t, err)
	require.Equal(t, tunnels[0].Port(), t2.Port())
}

// An edge killed under load (three edges on a 3-node NATS cluster): requests arriving at the
// surviving edges keep succeeding (the dead edge's members leave at once, as its link drops);
// its connector reconnects to a surviving edge and registers again without "already in use";
// both surviving edges then see the pool on that edge.
func TestClusterEdgeKilledUnderLoad(t *testing.T) {
	_, edges := startThreeEdges(t, nil)
	a, b, c := edges[0], edges[1], edges[2]
	// The connector on a fails over to b, as with `servers: [a, b]`.
	var dials atomic.Int32
	failover := tunnel.WithDialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
		addr := a.ControlAddr
		if dials.Add(1) > 1 {
			addr = b.ControlAddr
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	})
	ta, err := a.connect(failover).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
	c.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})

	var ok, failed atomic.Int64
	var lastErr atomic.Value
	ctx, stop := context.WithCancel(context.Background())
	var load sync.WaitGroup
	for _, e := range []*clusterEdge{b, b, c, c} { // c has no member: its requests all cross a link
		load.Go(func() {
			for ctx.Err() == nil {
				resp, err := e.Client.Get(e.URL("pool", "/"))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						ok.Add(1)
						continue
					}
					err = fmt.Errorf("%w %d", errStatus, resp.StatusCode)
				}
				failed.Add(1)
				lastErr.Store(err.Error())
			}
		})
	}
	require.Eventually(t, func() bool { return ok.Load() > 50 }, 10*time.Second, 5*time.Millisecond)
	a.kill()
	// The connector's tunnel comes back on b, as every surviving edge sees.
	for _, e := range []*clusterEdge{b, c} {
		require.Eventually(t, func() bool { return e.members("pool")["b"] == 2 }, 10*time.Second, 10*time.Millisecond,
			"%s sees %v", e.id, e.members("pool"))
	}
	before := ok.Load()
	require.Eventually(t, func() bool { return ok.Load() > before+50 }, 10*time.Second, 5*time.Millisecond)
	stop()
	load.Wait()
	// Requests in flight on the dead edge's member when it died may fail (at most one per
	// client); nothing else.
	require.LessOrEqual(t, failed.Load(), int64(4), "failed %d of %d; last: %v", failed.Load(), ok.Load(), lastErr.Load())
	t.Logf("%d requests succeeded, %d failed", ok.Load(), failed.Load())
	require.NoError(t, ta.Err())
	require.Equal(t, map[string]int{"b": 2}, b.members("pool"))
	require.Equal(t, map[string]int{"b": 2}, c.members("pool"))
}

// A member whose edge keeps its links but stops renewing its lease (it lost NATS) leaves
// the other edges' views within the lease.
func TestClusterLeaseLapseRemovesMembers(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	lease := 600 * time.Millisecond
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b := startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	// a's NATS connection goes; its link to b stays.
	a.c.nc.Close()
	gone := time.Now()
	require.Eventually(t, func() bool { return len(b.members("pool")) == 0 }, 5*time.Second, 10*time.Millisecond)
	require.Less(t, time.Since(gone), lease+time.Second, "members left after %v (lease %v)", time.Since(gone), lease)
	var ci admin.ClusterInfo
	b.adminJSON(t, "/api/cluster", &ci)
	require.Len(t, ci.Edges, 2)
	require.Eventually(t, func() bool { return edgeLease(b, "a") == "expired" }, 5*time.Second, 10*time.Millisecond,
		"%+v", b.info().Edges)
	b.adminJSON(t, "/api/cluster", &ci)
	require.Equal(t, "expired", ci.Edges[1].Lease, "%+v", ci.Edges)
	require.Contains(t, b.scrape(t), `warren_cluster_edges{lease="expired"} 1`)
	require.Contains(t, a.scrape(t), "warren_cluster_nats_connected 0")
	// a keeps serving what it knows without NATS, and refuses to claim new routes.
	code, body := a.get("pool", "/")
	require.Equal(t, 200, code, body)
	_, err = a.connect().Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "fresh", Group: "g", GroupKey: "k"}, hostPort(backend(t, "F").URL))
	require.ErrorIs(t, err, tunnel.ErrUnavailable)
}

// A pool that falls to zero healthy members across all edges fires one alert, not one per
// edge; its recovery likewise (recovery alerts asked for).
func TestClusterOneAlertPerPool(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	rcv := newReceiver(t)
	alerting := func(c *tunnel.ServerConfig) {
		c.Alerts.WebhookURL = rcv.URL
		c.Alerts.AllowPrivateWebhooks = true
		c.Alerts.OnRecovery = true
	}
	edges := []*clusterEdge{
		startClusterEdge(t, nodes, "a", clusterOpts{edit: alerting}),
		startClusterEdge(t, nodes, "b", clusterOpts{edit: alerting}),
		startClusterEdge(t, nodes, "c", clusterOpts{edit: alerting}),
	}
	var sw [2]switchable
	for i := range sw {
		spec := clusterPool("k")
		spec.Health = sw[i].spec()
		_, err := edges[i].connect().Forward(ctxT(t), spec, hostPort(backend(t, fmt.Sprint(i)).URL))
		require.NoError(t, err)
	}
	for _, e := range edges {
		e.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
	}
	for i := range sw {
		sw[i].down.Store(true)
	}
	// asked is whether every edge decided on one alert of event, and asked the cluster
	// whether to send it; sent how many of them the cluster told to send it.
	asked := func(e *clusterEdge, event string) func() bool {
		return func() bool { n, _ := e.alerts.decided(event); return n == 1 }
	}
	sent := func(event string) int {
		n := 0
		for _, e := range edges {
			_, s := e.alerts.decided(event)
			n += s
		}
		return n
	}
	require.Eventually(t, func() bool { return len(rcv.alerts()) >= 1 }, 10*time.Second, 10*time.Millisecond)
	// Every edge has seen the pool fall (and had its chance to alert).
	for _, e := range edges {
		require.Eventually(t, func() bool { return len(e.members("pool")) == 0 }, 10*time.Second, 10*time.Millisecond)
		require.Eventually(t, asked(e, "group_zero_healthy"), 10*time.Second, 10*time.Millisecond, "edge %s", e.id)
	}
	require.Equal(t, 1, sent("group_zero_healthy"), "edges told to send the pool's fall")
	sw[0].down.Store(false)
	require.Eventually(t, func() bool { return len(rcv.alerts()) >= 2 }, 10*time.Second, 10*time.Millisecond)
	for _, e := range edges {
		require.Eventually(t, asked(e, "group_recovered"), 10*time.Second, 10*time.Millisecond, "edge %s", e.id)
	}
	require.Equal(t, 1, sent("group_recovered"), "edges told to send the pool's recovery")
	// Let any duplicate arrive: the sender queues at once, so a short wait is enough.
	time.Sleep(200 * time.Millisecond)
	got := rcv.alerts()
	require.Len(t, got, 2, "%+v", got)
	require.Equal(t, "group_zero_healthy", got[0].Event)
	require.Equal(t, "group_recovered", got[1].Event)
}

// By default (the alert document's rule) a pool that falls, recovers and falls again well
// within a lease alerts once per fall across the cluster, never with group_recovered: every
// edge records the recovery, so that the second fall is not taken for another edge's copy of
// the first.
func TestClusterAlertsEveryFallOfAFlappingPool(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	rcv := newReceiver(t)
	opts := clusterOpts{lease: 10 * time.Second, edit: func(c *tunnel.ServerConfig) {
		c.Alerts.WebhookURL = rcv.URL
	}}
	edges := []*clusterEdge{startClusterEdge(t, nodes, "a", opts), startClusterEdge(t, nodes, "b", opts)}
	var sw switchable
	spec := clusterPool("k")
	spec.Health = sw.spec()
	_, err := edges[0].connect().Forward(ctxT(t), spec, hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	for _, e := range edges {
		e.waitMembers(t, "pool", map[string]int{"a": 1})
	}
	start := time.Now()
	zeros := func(n int) func() bool {
		return func() bool {
			a, _ := edges[0].alerts.decided("group_zero_healthy")
			b, _ := edges[1].alerts.decided("group_zero_healthy")
			return a == n && b == n
		}
	}
	sw.down.Store(true)
	require.Eventually(t, zeros(1), 10*time.Second, 10*time.Millisecond, "every edge decided on the first fall")
	sw.down.Store(false)
	for _, e := range edges {
		e.waitMembers(t, "pool", map[string]int{"a": 1})
	}
	sw.down.Store(true)
	require.Eventually(t, zeros(2), 10*time.Second, 10*time.Millisecond, "every edge decided on the second fall")
	require.Eventually(t, func() bool { return len(rcv.alerts()) >= 2 }, 10*time.Second, 10*time.Millisecond,
		"the second fall was decided on every edge but sent by none: %+v", rcv.alerts())
	require.Less(t, time.Since(start), 10*time.Second, "all within one lease")
	// Let any duplicate arrive: the sender queues at once, so a short wait is enough.
	time.Sleep(200 * time.Millisecond)
	got := rcv.alerts()
	require.Len(t, got, 2, "%+v", got)
	require.Equal(t, "group_zero_healthy", got[0].Event)
	require.Equal(t, "group_zero_healthy", got[1].Event)
}

// Every edge of three restarted (one after the other, and then all at once): route
// ownership, key hashes and TCP ports are kept in NATS (3 replicas on a 3-node cluster);
// another tenant still cannot take the routes.
func TestClusterRestartKeepsOwnershipAndPorts(t *testing.T) {
	tenants := func(c *tunnel.ServerConfig) {
		c.Auth = tenantAuth()
	}
	nodes, edges := startThreeEdges(t, tenants)
	ta, err := edges[0].connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, tcpNamed(t, "db"))
	require.NoError(t, err)
	port := ta.Port()
	_, err = edges[1].connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	restart := func(i int) {
		edges[i].close()
		edges[i] = startClusterEdge(t, nodes, edges[i].id, onNode(nodes, i, tenants))
	}
	// One after the other, then all at once.
	for i := range edges {
		restart(i)
	}
	for _, e := range edges {
		e.close()
	}
	for i := range edges {
		edges[i] = startClusterEdge(t, nodes, edges[i].id, onNode(nodes, i, tenants))
	}
	for _, e := range edges {
		_, err = e.connect(tunnel.WithToken(globexToken)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
		require.ErrorIs(t, err, tunnel.ErrOwned)
		_, err = e.connect(tunnel.WithToken(globexToken)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, tcpNamed(t, "x"))
		require.ErrorIs(t, err, tunnel.ErrOwned)
	}
	ta, err = edges[1].connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, tcpNamed(t, "db"))
	require.NoError(t, err)
	require.Equal(t, port, ta.Port())
	for _, e := range edges {
		e.waitMembers(t, "db", map[string]int{"b": 1})
		got, err := readTCP(net.JoinHostPort(e.host, fmt.Sprint(port)))
		require.NoError(t, err)
		require.Equal(t, "db", got, "edge %s", e.id)
	}
	// The owner may come back with its key, on any edge.
	_, err = edges[0].connect(tunnel.WithToken(acmeToken)).Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
}

// One NATS node of three lost: the three edges (each on its own node) keep serving, the
// edge whose node went moves to its second URL and keeps its members in every view, and new
// routes are still claimed (the buckets have three replicas).
func TestClusterSurvivesANATSNodeLoss(t *testing.T) {
	nodes, edges := startThreeEdges(t, nil)
	a, b, c := edges[0], edges[1], edges[2]
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	for _, e := range edges {
		e.waitMembers(t, "pool", map[string]int{"a": 1})
	}
	nodes[0].Shutdown() // a's node: a moves to its second URL
	nodes[0].WaitForShutdown()
	for _, e := range edges {
		code, _ := e.get("pool", "/")
		require.Equal(t, 200, code, "edge %s", e.id)
	}
	require.Eventually(t, func() bool {
		_, err := b.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "later", Group: "g", GroupKey: "k"}, hostPort(backend(t, "L").URL))
		return err == nil
	}, 20*time.Second, 200*time.Millisecond)
	for _, e := range []*clusterEdge{a, c} {
		e.waitMembers(t, "later", map[string]int{"b": 1})
		code, body := e.get("later", "/")
		require.Equal(t, 200, code)
		require.Equal(t, "L /", body)
	}
	// a's member is still renewed through a's second node: it stays in every view.
	time.Sleep(2 * a.c.Lease())
	for _, e := range edges {
		e.waitMembers(t, "pool", map[string]int{"a": 1})
	}
}

// NATS lost altogether: an edge serves what it knows and refuses new routes; when NATS
// returns, it writes its members again and the other edges see them.
func TestClusterReconcilesWhenNATSReturns(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	// Cut a off NATS by closing its connection's socket: the client reconnects by itself.
	require.NoError(t, a.c.nc.ForceReconnect())
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	code, _ := b.get("pool", "/")
	require.Equal(t, 200, code)
}

// Dispatch counts the streams other edges have open to a remote member (as its edge
// publishes them): an edge with no member of its own sends new requests to the idle member,
// not to the one busy with another edge's requests.
func TestClusterDispatchCountsPublishedLoad(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	c := startClusterEdge(t, nodes, "c", clusterOpts{})
	release := make(chan struct{})
	var held sync.WaitGroup
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
		_, _ = io.WriteString(w, "A")
	}))
	t.Cleanup(busy.Close)
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }); held.Wait() }
	t.Cleanup(unhold)
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(busy.URL))
	require.NoError(t, err)
	a.waitMembers(t, "pool", map[string]int{"a": 1})
	// Six requests held open on a's member, through edge a (its only member so far).
	for range 6 {
		held.Go(func() {
			resp, err := a.Client.Get(a.URL("pool", "/hold"))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	require.Eventually(t, func() bool { return activeOn(a, "pool", "") == 6 }, 5*time.Second, 5*time.Millisecond)
	_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	c.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
	// c learns a's load from a's lease renewals.
	require.Eventually(t, func() bool { return activeOn(c, "pool", "a") == 6 }, 5*time.Second, 10*time.Millisecond)
	for range 20 {
		code, body := c.get("pool", "/")
		require.Equal(t, 200, code)
		require.Equal(t, "B /", body)
	}
	unhold() // before the connectors close (their drain would wait for the held requests)
}

// activeOn is the load edge e sees on the member of label attached to edge id ("" for e's own).
func activeOn(e *clusterEdge, label, id string) int64 {
	for _, g := range e.Registry().Groups() {
		if g.Label != label {
			continue
		}
		for _, m := range g.Members {
			if m.Edge == id {
				return m.Active
			}
		}
	}
	return -1
}

// Shutdown of an edge whose member another edge keeps idle keep-alive streams to (they count
// as streams in flight on the member) returns promptly: it announces its members as draining
// first, and the other edge closes its idle streams to them.
func TestClusterShutdownWithForwardedIdleStreams(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	for range 3 {
		code, _ := b.get("pool", "/") // forwarded; the stream stays pooled on b
		require.Equal(t, 200, code)
	}
	require.Eventually(t, func() bool { return activeOn(a, "pool", "") > 0 }, 5*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, a.Shutdown(ctx))
	require.Less(t, time.Since(start), 3*time.Second)
}

// The retry rule holds across the edge-to-edge hop: a member on another edge whose backend
// is down refuses the forwarded stream before any byte reached an app, and the request goes
// to another member; a draining member on another edge takes no new work.
func TestClusterRetryAndDrainAcrossTheHop(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	c := startClusterEdge(t, nodes, "c", clusterOpts{})
	// A port nobody listens on: dials to it are refused at once. (A listener left open,
	// even one that never accepts, would take connections into its backlog: the connector
	// would acknowledge them and the request would count as delivered.)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	require.NoError(t, l.Close())
	_, err = a.connect().Forward(ctxT(t), clusterPool("k"), dead)
	require.NoError(t, err)
	var posts atomic.Int64
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		posts.Add(1)
		_, _ = fmt.Fprintf(w, "B %s", body)
	}))
	t.Cleanup(live.Close)
	tb, err := b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(live.URL))
	require.NoError(t, err)
	c.waitMembers(t, "pool", map[string]int{"a": 1, "b": 1})
	for i := range 40 {
		resp, err := c.Client.Post(c.URL("pool", "/"), "text/plain", strings.NewReader(fmt.Sprint(i)))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, string(body))
		require.Equal(t, fmt.Sprintf("B %d", i), string(body))
	}
	require.EqualValues(t, 40, posts.Load(), "every POST reached the live backend exactly once")
	require.Greater(t, c.Operator().Counters().RetriesOpenFailed, uint64(0), "some requests were refused by a's member and retried")

	// b's member drains: c stops sending it new work at once.
	_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B2").URL))
	require.NoError(t, err)
	c.waitMembers(t, "pool", map[string]int{"a": 1, "b": 2})
	go func() { _ = tb.Close() }()
	require.Eventually(t, func() bool { return c.members("pool")["b"] == 1 }, 5*time.Second, 5*time.Millisecond)
	for range 10 {
		code, body := c.get("pool", "/")
		require.Equal(t, 200, code)
		require.Equal(t, "B2 /", body)
	}
}

// A request another edge forwarded to a local member leaves that edge's keep-alive stream to
// it open, and the member's edge counts it as one of the member's streams (against its cap
// of active streams, in active_streams, and in its drain) until it is closed. Once idle for
// longer than Timeouts.IdleStream it is never reused: it must be closed within about that
// much more, not at a periodic sweep 30 s later, or a member at MaxConcurrentPerMember 1
// refuses every request through its own edge for half a minute after one through the other.
func TestClusterForwardedIdleStreamFreesTheMember(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	opts := clusterOpts{edit: func(c *tunnel.ServerConfig) {
		c.LoadBalancing.MaxConcurrentPerMember = 1
		c.Timeouts.IdleStream = 300 * time.Millisecond
	}}
	a := startClusterEdge(t, nodes, "a", opts)
	b := startClusterEdge(t, nodes, "b", opts)
	_, err := b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	a.waitMembers(t, "pool", map[string]int{"b": 1})
	code, body := a.get("pool", "/")
	require.Equal(t, 200, code, body)
	require.Equal(t, "B /", body)
	localActive := func() int64 {
		for _, g := range b.Registry().Groups() {
			for _, m := range g.Members {
				if g.Label == "pool" && m.Edge == "" {
					return m.Active
				}
			}
		}
		return -1
	}
	start := time.Now()
	require.Eventually(t, func() bool { return localActive() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the forwarded keep-alive stream, idle past Timeouts.IdleStream, still counts on the member's edge")
	t.Logf("the member's edge counts the idle forwarded stream for %v", time.Since(start))
	code, body = b.get("pool", "/")
	require.Equal(t, 200, code, body)
	require.Equal(t, "B /", body)
}
