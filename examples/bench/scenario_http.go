package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/warren-tunnel/warren/tunnel"
)

// p99AddedTarget is the target for the latency the tunnel adds at the 99th percentile.
const p99AddedTarget = 2 * time.Millisecond

// httpSummary is one HTTP workload over the runs.
type httpSummary struct {
	name           string
	clients        int
	targets        bool    // the targets apply (they are set at -clients)
	rate           float64 // requests/s the clients were paced at; 0 for a closed loop
	tunnel, direct []loadResult
	relay          []loadResult    // through two plain relays per backend (the first workload only)
	edgeCPU        []time.Duration // the edge's CPU time while each tunnel run was recorded
	noise          *noise
}

// runFunc runs one measurement; commit keeps its result (runPairs drops the results of
// runs that other load on the machine skewed, and runs them again).
type runFunc func() (commit func(), err error)

// runPairs runs tunnel and direct -runs times, alternating which goes first so that neither
// always runs on a warmer (or more throttled) machine. A run during which other processes
// used more than noisyCores is run again, up to -noisy-retries times.
func (b *bench) runPairs(ctx context.Context, what string, tunnelRun, directRun runFunc) (*noise, error) {
	n := &noise{}
	for r := range b.cfg.runs {
		order := []string{"tunnel", "direct"}
		if r%2 == 1 {
			order = []string{"direct", "tunnel"}
		}
		for _, mode := range order {
			f := tunnelRun
			if mode == "direct" {
				f = directRun
			}
			for attempt := 0; ; attempt++ {
				if err := ctx.Err(); err != nil {
					return n, err
				}
				b.say("%s run %d/%d: %s", what, r+1, b.cfg.runs, mode)
				m := startCPUMeter()
				commit, err := f()
				if err != nil {
					return n, fmt.Errorf("%s run %d (%s): %w", what, r+1, mode, err)
				}
				others, steal, merr := m.stop()
				if merr == nil && others > noisyCores && attempt < b.cfg.noisyRetries {
					b.say("%s run %d/%d: %s: other processes used %.2f cores; running it again", what, r+1, b.cfg.runs, mode, others)
					n.discarded++
					continue
				}
				commit()
				n.record(mode, others, steal, merr)
				break
			}
		}
	}
	return n, nil
}

// runHTTP measures requests/s and latency at -clients keep-alive clients through a 2-member
// group and directly against its two backends, for tiny and 64 KiB responses.
func (b *bench) runHTTP(ctx context.Context, rep *report) error {
	backends, err := startHTTPBackends(2, false)
	if err != nil {
		return err
	}
	defer stopHTTPBackends(backends)
	e, err := startEdge(ctx, b.cfg.edgeMode, b.edgeOptions("http"), b.log, b.progress)
	if err != nil {
		return err
	}
	defer e.Close()
	cs, err := connectGroup(ctx, e, tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "bench"},
		[]string{backends[0].addr, backends[1].addr}, b.log)
	if err != nil {
		return err
	}
	defer cs.Close()
	if err := e.waitGroup(ctx, "pool", 2, 2); err != nil {
		return err
	}
	warmup := min(time.Second, b.cfg.duration/5)
	type workload struct {
		name, path string
		n          int64
		clients    int
		// rate, when not nil, paces the clients at the requests/s it returns (it is called
		// once the workloads before it have run).
		rate func() float64
	}
	workloads := []workload{
		{name: "tiny responses (3 B)", path: "/tiny", n: int64(len(tinyBody)), clients: b.cfg.clients},
		{name: "64 KiB responses", path: "/64k", n: int64(len(payload64k)), clients: b.cfg.clients},
	}
	if f := b.cfg.pacedFraction; f > 0 {
		workloads = append(workloads, workload{name: fmt.Sprintf("tiny responses (3 B), paced at %.0f%% of the tunnel's rate above", 100*f),
			path: "/tiny", n: int64(len(tinyBody)), clients: b.cfg.clients,
			rate: func() float64 {
				rps := func(r loadResult) float64 { return r.rps() }
				return f * rep.http[0].series(rep.http[0].tunnel, rps).median()
			}})
	}
	if c := b.cfg.latencyClients; c > 0 {
		workloads = append(workloads, workload{name: "tiny responses (3 B), unloaded", path: "/tiny", n: int64(len(tinyBody)), clients: c})
	}
	for _, size := range workloads {
		s := httpSummary{name: size.name, clients: size.clients, targets: size.clients == b.cfg.clients}
		if size.rate != nil {
			s.rate = size.rate()
		}
		var err error
		through := loadOptions{clients: size.clients, expectLen: size.n, rate: s.rate,
			targets: []loadTarget{{url: "http://" + e.Public + size.path, host: "pool." + benchDomain}}}
		direct := loadOptions{clients: size.clients, expectLen: size.n, rate: s.rate,
			targets: []loadTarget{{url: "http://" + backends[0].addr + size.path}, {url: "http://" + backends[1].addr + size.path}}}
		s.noise, err = b.runPairs(ctx, fmt.Sprintf("http %s, %d client(s)", size.path, size.clients),
			func() (func(), error) {
				var marks []time.Duration
				res, err := runLoad(ctx, through, warmup, b.cfg.duration, func() { marks = append(marks, e.cpu()) })
				var cpu time.Duration
				if len(marks) == 2 {
					cpu = marks[1] - marks[0]
				}
				return func() { s.tunnel, s.edgeCPU = append(s.tunnel, res), append(s.edgeCPU, cpu) }, err
			},
			func() (func(), error) {
				res, err := runLoad(ctx, direct, warmup, b.cfg.duration, nil)
				return func() { s.direct = append(s.direct, res) }, err
			})
		if err != nil {
			return err
		}
		if len(rep.http) == 0 {
			if s.relay, err = b.httpRelayFloor(ctx, e, backends, direct); err != nil {
				return err
			}
		}
		rep.http = append(rep.http, s)
		rep.add(s.section(b.cfg, e.child()))
	}
	return nil
}

