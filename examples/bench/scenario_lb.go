package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-tunnel/warren/tunnel"
)

// Targets of the load-balancing scenario.
const (
	// lbSplitTolerance is how far, in percentage points, a member's share of sequential
	// requests may be from its weighted share.
	lbSplitTolerance = 5.0
	// lbMovedSlack is added to 1/N for the bound on the keys that change member when one of
	// N members leaves (percentage points, as a fraction).
	lbMovedSlack = 0.05
	// lbLoadBound is the bound of the edge's affinity hashing: no member carries more than
	// 1.25× its weighted share of the streams in flight (dispatch.Rendezvous).
	lbLoadBound = 1.25
	// lbAffinityHeader is the header the affinity pool hashes.
	lbAffinityHeader = "X-Client"
)

// lbSplits are the weighted pools whose split the scenario measures.
var lbSplits = [][]int{{3, 1}, {1, 1, 2}}

// lbSplit is one weighted pool's split over the runs.
type lbSplit struct {
	weights  []int
	requests int     // sequential requests per run
	counts   [][]int // per run, the requests each member served
}

// target is member i's weighted share, in percent.
func (s lbSplit) target(i int) float64 {
	sum := 0
	for _, w := range s.weights {
		sum += w
	}
	return 100 * float64(s.weights[i]) / float64(sum)
}

// share is member i's share of run r's requests, in percent.
func (s lbSplit) share(r, i int) float64 {
	return 100 * float64(s.counts[r][i]) / float64(s.requests)
}

// shares returns member i's share in every run, in percent.
func (s lbSplit) shares(i int) series {
	var out series
	for r := range s.counts {
		out = append(out, s.share(r, i))
	}
	return out
}

// errPP is how far member i's share is from its target in run r, in percentage points.
func (s lbSplit) errPP(r, i int) float64 {
	d := s.share(r, i) - s.target(i)
	if d < 0 {
		return -d
	}
	return d
}

// worstErr is the largest error of member i over the runs (every member when i < 0).
func (s lbSplit) worstErr(i int) float64 {
	worst := 0.0
	for r := range s.counts {
		for m := range s.weights {
			if i < 0 || m == i {
				worst = max(worst, s.errPP(r, m))
			}
		}
	}
	return worst
}

func (s lbSplit) name() string {
	parts := make([]string, len(s.weights))
	for i, w := range s.weights {
		parts[i] = strconv.Itoa(w)
	}
	return strings.Join(parts, ":")
}

// lbKeysRun is one run of the affinity measurement: every key sent once to N members,
// one member leaves, every key sent once again.
type lbKeysRun struct {
	members, keys int
	// moved counts the keys whose member changed; onLeaver those whose member left;
	// movedStaying those that moved although their member stayed.
	moved, onLeaver, movedStaying int
	// before and after are the keys per member, before (N members) and after the leave
	// (N-1: the one that left is not counted).
	before, after []int
	// left is how long the leaving member's Shutdown took.
	left time.Duration
}

func (r lbKeysRun) movedFrac() float64 { return float64(r.moved) / float64(r.keys) }

// spread returns the most and fewest keys of a member as multiples of the fair share.
func spread(counts []int, keys int) (hi, lo float64) {
	fair := float64(keys) / float64(len(counts))
	return float64(slices.Max(counts)) / fair, float64(slices.Min(counts)) / fair
}

// lbRotation is one group key rotation under load.
type lbRotation struct {
	churnRun
	from, to  string // the group keys (display names, not the keys)
	oldRefuse error  // what the edge answered an old-key registration after the rotation
}

// oldRefused reports whether the edge refused the old key once the rotation was done.
func (r lbRotation) oldRefused() bool { return errors.Is(r.oldRefuse, tunnel.ErrKeyMismatch) }

// lbSummary is the load-balancing scenario over the runs.
type lbSummary struct {
	splits    []lbSplit
	keys      []lbKeysRun
	rotations []lbRotation
}

