package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/webhook"
)

// The edge's counters (tunnel.Operator.Counters) are the request, retry and webhook delivery
// series, every reason and outcome with a series from the start, read at each scrape (the
// retry series package tunnel's unread_test.go and group_test.go read before the flip).
func TestMetricsRenderTheEdgeCounters(t *testing.T) {
	stats := Stats{HTTPRequests: 12, TCPConnections: 3, RetriesOpenFailed: 5, RetriesResetUnread: 2,
		Deliveries: map[webhook.Result]uint64{webhook.ResultSuccess: 3}}
	p, err := newPlane(config{
		View:    group.NewRegistry(group.Config{}).View(),
		URL:     func(g group.Info) string { return "http://" + g.Label + ".example.test" },
		Stats:   func() Stats { return stats },
		Metrics: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	defer p.Close()
	retries := func(openFailed, resetUnread, idempotent int) string {
		return fmt.Sprintf(`# HELP warren_dispatch_retries_total Requests and connections sent to one other member, by reason: opening the stream to the first failed (open_failed), its backend reset the connection with the bodyless request unread (reset_unread), or an idempotent request's member failed before answering (idempotent; opt-in).
# TYPE warren_dispatch_retries_total counter
warren_dispatch_retries_total{reason="idempotent"} %d
warren_dispatch_retries_total{reason="open_failed"} %d
warren_dispatch_retries_total{reason="reset_unread"} %d
`, idempotent, openFailed, resetUnread)
	}
	want := retries(5, 2, 0) + helpRequests + `
warren_requests_total{proto="http"} 12
warren_requests_total{proto="tcp"} 3
` + helpDeliveries + `
warren_webhook_deliveries_total{result="dropped"} 0
warren_webhook_deliveries_total{result="failure"} 0
warren_webhook_deliveries_total{result="refused"} 0
warren_webhook_deliveries_total{result="success"} 3
`
	names := []string{"warren_dispatch_retries_total", "warren_requests_total", "warren_webhook_deliveries_total"}
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(want), names...))
	stats.RetriesIdempotent = 1
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(retries(5, 2, 1)), "warren_dispatch_retries_total"))

	// The responses cut because their client did not keep up, by rule, and what stalled
	// responses are charged now.
	stats.ResponsesCut = map[string]uint64{"conn_budget": 0, "edge_budget": 0, "ip_budget": 1, "stall_timeout": 2}
	stats.StalledResponseBytes = 3 << 22
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(`# HELP warren_http_responses_cut_total Public HTTP responses cut because their client did not keep up, by rule: a write to it made no progress for the stall timeout (stall_timeout), or the response stalled while its connection's, its client address's or the edge's stalled responses held their budget (conn_budget, ip_budget, edge_budget).
# TYPE warren_http_responses_cut_total counter
warren_http_responses_cut_total{reason="conn_budget"} 0
warren_http_responses_cut_total{reason="edge_budget"} 0
warren_http_responses_cut_total{reason="ip_budget"} 1
warren_http_responses_cut_total{reason="stall_timeout"} 2
`), "warren_http_responses_cut_total"))
	families, err := p.Gatherer().Gather()
	require.NoError(t, err)
	var stalled float64 = -1
	for _, f := range families {
		if f.GetName() == "warren_http_stalled_response_bytes" {
			stalled = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	require.Equal(t, float64(3<<22), stalled, "warren_http_stalled_response_bytes")

	// The connector sessions attached now, by transport, each with a series from the start.
	const helpSessions = `# HELP warren_connector_sessions Connector sessions attached to this edge now (their token accepted), by transport: tcp (the control listener), websocket (the public HTTPS listener's WebSocket path) or quic (the QUIC UDP port).
# TYPE warren_connector_sessions gauge
`
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(helpSessions+`warren_connector_sessions{transport="quic"} 0
warren_connector_sessions{transport="tcp"} 0
warren_connector_sessions{transport="websocket"} 0
`), "warren_connector_sessions"))
	stats.Sessions = map[string]int64{"tcp": 3, "websocket": 2, "quic": 1}
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(helpSessions+`warren_connector_sessions{transport="quic"} 1
warren_connector_sessions{transport="tcp"} 3
warren_connector_sessions{transport="websocket"} 2
`), "warren_connector_sessions"))
}

