package group

import (
	"fmt"
	"time"
)

// Ejection configures passive outlier ejection: a member whose streams keep failing (its
// stream could not be opened, its backend reset before answering, or answered 502) is taken
// out of dispatch for a while, even if its health probe passes.
type Ejection struct {
	// Failures in a row, each within Window of the first, eject a member. Default 5.
	Failures int
	// Window bounds the run of failures. Default 10 s.
	Window time.Duration
	// Duration is the first ejection's length; each ejection that follows a return without a
	// successful stream in between doubles it, up to MaxDuration. Defaults 30 s and 5 min.
	Duration, MaxDuration time.Duration
}

// DefaultEjection is the ejection policy with every default: 5 failures in a row within
// 10 s eject a member for 30 s, doubling up to 5 min while it keeps failing.
var DefaultEjection = Ejection{Failures: 5, Window: 10 * time.Second, Duration: 30 * time.Second, MaxDuration: 5 * time.Minute}

func (e Ejection) withDefaults() Ejection {
	d := DefaultEjection
	if e.Failures > 0 {
		d.Failures = e.Failures
	}
	if e.Window > 0 {
		d.Window = e.Window
	}
	if e.Duration > 0 {
		d.Duration = e.Duration
	}
	if e.MaxDuration > 0 {
		d.MaxDuration = e.MaxDuration
	}
	d.MaxDuration = max(d.MaxDuration, d.Duration)
	return d
}

// outlier is a member's failure record; guarded by its group's mu.
type outlier struct {
	run      int       // failures in a row
	runStart time.Time // when the run's first failure was reported
	level    int       // ejections in a row without a success between them
	since    time.Time // when the current ejection began
	timer    *time.Timer
}

// ReportOutcome tells the registry how a stream to m went: failed for a stream that could not
// be opened, was reset before a response, or was answered 502; not failed for any other
// answer. With ejection configured (Config.Ejection), enough failures in a row eject m (an
// EventHealth with the reason), unless that would leave more than half of its group ejected
// or no member selectable; m returns after the ejection time (another EventHealth). A
// success costs two atomic loads when m has no failures on record.
func (r *Registry) ReportOutcome(m *Member, failed bool, reason string) {
	if r.cfg.Ejection == nil {
		return
	}
	if !failed {
		if m.failing.Load() {
			r.clearFailures(m)
		}
		return
	}
	g := m.group
	g.mu.Lock()
	if !r.recordFailure(m, reason) {
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	r.deliver(g)
}

// clearFailures ends m's run of failures after a success.
func (r *Registry) clearFailures(m *Member) {
	g := m.group
	g.mu.Lock()
	if !m.ejected.Load() {
		m.out.run, m.out.level = 0, 0
		m.failing.Store(false)
	}
	g.mu.Unlock()
}

// recordFailure counts one failure of m and ejects it when the run is long enough; the
// caller holds g.mu. It reports whether an event was queued.
func (r *Registry) recordFailure(m *Member, reason string) bool {
	g, e := m.group, r.ejection
	if m.ejected.Load() || m.Draining() {
		return false
	}
	now := time.Now()
	if m.out.run == 0 || now.Sub(m.out.runStart) > e.Window {
		m.out.run, m.out.runStart = 0, now
	}
	m.out.run++
	m.failing.Store(true)
	if m.out.run < e.Failures {
		return false
	}
	ejected, selectable := 0, 0
	for _, x := range g.members {
		if x.ejected.Load() {
			ejected++
		}
		if x != m && x.selectable() {
			selectable++
		}
	}
	if 2*(ejected+1) > len(g.members) || selectable == 0 {
		return false // keep serving: the run stays on record and ejects once it may
	}
	d := e.Duration
	for range m.out.level {
		if d >= e.MaxDuration {
			break
		}
		d *= 2
	}
	d = min(d, e.MaxDuration)
	m.out.level++
	m.out.run = 0
	m.ejected.Store(true)
	m.out.since = now
	why := fmt.Sprintf("ejected for %s after %d failed streams in a row (last: %s)", d, e.Failures, reason)
	m.record(Transition{At: now, Healthy: false, Reason: why})
	g.publishLocked()
	r.queueEjectionLocked(g, m, why)
	m.out.timer = time.AfterFunc(d, func() { r.readmit(m) })
	return true
}

// readmit ends m's ejection when its time is up.
func (r *Registry) readmit(m *Member) {
	g := m.group
	g.mu.Lock()
	if !m.ejected.Load() || m.Draining() {
		g.mu.Unlock()
		return
	}
	r.readmitLocked(m, "ejection over")
	g.mu.Unlock()
	r.deliver(g)
}

// readmitLocked ends m's ejection; the caller holds g.mu.
func (r *Registry) readmitLocked(m *Member, why string) {
	g := m.group
	m.ejected.Store(false)
	m.stopEjection()
	m.record(Transition{At: time.Now(), Healthy: m.Healthy(), Reason: why})
	if m.Healthy() {
		m.startRamp()
	}
	g.publishLocked()
	r.queueEjectionLocked(g, m, why)
}

// rebalanceLocked readmits ejected members, the longest ejected first, while more than half
// of g is ejected or no member can take work: a pool that shrank or lost members after an
// ejection is never left with nothing to send to. The caller holds g.mu; it runs after a
// member leaves, drains or fails its probe.
func (r *Registry) rebalanceLocked(g *Group) {
	if r.cfg.Ejection == nil {
		return
	}
	for {
		ejected, selectable := 0, 0
		var first *Member
		for _, x := range g.members {
			switch {
			case x.ejected.Load() && !x.Draining():
				ejected++
				if first == nil || x.out.since.Before(first.out.since) {
					first = x
				}
			case x.selectable():
				selectable++
			}
		}
		if first == nil || 2*ejected <= len(g.members) && selectable > 0 {
			return
		}
		r.readmitLocked(first, "ejection ended early: the pool needs the member")
	}
}

// stopEjection cancels m's return timer (it is leaving); the caller holds g.mu.
func (m *Member) stopEjection() {
	if m.out.timer != nil {
		m.out.timer.Stop()
		m.out.timer = nil
	}
}

// queueEjectionLocked queues the EventHealth of an ejection or of its end; the caller holds
// g.mu.
func (r *Registry) queueEjectionLocked(g *Group, m *Member, why string) {
	if r.cfg.OnEvent == nil {
		return
	}
	ev := eventLocked(EventHealth, g, m, why, false)
	ev.Ejection = true
	r.pushLocked(g, ev)
}