// rotationTotals counts the failed requests and all requests over the rotation runs.
func (s *lbSummary) rotationTotals() (failed, total int) {
	for _, r := range s.rotations {
		failed += r.res.failed + r.res.warmupFailed
		total += r.res.requests()
	}
	return failed, total
}

// lbPool is a pool the scenario registers: one backend and one connector session (with
// one tunnel) per member.
type lbPool struct {
	e        *edge
	label    string // the subdomain
	backends []*httpBackend
	cs       *connectors
}

// startLBPool starts one backend and one connector per spec, all on the subdomain of the
// first spec, and waits until the edge has them all healthy.
func (b *bench) startLBPool(ctx context.Context, e *edge, specs []tunnel.TunnelSpec) (_ *lbPool, err error) {
	p := &lbPool{e: e, label: specs[0].Subdomain, cs: &connectors{}}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.backends, err = startHTTPBackends(len(specs), true); err != nil {
		return p, err
	}
	for i, spec := range specs {
		sess, err := tunnel.Dial(ctx, e.Control, tunnel.WithLogger(b.log))
		if err != nil {
			return p, err
		}
		p.cs.sessions = append(p.cs.sessions, sess)
		t, err := sess.Forward(ctx, spec, p.backends[i].addr)
		if err != nil {
			return p, fmt.Errorf("registering member %d of %s: %w", i+1, p.label, err)
		}
		p.cs.tunnels, p.cs.specs, p.cs.targets = append(p.cs.tunnels, t), append(p.cs.specs, spec), append(p.cs.targets, p.backends[i].addr)
	}
	return p, e.waitGroup(ctx, p.label, len(specs), len(specs))
}

func (p *lbPool) Close() {
	_ = p.cs.Close()
	stopHTTPBackends(p.backends)
}

func (p *lbPool) lives() []*backendInstance {
	return (&churnEnv{backends: p.backends}).lives()
}

// servedBy returns, for each request id, the index of the backend whose handler received
// it, or -1.
func servedBy(bs []*httpBackend, ids []uint64) []int {
	who := map[string]int{}
	for i, be := range bs {
		be.mu.Lock()
		lives := append(slices.Clone(be.past), be.cur)
		be.mu.Unlock()
		for _, in := range lives {
			if in == nil {
				continue
			}
			for id := range in.seenIDs() {
				who[id] = i
			}
		}
	}
	out := make([]int, len(ids))
	for k, id := range ids {
		i, ok := who[strconv.FormatUint(id, 10)]
		if !ok {
			i = -1
		}
		out[k] = i
	}
	return out
}

// sequential sends n GETs one after the other on one keep-alive connection to the pool;
// header, when not nil, gives request k's headers. It returns the requests' ids; any failed
// request is an error (nothing disturbs these pools).
func (p *lbPool) sequential(ctx context.Context, n int, header func(k int, h http.Header)) ([]uint64, error) {
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true,
		ResponseHeaderTimeout: 15 * time.Second}
	defer tr.CloseIdleConnections()
	buf := make([]byte, 4<<10)
	ids := make([]uint64, n)
	for k := range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.e.Public+"/tiny", nil)
		if err != nil {
			return nil, err
		}
		req.Host = p.label + "." + benchDomain
		ids[k] = requestIDs.Add(1)
		req.Header.Set(reqIDHeader, strconv.FormatUint(ids[k], 10))
		if header != nil {
			header(k, req.Header)
		}
		if _, err := roundTrip(tr, req, buf, int64(len(tinyBody))); err != nil {
			return nil, fmt.Errorf("request %d of %d to %s: %w", k+1, n, p.label, err)
		}
	}
	return ids, nil
}

