package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
	"github.com/warren-tunnel/warren/tunnel/cluster"
)

// startConnectors starts the two connectors, each registering its backend in the pool:
// app-1's lists the edges as [a, b], app-2's as [b, a]. It returns the sessions it
// started, also those of a failed start, for the caller to close.
func startConnectors(ctx context.Context, say func(string, ...any), backends map[string]*backend, a, b *edge) ([]*tunnel.Session, error) {
	var sessions []*tunnel.Session
	for _, c := range []struct {
		backend string
		edges   []*edge
	}{{"app-1", []*edge{a, b}}, {"app-2", []*edge{b, a}}} {
		addrs := []string{c.edges[0].control, c.edges[1].control}
		sess, err := tunnel.DialServers(ctx, addrs, tunnel.WithToken(demoToken), tunnel.WithBackoff(50*time.Millisecond, 500*time.Millisecond))
		if err != nil {
			return sessions, fmt.Errorf("connector of %s: %w", c.backend, err)
		}
		sessions = append(sessions, sess)
		if _, err := sess.Forward(ctx, tunnel.TunnelSpec{Subdomain: pool, Group: pool, GroupKey: "demo-group-key"}, backends[c.backend].addr); err != nil {
			return sessions, fmt.Errorf("connector of %s: %w", c.backend, err)
		}
		say("   connector of %s: servers [%s], attached to %s", c.backend, edgeNames(c.edges), edgeByControl(sess.Server(), a, b).id)
	}
	return sessions, nil
}

// sendThrough sends 24 requests through e, 4 at a time, and checks that both backends
// answered and none failed.
func sendThrough(ctx context.Context, say func(string, ...any), e *edge) error {
	tally, failed := e.send(ctx, 24, 4)
	say("   24 requests through %s: app-1: %d, app-2: %d, failed: %d", e.id, tally["app-1"], tally["app-2"], failed)
	if failed > 0 || tally["app-1"] == 0 || tally["app-2"] == 0 {
		return fmt.Errorf("through %s: expected both backends to answer and no failure, got %v and %d failed", e.id, tally, failed)
	}
	return nil
}

// failover is step 6 after edge A stopped: edge B keeps serving, connector 1 attaches to
// it (sess1 is its session) and registers again, and both backends answer through it.
func failover(ctx context.Context, say func(string, ...any), edgeB *edge, sess1 *tunnel.Session) error {
	tally, failed := edgeB.send(ctx, 12, 4)
	say("   12 requests through edge-b right after: app-1: %d, app-2: %d, failed: %d", tally["app-1"], tally["app-2"], failed)
	if failed > 0 || tally["app-2"] == 0 {
		return fmt.Errorf("edge B after edge A stopped: %v and %d failed", tally, failed)
	}
	members, err := edgeB.waitPool(ctx, map[string]int{"edge-b": 2})
	if err != nil {
		return err
	}
	if srv := sess1.Server(); srv != edgeB.control {
		return fmt.Errorf("connector of app-1 is attached to %s, not edge B", srv)
	}
	say("   connector of app-1 is attached to edge-b now; edge-b sees pool %q with %d members:", pool, len(members))
	printMembers(say, members)
	tally, failed = edgeB.send(ctx, 24, 4)
	say("   24 requests through edge-b: app-1: %d, app-2: %d, failed: %d", tally["app-1"], tally["app-2"], failed)
	if failed > 0 || tally["app-1"] == 0 || tally["app-2"] == 0 {
		return fmt.Errorf("through edge B after the failover: expected both backends, got %v and %d failed", tally, failed)
	}
	info, err := edgeB.cluster(ctx)
	if err != nil {
		return err
	}
	say("   GET /api/cluster on edge-b:")
	printCluster(say, info)
	return nil
}

// printTryURLs prints what to try against the running cluster while it holds.
func printTryURLs(say func(string, ...any), a, b *edge) {
	say("\nHolding after step 5: NATS, both edges, the backends and the connectors stay up. Try:")
	for _, e := range []*edge{a, b} {
		say("   curl -H 'Host: demo.localhost' http://%s/", e.public)
	}
	for _, e := range []*edge{a, b} {
		say("   curl -H 'Authorization: Bearer %s' http://%s/api/groups", adminToken, e.admin)
	}
	say("   curl -H 'Authorization: Bearer %s' http://%s/api/cluster", adminToken, b.admin)
	say("   status page: http://%s/ (token %s)", b.admin, adminToken)
	say("press Ctrl-C to stop (it skips step 6, the failover, and shuts down)")
}

func printMembers(say func(string, ...any), members []admin.GroupMember) {
	for _, m := range members {
		say("     member %s on %s, healthy=%t", m.ID, m.EdgeID, m.Healthy)
	}
}

