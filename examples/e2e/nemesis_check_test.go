package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The nemesis's checker (nemesis_test.go): rules over the history of a run, and the live
// check of the cluster after the last fault healed.

const (
	// settleBound is how long, past the lease, the cluster may take after a fault healed to
	// serve every route through every edge again, and within which failures it caused are
	// allowed: a connector notices its edge died and registers on the next one (reconnect
	// backoff from 250 ms), a restarted edge joins NATS and links to its peers, a restarted
	// NATS node catches up with its streams, an edge whose lease lapsed renews it and
	// writes its members again, and the other edges learn them from their watches.
	settleBound = 8 * time.Second
	// quietPeriod is how long the workload runs after the last window closed: every request
	// then must succeed.
	quietPeriod = 3 * time.Second
	// noticeBound is how long after a connector was killed its edge may still dispatch to
	// it: the edge learns of the death from the closed connection (51 ms seen under load),
	// another edge from the first. A request dispatched meanwhile was in flight on the
	// killed member as far as the cluster could know.
	noticeBound = 250 * time.Millisecond
)

// violation is one broken rule with the history lines that break it.
type violation struct {
	rule string
	what string
	recs []record
}

// expected says which identities may answer a route of the history: "http/<host>" or
// "tcp/<port>"; nil for a port no pool holds (nothing may answer).
func (c *nemCluster) expected(route string) []string {
	switch route {
	case "http/" + hostPool:
		return []string{idAlphaWeb1, idAlphaWeb2}
	case "http/" + hostSolo:
		return []string{idAlphaSolo}
	case "http/" + hostResv:
		return []string{idAlphaResv}
	case "http/" + hostBetaPool:
		return []string{idBetaWeb}
	case "http/" + hostRot:
		// Pool rot's members as they are now; over the history, keyHeld decides.
		return []string{rotID(0, c.rotGen[0]), rotID(1, c.rotGen[1])}
	}
	port, err := strconv.Atoi(strings.TrimPrefix(route, "tcp/"))
	if err != nil {
		return nil
	}
	switch c.portPool[port] {
	case "alpha/db":
		return []string{idAlphaDB1, idAlphaDB2}
	case "beta/bdb":
		return []string{idBetaDB}
	}
	return nil
}

// poolOf is the "tenant/pool" of an identity.
func poolOf(id string) string {
	parts := strings.SplitN(id, "/", 3)
	if len(parts) < 2 {
		return id
	}
	return parts[0] + "/" + parts[1]
}

// window is a span in which failures are allowed, and the cause they are counted under.
type window struct {
	from, to time.Time
	// at is when the fault began: a failure that began before and ended after was in flight.
	at    time.Time
	cause string
	// routes are the routes it may fail; nil for every route.
	routes []string
	// inFlightOnly allows only what was in flight when the fault began.
	inFlightOnly bool
	// edge is the edge a fault hit; failures through it are counted apart.
	edge string
}

