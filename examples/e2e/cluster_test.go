package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
)

const (
	// edgesToken is the edges' shared cluster secret (distinct from every [auth] token).
	edgesToken = "e2e-edges-cluster-secret-0123"
	// failoverBound bounds each step of the failover after an edge is killed.
	failoverBound = 15 * time.Second
)

// startClusterNATS starts an embedded NATS server with JetStream on 127.0.0.1, its store
// in a temporary directory; it is shut down (and waited for) at the end of the test.
func startClusterNATS(t *testing.T) string {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	require.True(t, ns.ReadyForConnections(10*time.Second), "NATS not ready")
	return ns.ClientURL()
}

// freePortsOn returns n distinct ports of host that were free a moment ago.
func freePortsOn(t *testing.T, host string, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		require.NoError(t, err)
		defer l.Close() // held open until all are chosen, so that they differ
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// sharedTCPRange picks three consecutive ports in 20000–29999, below the kernel's
// ephemeral range (so no outgoing connection takes one), that are free on every host.
func sharedTCPRange(t *testing.T, hosts ...string) (lo, hi int) {
	t.Helper()
	for range 50 {
		lo = 20000 + rand.IntN(9997)
		var held []net.Listener
		ok := true
		for p := lo; p <= lo+2 && ok; p++ {
			for _, h := range hosts {
				l, err := net.Listen("tcp", net.JoinHostPort(h, fmt.Sprint(p)))
				if err != nil {
					ok = false
					break
				}
				held = append(held, l)
			}
		}
		for _, l := range held {
			_ = l.Close()
		}
		if ok {
			return lo, lo + 2
		}
	}
	t.Fatal("no three consecutive ports free in 20000-29999")
	return 0, 0
}

// clusterEdge is an edge process of a cluster, listening on host.
type clusterEdge struct {
	*proc
	id                         string
	host                       string
	control, http, admin, peer int
}

func (e *clusterEdge) controlAddr() string { return net.JoinHostPort(e.host, fmt.Sprint(e.control)) }

// startClusterEdge writes a server.toml with [cluster] (lease 1 s, peer_port peerPort) and
// load balancing on, every listener on host, and starts the edge; it returns once the admin
// API answers.
func startClusterEdge(t *testing.T, natsURL, id, host string, tcpLo, tcpHi, peerPort int) *clusterEdge {
	t.Helper()
	ports := freePortsOn(t, host, 3)
	e := &clusterEdge{id: id, host: host, control: ports[0], http: ports[1], admin: ports[2], peer: peerPort}
	path := filepath.Join(t.TempDir(), "server.toml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `
[server]
domain = "localhost"
bind = %q
http_port = %d
control_port = %d
admin_port = %d

[auth]
require_auth = true
tokens = [%q]
admin_token = %q

[limits]
tcp_port_range = [%d, %d]
drain_timeout_secs = 2

[load_balancing]
enabled = true

[cluster]
nats_urls = [%q]
edge_id = %q
advertise = "%s:%d"
peer_port = %d
token = %q
lease_secs = 1
replicas = 1
`, host, e.http, e.control, e.admin, token, adminToken, tcpLo, tcpHi,
		natsURL, id, host, e.peer, e.peer, edgesToken), 0o600))
	e.proc = start(t, id, "edge", "-config", path)
	waitAdmin(t, e.proc, fmt.Sprintf("http://%s/healthz", net.JoinHostPort(host, fmt.Sprint(e.admin))))
	return e
}

// apiGroup is the part of a GET /api/groups entry the test reads.
type apiGroup struct {
	Protocol     string `json:"protocol"`
	Label        string `json:"label"`
	Port         int    `json:"port"`
	MemberCount  int    `json:"member_count"`
	HealthyCount int    `json:"healthy_count"`
	Members      []struct {
		EdgeID  string `json:"edge_id"`
		Healthy bool   `json:"healthy"`
	} `json:"members"`
}

// healthyOn counts the group's healthy members by edge id.
func (g apiGroup) healthyOn() map[string]int {
	on := map[string]int{}
	for _, m := range g.Members {
		if m.Healthy {
			on[m.EdgeID]++
		}
	}
	return on
}

// apiCluster is the part of GET /api/cluster the test reads.
type apiCluster struct {
	Self  string `json:"self"`
	Edges []struct {
		ID    string `json:"edge_id"`
		Lease string `json:"lease"`
	} `json:"edges"`
}

// lease returns the lease state edge id has in c, "" when c does not list it.
func (c apiCluster) lease(id string) string {
	for _, e := range c.Edges {
		if e.ID == id {
			return e.Lease
		}
	}
	return ""
}

var adminClient = &http.Client{Timeout: 5 * time.Second}

// adminJSON decodes GET path on e's admin API (with the admin token) into v.
func (e *clusterEdge) adminJSON(path string, v any) error {
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://%s%s", net.JoinHostPort(e.host, fmt.Sprint(e.admin)), path), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := adminClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return json.Unmarshal(body, v)
}

// groups returns e's groups by "protocol/label"; nil if the admin API did not answer.
func (e *clusterEdge) groups() map[string]apiGroup {
	var gs []apiGroup
	if err := e.adminJSON("/api/groups", &gs); err != nil {
		return nil
	}
	out := map[string]apiGroup{}
	for _, g := range gs {
		out[g.Protocol+"/"+g.Label] = g
	}
	return out
}

// clientTo sends every request to host:port, whatever the URL's host; keep-alive.
func clientTo(t *testing.T, host string, port int) *http.Client {
	t.Helper()
	addr := net.JoinHostPort(host, fmt.Sprint(port))
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: 8,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
	}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// banner connects to host:port and returns the first line the far end writes.
func banner(host string, port int) (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(host, fmt.Sprint(port)), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

// clusterConnector writes a connector YAML listing the edges in order, with an HTTP tunnel
// "web" (pool, group web) and a TCP tunnel "db" (group db), and starts the connector.
func clusterConnector(t *testing.T, name string, edges []*clusterEdge, httpPort, tcpPort int) *proc {
	t.Helper()
	var servers []string
	for _, e := range edges {
		servers = append(servers, e.controlAddr())
	}
	path := filepath.Join(t.TempDir(), name+".yml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `servers: [%s]
auth_token: %q
drain_timeout_secs: 2
tunnels:
  web:
    proto: http
    local_port: %d
    subdomain: pool
    group: web
    group_key: %q
  db:
    proto: tcp
    local_port: %d
    group: db
    group_key: %q
`, strings.Join(servers, ", "), token, httpPort, groupKey, tcpPort, groupKey+"-db"), 0o600))
	return start(t, name, "connector", "start", "--config", path)
}

// TestClusterEdgeKill9: two edge processes form a cluster through NATS; two connectors,
// each listing both edges, serve one HTTP pool and one TCP pool, one connector attached to
// each edge. Under load through edge-b, edge-a is killed with SIGKILL: edge-b keeps
// answering (only requests in flight on the dead edge's member may fail), connector 1 moves
// to edge-b and registers again without "already in use", edge-a's lease expires, and both
// pools are served by two members on edge-b, the TCP pool on the same public port.
func TestClusterEdgeKill9(t *testing.T) {
	natsURL := startClusterNATS(t)
	t.Cleanup(adminClient.CloseIdleConnections)
	// Every listener of edge-a on 127.0.0.1, of edge-b on 127.0.0.2: a TCP pool has the same
	// public port on every edge, so the two edges cannot share an address.
	const hostA, hostB = "127.0.0.1", "127.0.0.2"
	tcpLo, tcpHi := sharedTCPRange(t, hostA, hostB)
	// Both edges take the same peer_port, each on its own bind address, as every other
	// *_port (docs/cluster.md's layout): it used to bind every interface, and edge-b died with
	// "address already in use".
	peerPort, _ := sharedTCPRange(t, hostA, hostB)
	for peerPort >= tcpLo-2 && peerPort <= tcpHi {
		peerPort, _ = sharedTCPRange(t, hostA, hostB)
	}
	a := startClusterEdge(t, natsURL, "edge-a", hostA, tcpLo, tcpHi, peerPort)
	b := startClusterEdge(t, natsURL, "edge-b", hostB, tcpLo, tcpHi, peerPort)
	edges := []*clusterEdge{a, b}

	http1, tcp1 := httpBackend(t, "backend-1"), bannerBackend(t, "banner-1")
	http2, tcp2 := httpBackend(t, "backend-2"), bannerBackend(t, "banner-2")
	c1 := clusterConnector(t, "connector-1", []*clusterEdge{a, b}, http1, tcp1)
	c1.line(t, "tunnel web: ")
	m := tcpURL.FindStringSubmatch(c1.line(t, "tunnel db: "))
	require.NotNil(t, m)
	c2 := clusterConnector(t, "connector-2", []*clusterEdge{b, a}, http2, tcp2)
	c2.line(t, "tunnel web: ")
	m2 := tcpURL.FindStringSubmatch(c2.line(t, "tunnel db: "))
	require.NotNil(t, m2)
	require.Equal(t, m[1], m2[1], "both members of the TCP pool print the same public port")
	var tcpPort int
	_, err := fmt.Sscan(m[1], &tcpPort)
	require.NoError(t, err)
	require.True(t, tcpPort >= tcpLo && tcpPort <= tcpHi, "port %d in [%d, %d]", tcpPort, tcpLo, tcpHi)

	// Both edges list both pools with one healthy member on each edge, the TCP pool on the
	// same port, and that port answers on each edge.
	split := map[string]int{"edge-a": 1, "edge-b": 1}
	for _, e := range edges {
		var last map[string]apiGroup
		require.Eventually(t, func() bool {
			last = e.groups()
			web, tcp := last["http/pool"], last["tcp/db"]
			return web.HealthyCount == 2 && fmt.Sprint(web.healthyOn()) == fmt.Sprint(split) &&
				tcp.HealthyCount == 2 && fmt.Sprint(tcp.healthyOn()) == fmt.Sprint(split) && tcp.Port == tcpPort
		}, waitTimeout, 20*time.Millisecond, "%s's groups: %+v", e.id, last)
		require.Eventually(t, func() bool {
			got, err := banner(e.host, tcpPort)
			return err == nil && (got == "banner-1" || got == "banner-2")
		}, waitTimeout, 20*time.Millisecond, "the TCP pool answers on %s:%d", e.host, tcpPort)
	}

	// edge-b sees both leases held.
	var ci apiCluster
	require.Eventually(t, func() bool {
		return b.adminJSON("/api/cluster", &ci) == nil && ci.lease("edge-a") == "held" && ci.lease("edge-b") == "held"
	}, waitTimeout, 20*time.Millisecond, "edge-b's /api/cluster: %+v", ci)

	// Load: 4 keep-alive clients on edge-b's public HTTP port.
	pub := clientTo(t, hostB, b.http)
	var ok, failed atomic.Int64
	var lastErr atomic.Value
	ctx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	stop := func() { stopLoad(); load.Wait() }
	defer stop()
	for range 4 {
		load.Go(func() {
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://pool.localhost/", nil)
				if err != nil {
					panic(err)
				}
				resp, err := pub.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						ok.Add(1)
						continue
					}
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				if ctx.Err() != nil {
					return // the test stopped the load: not the edge's failure
				}
				failed.Add(1)
				lastErr.Store(err.Error())
			}
		})
	}
	require.Eventually(t, func() bool { return ok.Load() > 50 }, waitTimeout, 5*time.Millisecond,
		"no load through edge-b: %d ok, %d failed, last %v", ok.Load(), failed.Load(), lastErr.Load())

	require.NoError(t, a.cmd.Process.Kill())
	killed := time.Now()
	<-a.done

	// Poll edge-b until, for each step, it has been seen once; note when.
	var gone, moved, tcpMoved, expired time.Duration
	var lastGroups map[string]apiGroup
	var lastCluster apiCluster
	onB := map[string]int{"edge-b": 2}
	deadline := killed.Add(failoverBound)
	for (gone == 0 || moved == 0 || tcpMoved == 0 || expired == 0) && time.Now().Before(deadline) {
		lastGroups = b.groups()
		if lastGroups != nil {
			now := time.Since(killed)
			web, tcp := lastGroups["http/pool"], lastGroups["tcp/db"]
			if gone == 0 && web.healthyOn()["edge-a"] == 0 && tcp.healthyOn()["edge-a"] == 0 {
				gone = now
			}
			if moved == 0 && fmt.Sprint(web.healthyOn()) == fmt.Sprint(onB) && web.MemberCount == 2 {
				moved = now
			}
			if tcpMoved == 0 && fmt.Sprint(tcp.healthyOn()) == fmt.Sprint(onB) && tcp.MemberCount == 2 && tcp.Port == tcpPort {
				tcpMoved = now
			}
		}
		if expired == 0 && b.adminJSON("/api/cluster", &lastCluster) == nil {
			if l := lastCluster.lease("edge-a"); l == "expired" || l == "" {
				expired = time.Since(killed)
			}
		}
		time.Sleep(10 * time.Millisecond) // polling interval of an observer, not synchronisation
	}
	t.Logf("after SIGKILL of edge-a: its members left edge-b's view in %v, connector 1's HTTP member on edge-b in %v, its TCP member in %v, edge-a's lease expired in %v",
		gone, moved, tcpMoved, expired)
	require.NotZero(t, gone, "edge-a's members still on edge-b after %v: %+v", failoverBound, lastGroups)
	require.NotZero(t, moved, "the HTTP pool on edge-b after %v: %+v", failoverBound, lastGroups["http/pool"])
	require.NotZero(t, tcpMoved, "the TCP pool on edge-b after %v: %+v", failoverBound, lastGroups["tcp/db"])
	require.NotZero(t, expired, "edge-b's /api/cluster after %v: %+v", failoverBound, lastCluster)
	require.Equal(t, "edge-b", lastCluster.Self)

	before := ok.Load()
	require.Eventually(t, func() bool { return ok.Load() > before+50 }, failoverBound, 5*time.Millisecond,
		"load through edge-b after the failover: %d ok (%d before), %d failed, last %v", ok.Load(), before, failed.Load(), lastErr.Load())
	stop()
	t.Logf("load through edge-b: %d requests answered 200, %d failed (last: %v)", ok.Load(), failed.Load(), lastErr.Load())
	require.LessOrEqual(t, failed.Load(), int64(4), "only requests in flight on edge-a's member may fail; last: %v", lastErr.Load())

	for _, out := range []string{c1.stdout.String(), c1.stderr.String()} {
		require.NotContains(t, out, "already in use")
	}
	// The TCP pool keeps its port on edge-b, and both pools reach both backends there.
	banners := map[string]int{}
	for range 20 {
		got, err := banner(hostB, tcpPort)
		require.NoError(t, err)
		banners[got]++
	}
	require.Equal(t, 20, banners["banner-1"]+banners["banner-2"], "%v", banners)
	require.Positive(t, banners["banner-1"], "%v", banners)
	require.Positive(t, banners["banner-2"], "%v", banners)
	counts := tally(t, pub, 40)
	require.GreaterOrEqual(t, counts["backend-1"], 5, "%v", counts)
	require.GreaterOrEqual(t, counts["backend-2"], 5, "%v", counts)

	// SIGTERM drains the connectors and stops edge-b; each exits 0.
	for _, p := range []*proc{c1, c2, b.proc} {
		p.signal(t, syscall.SIGTERM)
		require.Equal(t, 0, p.wait(t), "%s's exit code", p.name)
	}
}
