package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
	"github.com/warren-tunnel/warren/webhook"
)

// The cluster's tests run real edges (tunneltest.NewEdge), each given a Cluster of its own
// (New), against embedded NATS servers with JetStream: one alone, or three routed to each
// other with the edges on 127.0.0.1, .2 and .3. They are internal tests: where a promise is
// about what an edge of the cluster knows (its remote view, its links, its route store),
// they read the Cluster's own state.

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const clusterToken = "cluster-secret"

// adminToken is the bearer token of the edges' operator planes (package tunnel/admin).
const adminToken = "admin-token-0123456789"

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

// clusterEdge is one edge of a test cluster: a tunneltest.Edge (connectors and public HTTP
// on 127.0.0.1) whose ServerConfig.Cluster is c, serving the other edges' links with
// c.ServePeers on peerAddr. Its TCP groups' ports and its peer listener are on host
// (127.0.0.x).
type clusterEdge struct {
	*tunneltest.Edge
	t        testing.TB
	id       string
	host     string
	peerAddr string
	// c is the edge's Cluster; alerts is what the edge was given as ServerConfig.Cluster: c,
	// counting what ClaimAlert answered it.
	c      *Cluster
	alerts *alertClaims
	peers  sync.WaitGroup

	adminOnce sync.Once
	adminAddr string
}

type clusterOpts struct {
	host     string // 127.0.0.1 if empty
	lease    time.Duration
	replicas int
	edit     func(*tunnel.ServerConfig) // applied to the edge's configuration
	cluster  func(*Config)              // applied to the cluster's configuration, before New
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
	peer, err := net.Listen("tcp", o.host+":0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = peer.Close() }) // should the edge not start (Leave closes it otherwise)
	ccfg := Config{NATSURLs: natsURLs(nodes), EdgeID: id, Advertise: peer.Addr().String(),
		Token: clusterToken, LeaseTTL: o.lease, Replicas: max(o.replicas, 1), Timeout: 2 * time.Second,
		NATSOptions: []nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}}
	if o.cluster != nil {
		o.cluster(&ccfg)
	}
	c, err := New(ccfg)
	require.NoError(t, err)
	claims := &alertClaims{Cluster: c}
	cfg := tunnel.ServerConfig{
		Logger:        zaptest.NewLogger(t).Named(id),
		LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		TCP: tunnel.TCPTunnels{
			Ports:    group.PortRange{Lo: 31300, Hi: 31399}, // below the ephemeral range: no client socket holds one
			BindHost: o.host,
		},
		Cluster: claims,
	}
	if o.edit != nil {
		o.edit(&cfg)
	}
	e := &clusterEdge{Edge: tunneltest.NewEdge(t, cfg), t: t, id: id, host: o.host, peerAddr: peer.Addr().String(),
		c: c, alerts: claims}
	e.peers.Go(func() {
		if err := c.ServePeers(peer); !errors.Is(err, tunnel.ErrServerClosed) {
			t.Errorf("edge %s: ServePeers returned %v, want ErrServerClosed", id, err)
		}
	})
	t.Cleanup(e.close)
	return e
}

// close stops the edge gracefully (idempotent).
func (e *clusterEdge) close() {
	e.Client.CloseIdleConnections()
	_ = e.Close()
	e.peers.Wait()
}

// kill stops the edge as kill -9 would, as far as the others can tell: its links and
// connections drop, and its lease and member records stay until the lease lapses. (The
// cluster leaves without a goodbye first; the edge's own Leave is then a no-op.)
func (e *clusterEdge) kill() {
	e.c.Leave(false)
	e.close()
}

// connect dials a connector to the edge (tunneltest.Connect); Close runs at cleanup.
func (e *clusterEdge) connect(opts ...tunnel.Option) *tunnel.Session {
	e.t.Helper()
	return tunneltest.Connect(e.t, e.Edge, opts...)
}

