package admin

import (
	"maps"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/webhook"
)

// collector is the edge's prometheus.Collector. Gauges and the per-group dispatch counters
// are read from the registry at scrape time, so dispatch pays nothing for metrics; the
// registry keeps the dispatch totals of removed pools per name, so a counter never goes down.
// Health failures are counted here from the events.
//
// Per-group series are per group name: pools that share a name (HTTP pools on different
// subdomains, TCP pools with different keys) are summed into one series. Solo tunnels are
// not pools and appear only in warren_active_tunnels and warren_requests_total.
type collector struct {
	cfg                                       config
	members, dispatches, failures             *prometheus.Desc
	activeTunnels, requests, webhookDelivery  *prometheus.Desc
	retries, ejections                        *prometheus.Desc
	responsesCut, stalledBytes                *prometheus.Desc
	sessions                                  *prometheus.Desc
	clusterMembers, clusterEdges, clusterNATS *prometheus.Desc // only in a cluster

	mu      sync.Mutex
	failed  map[failureKey]uint64 // unhealthy transitions reported by probes
	ejected map[string]uint64     // outlier ejections per group name
}

type failureKey struct{ group, kind string }

func newCollector(cfg config) *collector {
	region := prometheus.Labels{"region": cfg.RegionID}
	return &collector{
		cfg: cfg,
		members: prometheus.NewDesc("warren_group_members",
			"Members of the load-balancing groups with this name, by health bit.",
			[]string{"group", "healthy"}, region),
		dispatches: prometheus.NewDesc("warren_group_dispatches_total",
			"Requests and connections dispatched to members of the groups with this name.",
			[]string{"group"}, region),
		failures: prometheus.NewDesc("warren_group_health_failures_total",
			"Unhealthy transitions reported by members of the groups with this name, by probe type.",
			[]string{"group", "kind"}, region),
		activeTunnels: prometheus.NewDesc("warren_active_tunnels",
			"Registered tunnels (group members and solo tunnels), by protocol.",
			[]string{"proto"}, nil),
		requests: prometheus.NewDesc("warren_requests_total",
			"Public HTTP(S) requests (proto http) and TCP connections (proto tcp) received.",
			[]string{"proto"}, nil),
		webhookDelivery: prometheus.NewDesc("warren_webhook_deliveries_total",
			"Alert webhook deliveries, by outcome.",
			[]string{"result"}, nil),
		retries: prometheus.NewDesc("warren_dispatch_retries_total",
			"Requests and connections sent to one other member, by reason: opening the stream to the first failed (open_failed), its backend reset the connection with the bodyless request unread (reset_unread), or an idempotent request's member failed before answering (idempotent; opt-in).",
			[]string{"reason"}, nil),
		responsesCut: prometheus.NewDesc("warren_http_responses_cut_total",
			"Public HTTP responses cut because their client did not keep up, by rule: a write to it made no progress for the stall timeout (stall_timeout), or the response stalled while its connection's, its client address's or the edge's stalled responses held their budget (conn_budget, ip_budget, edge_budget).",
			[]string{"reason"}, nil),
		stalledBytes: prometheus.NewDesc("warren_http_stalled_response_bytes",
			"What the public HTTP responses whose client is not keeping up may hold at the edge now, as charged to the edge's budget (each its member stream's window, or the rest of its body if shorter).",
			nil, nil),
		sessions: prometheus.NewDesc("warren_connector_sessions",
			"Connector sessions attached to this edge now (their token accepted), by transport: tcp (the control listener), websocket (the public HTTPS listener's WebSocket path) or quic (the QUIC UDP port).",
			[]string{"transport"}, nil),
		ejections: prometheus.NewDesc("warren_member_ejections_total",
			"Members of the groups with this name ejected by passive outlier detection (streams failing in a row).",
			[]string{"group"}, region),
		clusterMembers: prometheus.NewDesc("warren_cluster_members",
			"In a cluster: members of the groups with this name by the edge their connector is attached to (edge_id), by health bit.",
			[]string{"group", "edge_id", "healthy"}, region),
		clusterEdges: prometheus.NewDesc("warren_cluster_edges",
			"In a cluster: the edges this edge knows of (itself included), by lease state (held, expired, unreachable, not renewed).",
			[]string{"lease"}, nil),
		clusterNATS: prometheus.NewDesc("warren_cluster_nats_connected",
			"In a cluster: 1 while this edge is connected to NATS, else 0 (it then serves the routes it knows and refuses new ones).",
			nil, nil),
		failed:  map[failureKey]uint64{},
		ejected: map[string]uint64{},
	}
}

// healthKindLabel is the kind label of a member's probe type.
func healthKindLabel(kind string) string {
	if kind == "" {
		return "none"
	}
	return kind
}