// windows are the spans after each fault where failures are allowed (RELIABILITY.md,
// "Cluster under a nemesis"), from the fault (less workTimeout, for what was in flight) to
// lease + settleBound after it healed:
//   - an edge killed or stopped: every route, through every edge (its connectors move, and
//     a route whose only member was there is unavailable until its connector registered
//     again; a stopped edge answers nothing and its lease lapses on the others);
//   - a NATS node killed or stopped: none (replicas = 3: "nothing visible"; an edge whose
//     node hangs moves to another within half a lease);
//   - every NATS node killed at once: none (every edge is cut off from NATS and keeps
//     serving what it knows; none takes another for lapsed, its own view being stale);
//   - a connector of a pool of two killed: only what was in flight on it, or dispatched to
//     it within noticeBound after the kill (the pool's other member serves); a connector
//     that is its routes' only member: its routes.
func (c *nemCluster) windows(recs []record) []window {
	routesOf := map[string][]string{
		"alpha-1":    {"http/" + hostPool, "tcp/" + c.portOf("alpha/db")},
		"alpha-2":    {"http/" + hostPool, "tcp/" + c.portOf("alpha/db")},
		"alpha-solo": {"http/" + hostSolo, "http/" + hostResv},
		"beta-1":     {"http/" + hostBetaPool, "tcp/" + c.portOf("beta/bdb")},
	}
	// alpha-1 and alpha-2 are also pool rot's members.
	for _, k := range []string{"alpha-1", "alpha-2"} {
		routesOf[k] = append(routesOf[k], "http/"+hostRot)
	}
	var ws []window
	for _, r := range recs {
		if r.Type != recFault {
			continue
		}
		end := r.Ready
		if end.IsZero() {
			end = r.End
		}
		w := window{at: r.Start, from: r.Start.Add(-workTimeout), to: end.Add(c.lease + settleBound), cause: r.Kind + " " + r.Edge}
		pooled := r.Edge == "alpha-1" || r.Edge == "alpha-2"
		switch faultKind(r.Kind) {
		case faultConnectorKill, faultConnectorTerm:
			w.routes = routesOf[r.Edge]
			w.inFlightOnly = pooled
		case faultConnectorDetach:
			// A pool member's tunnels drain and leave: the pool's other member serves, and what
			// was in flight on the leaving one finishes. alpha-solo's solo tunnel: its route.
			w.routes = routesOf[r.Edge]
			w.inFlightOnly = pooled
			if r.Edge == "alpha-solo" {
				w.routes = []string{"http/" + hostSolo}
			}
		case faultEdgeKill, faultEdgeStop, faultEdgeCutNATS, faultEdgeCutPeers:
			if strings.HasPrefix(r.Err, "skipped") {
				continue
			}
			w.edge = r.Edge
		case faultNATSKill, faultNATSKillAll, faultNATSStop, faultKeyRotate, faultNATSRollback, faultNATSStoreCopy:
			continue
		}
		ws = append(ws, w)
	}
	return ws
}

// explain returns the cause of failed record r: the window of the latest fault that began
// before r ended and allows r; "" if none does.
func explain(ws []window, r record) string {
	var best *window
	for i, w := range ws {
		if r.End.Before(w.from) || r.Start.After(w.to) {
			continue
		}
		if w.routes != nil && !slices.Contains(w.routes, r.Route) {
			continue
		}
		inFlight := !r.Start.After(w.at.Add(noticeBound)) && !r.End.Before(w.at)
		if w.inFlightOnly && !inFlight {
			continue
		}
		if best == nil || (!w.at.After(r.End) && w.at.After(best.at)) {
			best = &ws[i]
		}
	}
	if best == nil {
		return ""
	}
	cause := best.cause
	if !r.Start.After(best.at.Add(noticeBound)) && !r.End.Before(best.at) {
		cause += ", in flight"
	}
	if best.edge != "" {
		if best.edge == r.Edge {
			cause += " (through it)"
		} else {
			cause += " (through another edge)"
		}
	}
	return cause
}

func (c *nemCluster) portOf(pool string) string {
	for p, name := range c.portPool {
		if name == pool {
			return strconv.Itoa(p)
		}
	}
	return "none"
}