// get fetches path on subdomain sub at the edge and returns status and body.
func (e *clusterEdge) get(sub, path string) (int, string) {
	e.t.Helper()
	resp, err := e.Client.Get(e.URL(sub, path))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(b)
}

// getCode fetches / on subdomain sub at the edge and returns its status, or 0 if the
// request failed; it does not fail the test, so that a polled condition may call it.
func (e *clusterEdge) getCode(sub string) int {
	resp, err := e.Client.Get(e.URL(sub, "/"))
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// info is the edge's view of its cluster: what its operator plane serves as GET /api/cluster
// and renders as the warren_cluster_edges and warren_cluster_nats_connected series.
func (e *clusterEdge) info() tunnel.ClusterStatus { return e.c.Status() }

// edgeLease is the lease state edge e shows for edge id in /api/cluster ("" when unlisted).
func edgeLease(e *clusterEdge, id string) string {
	for _, ce := range e.info().Edges {
		if ce.ID == id {
			return ce.Lease
		}
	}
	return ""
}

// admin starts the edge's operator plane (package tunnel/admin) on a listener of its own,
// once, and returns its address.
func (e *clusterEdge) admin() string {
	e.t.Helper()
	e.adminOnce.Do(func() {
		plane, err := admin.New(e.Server, admin.Options{Token: adminToken})
		require.NoError(e.t, err)
		e.t.Cleanup(plane.Close)
		e.adminAddr = e.ServeAdmin(plane.Handler())
	})
	return e.adminAddr
}

// adminGet fetches path from the edge's operator plane, as the operator, and returns its body.
func (e *clusterEdge) adminGet(t testing.TB, path string) []byte {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+e.admin()+path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", path, body)
	return body
}

// adminJSON decodes what the edge's operator plane answers GET path with into v.
func (e *clusterEdge) adminJSON(t testing.TB, path string, v any) {
	t.Helper()
	require.NoError(t, json.Unmarshal(e.adminGet(t, path), v))
}

// groups returns what the edge's admin API lists (GET /api/groups).
func (e *clusterEdge) groups(t testing.TB) []admin.GroupInfo {
	t.Helper()
	var out []admin.GroupInfo
	e.adminJSON(t, "/api/groups", &out)
	return out
}

// scrape returns the edge's /metrics.
func (e *clusterEdge) scrape(t testing.TB) string {
	t.Helper()
	return string(e.adminGet(t, "/metrics"))
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

// alertClaims is the tunnel.Cluster a test edge is given: its Cluster, counting by event
// what ClaimAlert answered the edge. Every alert an edge of a cluster decides on (its
// debouncer fired) is one ClaimAlert call, and only the edge it answers true sends it.
type alertClaims struct {
	*Cluster
	mu          sync.Mutex
	asked, sent map[string]int
}

func (a *alertClaims) ClaimAlert(pool, event string) bool {
	ok := a.Cluster.ClaimAlert(pool, event)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.asked == nil {
		a.asked, a.sent = map[string]int{}, map[string]int{}
	}
	a.asked[event]++
	if ok {
		a.sent[event]++
	}
	return ok
}

// decided returns how many alerts of event the edge decided on (and asked the cluster
// whether to send), and how many of them the cluster told it to send.
func (a *alertClaims) decided(event string) (asked, sent int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.asked[event], a.sent[event]
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
// edit, if any, is applied to the edge's configuration.
func onNode(nodes []*server.Server, i int, edit func(*tunnel.ServerConfig)) clusterOpts {
	return clusterOpts{host: fmt.Sprintf("127.0.0.%d", i+1), replicas: 3, edit: edit, cluster: func(c *Config) {
		c.NATSURLs = []string{nodes[i].ClientURL(), nodes[(i+1)%len(nodes)].ClientURL()}
	}}
}

// startThreeEdges starts a 3-node NATS cluster and edges a, b and c, each on its own node
// and host (onNode).
func startThreeEdges(t testing.TB, edit func(*tunnel.ServerConfig)) ([]*server.Server, []*clusterEdge) {
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
	sessions := make([]*tunnel.Session, len(edges))
	for i, e := range edges {
		sessions[i] = e.connect(tunnel.WithReconnect(false))
	}
	errs := make([]error, len(edges))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			<-start
			_, errs[i] = sessions[i].Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: sub, Group: "g", GroupKey: fmt.Sprintf("k%d", i+1)},
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
		first, err := e.connect(tunnel.WithReconnect(false)).Forward(ctxT(t),
			tunnel.TunnelSpec{Subdomain: fmt.Sprintf("old%d", i), Group: "g", GroupKey: "k0"}, hostPort(backend(t, "0").URL))
		require.NoError(t, err)
		require.NoError(t, first.Close())
	}
	require.Eventually(t, func() bool {
		for i := range n {
			r, err := e.c.routes.Get(t.Context(), fmt.Sprintf("http/old%d", i))
			if err != nil || r == nil || r.EmptySince.IsZero() || time.Since(r.EmptySince) <= lease || time.Since(r.Claimed) <= lease {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the routes were not recorded empty for longer than the lease")
}

// failoverDialer makes a connector dial from's control port first and to's after.
func failoverDialer(from, to *clusterEdge) tunnel.Option {
	return dialEdgesInTurn(from, to)
}

// dialEdgesInTurn makes a connector dial the control ports of edges in turn: its first dial goes
// to edges[0], its second to edges[1], and so on (the last one after that).
func dialEdgesInTurn(edges ...*clusterEdge) tunnel.Option {
	var dials atomic.Int32
	return tunnel.WithDialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
		i := min(int(dials.Add(1))-1, len(edges)-1)
		var d net.Dialer
		return d.DialContext(ctx, network, edges[i].ControlAddr)
	})
}

func clusterPool(key string) tunnel.TunnelSpec {
	return tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: key}
}

// Connectors, backends and clients of the tests.

const (
	acmeToken   = "acme-token-0123456789"
	globexToken = "globex-token-0123456789"
	plainToken  = "plain-token-0123456789" // belongs to no tenant
)

// tenantAuth knows two tenants, acme and globex, and a token of no tenant.
func tenantAuth() tunnel.Authenticator {
	a, err := tunnel.NewStaticTokens([]string{plainToken}, map[string]string{"acme": acmeToken, "globex": globexToken})
	if err != nil {
		panic(err) // the tokens above are long enough
	}
	return a
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// backend is a loopback HTTP server that names itself in every answer.
func backend(t testing.TB, name string) *httptest.Server {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	return b
}

// slowBackend is a backend whose answers take 20 ms, so that concurrent requests overlap.
func slowBackend(t testing.TB, name string) *httptest.Server {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	return b
}

func hostPort(u string) string { return strings.TrimPrefix(u, "http://") }

// tcpNamed serves a TCP backend that answers every connection with its name.
func tcpNamed(t testing.TB, name string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_, _ = io.WriteString(c, name)
			})
		}
	})
	return l.Addr().String()
}

func readTCP(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	return string(b), err
}

// dialFrom connects to addr from the loopback address ip (127.0.0.0/8 all lives on lo).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// receiver records the alerts POSTed to it.
type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []webhook.Payload
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var p webhook.Payload
		if err := json.Unmarshal(body, &p); err != nil || req.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad alert", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, p)
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) alerts() []webhook.Payload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]webhook.Payload(nil), r.got...)
}

// switchable is a health check the test turns on and off. Its check returns at once; the
// timeout is generous so that a loaded machine (a starved goroutine) never fails it.
type switchable struct{ down atomic.Bool }

func (s *switchable) spec() *health.Spec {
	return &health.Spec{Type: health.TypeFunc, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, MaxFailed: 1,
		Check: func(context.Context) error {
			if s.down.Load() {
				return errors.New("switched off")
			}
			return nil
		}}
}