// An edge of a cluster: the per-group series count every member the edge sees, its own and
// other edges', warren_cluster_members splits them by the edge their connector is attached
// to (this edge's id for its own), warren_cluster_edges counts the edges by lease and
// warren_cluster_nats_connected follows NATS; GET /api/cluster is the edge's cluster view and
// GET /api/groups names each member's edge. (Package tunnel's cluster tests read the edge's
// side of it: its registry and its cluster view.)
func TestClusterSeriesAndAPI(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	var key group.KeyHash
	key[0] = 0xab
	for _, m := range []struct{ id, edge string }{{"m1", ""}, {"m2", "b"}, {"m3", "b"}} {
		_, err := reg.Join(group.JoinRequest{ID: m.id, Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: key, Edge: m.edge})
		require.NoError(t, err)
	}
	info := ClusterInfo{Enabled: true, Self: "a", NATS: true, Edges: []ClusterEdge{
		{ID: "a", Self: true, Lease: "held", Members: 1},
		{ID: "b", Lease: "held", Members: 2},
		{ID: "c", Lease: "expired"},
	}, Warnings: []string{"two edges share one edge_id"}}
	p, err := newPlane(config{
		View:     reg.View(),
		URL:      func(g group.Info) string { return "http://" + g.Label + ".example.test" },
		RegionID: "local",
		EdgeID:   "a",
		Cluster:  func() ClusterInfo { return info },
		Metrics:  prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	defer p.Close()

	want := helpMembers + `
warren_group_members{group="web",healthy="false",region="local"} 0
warren_group_members{group="web",healthy="true",region="local"} 3
` + `# HELP warren_cluster_members In a cluster: members of the groups with this name by the edge their connector is attached to (edge_id), by health bit.
# TYPE warren_cluster_members gauge
warren_cluster_members{edge_id="a",group="web",healthy="false",region="local"} 0
warren_cluster_members{edge_id="a",group="web",healthy="true",region="local"} 1
warren_cluster_members{edge_id="b",group="web",healthy="false",region="local"} 0
warren_cluster_members{edge_id="b",group="web",healthy="true",region="local"} 2
# HELP warren_cluster_edges In a cluster: the edges this edge knows of (itself included), by lease state (held, expired, unreachable, not renewed).
# TYPE warren_cluster_edges gauge
warren_cluster_edges{lease="expired"} 1
warren_cluster_edges{lease="held"} 2
# HELP warren_cluster_nats_connected In a cluster: 1 while this edge is connected to NATS, else 0 (it then serves the routes it knows and refuses new ones).
# TYPE warren_cluster_nats_connected gauge
warren_cluster_nats_connected 1
`
	names := []string{"warren_group_members", "warren_cluster_members", "warren_cluster_edges", "warren_cluster_nats_connected"}
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(want), names...))
	info.NATS = false
	require.NoError(t, testutil.GatherAndCompare(p.Gatherer(), strings.NewReader(`# HELP warren_cluster_nats_connected In a cluster: 1 while this edge is connected to NATS, else 0 (it then serves the routes it knows and refuses new ones).
# TYPE warren_cluster_nats_connected gauge
warren_cluster_nats_connected 0
`), "warren_cluster_nats_connected"))

	get := func(path string, v any) {
		t.Helper()
		rec := httptest.NewRecorder()
		p.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil))
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), v))
	}
	var ci ClusterInfo
	get("/api/cluster", &ci)
	require.Equal(t, info, ci)
	var groups []GroupInfo
	get("/api/groups", &groups)
	require.Len(t, groups, 1)
	require.Equal(t, 3, groups[0].MemberCount)
	var edges []string
	for _, m := range groups[0].Members {
		edges = append(edges, m.EdgeID)
	}
	require.Equal(t, []string{"a", "b", "b"}, edges, "this edge's id on its own members")
}

// An edge outside a cluster has no cluster series and no member edge ids.
func TestNoClusterSeriesOutsideACluster(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	_, err := reg.Join(group.JoinRequest{ID: "m1", Proto: group.ProtoHTTP, Label: "pool", Group: "web", KeyHash: group.HashKey("k")})
	require.NoError(t, err)
	p, err := newPlane(config{View: reg.View(), URL: func(g group.Info) string { return "http://" + g.Label + ".example.test" },
		Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	defer p.Close()
	mfs, err := p.Gatherer().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		require.False(t, strings.HasPrefix(mf.GetName(), "warren_cluster_"), mf.GetName())
	}
	rec := httptest.NewRecorder()
	p.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://127.0.0.1/api/groups", nil))
	require.NotContains(t, rec.Body.String(), "edge_id")
}