// checkHistory applies rules (a), (b) and (d) to the history. It returns the violations
// and the failures counted per cause.
func (c *nemCluster) checkHistory(recs []record) (vs []violation, causes map[string]int) {
	causes = map[string]int{}
	ws := c.windows(recs)

	// (a) nobody but the route's own members answers it; no attack is admitted.
	var foreign, otherKey, admitted []record
	held := keysHeld(recs)
	for _, r := range recs {
		switch r.Type {
		case recHTTP, recTCP:
			if r.Answer == "" || (r.Type == recHTTP && r.Status != http.StatusOK) {
				continue
			}
			if r.Route == "http/"+hostRot {
				if !strings.HasPrefix(r.Answer, "alpha/rot/") {
					foreign = append(foreign, r)
				} else if !held.covers(r) {
					otherKey = append(otherKey, r)
				}
				continue
			}
			if !slices.Contains(c.expected(r.Route), r.Answer) {
				foreign = append(foreign, r)
			}
		case recAttack:
			if strings.HasPrefix(r.Answer, "registered") {
				admitted = append(admitted, r)
			}
		}
	}
	if len(foreign) > 0 {
		vs = append(vs, violation{"a", "answered by a member of another tenant, pool or key", foreign})
	}
	if len(otherKey) > 0 {
		vs = append(vs, violation{"a", "answered by a member of pool rot holding a key it did not hold then", otherKey})
	}
	if len(admitted) > 0 {
		vs = append(vs, violation{"a", "a connector of another tenant, or with a key the pool does not hold, registered a route of tenant alpha", admitted})
	}

	// (b) no TCP port leads to two pools at one moment: no two connections to one port
	// answered by two pools overlap in time.
	byPort := map[string][]record{}
	for _, r := range recs {
		if r.Type == recTCP && r.Answer != "" && strings.Count(r.Answer, "/") == 3 {
			byPort[r.Route] = append(byPort[r.Route], r)
		}
	}
	for _, port := range slices.Sorted(maps.Keys(byPort)) {
		rs := byPort[port]
		sort.Slice(rs, func(i, j int) bool { return rs[i].Start.Before(rs[j].Start) })
		var bad []record
		for i, r := range rs {
			for _, o := range rs[i+1:] {
				if o.Start.After(r.End) {
					break
				}
				if poolOf(o.Answer) != poolOf(r.Answer) {
					bad = append(bad, r, o)
				}
			}
		}
		if len(bad) > 0 {
			vs = append(vs, violation{"b", "port " + strings.TrimPrefix(port, "tcp/") + " led to two pools at one moment", bad})
		}
	}

	// (d) failures only inside a fault's window, counted per cause.
	var unexplained []record
	for _, r := range recs {
		if (r.Type != recHTTP && r.Type != recTCP) || !r.failed() {
			continue
		}
		if c.expected(r.Route) == nil {
			continue // a port no pool holds: refusing is its job
		}
		cause := explain(ws, r)
		if cause == "" {
			unexplained = append(unexplained, r)
			continue
		}
		causes[cause]++
	}
	if len(unexplained) > 0 {
		vs = append(vs, violation{"d", "failed outside every fault's window (fault - workTimeout .. healed + lease + settleBound)", unexplained})
	}
	return vs, causes
}

// keySpans are, for each identity of pool rot ("alpha/rot/<member>/g<generation>"), the
// spans when its member held that generation's key: from the start of the reload that gave
// it (generation 0: from the start) to nemDrainSecs + keyDrainSlack after the reload that
// took it away returned (the old registration drains meanwhile); an open span has a zero
// end.
type keySpans map[string][][2]time.Time

// keyDrainSlack is what a replaced registration's drain may take beyond drain_timeout_secs
// (the edges learn the leave through NATS).
const keyDrainSlack = time.Second

func keysHeld(recs []record) keySpans {
	ks := keySpans{rotID(0, 0): {{}}, rotID(1, 0): {{}}}
	cur := map[string]string{"alpha-1": rotID(0, 0), "alpha-2": rotID(1, 0)}
	for _, r := range recs {
		if r.Type != recKey {
			continue
		}
		if old := ks[cur[r.Edge]]; len(old) > 0 {
			old[len(old)-1][1] = r.End.Add(nemDrainSecs*time.Second + keyDrainSlack)
		}
		cur[r.Edge] = r.Answer
		ks[r.Answer] = append(ks[r.Answer], [2]time.Time{r.Start, {}})
	}
	return ks
}

// covers reports whether the identity that answered r held its key at some moment of r.
func (ks keySpans) covers(r record) bool {
	for _, s := range ks[r.Answer] {
		if !r.End.Before(s[0]) && (s[1].IsZero() || !r.Start.After(s[1])) {
			return true
		}
	}
	return false
}

// groupSummary is what the edges must agree on about one group of /api/groups.
func groupSummary(g apiGroupFull) string {
	var ms []string
	for _, m := range g.Members {
		ms = append(ms, fmt.Sprintf("%s:%s:healthy=%v:draining=%v", m.EdgeID, m.Tenant, m.Healthy, m.Draining))
	}
	sort.Strings(ms)
	return fmt.Sprintf("name=%s key=%s port=%d members=[%s]", g.Name, g.KeyHashShort, g.Port, strings.Join(ms, " "))
}

// apiGroupFull is the part of a GET /api/groups entry the nemesis compares.
type apiGroupFull struct {
	Protocol     string `json:"protocol"`
	Label        string `json:"label"`
	Name         string `json:"name"`
	KeyHashShort string `json:"key_hash_short"`
	Port         int    `json:"port"`
	Members      []struct {
		EdgeID   string `json:"edge_id"`
		Tenant   string `json:"tenant"`
		Healthy  bool   `json:"healthy"`
		Draining bool   `json:"draining"`
	} `json:"members"`
}