// observe counts unhealthy transitions, which the registry does not remember.
func (c *collector) observe(ev group.Event) {
	if ev.Group.Solo() || ev.Kind != group.EventHealth || ev.Healthy {
		return
	}
	c.mu.Lock()
	switch {
	case !ev.Ejection:
		c.failed[failureKey{ev.Group.Name, healthKindLabel(ev.Member.HealthKind)}]++
	case ev.Member.Ejected: // an ejection, not the end of one
		c.ejected[ev.Group.Name]++
	}
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.members, c.dispatches, c.failures, c.activeTunnels, c.requests, c.webhookDelivery, c.retries, c.ejections, c.responsesCut, c.stalledBytes, c.sessions} {
		ch <- d
	}
	if c.cfg.Cluster != nil {
		ch <- c.clusterMembers
		ch <- c.clusterEdges
		ch <- c.clusterNATS
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	view := c.cfg.View
	stats := c.cfg.Stats()
	tunnels := map[group.Proto]int{group.ProtoHTTP: 0, group.ProtoHTTPS: 0, group.ProtoTCP: 0}
	type healthSplit struct{ healthy, unhealthy int }
	members := map[string]healthSplit{}
	type edgeKey struct{ group, edge string }
	byEdge := map[edgeKey]healthSplit{}
	var cluster ClusterInfo
	if c.cfg.Cluster != nil {
		cluster = c.cfg.Cluster()
	}
	c.mu.Lock()
	failures := maps.Clone(c.failed)
	ejected := maps.Clone(c.ejected)
	c.mu.Unlock()
	for _, g := range view.Groups() {
		tunnels[g.Proto] += len(g.Members)
		if g.Solo() {
			continue
		}
		hs := members[g.Name]
		for _, m := range g.Members {
			ek := edgeKey{g.Name, m.Edge}
			if m.Edge == "" {
				ek.edge = cluster.Self
			}
			es := byEdge[ek]
			if m.Healthy {
				hs.healthy++
				es.healthy++
			} else {
				hs.unhealthy++
				es.unhealthy++
			}
			byEdge[ek] = es
			if k := (failureKey{g.Name, healthKindLabel(m.HealthKind)}); !hasKey(failures, k) {
				failures[k] = 0 // every probe type in a pool has a series from the start
			}
		}
		members[g.Name] = hs
		if _, ok := ejected[g.Name]; !ok {
			ejected[g.Name] = 0 // every pool has a series from the start
		}
	}
	for name, n := range ejected {
		ch <- prometheus.MustNewConstMetric(c.ejections, prometheus.CounterValue, float64(n), name)
	}
	dispatches := view.Dispatches()

	for name, hs := range members {
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(hs.healthy), name, "true")
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(hs.unhealthy), name, "false")
	}
	if c.cfg.Cluster != nil {
		for k, es := range byEdge {
			ch <- prometheus.MustNewConstMetric(c.clusterMembers, prometheus.GaugeValue, float64(es.healthy), k.group, k.edge, "true")
			ch <- prometheus.MustNewConstMetric(c.clusterMembers, prometheus.GaugeValue, float64(es.unhealthy), k.group, k.edge, "false")
		}
		leases := map[string]int{"held": 0, "expired": 0}
		for _, e := range cluster.Edges {
			leases[e.Lease]++
		}
		for lease, n := range leases {
			ch <- prometheus.MustNewConstMetric(c.clusterEdges, prometheus.GaugeValue, float64(n), lease)
		}
		nats := 0.0
		if cluster.NATS {
			nats = 1
		}
		ch <- prometheus.MustNewConstMetric(c.clusterNATS, prometheus.GaugeValue, nats)
	}
	for name, n := range dispatches {
		ch <- prometheus.MustNewConstMetric(c.dispatches, prometheus.CounterValue, float64(n), name)
	}
	for k, n := range failures {
		ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(n), k.group, k.kind)
	}
	for proto, n := range tunnels {
		ch <- prometheus.MustNewConstMetric(c.activeTunnels, prometheus.GaugeValue, float64(n), string(proto))
	}
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(stats.HTTPRequests), string(group.ProtoHTTP))
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(stats.TCPConnections), string(group.ProtoTCP))
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(stats.RetriesOpenFailed), "open_failed")
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(stats.RetriesResetUnread), "reset_unread")
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(stats.RetriesIdempotent), "idempotent")
	for reason, n := range stats.ResponsesCut {
		ch <- prometheus.MustNewConstMetric(c.responsesCut, prometheus.CounterValue, float64(n), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.stalledBytes, prometheus.GaugeValue, float64(stats.StalledResponseBytes))
	for _, tr := range []string{tunnel.TransportTCP, tunnel.TransportWebSocket, tunnel.TransportQUIC} {
		// every transport has a series from the start
		ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(stats.Sessions[tr]), tr)
	}
	deliveries := maps.Clone(stats.Deliveries)
	if deliveries == nil {
		deliveries = map[webhook.Result]uint64{}
	}
	for _, r := range []webhook.Result{webhook.ResultSuccess, webhook.ResultFailure, webhook.ResultRefused, webhook.ResultDropped} {
		if _, ok := deliveries[r]; !ok {
			deliveries[r] = 0 // every outcome has a series from the start
		}
	}
	for r, n := range deliveries {
		ch <- prometheus.MustNewConstMetric(c.webhookDelivery, prometheus.CounterValue, float64(n), string(r))
	}
}

func hasKey[K comparable, V any](m map[K]V, k K) bool { _, ok := m[k]; return ok }
