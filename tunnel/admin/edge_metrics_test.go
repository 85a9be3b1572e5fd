package admin

// The Prometheus metrics of a Plane over a live edge, and its registration on an embedder's
// registry (moved from package tunnel's metrics_test.go).

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
)

const (
	helpMembers = `# HELP warren_group_members Members of the load-balancing groups with this name, by health bit.
# TYPE warren_group_members gauge
`
	helpDispatches = `# HELP warren_group_dispatches_total Requests and connections dispatched to members of the groups with this name.
# TYPE warren_group_dispatches_total counter
`
	helpFailures = `# HELP warren_group_health_failures_total Unhealthy transitions reported by members of the groups with this name, by probe type.
# TYPE warren_group_health_failures_total counter
`
	helpTunnels = `# HELP warren_active_tunnels Registered tunnels (group members and solo tunnels), by protocol.
# TYPE warren_active_tunnels gauge
`
	helpRequests = `# HELP warren_requests_total Public HTTP(S) requests (proto http) and TCP connections (proto tcp) received.
# TYPE warren_requests_total counter
`
	helpDeliveries = `# HELP warren_webhook_deliveries_total Alert webhook deliveries, by outcome.
# TYPE warren_webhook_deliveries_total counter
`
)

// switchableHTTP is a backend whose /health answers 503 while down is set.
func switchableHTTP(t *testing.T, name string, down *atomic.Bool) *httptest.Server {
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" && down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, name)
	}))
	t.Cleanup(b.Close)
	return b
}