// httpRelayFloor runs the direct load -runs times through two plain relays per backend, the
// first in the edge's process and the second in this one: the tunnel's topology and process
// layout, without HTTP parsing, dispatch or multiplexing.
func (b *bench) httpRelayFloor(ctx context.Context, e *edge, backends []*httpBackend, direct loadOptions) ([]loadResult, error) {
	o := direct
	o.targets = nil
	for i, t := range direct.targets {
		r1, stop, err := relayChain(ctx, e, backends[i].addr)
		if err != nil {
			return nil, err
		}
		defer stop()
		o.targets = append(o.targets, loadTarget{url: strings.Replace(t.url, backends[i].addr, r1, 1)})
	}
	warmup := min(time.Second, b.cfg.duration/5)
	var out []loadResult
	for r := range b.cfg.runs {
		b.say("http, %d client(s) run %d/%d: two plain relays", o.clients, r+1, b.cfg.runs)
		res, err := runLoad(ctx, o, warmup, b.cfg.duration, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	return out, nil
}

func (s httpSummary) series(rs []loadResult, f func(loadResult) float64) series {
	out := make(series, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func (s httpSummary) section(cfg *config, childEdge bool) *section {
	sec := &section{title: fmt.Sprintf("HTTP, %s: %d keep-alive client(s), %s per run, median of %d runs", s.name, s.clients, cfg.duration, cfg.runs)}
	rps := func(r loadResult) float64 { return r.rps() }
	tr, dr := s.series(s.tunnel, rps), s.series(s.direct, rps)
	rat := ratio(tr.median(), dr.median())
	r := row{metric: "requests/s", tunnel: fmtRate(tr.median()), direct: fmtRate(dr.median()), compare: fmtRatio(rat)}
	if s.targets && s.rate == 0 {
		r.target, r.result = "≥ 0.25× direct", check(rat >= 0.25)
	}
	sec.add(r)
	for _, p := range []struct {
		name string
		q    float64
	}{{"latency p50", 0.50}, {"latency p99", 0.99}, {"latency p99.9", 0.999}} {
		pf := func(r loadResult) float64 { return float64(r.pct(p.q)) }
		tm, dm := time.Duration(s.series(s.tunnel, pf).median()), time.Duration(s.series(s.direct, pf).median())
		r := row{metric: p.name, tunnel: fmtDur(tm), direct: fmtDur(dm), compare: fmtAdded(tm - dm)}
		if p.q == 0.99 && s.targets {
			r.target, r.result = "≤ +2 ms added", check(tm-dm <= p99AddedTarget)
		}
		sec.add(r)
	}
	if len(s.relay) > 0 {
		rr := s.series(s.relay, rps)
		sec.add(row{metric: "requests/s, two plain relays (no Warren)", tunnel: fmtRate(rr.median()), direct: fmtRate(dr.median()), compare: fmtRatio(ratio(rr.median(), dr.median()))})
		pf := func(r loadResult) float64 { return float64(r.pct(0.99)) }
		rm, dm := time.Duration(s.series(s.relay, pf).median()), time.Duration(s.series(s.direct, pf).median())
		sec.add(row{metric: "latency p99, two plain relays (no Warren)", tunnel: fmtDur(rm), direct: fmtDur(dm), compare: fmtAdded(rm - dm)})
	}
	tf, tn, df, dn := 0, 0, 0, 0
	for _, r := range s.tunnel {
		tf, tn = tf+r.failed+r.warmupFailed, tn+r.requests()
	}
	for _, r := range s.direct {
		df, dn = df+r.failed+r.warmupFailed, dn+r.requests()
	}
	sec.add(row{metric: "failed requests (all runs)", tunnel: fmt.Sprintf("%d of %d", tf, tn), direct: fmt.Sprintf("%d of %d", df, dn),
		target: "0", result: check(tf == 0)})
	if childEdge {
		var per []float64
		for i, r := range s.tunnel {
			if r.ok > 0 {
				per = append(per, float64(s.edgeCPU[i])/float64(r.ok))
			}
		}
		if len(per) > 0 {
			sec.add(row{metric: "edge CPU per request", tunnel: fmtDur(time.Duration(median(per)))})
		}
	}
	sec.note("tunnel: %d client(s) → edge public listener, Host pool.%s → 2-member group (2 connector sessions → 2 net/http backends); direct: the same clients split evenly over the same 2 backends",
		s.clients, benchDomain)
	switch {
	case !s.targets:
		sec.note("the targets are set at %d clients; with %d client(s) the machine is far from saturated, so this shows the time the tunnel adds to one request without queueing", cfg.clients, s.clients)
	case s.rate > 0:
		sec.note("open loop: the %d clients together start %s requests/s, evenly spread, through the tunnel and directly alike, so both carry the same load and neither saturates the machine; a request held back because its client's previous answer came late counts from the time it was due (a stall delays the requests behind it, and they count it)",
			s.clients, fmtNum(s.rate))
	default:
		sec.note("a closed loop of %d clients keeps %d requests in flight, so mean latency ≈ %d / requests/s: %s through the tunnel, %s directly (Little's law); on this machine clients, edge, connectors and backends share the same cores",
			s.clients, s.clients, s.clients, fmtDur(time.Duration(float64(s.clients)/tr.median()*1e9)), fmtDur(time.Duration(float64(s.clients)/dr.median()*1e9)))
	}
	if len(s.relay) > 0 {
		sec.note("two plain relays: each client → a relay in the edge's process → a relay in the connectors' process → its backend, copying bytes both ways (no HTTP parsing, no dispatch, no multiplexing): the tunnel's topology and process layout alone, for scale")
	}
	sec.note("per run, requests/s: tunnel %s; direct %s", tr.list(fmtNum), dr.list(fmtNum))
	p99 := func(r loadResult) float64 { return float64(r.pct(0.99)) }
	sec.note("per run, p99: tunnel %s; direct %s", s.series(s.tunnel, p99).list(fmtDurF), s.series(s.direct, p99).list(fmtDurF))
	td, dd := 0, 0
	for i := range s.tunnel {
		td += s.tunnel[i].dials
	}
	for i := range s.direct {
		dd += s.direct[i].dials
	}
	sec.note("%s", s.noise.note())
	sec.note("client connections opened (all runs): tunnel %d, direct %d; %d means every client kept its one keep-alive connection", td, dd, s.clients*cfg.runs)
	for i, r := range s.tunnel {
		if r.failed+r.warmupFailed > 0 {
			sec.note("tunnel run %d: %d failed requests, e.g. %s", i+1, r.failed+r.warmupFailed, firstFailure(r))
		}
	}
	return sec
}

func fmtNum(x float64) string { return fmt.Sprintf("%.0f", x) }

func firstFailure(r loadResult) string {
	if len(r.failures) == 0 {
		return "(during warm-up)"
	}
	return r.failures[0].err
}