// runLB measures the load-balancing policies: how closely weighted pools split sequential
// requests, how many affinity keys move when one member of N leaves, and how many requests
// fail while a group key is rotated under load. Each run does all three in turn.
func (b *bench) runLB(ctx context.Context, rep *report) error {
	e, err := startEdge(ctx, b.cfg.edgeMode, b.edgeOptions("lb"), b.log, b.progress)
	if err != nil {
		return err
	}
	defer e.Close()
	sum := &lbSummary{}
	for _, w := range lbSplits {
		sum.splits = append(sum.splits, lbSplit{weights: w, requests: b.cfg.lbRequests})
	}
	rot, err := b.startRotationPool(ctx, e)
	if err != nil {
		return err
	}
	defer rot.Close()
	for r := range b.cfg.runs {
		for i := range sum.splits {
			s := &sum.splits[i]
			b.say("lb run %d/%d: split of %d sequential requests, weights %s", r+1, b.cfg.runs, s.requests, s.name())
			counts, err := b.splitRun(ctx, e, fmt.Sprintf("split%d-r%d", i+1, r+1), s.weights, s.requests)
			if err != nil {
				return fmt.Errorf("split %s, run %d: %w", s.name(), r+1, err)
			}
			s.counts = append(s.counts, counts)
		}
		b.say("lb run %d/%d: %d affinity keys over %d members, then over %d", r+1, b.cfg.runs, b.cfg.lbKeys, b.cfg.lbMembers, b.cfg.lbMembers-1)
		k, err := b.keysRun(ctx, e, fmt.Sprintf("keys-r%d", r+1))
		if err != nil {
			return fmt.Errorf("keys, run %d: %w", r+1, err)
		}
		sum.keys = append(sum.keys, k)
		b.say("lb run %d/%d: group key rotation by a rolling restart of 3 members under load", r+1, b.cfg.runs)
		rr, err := b.lbRotate(ctx, rot, r)
		if err != nil {
			return fmt.Errorf("key rotation, run %d: %w", r+1, err)
		}
		sum.rotations = append(sum.rotations, rr)
	}
	rep.lb = sum
	rep.add(b.lbSection(sum))
	return nil
}

// splitRun registers one member per weight on a fresh subdomain, sends n sequential
// requests and returns how many each member served.
func (b *bench) splitRun(ctx context.Context, e *edge, label string, weights []int, n int) ([]int, error) {
	var specs []tunnel.TunnelSpec
	for _, w := range weights {
		specs = append(specs, tunnel.TunnelSpec{Subdomain: label, Group: "web", GroupKey: "bench", Weight: w})
	}
	p, err := b.startLBPool(ctx, e, specs)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	ids, err := p.sequential(ctx, n, nil)
	if err != nil {
		return nil, err
	}
	counts := make([]int, len(weights))
	for k, i := range servedBy(p.backends, ids) {
		if i < 0 {
			return nil, fmt.Errorf("request %d (id %d) was answered, but by no backend's handler", k+1, ids[k])
		}
		counts[i]++
	}
	return counts, nil
}

// keysRun registers -lb-members members with header affinity, sends -lb-keys distinct keys
// once each, shuts the last member down, and sends the same keys again.
func (b *bench) keysRun(ctx context.Context, e *edge, label string) (lbKeysRun, error) {
	n, keys := b.cfg.lbMembers, b.cfg.lbKeys
	run := lbKeysRun{members: n, keys: keys, before: make([]int, n), after: make([]int, n-1)}
	specs := make([]tunnel.TunnelSpec, n)
	for i := range specs {
		specs[i] = tunnel.TunnelSpec{Subdomain: label, Group: "web", GroupKey: "bench", Affinity: "header:" + lbAffinityHeader}
	}
	p, err := b.startLBPool(ctx, e, specs)
	if err != nil {
		return run, err
	}
	defer p.Close()
	setKey := func(k int, h http.Header) { h.Set(lbAffinityHeader, "client-"+strconv.Itoa(k)) }
	pass := func() ([]int, error) {
		ids, err := p.sequential(ctx, keys, setKey)
		if err != nil {
			return nil, err
		}
		who := servedBy(p.backends, ids)
		for k, i := range who {
			if i < 0 {
				return nil, fmt.Errorf("key %d (request id %d) was answered, but by no backend's handler", k, ids[k])
			}
		}
		return who, nil
	}
	first, err := pass()
	if err != nil {
		return run, err
	}
	// The last member registered leaves, as a connector that is stopped does: it drains, then
	// the edge removes it.
	leaver := n - 1
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	start := time.Now()
	err = p.cs.tunnels[leaver].Shutdown(sctx)
	run.left = time.Since(start)
	cancel()
	if err != nil {
		return run, fmt.Errorf("shutting member %d down: %w", leaver+1, err)
	}
	if err := e.waitGroup(ctx, label, n-1, n-1); err != nil {
		return run, err
	}
	second, err := pass()
	if err != nil {
		return run, err
	}
	for k := range keys {
		run.before[first[k]]++
		if second[k] == leaver {
			return run, fmt.Errorf("key %d went to the member that had left", k)
		}
		run.after[second[k]]++
		if first[k] == leaver {
			run.onLeaver++
		}
		if first[k] != second[k] {
			run.moved++
			if first[k] != leaver {
				run.movedStaying++
			}
		}
	}
	return run, nil
}