// wantMembers is how many healthy members each group has once every connector is back.
var wantMembers = map[string]int{"http/rot": 2, "http/pool": 2, "tcp/db": 2, "http/resv": 1, "http/bpool": 1, "tcp/bdb": 1}

// agreement reports why the edges' /api/groups do not agree or miss members; "" if they
// agree and every group has its members, all healthy.
func (c *nemCluster) agreement() string {
	var first string
	for i, e := range c.edges {
		ce := &clusterEdge{host: e.host, admin: e.admin}
		var gs []apiGroupFull
		if err := ce.adminJSON("/api/groups", &gs); err != nil {
			return fmt.Sprintf("%s: %v", e.id, err)
		}
		byKey := map[string]string{}
		for _, g := range gs {
			k := g.Protocol + "/" + g.Label
			byKey[k] = groupSummary(g)
			if want, ok := wantMembers[k]; ok {
				healthy := 0
				for _, m := range g.Members {
					if m.Healthy && !m.Draining {
						healthy++
					}
				}
				if healthy != want || len(g.Members) != want {
					return fmt.Sprintf("%s lists %s with %d members, %d healthy (want %d): %s", e.id, k, len(g.Members), healthy, want, byKey[k])
				}
			}
		}
		for k := range wantMembers {
			if _, ok := byKey[k]; !ok {
				return fmt.Sprintf("%s does not list %s", e.id, k)
			}
		}
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(byKey)) {
			lines = append(lines, k+" "+byKey[k])
		}
		s := strings.Join(lines, "\n")
		if i == 0 {
			first = s
		} else if s != first {
			return fmt.Sprintf("%s and %s disagree:\n%s\n---\n%s", c.edges[0].id, e.id, first, s)
		}
	}
	return ""
}

// reachability reports a route of an edge that did not reach every member of its pool in a
// few tries; "" when every edge reached every member of every route.
func (c *nemCluster) reachability(ctx context.Context) string {
	for _, e := range c.edges {
		addr := e.httpAddr()
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}}
		client := &http.Client{Timeout: 2 * time.Second, Transport: tr}
		var routes []string
		for _, h := range nemHTTPHosts {
			routes = append(routes, "http/"+h)
		}
		for p := c.tcpLo; p <= c.tcpHi; p++ {
			routes = append(routes, fmt.Sprintf("tcp/%d", p))
		}
		for _, route := range routes {
			want := c.expected(route)
			seen := map[string]bool{}
			var last string
			for try := 0; try < 6*max(len(want), 1) && len(seen) < len(want); try++ {
				id, err := c.ask(ctx, client, e, route)
				switch {
				case err != nil:
					last = err.Error()
				case slices.Contains(want, id):
					seen[id] = true
				default:
					last = "answered by " + id
				}
			}
			if len(want) == 0 {
				if id, err := c.ask(ctx, client, e, route); err == nil {
					tr.CloseIdleConnections()
					return fmt.Sprintf("%s: %s answered by %s, which no pool holds", e.id, route, id)
				}
				continue
			}
			if len(seen) < len(want) {
				tr.CloseIdleConnections()
				return fmt.Sprintf("%s: %s reached %v of %v (last: %s)", e.id, route, slices.Sorted(maps.Keys(seen)), want, last)
			}
		}
		tr.CloseIdleConnections()
	}
	return ""
}

// ask sends one request or opens one connection for route through e and returns who answered.
func (c *nemCluster) ask(ctx context.Context, client *http.Client, e *nemEdge, route string) (string, error) {
	if port, ok := strings.CutPrefix(route, "tcp/"); ok {
		return tcpExchange(ctx, net.JoinHostPort(e.host, port), 2*time.Second)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimPrefix(route, "http/")+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %.80s", resp.StatusCode, body)
	}
	return string(body), nil
}

// converge waits until the edges agree on every group with every member healthy and every
// edge reaches every member (rule c), or until deadline; it returns when it saw that.
func (c *nemCluster) converge(deadline time.Time) (time.Time, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(10*time.Second))
	defer cancel()
	var why string
	for {
		if why = c.agreement(); why == "" {
			if why = c.reachability(ctx); why == "" {
				return time.Now(), nil
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("not converged: %s", why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
