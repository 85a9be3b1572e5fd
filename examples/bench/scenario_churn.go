package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
)

// churnHealth is the members' health check in the churn scenario. The timeout only matters
// for a backend that hangs; a killed one refuses the connection at once.
var churnHealth = health.Spec{Type: health.TypeTCP, Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond, MaxFailed: 2}

// settle is how long the churn load runs before the first disruption and after the last:
// a fifth of -duration, between 100 ms and 1 s.
func (b *bench) settle() time.Duration {
	return max(100*time.Millisecond, min(time.Second, b.cfg.duration/5))
}

// churnRun is one disruption under load.
type churnRun struct {
	res loadResult
	// classes sorts the failed requests by what happened to them.
	classes []failClass
	// events are the disruption's milestones, relative to its first disruption.
	events []string
}

// churnSummary is one disruption over the runs.
type churnSummary struct {
	name string
	// retry: the edge ran with the idempotent retry on (tunnel.ServerConfig.LoadBalancing.RetryIdempotent).
	retry bool
	runs  []churnRun
}

// killed counts the failed requests that the killed backend's handler had received.
func (s churnSummary) killed() int {
	n := 0
	for _, r := range s.runs {
		for _, c := range r.classes {
			if c.fate == fateKilled {
				n += c.n
			}
		}
	}
	return n
}

func (s churnSummary) totals() (failed, total int) {
	for _, r := range s.runs {
		failed += r.res.failed + r.res.warmupFailed
		total += r.res.requests()
	}
	return failed, total
}

// fate says which backend, if any, received a failed request.
type fate int

const (
	fateKilled fate = iota // the killed backend's handler received it
	fateLive               // a backend that was not killed received it
	fateNone               // no backend's handler received it
)

// timing places a failed request relative to the disruption.
type timing int

const (
	timingBefore   timing = iota // ended before the disruption
	timingInFlight               // started before it and ended after it
	timingAfter                  // started after it
)

// failClass is a set of failed requests with the same fate and timing.
type failClass struct {
	fate     fate
	timing   timing
	n        int
	from, to time.Duration // start times relative to the disruption
	errs     map[string]int
}

func (c failClass) what() string {
	s := [...]string{fateKilled: "reached the killed backend's handler", fateLive: "reached a live backend's handler", fateNone: "reached no backend's handler"}[c.fate]
	return s + [...]string{timingBefore: ", ended before the disruption", timingInFlight: ", in flight at the disruption", timingAfter: ", started after the disruption"}[c.timing]
}

// why explains a class of failures of the kill scenario, from what the tunnel does; retry
// says whether the edge ran with the idempotent retry on.
func (c failClass) why(retry bool) string {
	switch {
	case retry && c.timing != timingBefore:
		return "with the idempotent retry on, a GET whose member failed before any byte of its response came back goes to one other member; " +
			"these failed all the same: their one retry was spent (a refused stream open had already moved them once), the second member failed too, " +
			"or the failure came after a response byte (see the errors)"
	case c.fate == fateKilled:
		return "the killed backend had read these requests (its handler ran) when its connection was closed, so no answer came; " +
			"the edge answered 502 and, by default, never replays a request that may have reached an app (with the idempotent retry on it sends a GET to another member: see the kill+retry row)"
	case c.fate == fateNone && c.timing == timingInFlight:
		return "the killed backend's server had already read these from its socket (so its close was an orderly FIN, not a reset) but not yet handed them to a handler; " +
			"from outside the backend that cannot be told apart from a request that reached its app, so the edge answers 502 and does not replay them. " +
			"Requests still unread in the backend's socket or accept queue were reset by its kernel, the connector said so, and the edge sent them to another member (counted above)"
	case c.fate == fateNone && c.timing == timingAfter:
		return "these were dispatched to the killed member while or just after the kill closed its backend connections (it closes them one by one), on a kept-alive stream whose backend connection was gone or going: " +
			"the connector's close of that stream had not reached the edge yet, so the edge wrote the request and could no longer retry it: 502. " +
			"Requests that opened a new stream to the dead backend while its member was still selectable were refused by the connector before any byte was written and retried on another member, so they succeeded"
	case c.timing == timingBefore:
		return "these failed before the kill: not caused by it"
	}
	return "unexpected: a live backend received these requests, yet they failed"
}