// echoBackend is a TCP echo server that the test can stop early; stop is idempotent.
func echoBackend(t *testing.T) (addr string, stop func()) {
	return stoppableTCPBackend(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

func fastProbe(typ health.Type) *health.Spec {
	spec := &health.Spec{Type: typ, Interval: 10 * time.Millisecond, Timeout: time.Second, MaxFailed: 1}
	if typ == health.TypeHTTP {
		spec.Path = "/health"
	}
	return spec
}

func TestMetricsAfterJoinsDispatchesFailuresAndLeaves(t *testing.T) {
	op := newReceiver(t)
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, RegionID: "eu", Alerts: tunnel.Alerts{WebhookURL: op.URL},
		TCP: tunnel.TCPTunnels{Ports: tcpRange(44100), BindHost: "127.0.0.1"}}, Options{})
	healthy := func(id string, want bool) func() bool {
		return func() bool {
			m, _, ok := e.Registry().Member(id)
			return ok && m.Healthy == want
		}
	}
	wait := func(cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 5*time.Second, 5*time.Millisecond)
	}

	// Joins. "pool" and "alt" are two pools (other subdomain, other key) named "web".
	var aDown atomic.Bool
	backA := switchableHTTP(t, "A", &aDown)
	specA := pool("pool")
	specA.Health = fastProbe(health.TypeHTTP)
	sessA, sessB, sessC := e.connect(), e.connect(), e.connect()
	ta, err := sessA.Forward(ctxT(t), specA, hostPort(backA.URL))
	require.NoError(t, err)
	_, err = sessB.Forward(ctxT(t), pool("pool"), hostPort(backend(t, "B").URL))
	require.NoError(t, err)
	var hc switchable
	tc, err := sessC.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "alt", Group: "web", GroupKey: "another key", Health: hc.spec()},
		hostPort(backend(t, "C").URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "solo"}, hostPort(backend(t, "S").URL))
	require.NoError(t, err)
	echo, stopEcho := echoBackend(t)
	td, err := e.connect().Forward(ctxT(t), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k", Health: fastProbe(health.TypeTCP)}, echo)
	require.NoError(t, err)
	wait(healthy(ta.ID(), true))
	wait(healthy(tc.ID(), true))
	wait(healthy(td.ID(), true))

	// Dispatches: 6 to pool, 4 to alt, 2 to the solo tunnel, 3 TCP connections to db.
	for sub, n := range map[string]int{"pool": 6, "alt": 4, "solo": 2} {
		for range n {
			code, body := e.get(sub, "/")
			require.Equal(t, http.StatusOK, code, body)
		}
	}
	for range 3 {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", td.Port()), 5*time.Second)
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write([]byte("x"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 1))
		require.NoError(t, err)
		require.NoError(t, c.Close())
	}

	// Failures: A (http probe) fails twice, C (func probe) once, D (tcp probe) once.
	aDown.Store(true)
	wait(healthy(ta.ID(), false))
	aDown.Store(false)
	wait(healthy(ta.ID(), true))
	aDown.Store(true)
	wait(healthy(ta.ID(), false))
	hc.down.Store(true)
	wait(healthy(tc.ID(), false)) // alt has no healthy member: alert 1
	stopEcho()
	wait(healthy(td.ID(), false)) // db has no healthy member: alert 2

	// A health bit flips before its event reaches the collector (events are delivered with
	// no lock held, just after the change): wait for the counters rather than the bits.
	wantAfterFailures := helpMembers + `
warren_group_members{group="db",healthy="false",region="eu"} 1
warren_group_members{group="db",healthy="true",region="eu"} 0
warren_group_members{group="web",healthy="false",region="eu"} 2
warren_group_members{group="web",healthy="true",region="eu"} 1
` + helpDispatches + `
warren_group_dispatches_total{group="db",region="eu"} 3
warren_group_dispatches_total{group="web",region="eu"} 10
` + helpFailures + `
warren_group_health_failures_total{group="db",kind="tcp",region="eu"} 1
warren_group_health_failures_total{group="web",kind="func",region="eu"} 1
warren_group_health_failures_total{group="web",kind="http",region="eu"} 2
warren_group_health_failures_total{group="web",kind="none",region="eu"} 0
` + helpTunnels + `
warren_active_tunnels{proto="http"} 4
warren_active_tunnels{proto="https"} 0
warren_active_tunnels{proto="tcp"} 1
` + helpRequests + `
warren_requests_total{proto="http"} 12
warren_requests_total{proto="tcp"} 3
`
	afterFailureNames := []string{"warren_group_members", "warren_group_dispatches_total", "warren_group_health_failures_total",
		"warren_active_tunnels", "warren_requests_total"}
	wait(func() bool {
		return testutil.GatherAndCompare(e.plane.Gatherer(), strings.NewReader(wantAfterFailures), afterFailureNames...) == nil
	})
	require.NoError(t, testutil.GatherAndCompare(e.plane.Gatherer(), strings.NewReader(wantAfterFailures), afterFailureNames...))
	// A single edge has no cluster series.
	families, err := e.plane.Gatherer().Gather()
	require.NoError(t, err)
	for _, f := range families {
		require.False(t, strings.HasPrefix(f.GetName(), "warren_cluster_"), f.GetName())
	}

	// Leaves: alt goes away, then pool (its last healthy member B leaving is alert 3). A new
	// pool "pool" then takes one request: web's dispatches go on from 10, never down.
	require.NoError(t, sessC.Close())
	require.NoError(t, sessA.Close())
	require.NoError(t, sessB.Close())
	wait(func() bool {
		_, pool := e.Registry().LookupHTTP("pool")
		_, alt := e.Registry().LookupHTTP("alt")
		return !pool && !alt
	})
	require.NoError(t, testutil.GatherAndCompare(e.plane.Gatherer(), strings.NewReader(helpDispatches+`
warren_group_dispatches_total{group="db",region="eu"} 3
warren_group_dispatches_total{group="web",region="eu"} 10
`), "warren_group_dispatches_total"))
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(backend(t, "E").URL))
	require.NoError(t, err)
	code, _ := e.get("pool", "/")
	require.Equal(t, http.StatusOK, code)
	wait(func() bool { return len(op.alerts()) == 3 })

	want := helpMembers + `
warren_group_members{group="db",healthy="false",region="eu"} 1
warren_group_members{group="db",healthy="true",region="eu"} 0
warren_group_members{group="web",healthy="false",region="eu"} 0
warren_group_members{group="web",healthy="true",region="eu"} 1
` + helpDispatches + `
warren_group_dispatches_total{group="db",region="eu"} 3
warren_group_dispatches_total{group="web",region="eu"} 11
` + helpFailures + `
warren_group_health_failures_total{group="db",kind="tcp",region="eu"} 1
warren_group_health_failures_total{group="web",kind="func",region="eu"} 1
warren_group_health_failures_total{group="web",kind="http",region="eu"} 2
warren_group_health_failures_total{group="web",kind="none",region="eu"} 0
` + helpTunnels + `
warren_active_tunnels{proto="http"} 2
warren_active_tunnels{proto="https"} 0
warren_active_tunnels{proto="tcp"} 1
` + helpRequests + `
warren_requests_total{proto="http"} 13
warren_requests_total{proto="tcp"} 3
` + helpDeliveries + `
warren_webhook_deliveries_total{result="dropped"} 0
warren_webhook_deliveries_total{result="failure"} 0
warren_webhook_deliveries_total{result="refused"} 0
warren_webhook_deliveries_total{result="success"} 3
`
	names := []string{"warren_group_members", "warren_group_dispatches_total", "warren_group_health_failures_total",
		"warren_active_tunnels", "warren_requests_total", "warren_webhook_deliveries_total"}
	// The webhook sender counts a delivery just after the receiver has answered.
	wait(func() bool {
		return testutil.GatherAndCompare(e.plane.Gatherer(), strings.NewReader(want), names...) == nil
	})

	// The same through a real scrape of /metrics on the admin listener.
	api := newAPIClient(t, e.adminAddr)
	code, h, body := api.get("", "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, h.Get("Content-Type"), "text/plain")
	for _, line := range strings.Split(want, "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			require.Contains(t, string(body), line+"\n")
		}
	}
}