// rotationKey names the group key of the rotation pool after rotation r (0: the first key).
func rotationKey(r int) string { return fmt.Sprintf("bench-key-%d", r) }

// startRotationPool starts the 3-member pool whose group key the scenario rotates: TCP
// health checks as in the churn scenario, the first key.
func (b *bench) startRotationPool(ctx context.Context, e *edge) (*lbPool, error) {
	hs := churnHealth
	specs := make([]tunnel.TunnelSpec, 3)
	for i := range specs {
		specs[i] = tunnel.TunnelSpec{Subdomain: "rotate", Group: "web", GroupKey: rotationKey(0), Health: &hs}
	}
	return b.startLBPool(ctx, e, specs)
}

// lbRotate rotates the pool's group key from key r to key r+1 under load, by a rolling
// restart: for each member, a replacement connector registers with the new key (naming the
// old one in PreviousGroupKeys) and turns healthy, then the old member is shut down (it
// drains). Once every member holds the new key, an old-key registration must be refused.
func (b *bench) lbRotate(ctx context.Context, p *lbPool, r int) (lbRotation, error) {
	run := lbRotation{from: rotationKey(r), to: rotationKey(r + 1)}
	hs := churnHealth
	next := tunnel.TunnelSpec{Subdomain: p.label, Group: "web", GroupKey: run.to, PreviousGroupKeys: []string{run.from}, Health: &hs}
	meter := startCPUMeter()
	l := startLoad(ctx, loadOptions{clients: b.cfg.clients, expectLen: int64(len(tinyBody)), tagIDs: true,
		targets: []loadTarget{{url: "http://" + p.e.Public + "/tiny", host: p.label + "." + benchDomain}}})
	l.record()
	defer l.stop() // on an early return; a no-op once the run has stopped it
	if err := sleep(ctx, b.settle()); err != nil {
		return run, err
	}
	// The pause after each step of the rotation: a quarter of the settling time.
	dwell := b.settle() / 4
	first := time.Now()
	for i := range p.cs.tunnels {
		start := time.Now()
		sess, err := tunnel.Dial(ctx, p.e.Control, tunnel.WithLogger(b.log))
		if err != nil {
			return run, err
		}
		nt, err := sess.Forward(ctx, next, p.cs.targets[i])
		if err != nil {
			_ = sess.Close()
			return run, fmt.Errorf("registering member %d's replacement with the new key: %w", i+1, err)
		}
		// From here the pool closes the replacement (p.Close), and this loop the old member.
		oldSess, oldTunnel := p.cs.sessions[i], p.cs.tunnels[i]
		p.cs.sessions[i], p.cs.tunnels[i], p.cs.specs[i] = sess, nt, next
		if err := p.e.waitGroup(ctx, p.label, 4, 4); err != nil {
			_ = oldSess.Close()
			return run, err
		}
		joined := time.Since(start)
		// Old-key and new-key members serve side by side for a while, as they do while a
		// real rolling restart makes its way through a pool.
		if err := sleep(ctx, dwell); err != nil {
			_ = oldSess.Close()
			return run, err
		}
		start = time.Now()
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = oldTunnel.Shutdown(sctx)
		cancel()
		drained := time.Since(start)
		_ = oldSess.Close()
		if err != nil {
			return run, fmt.Errorf("shutting member %d down: %w", i+1, err)
		}
		if err := p.e.waitGroup(ctx, p.label, 3, 3); err != nil {
			return run, err
		}
		if err := sleep(ctx, dwell); err != nil {
			return run, err
		}
		run.events = append(run.events, fmt.Sprintf("member %d: replacement with the new key registered and healthy in %s, then the old member drained in %s",
			i+1, fmtDur(joined), fmtDur(drained)))
	}
	took := time.Since(first)
	if err := sleep(ctx, b.settle()); err != nil {
		return run, err
	}
	run.res = l.stop()
	run.events = append(run.events, fmt.Sprintf("the rotation took %s of the %s under load", fmtDur(took), fmtDur(run.res.elapsed)))
	if others, _, err := meter.stop(); err == nil {
		run.events = append(run.events, fmt.Sprintf("other processes used %.2f cores meanwhile", others))
	}
	run.classes = classify(run.res.failures, first, nil, p.lives())
	// Every member now presents the new key: a connector still on the old one is refused.
	sess, err := tunnel.Dial(ctx, p.e.Control, tunnel.WithLogger(b.log))
	if err != nil {
		return run, err
	}
	defer sess.Close()
	old := tunnel.TunnelSpec{Subdomain: p.label, Group: "web", GroupKey: run.from, Health: &hs}
	t, err := sess.Forward(ctx, old, p.cs.targets[0])
	if err == nil {
		run.oldRefuse = errors.New("the edge accepted it")
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		_ = t.Shutdown(sctx)
		return run, p.e.waitGroup(ctx, p.label, 3, 3)
	}
	run.oldRefuse = err
	return run, nil
}

