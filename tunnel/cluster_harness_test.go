package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
)

const clusterToken = "cluster-secret"

// startNATSCluster starts n embedded NATS servers with JetStream on 127.0.0.1 (one alone,
// or a cluster of n routed to each other) and waits until JetStream answers; they stop at
// the end of the test. The route ports are picked free and closed before the servers bind
// them: when another socket took one meanwhile (the servers then never get ready), the
// cluster is started again on new ports.
func startNATSCluster(t testing.TB, n int) []*server.Server {
	t.Helper()
	var nodes []*server.Server
	for attempt := 1; ; attempt++ {
		var ready bool
		nodes, ready = tryNATSCluster(t, n)
		if ready {
			break
		}
		for _, ns := range nodes {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
		require.Less(t, attempt, 3, "NATS servers not ready")
		t.Logf("NATS servers not ready (attempt %d): starting them again on other ports", attempt)
	}
	// JetStream is ready once a replicated bucket can be made.
	nc, err := nats.Connect(nodes[0].ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ready", Replicas: n, Storage: jetstream.MemoryStorage})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "JetStream not ready")
	return nodes
}

// tryNATSCluster starts n NATS servers (stopped at the end of the test) and reports whether
// all of them got ready within 10 s.
func tryNATSCluster(t testing.TB, n int) ([]*server.Server, bool) {
	t.Helper()
	var nodes []*server.Server
	// Route ports chosen up front, so that every node lists every other.
	var routes []*url.URL
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		routes = append(routes, &url.URL{Scheme: "nats", Host: l.Addr().String()})
		require.NoError(t, l.Close())
	}
	for i := range n {
		opts := &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
		if n > 1 {
			opts.Cluster = server.ClusterOpts{Name: "warren-test", Host: "127.0.0.1", Port: ports[i]}
			opts.Routes = routes
		}
		ns, err := server.NewServer(opts)
		require.NoError(t, err)
		ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		nodes = append(nodes, ns)
	}
	for _, ns := range nodes {
		if !ns.ReadyForConnections(10 * time.Second) {
			return nodes, false
		}
	}
	return nodes, true
}

func natsURLs(nodes []*server.Server) []string {
	var out []string
	for _, ns := range nodes {
		out = append(out, ns.ClientURL())
	}
	return out
}

// clusterEdge is one edge of a test cluster, serving on host (127.0.0.x).
type clusterEdge struct {
	*testEdge
	id       string
	host     string
	peerAddr string
	cfg      ServerConfig
}

type clusterOpts struct {
	host     string // 127.0.0.1 if empty
	lease    time.Duration
	replicas int
	edit     func(*ServerConfig)
	peerAddr string // reuse an address (a restart)
	public   string // reuse a public address (a restart)
}

// startClusterEdge starts an edge with id in the cluster on nodes. Its Close runs at cleanup.
func startClusterEdge(t testing.TB, nodes []*server.Server, id string, o clusterOpts) *clusterEdge {
	t.Helper()
	if o.host == "" {
		o.host = "127.0.0.1"
	}
	if o.lease == 0 {
		o.lease = time.Second
	}
	listen := func(addr string) net.Listener {
		if addr == "" {
			addr = o.host + ":0"
		}
		var l net.Listener
		require.Eventually(t, func() bool {
			var err error
			l, err = net.Listen("tcp", addr)
			return err == nil
		}, 5*time.Second, 20*time.Millisecond, "listen %s", addr)
		return l
	}
	peer := listen(o.peerAddr)
	ctl, pub := listen(""), listen(o.public)
	cfg := ServerConfig{
		Domain:         testDomain,
		Logger:         zaptest.NewLogger(t).Named(id),
		LoadBalancing:  true,
		TCPPorts:       group.PortRange{Lo: 31300, Hi: 31399}, // below the ephemeral range: no client socket holds one
		TCPBindHost:    o.host,
		PublicHTTPPort: pub.Addr().(*net.TCPAddr).Port,
		Cluster: &ClusterConfig{NATSURLs: natsURLs(nodes), EdgeID: id, Advertise: peer.Addr().String(),
			Token: clusterToken, LeaseTTL: o.lease, Replicas: max(o.replicas, 1), Timeout: 2 * time.Second,
			NATSOptions: []nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}},
	}
	if o.edit != nil {
		o.edit(&cfg)
	}
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	e := &testEdge{Server: srv, t: t}
	e.controlAddr, e.publicAddr = ctl.Addr().String(), pub.Addr().String()
	for _, sv := range []struct {
		l     net.Listener
		serve func(net.Listener) error
	}{{ctl, srv.Serve}, {pub, srv.ServePublic}, {peer, srv.ServePeers}} {
		e.served.Go(func() { _ = sv.serve(sv.l) })
	}
	e.client = publicClient(e.publicAddr)
	ce := &clusterEdge{testEdge: e, id: id, host: o.host, peerAddr: peer.Addr().String(), cfg: cfg}
	t.Cleanup(ce.close)
	return ce
}

// close stops the edge gracefully (idempotent).
func (e *clusterEdge) close() {
	e.client.CloseIdleConnections()
	_ = e.Close()
	e.served.Wait()
}

// kill stops the edge as kill -9 would, as far as the others can tell: its links and
// connections drop, and its lease and member records stay until the lease lapses.
func (e *clusterEdge) kill() {
	e.stopCluster(false)
	e.close()
}

// info is the edge's view of its cluster: what its operator plane serves as GET /api/cluster
// and renders as the warren_cluster_edges and warren_cluster_nats_connected series.
func (e *clusterEdge) info() ClusterStatus { return e.cluster.info() }