// churnEnv is the churn scenario's edge, three backends and three connectors.
type churnEnv struct {
	e        *edge
	backends []*httpBackend
	cs       *connectors
}

// startChurnEnv starts the churn scenario's edge (with the idempotent retry on when retry
// is true), backends and connectors.
func (b *bench) startChurnEnv(ctx context.Context, retry bool) (_ *churnEnv, err error) {
	env := &churnEnv{}
	defer func() {
		if err != nil {
			env.Close()
		}
	}()
	if env.backends, err = startHTTPBackends(3, true); err != nil {
		return env, err
	}
	o := b.edgeOptions("churn")
	if retry {
		o = b.edgeOptions("churn-retry")
		o.retryIdempotent = true
	}
	if env.e, err = startEdge(ctx, b.cfg.edgeMode, o, b.log, b.progress); err != nil {
		return env, err
	}
	var targets []string
	for _, be := range env.backends {
		targets = append(targets, be.addr)
	}
	hs := churnHealth
	env.cs, err = connectGroup(ctx, env.e, tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "bench", Health: &hs}, targets, b.log)
	if err != nil {
		return env, err
	}
	return env, env.e.waitGroup(ctx, "pool", 3, 3)
}

func (env *churnEnv) Close() {
	if env.cs != nil {
		_ = env.cs.Close()
	}
	if env.e != nil {
		_ = env.e.Close()
	}
	stopHTTPBackends(env.backends)
}

func (env *churnEnv) load(ctx context.Context, clients int) *load {
	return startLoad(ctx, loadOptions{clients: clients, expectLen: int64(len(tinyBody)), tagIDs: true,
		targets: []loadTarget{{url: "http://" + env.e.Public + "/tiny", host: "pool." + benchDomain}}})
}