func TestMetricsCountersSurviveRemovalsAndNeverDuplicate(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
	b := backend(t, "b")
	dispatches := func() float64 {
		t.Helper()
		mfs, err := e.plane.Gatherer().Gather() // fails on duplicate series
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "warren_group_dispatches_total" {
				require.Len(t, mf.GetMetric(), 1, "one series per group name")
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	// Pools come and go under one name, while scrapes run; the counter only grows.
	var last float64
	for round := range 5 {
		sess := e.connect()
		for i := range 3 {
			spec := tunnel.TunnelSpec{Subdomain: fmt.Sprintf("p%d", i), Group: "web", GroupKey: fmt.Sprintf("key %d %d", round, i)}
			_, err := sess.Forward(ctxT(t), spec, hostPort(b.URL))
			require.NoError(t, err)
			code, _ := e.get(fmt.Sprintf("p%d", i), "/")
			require.Equal(t, http.StatusOK, code)
			now := dispatches()
			require.GreaterOrEqual(t, now, last)
			last = now
		}
		require.NoError(t, sess.Close())
		for range 3 {
			now := dispatches()
			require.GreaterOrEqual(t, now, last)
			last = now
		}
		require.Eventually(t, func() bool { return len(e.Registry().Groups()) == 0 }, 5*time.Second, 5*time.Millisecond)
	}
	require.Equal(t, float64(15), dispatches())
}

// newServer is an edge that serves nothing, closed at cleanup (Close is idempotent).
func newServer(t *testing.T, cfg tunnel.ServerConfig) *tunnel.Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	srv, err := tunnel.NewServer(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	return srv
}

func TestMetricsRegisterOnTheEmbeddersRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := newServer(t, tunnel.ServerConfig{RegionID: "eu"})
	p, err := New(srv, Options{Metrics: reg})
	require.NoError(t, err)
	defer p.Close()
	n, err := testutil.GatherAndCount(reg, "warren_active_tunnels", "warren_webhook_deliveries_total")
	require.NoError(t, err)
	require.Equal(t, 3+4, n)

	_, err = New(newServer(t, tunnel.ServerConfig{}), Options{Metrics: reg})
	require.ErrorContains(t, err, "registering the edge's metrics", "a second edge's plane on one registry is refused")
	p.Close()
	require.NoError(t, srv.Close())
	again, err := New(newServer(t, tunnel.ServerConfig{}), Options{Metrics: reg})
	require.NoError(t, err, "Close unregisters, so a restarted edge's plane can use the registry again")
	again.Close()

	// A Registerer that is not a Gatherer still gets the metrics; /metrics serves them from a
	// private registry.
	reg2 := prometheus.NewRegistry()
	other, err := New(newServer(t, tunnel.ServerConfig{}), Options{Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"edge": "b"}, reg2)})
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, testutil.GatherAndCompare(reg2, strings.NewReader(helpTunnels+`
warren_active_tunnels{edge="b",proto="http"} 0
warren_active_tunnels{edge="b",proto="https"} 0
warren_active_tunnels{edge="b",proto="tcp"} 0
`), "warren_active_tunnels"))
	rec := httptest.NewRecorder()
	other.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Contains(t, rec.Body.String(), `warren_active_tunnels{proto="tcp"} 0`)
}