func fmtPct(x float64) string { return fmt.Sprintf("%.1f %%", x) }

func (b *bench) lbSection(s *lbSummary) *section {
	cfg := b.cfg
	sec := &section{title: fmt.Sprintf("Load-balancing policies: weighted split, header affinity, group key rotation under load, %d runs", cfg.runs)}
	for _, sp := range s.splits {
		for i, w := range sp.weights {
			worst := sp.worstErr(i)
			med := sp.shares(i).median()
			sec.add(row{
				metric:  fmt.Sprintf("share of %d sequential requests, weights %s: member %d (weight %d)", sp.requests, sp.name(), i+1, w),
				tunnel:  fmtPct(med),
				compare: fmt.Sprintf("%.1f pp off (worst run %.1f pp)", abs(med-sp.target(i)), worst),
				target:  fmt.Sprintf("%s ± %.0f pp", fmtPct(sp.target(i)), lbSplitTolerance),
				result:  check(worst <= lbSplitTolerance),
			})
		}
	}
	var moved series
	var staying, stayingKeys int
	var hiBefore, loBefore, hiAfter, loAfter float64 = 0, 10, 0, 10
	for _, k := range s.keys {
		moved = append(moved, 100*k.movedFrac())
		staying += k.movedStaying
		stayingKeys += k.keys - k.onLeaver
		h, l := spread(k.before, k.keys)
		hiBefore, loBefore = max(hiBefore, h), min(loBefore, l)
		h, l = spread(k.after, k.keys)
		hiAfter, loAfter = max(hiAfter, h), min(loAfter, l)
	}
	n, keys := cfg.lbMembers, cfg.lbKeys
	lim := 100 * (1/float64(n) + lbMovedSlack)
	sec.add(row{
		metric:  fmt.Sprintf("keys that changed member when 1 of %d members left (%d keys, affinity header:%s)", n, keys, lbAffinityHeader),
		tunnel:  fmtPct(moved.median()),
		compare: fmt.Sprintf("worst run %s", fmtPct(slices.Max(moved))),
		target:  fmt.Sprintf("≤ %s (1/%d + %.0f pp)", fmtPct(lim), n, 100*lbMovedSlack),
		result:  check(slices.Max(moved) <= lim),
	})
	sec.add(row{
		metric: "…of which had been on a member that stayed (all runs)",
		tunnel: fmt.Sprintf("%d of %d", staying, stayingKeys),
		target: "0", result: check(staying == 0),
	})
	sec.add(row{
		metric: fmt.Sprintf("keys per member, %d members: most / fewest vs fair share (%d), worst run", n, keys/n),
		tunnel: fmt.Sprintf("%.2f× / %.2f×", hiBefore, loBefore),
		target: fmt.Sprintf("most ≤ %.2f×", lbLoadBound), result: check(hiBefore <= lbLoadBound),
	})
	sec.add(row{
		metric: fmt.Sprintf("keys per member, %d members after the leave: most / fewest vs fair share (%d), worst run", n-1, keys/(n-1)),
		tunnel: fmt.Sprintf("%.2f× / %.2f×", hiAfter, loAfter),
		target: fmt.Sprintf("most ≤ %.2f×", lbLoadBound), result: check(hiAfter <= lbLoadBound),
	})
	rf, rt := s.rotationTotals()
	refused := 0
	for _, r := range s.rotations {
		if r.oldRefused() {
			refused++
		}
	}
	sec.add(row{
		metric: fmt.Sprintf("failed requests (all runs), group key rotated by a rolling restart of 3 members, %d clients", cfg.clients),
		tunnel: fmt.Sprintf("%d of %d", rf, rt), target: "0", result: check(rf == 0),
	})
	sec.add(row{
		metric: "old group key refused once every member holds the new one",
		tunnel: fmt.Sprintf("%d of %d runs", refused, len(s.rotations)), target: "every run", result: check(refused == len(s.rotations)),
	})
	for _, sp := range s.splits {
		for r, c := range sp.counts {
			sec.note("split %s run %d: %s requests per member", sp.name(), r+1, joinInts(c, " / "))
		}
	}
	for r, k := range s.keys {
		sec.note("keys run %d: %d of %d keys (%s) changed member when member %d of %d shut down (drained in %s); %d had been on it; keys per member before %s, after %s",
			r+1, k.moved, k.keys, fmtPct(100*k.movedFrac()), k.members, k.members, fmtDur(k.left), k.onLeaver, joinInts(k.before, " / "), joinInts(k.after, " / "))
	}
	for r, rot := range s.rotations {
		sec.note("rotation run %d (%s → %s): %d of %d failed; %s; an old-key registration afterwards: %v",
			r+1, rot.from, rot.to, rot.res.failed+rot.res.warmupFailed, rot.res.requests(), strings.Join(rot.events, "; "), rot.oldRefuse)
		for _, c := range rot.classes {
			sec.note("rotation run %d: %s", r+1, c)
		}
	}
	sec.note("split: one client sends the requests one after the other (one in flight), through the edge's default strategy (least_streams: every member is idle at each pick, so ties are rotated in proportion to weight); each case registers fresh members on its own subdomain")
	sec.note("keys: one client sends each key once, one request in flight, so the bound on streams in flight (a member takes at most %.2f× its weighted share) never moves a key; the spread of keys per member is that of the rendezvous hashing. "+
		"The member that leaves is the last one registered, by Tunnel.Shutdown (drain, then removal); only the keys that were on it should move", lbLoadBound)
	sec.note("rotation: %d keep-alive clients send tiny GETs to a 3-member pool with TCP health checks (interval %s); for each member in turn a new connector registers with the new key and PreviousGroupKeys [old key], "+
		"waits until healthy, %s later the old member is shut down (drain), and %s later the next member follows. The edge runs with RetryUnreadRequests on and RetryIdempotent off, as in the churn scenario's first edge; each run rotates the key once more",
		cfg.clients, churnHealth.Interval, fmtDur(b.settle()/4), fmtDur(b.settle()/4))
	return sec
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func joinInts(xs []int, sep string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, sep)
}