// lives returns every life of every backend, past and current.
func (env *churnEnv) lives() []*backendInstance {
	var out []*backendInstance
	for _, be := range env.backends {
		be.mu.Lock()
		out = append(out, be.past...)
		if be.cur != nil {
			out = append(out, be.cur)
		}
		be.mu.Unlock()
	}
	return out
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runChurn counts failed requests under load while (a) a backend is killed and restarted
// and (b) the members are restarted one by one; and (c) the same kill under the same load
// once more, through a second edge (with its own backends and connectors) that has the
// idempotent retry on. Each run does (a), (b) and (c) in turn.
func (b *bench) runChurn(ctx context.Context, rep *report) error {
	env, err := b.startChurnEnv(ctx, false)
	if err != nil {
		return err
	}
	defer env.Close()
	renv, err := b.startChurnEnv(ctx, true)
	if err != nil {
		return err
	}
	defer renv.Close()
	kill, roll := churnSummary{name: "kill"}, churnSummary{name: "rolling"}
	killRetry := churnSummary{name: "kill+retry", retry: true}
	for r := range b.cfg.runs {
		b.say("churn run %d/%d: kill one backend for %s", r+1, b.cfg.runs, b.cfg.killFor)
		k, err := b.churnKill(ctx, env)
		if err != nil {
			return fmt.Errorf("kill run %d: %w", r+1, err)
		}
		kill.runs = append(kill.runs, k)
		b.say("churn run %d/%d: rolling restart of 3 members", r+1, b.cfg.runs)
		rr, err := b.churnRolling(ctx, env)
		if err != nil {
			return fmt.Errorf("rolling run %d: %w", r+1, err)
		}
		roll.runs = append(roll.runs, rr)
		b.say("churn run %d/%d: kill one backend for %s, idempotent retry on", r+1, b.cfg.runs, b.cfg.killFor)
		kr, err := b.churnKill(ctx, renv)
		if err != nil {
			return fmt.Errorf("kill run %d with the idempotent retry: %w", r+1, err)
		}
		killRetry.runs = append(killRetry.runs, kr)
	}
	rep.churn = append(rep.churn, kill, roll, killRetry)
	rep.add(b.churnSection(kill, roll, killRetry))
	return nil
}

// churnKill kills backend 0 abruptly under load, restarts it after -kill-for on the same
// port, and waits for its member to be healthy again.
func (b *bench) churnKill(ctx context.Context, env *churnEnv) (churnRun, error) {
	var run churnRun
	l := env.load(ctx, b.cfg.clients)
	l.record()
	defer l.stop() // on an early return; a no-op once the run has stopped it
	if err := sleep(ctx, b.settle()); err != nil {
		return run, err
	}
	be := env.backends[0]
	addr := be.addr
	before, err := env.e.retries(ctx)
	if err != nil {
		return run, err
	}
	killAt := time.Now()
	killed := be.kill()
	killedDone := time.Since(killAt)
	// Watch the group while the backend is down: when does its member leave the rotation?
	var leftAt time.Duration = -1
	deadline := killAt.Add(b.cfg.killFor)
	for time.Now().Before(deadline) {
		if leftAt < 0 {
			if gs, err := env.e.groups(ctx); err == nil {
				for _, g := range gs {
					if g.Label == "pool" && g.Healthy < 3 {
						leftAt = time.Since(killAt)
					}
				}
			}
		}
		if err := sleep(ctx, min(10*time.Millisecond, time.Until(deadline))); err != nil {
			return run, err
		}
	}
	restartAt := time.Since(killAt)
	if err := be.start(addr); err != nil {
		return run, err
	}
	if err := env.e.waitGroup(ctx, "pool", 3, 3); err != nil {
		return run, err
	}
	backAt := time.Since(killAt)
	if err := sleep(ctx, b.settle()); err != nil {
		return run, err
	}
	run.res = l.stop()
	after, err := env.e.retries(ctx)
	if err != nil {
		return run, err
	}
	left := "did not leave the rotation while down"
	if leftAt >= 0 {
		left = fmt.Sprintf("left the rotation after %s", fmtDur(leftAt))
	}
	run.events = []string{fmt.Sprintf("backend killed (listener and connections closed in %s), its member %s, restarted at %s, healthy again at %s",
		fmtDur(killedDone), left, fmtDur(restartAt), fmtDur(backAt)),
		fmt.Sprintf("the edge sent %d requests to another member because opening a stream to the dead backend's member failed, %d because the backend reset its connection with the request unread, and %d by the idempotent retry (the member failed before any response byte)",
			after.OpenFailed-before.OpenFailed, after.ResetUnread-before.ResetUnread, after.Idempotent-before.Idempotent)}
	run.classes = classify(run.res.failures, killAt, killed, env.lives())
	return run, nil
}

// churnRolling restarts the three members one after the other under load: Tunnel.Close
// (drain), Forward again, wait until the new member is healthy.
func (b *bench) churnRolling(ctx context.Context, env *churnEnv) (churnRun, error) {
	var run churnRun
	l := env.load(ctx, b.cfg.clients)
	l.record()
	defer l.stop() // on an early return; a no-op once the run has stopped it
	if err := sleep(ctx, b.settle()); err != nil {
		return run, err
	}
	first := time.Now()
	for i, t := range env.cs.tunnels {
		start := time.Now()
		if err := t.Close(); err != nil {
			return run, fmt.Errorf("closing member %d: %w", i, err)
		}
		drained := time.Since(start)
		nt, err := env.cs.sessions[i].Forward(ctx, env.cs.specs[i], env.cs.targets[i])
		if err != nil {
			return run, fmt.Errorf("registering member %d again: %w", i, err)
		}
		env.cs.tunnels[i] = nt
		if err := env.e.waitGroup(ctx, "pool", 3, 3); err != nil {
			return run, err
		}
		run.events = append(run.events, fmt.Sprintf("member %d: closed (drained) in %s, registered again and healthy %s later",
			i+1, fmtDur(drained), fmtDur(time.Since(start)-drained)))
	}
	if err := sleep(ctx, b.settle()); err != nil {
		return run, err
	}
	run.res = l.stop()
	run.classes = classify(run.res.failures, first, nil, env.lives())
	return run, nil
}

// classify sorts failed requests by what happened to them: whether the killed backend life
// (nil if none) or another backend received them, and whether they were already in flight
// at ref or started after it.
func classify(fs []failure, ref time.Time, killed *backendInstance, lives []*backendInstance) []failClass {
	var killedSeen map[string]bool
	if killed != nil {
		killedSeen = killed.seenIDs()
	}
	otherSeen := map[string]bool{}
	for _, in := range lives {
		if in != killed {
			maps.Copy(otherSeen, in.seenIDs())
		}
	}
	type key struct {
		f fate
		t timing
	}
	classes := map[key]*failClass{}
	var order []key
	for _, f := range fs {
		id := strconv.FormatUint(f.id, 10)
		k := key{fateNone, timingAfter}
		switch {
		case killedSeen[id]:
			k.f = fateKilled
		case otherSeen[id]:
			k.f = fateLive
		}
		switch {
		case f.end.Before(ref):
			k.t = timingBefore
		case f.start.Before(ref):
			k.t = timingInFlight
		}
		c := classes[k]
		if c == nil {
			c = &failClass{fate: k.f, timing: k.t, from: f.start.Sub(ref), errs: map[string]int{}}
			classes[k] = c
			order = append(order, k)
		}
		c.n++
		c.to = f.start.Sub(ref)
		c.errs[f.err]++
	}
	out := make([]failClass, 0, len(order))
	for _, k := range order {
		out = append(out, *classes[k])
	}
	return out
}

func (c failClass) String() string {
	errs := slices.SortedFunc(maps.Keys(c.errs), func(a, b string) int { return c.errs[b] - c.errs[a] })
	var parts []string
	for i, e := range errs {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d other errors", len(errs)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%d× %s", c.errs[e], e))
	}
	return fmt.Sprintf("%d %s (started %s … %s from it): %s", c.n, c.what(), fmtAdded(c.from), fmtAdded(c.to), strings.Join(parts, "; "))
}