// Several edges share one registry when each plane is wrapped with the same label names (see
// docs/admin.md, Metrics); an unwrapped second edge's plane is refused. Closing the planes
// unregisters them all.
func TestSeveralEdgesOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	var planes []*Plane
	for _, name := range []string{"a", "b"} {
		p, err := New(newServer(t, tunnel.ServerConfig{}), Options{Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"edge": name}, reg)})
		require.NoError(t, err)
		planes = append(planes, p)
	}
	_, err := New(newServer(t, tunnel.ServerConfig{}), Options{Metrics: reg})
	require.Error(t, err, "an unwrapped edge clashes with the wrapped ones")
	n, err := testutil.GatherAndCount(reg, "warren_active_tunnels")
	require.NoError(t, err)
	require.Equal(t, 2*3, n, "both edges' series, told apart by the edge label")
	for _, p := range planes {
		p.Close()
	}
	n, err = testutil.GatherAndCount(reg, "warren_active_tunnels")
	require.NoError(t, err)
	require.Zero(t, n, "Close unregisters each plane")
}

// Plane.Close stops the plane following its edge: the group events after it reach neither
// its event streams (which stay open until the edge shuts down) nor its counters. And it
// unregisters the collector, so that another plane of the edge registers on the same
// registry, and follows the edge from then on.
func TestPlaneCloseUnsubscribesAndUnregisters(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{Metrics: reg})
	id, ctrl := rawMember(t, e, "", probedRegister("pool", "web", "k"))
	failures := func(p *Plane) uint64 { // the tcp probe's unhealthy transitions p counted
		p.metrics.mu.Lock()
		defer p.metrics.mu.Unlock()
		return p.metrics.failed[failureKey{"web", "tcp"}]
	}
	first := openStream(t, e.adminAddr, "", "/api/groups/http/pool/events", nil).read()
	require.Equal(t, "group events of http/pool", first.next().comment)
	setHealth(t, ctrl, id, true, "up")
	setHealth(t, ctrl, id, false, "down")
	require.Equal(t, "up", first.nextGroupEvent().Reason)
	require.Equal(t, "down", first.nextGroupEvent().Reason)
	require.Equal(t, uint64(1), failures(e.plane))

	_, err := New(e.Server, Options{Metrics: reg})
	require.ErrorContains(t, err, "registering the edge's metrics", "one plane per registry while it is open")
	e.plane.Close()
	e.plane.Close() // idempotent
	second, err := New(e.Server, Options{Metrics: reg})
	require.NoError(t, err, "Close unregistered the first plane's collector")
	defer second.Close()
	st := openStream(t, e.ServeAdmin(second.Handler()), "", "/api/groups/http/pool/events", nil).read()
	require.Equal(t, "group events of http/pool", st.next().comment)

	setHealth(t, ctrl, id, true, "up again")
	setHealth(t, ctrl, id, false, "down again")
	require.Equal(t, "up again", st.nextGroupEvent().Reason)
	require.Equal(t, "down again", st.nextGroupEvent().Reason)
	require.Equal(t, uint64(1), failures(second), "the new plane counts from its start")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(helpFailures+`
warren_group_health_failures_total{group="web",kind="tcp",region="local"} 1
`), "warren_group_health_failures_total"), "the registry serves the new plane's counters")

	// The events published to the new plane were not published to the closed one: its
	// stream, still open, has nothing more (its writer would have had them by now).
	deadline := time.After(300 * time.Millisecond)
	for done := false; !done; {
		select {
		case it, ok := <-first.items:
			require.True(t, ok, "the closed plane's stream stays open until the edge shuts down")
			require.Empty(t, it.name, "an event after Close: %s %s", it.name, it.data)
		case <-deadline:
			done = true
		}
	}
	require.Equal(t, uint64(1), failures(e.plane), "the closed plane counts nothing more")
}