// edgeIDs returns the edge id of each member of the group label the edge sees ("" stands for
// the edge itself: its own id), in join order, as its operator plane lists them.
func (e *clusterEdge) edgeIDs(label string) []string {
	var out []string
	for _, g := range e.Registry().Groups() {
		if g.Label != label {
			continue
		}
		for _, m := range g.Members {
			id := m.Edge
			if id == "" {
				id = e.id
			}
			out = append(out, id)
		}
	}
	return out
}

// members returns the edge ids of the members of the group label the edge sees, healthy ones.
func (e *clusterEdge) members(label string) map[string]int {
	out := map[string]int{}
	for _, g := range e.Registry().Groups() {
		if g.Label != label {
			continue
		}
		for _, m := range g.Members {
			if m.Healthy && !m.Draining {
				id := m.Edge
				if id == "" {
					id = e.id
				}
				out[id]++
			}
		}
	}
	return out
}

// waitMembers waits until the edge sees want healthy members of label per edge id.
func (e *clusterEdge) waitMembers(t testing.TB, label string, want map[string]int) {
	t.Helper()
	require.Eventually(t, func() bool {
		got := e.members(label)
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "edge %s: members of %s: got %v, want %v", e.id, label, e.members(label), want)
}

// counter counts answers by body.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(k string) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[k]++
	c.mu.Unlock()
}

func (c *counter) get() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

var errStatus = errors.New("unexpected status")

// onNode places edge i of a three-edge test cluster: on host 127.0.0.(i+1), connected to
// NATS node i (and node i+1 as its second URL, for failover), buckets with 3 replicas;
// edit, if any, is applied after.
func onNode(nodes []*server.Server, i int, edit func(*ServerConfig)) clusterOpts {
	return clusterOpts{host: fmt.Sprintf("127.0.0.%d", i+1), replicas: 3, edit: func(c *ServerConfig) {
		c.Cluster.NATSURLs = []string{nodes[i].ClientURL(), nodes[(i+1)%len(nodes)].ClientURL()}
		if edit != nil {
			edit(c)
		}
	}}
}

// startThreeEdges starts a 3-node NATS cluster and edges a, b and c, each on its own node
// and host (onNode).
func startThreeEdges(t testing.TB, edit func(*ServerConfig)) ([]*server.Server, []*clusterEdge) {
	t.Helper()
	nodes := startNATSCluster(t, 3)
	var edges []*clusterEdge
	for i, id := range []string{"a", "b", "c"} {
		edges = append(edges, startClusterEdge(t, nodes, id, onNode(nodes, i, edit)))
	}
	return nodes, edges
}

// raceKeys registers a member of pool sub on each of edges at once, each with its own key
// (k1, k2, ...) and a new session, and returns the registrations' errors.
func raceKeys(t testing.TB, sub string, edges ...*clusterEdge) []error {
	t.Helper()
	sessions := make([]*Session, len(edges))
	for i, e := range edges {
		sessions[i] = e.connect(WithReconnect(false))
	}
	errs := make([]error, len(edges))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			<-start
			_, errs[i] = sessions[i].Forward(ctxT(t), TunnelSpec{Subdomain: sub, Group: "g", GroupKey: fmt.Sprintf("k%d", i+1)},
				hostPort(backend(t, fmt.Sprint(i)).URL))
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// twoEdgesWithAMemberEach starts edges a and b (lease lease) with one member each of pool
// "pool", and waits until both edges see both members.
func twoEdgesWithAMemberEach(t testing.TB, nodes []*server.Server, lease time.Duration) (a, b *clusterEdge) {
	t.Helper()
	a = startClusterEdge(t, nodes, "a", clusterOpts{lease: lease})
	b = startClusterEdge(t, nodes, "b", clusterOpts{lease: lease})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	_, err = b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	both := map[string]int{"a": 1, "b": 1}
	a.waitMembers(t, "pool", both)
	b.waitMembers(t, "pool", both)
	return a, b
}

// jetStreamOn connects a JetStream client of its own to node (closed at the end of the
// test), for a test that acts on the buckets behind the edges' backs, and returns it with a
// context bounding its requests to 5 s.
func jetStreamOn(t testing.TB, node *server.Server) (jetstream.JetStream, context.Context) {
	t.Helper()
	nc, err := nats.Connect(node.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return js, ctx
}

// staleRoutes registers on e, and closes at once, a pool member (key k0) of the subdomains
// old0 to old<n-1>, then waits until each route is recorded empty and both its emptiness and
// its last claim are older than lease: a claim or emptiness within the lease would by itself
// serialise registrations racing on the route, which the caller means to race.
func staleRoutes(t testing.TB, e *clusterEdge, n int, lease time.Duration) {
	t.Helper()
	for i := range n {
		first, err := e.connect(WithReconnect(false)).Forward(ctxT(t), TunnelSpec{Subdomain: fmt.Sprintf("old%d", i), Group: "g", GroupKey: "k0"},
			hostPort(backend(t, "0").URL))
		require.NoError(t, err)
		require.NoError(t, first.Close())
	}
	require.Eventually(t, func() bool {
		for i := range n {
			r, err := e.routes.st.Get(t.Context(), fmt.Sprintf("http/old%d", i))
			if err != nil || r == nil || r.EmptySince.IsZero() || time.Since(r.EmptySince) <= lease || time.Since(r.Claimed) <= lease {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the routes were not recorded empty for longer than the lease")
}