func (b *bench) churnSection(kill, roll, killRetry churnSummary) *section {
	sec := &section{title: fmt.Sprintf("Churn: %d keep-alive clients, tiny responses, 3-member group with TCP health checks (interval %s, max_failed %d), %d runs",
		b.cfg.clients, churnHealth.Interval, churnHealth.MaxFailed, b.cfg.runs)}
	kf, kt := kill.totals()
	rf, rt := roll.totals()
	xf, xt := killRetry.totals()
	sec.add(row{metric: fmt.Sprintf("failed requests, backend killed for %s and restarted", b.cfg.killFor), tunnel: fmt.Sprintf("%d of %d", kf, kt), target: "0", result: check(kf == 0)})
	sec.add(row{metric: fmt.Sprintf("failed requests, backend killed for %s and restarted, idempotent retry on", b.cfg.killFor), tunnel: fmt.Sprintf("%d of %d", xf, xt), target: "0", result: check(xf == 0)})
	sec.add(row{metric: "…of which reached the killed backend's handler: retry off / on",
		tunnel: fmt.Sprintf("%d / %d", kill.killed(), killRetry.killed()), target: "— / 0", result: check(killRetry.killed() == 0)})
	sec.add(row{metric: "failed requests, rolling restart of 3 members", tunnel: fmt.Sprintf("%d of %d", rf, rt), target: "0", result: check(rf == 0)})
	for _, s := range []churnSummary{kill, killRetry, roll} {
		for i, r := range s.runs {
			sec.note("%s run %d: %d of %d failed; %s", s.name, i+1, r.res.failed+r.res.warmupFailed, r.res.requests(), strings.Join(r.events, "; "))
			for _, c := range r.classes {
				sec.note("%s run %d: %s", s.name, i+1, c)
			}
		}
	}
	sec.note("the edge runs with RetryUnreadRequests on (it is off by default): a bodyless request whose backend reset its connection with it unread goes to one other member")
	sec.note("kill+retry, \"idempotent retry on\": the same kill under the same load through a second edge, with its own 3 backends and connectors, that also has RetryIdempotent on (off by default): " +
		"a GET, HEAD, OPTIONS, PUT or DELETE (or a request with an Idempotency-Key) with a body of at most 64 KiB whose member fails before any byte of a response goes to one other member, " +
		"even if the first member's application may have run it, as nginx's proxy_next_upstream and Go's http.Transport do; the load is GETs")
	// Explain each kind of failure seen when a backend was killed, once per edge setting.
	for _, s := range []churnSummary{kill, killRetry} {
		explained := map[[2]int]bool{}
		for _, r := range s.runs {
			for _, c := range r.classes {
				if k := [2]int{int(c.fate), int(c.timing)}; !explained[k] {
					explained[k] = true
					sec.note("%s, why %q failed: %s", s.name, c.what(), c.why(s.retry))
				}
			}
		}
	}
	return sec
}
