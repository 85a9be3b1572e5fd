package tunnel

import (
	"maps"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/webhook"
)

// collector is the edge's prometheus.Collector. Gauges and the per-group dispatch counters
// are read from the registry at scrape time, so dispatch pays nothing for metrics. What the
// registry forgets is kept here: the dispatches of removed pools (per group name, so that a
// counter never goes down when a pool goes away) and the health failures.
//
// Per-group series are per group name: pools that share a name (HTTP pools on different
// subdomains, TCP pools with different keys) are summed into one series. Solo tunnels are
// not pools and appear only in warren_active_tunnels and warren_requests_total.
type collector struct {
	srv                                      *Server
	members, dispatches, failures            *prometheus.Desc
	activeTunnels, requests, webhookDelivery *prometheus.Desc
	retries                                  *prometheus.Desc

	mu       sync.Mutex
	retained map[string]uint64     // group name → dispatches of its removed pools
	failed   map[failureKey]uint64 // unhealthy transitions
	// removed holds pools whose removal is folded into retained but that a registry listing
	// may still return, with the removal's sequence number; Collect skips and then prunes them.
	removed map[*group.Group]uint64
	seq     uint64
}

type failureKey struct{ group, kind string }

func newCollector(s *Server) *collector {
	region := prometheus.Labels{"region": s.cfg.RegionID}
	return &collector{
		srv: s,
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
			"Requests and connections sent to one other member, by reason: opening the stream to the first failed (open_failed), or its backend reset the connection with the bodyless request unread (reset_unread).",
			[]string{"reason"}, nil),
		retained: map[string]uint64{},
		failed:   map[failureKey]uint64{},
		removed:  map[*group.Group]uint64{},
	}
}

// healthKindLabel is the kind label of a member's probe type.
func healthKindLabel(kind string) string {
	if kind == "" {
		return "none"
	}
	return kind
}

// observe records what the registry will not remember. It runs under the group's lock and
// takes only the collector's own lock.
func (c *collector) observe(ev group.Event) {
	g := ev.Group
	if g.Solo() {
		return
	}
	failure := ev.Kind == group.EventHealth && !ev.Healthy
	if !failure && !ev.GroupRemoved {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if failure {
		c.failed[failureKey{g.Name, healthKindLabel(ev.Member.HealthKind)}]++
	}
	if ev.GroupRemoved {
		// The last member is already closed to new streams. A pick that acquired it just
		// before may still add its one dispatch; that one is not counted, and the series
		// never goes down.
		c.retained[g.Name] += g.Dispatches()
		c.seq++
		c.removed[g] = c.seq
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.members, c.dispatches, c.failures, c.activeTunnels, c.requests, c.webhookDelivery, c.retries} {
		ch <- d
	}
}

// poolStat is one live pool as a scrape saw it.
type poolStat struct {
	g                *group.Group
	members, healthy int
	kinds            []string
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	start := c.seq
	c.mu.Unlock()

	// Read the registry without the collector's lock: Members takes each group's lock,
	// under which observe takes ours.
	tunnels := map[group.Proto]int{group.ProtoHTTP: 0, group.ProtoHTTPS: 0, group.ProtoTCP: 0}
	listed := c.srv.registry.Groups()
	var pools []poolStat
	for _, g := range listed {
		ms := g.Members()
		tunnels[g.Proto] += len(ms)
		if g.Solo() {
			continue
		}
		p := poolStat{g: g, members: len(ms)}
		for _, m := range ms {
			if m.Healthy() {
				p.healthy++
			}
			p.kinds = append(p.kinds, healthKindLabel(m.HealthKind))
		}
		pools = append(pools, p)
	}

	type healthSplit struct{ healthy, unhealthy int }
	members := map[string]healthSplit{}
	c.mu.Lock()
	dispatches := maps.Clone(c.retained)
	failures := maps.Clone(c.failed)
	for _, p := range pools {
		if _, gone := c.removed[p.g]; gone {
			continue // its dispatches are in retained already
		}
		name := p.g.Name
		dispatches[name] += p.g.Dispatches()
		hs := members[name]
		hs.healthy += p.healthy
		hs.unhealthy += p.members - p.healthy
		members[name] = hs
		for _, k := range p.kinds {
			if _, ok := failures[failureKey{name, k}]; !ok {
				failures[failureKey{name, k}] = 0
			}
		}
	}
	// A pool removed before this scrape started and absent from its listing is out of the
	// registry for good.
	onList := make(map[*group.Group]bool, len(listed))
	for _, g := range listed {
		onList[g] = true
	}
	for g, at := range c.removed {
		if at <= start && !onList[g] {
			delete(c.removed, g)
		}
	}
	c.mu.Unlock()

	for name, hs := range members {
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(hs.healthy), name, "true")
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(hs.unhealthy), name, "false")
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
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(c.srv.requests.http.Load()), string(group.ProtoHTTP))
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(c.srv.requests.tcp.Load()), string(group.ProtoTCP))
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(c.srv.retries.open.Load()), "open_failed")
	ch <- prometheus.MustNewConstMetric(c.retries, prometheus.CounterValue, float64(c.srv.retries.unread.Load()), "reset_unread")
	deliveries := c.srv.alerts.deliveries()
	for _, r := range []webhook.Result{webhook.ResultSuccess, webhook.ResultFailure, webhook.ResultRefused, webhook.ResultDropped} {
		if _, ok := deliveries[r]; !ok {
			deliveries[r] = 0 // every outcome has a series from the start
		}
	}
	for r, n := range deliveries {
		ch <- prometheus.MustNewConstMetric(c.webhookDelivery, prometheus.CounterValue, float64(n), string(r))
	}
}