// startNATS starts an embedded NATS server with JetStream on a free port of 127.0.0.1.
func startNATS() (*natsserver.Server, string, error) {
	dir, err := os.MkdirTemp("", "warren-cluster-demo-")
	if err != nil {
		return nil, "", err
	}
	ns, err := natsserver.NewServer(&natsserver.Options{ServerName: "demo", Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", fmt.Errorf("NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
		return nil, "", errors.New("NATS did not start within 10s")
	}
	return ns, dir, nil
}

// edge is one edge of the demo with its four listeners.
type edge struct {
	id                           string
	srv                          *tunnel.Server
	plane                        *admin.Plane
	control, public, admin, peer string
	serving                      sync.WaitGroup
	client                       *http.Client // to the public listener, whatever the host
	closeOnce                    sync.Once
}

func startEdge(id, natsURL string) (*edge, error) {
	var ls []net.Listener
	fail := func(err error) (*edge, error) {
		for _, l := range ls {
			_ = l.Close()
		}
		return nil, fmt.Errorf("%s: %w", id, err)
	}
	for range 4 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		ls = append(ls, l)
	}
	auth, err := tunnel.NewStaticTokens(nil, map[string]string{"demo": demoToken})
	if err != nil {
		return fail(err)
	}
	c, err := cluster.New(cluster.Config{
		NATSURLs:  []string{natsURL},
		EdgeID:    id,
		Advertise: ls[3].Addr().String(),
		Token:     clusterToken,
		LeaseTTL:  3 * time.Second,
	})
	if err != nil {
		return fail(err)
	}
	srv, err := tunnel.NewServer(tunnel.ServerConfig{
		Domain: "localhost",
		LoadBalancing: tunnel.LoadBalancing{
			Enabled: true,
		},
		Auth: auth,
		Public: tunnel.PublicHTTP{
			URLHTTPPort: ls[1].Addr().(*net.TCPAddr).Port,
		},
		Cluster: c,
	})
	if err != nil {
		return fail(err)
	}
	plane, err := admin.New(srv, admin.Options{Token: adminToken})
	if err != nil {
		_ = srv.Close()
		return fail(err)
	}
	e := &edge{id: id, srv: srv, plane: plane, control: ls[0].Addr().String(), public: ls[1].Addr().String(),
		admin: ls[2].Addr().String(), peer: ls[3].Addr().String()}
	serveAdmin := func(l net.Listener) error { return srv.ServeAdmin(l, plane.Handler()) }
	for i, serve := range []func(net.Listener) error{srv.Serve, srv.ServePublic, serveAdmin, c.ServePeers} {
		e.serving.Go(func() { _ = serve(ls[i]) }) // each returns at Shutdown or Close
	}
	e.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.public)
		},
	}}
	return e, nil
}

// close stops the edge at once (idempotent) and waits for its listeners' goroutines.
func (e *edge) close() {
	e.closeOnce.Do(func() {
		e.client.CloseIdleConnections()
		_ = e.srv.Close()
		e.serving.Wait()
		e.plane.Close()
	})
}

// send sends n requests through the edge's public listener, conc at a time, and counts
// the answers by backend.
func (e *edge) send(ctx context.Context, n, conc int) (map[string]int, int) {
	var mu sync.Mutex
	tally, failed := map[string]int{}, 0
	work := make(chan struct{})
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for range work {
				who, err := e.get(ctx)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					tally[who]++
				}
				mu.Unlock()
			}
		})
	}
	for range n {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	return tally, failed
}

// get sends one request for the pool and returns the backend that answered.
func (e *edge) get(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+pool+".localhost/", nil)
	if err != nil {
		return "", err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return strings.TrimSpace(string(body)), err
}

// adminGet decodes the JSON of an admin API path.
func (e *edge) adminGet(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.admin+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", e.id, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s", e.id, path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// waitPool waits until the edge's /api/groups lists the pool with want healthy members
// per edge id, and returns its members sorted by edge.
func (e *edge) waitPool(ctx context.Context, want map[string]int) ([]admin.GroupMember, error) {
	var last []admin.GroupMember
	for {
		var groups []admin.GroupInfo
		if err := e.adminGet(ctx, "/api/groups", &groups); err != nil {
			return nil, err
		}
		last = nil
		got := map[string]int{}
		for _, g := range groups {
			if g.Label == pool {
				last = g.Members
				for _, m := range g.Members {
					if m.Healthy && !m.Draining {
						got[m.EdgeID]++
					}
				}
			}
		}
		if equalCounts(got, want) {
			sort.Slice(last, func(i, j int) bool { return last[i].EdgeID < last[j].EdgeID })
			return last, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: waiting for pool %q with members %v, last seen %v: %w", e.id, pool, want, got, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (e *edge) cluster(ctx context.Context) (admin.ClusterInfo, error) {
	var info admin.ClusterInfo
	err := e.adminGet(ctx, "/api/cluster", &info)
	return info, err
}

func printCluster(say func(string, ...any), info admin.ClusterInfo) {
	say("     answered by %s, connected to NATS: %t", info.Self, info.NATS)
	for _, ce := range info.Edges {
		say("     edge %s at %s: lease %s, %d %s", ce.ID, ce.Advertise, ce.Lease, ce.Members, map[bool]string{true: "member", false: "members"}[ce.Members == 1])
	}
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}

func edgeNames(es []*edge) string {
	var out []string
	for _, e := range es {
		out = append(out, e.id)
	}
	return strings.Join(out, ", ")
}

func edgeByControl(addr string, es ...*edge) *edge {
	for _, e := range es {
		if e.control == addr {
			return e
		}
	}
	return &edge{id: addr}
}

// backend is a plain net/http server that answers with its name after backendDelay.
type backend struct {
	name, addr string
	srv        *http.Server
	done       chan struct{}
}

func startBackend(name string) (*backend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	b := &backend{name: name, addr: ln.Addr().String(), done: make(chan struct{})}
	b.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(backendDelay):
		case <-r.Context().Done():
			return
		}
		fmt.Fprintln(w, name)
	})}
	go func() { defer close(b.done); _ = b.srv.Serve(ln) }()
	return b, nil
}

// stop closes the server and waits for it; it is idempotent.
func (b *backend) stop() {
	if b.srv != nil {
		_ = b.srv.Close()
		<-b.done
		b.srv = nil
	}
}
