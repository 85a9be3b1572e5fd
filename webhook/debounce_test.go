package webhook

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a Clock that moves only when told to. Advance runs the timers that fall due,
// in time order, in the caller's goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at   time.Time
	f    func()
	done bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 5, 6, 13, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !t.done
		t.done = true
		return stopped
	}
}

// Advance moves the clock forward by d, running every timer due on the way.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	for {
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.done && !t.at.After(target) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		next.done = true
		if next.at.After(c.now) {
			c.now = next.at
		}
		c.mu.Unlock()
		next.f()
		c.mu.Lock()
	}
	c.now = target
	live := c.timers[:0]
	for _, t := range c.timers {
		if !t.done {
			live = append(live, t)
		}
	}
	c.timers = live
	c.mu.Unlock()
}

// pendingTimers counts the timers armed and not yet run or stopped.
func (c *fakeClock) pendingTimers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

// alertLog collects the alerts a Debouncer fires.
type alertLog struct {
	mu  sync.Mutex
	got []Alert[int]
}

func (l *alertLog) fire(a Alert[int]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, a)
}

func (l *alertLog) all() []Alert[int] {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Alert[int](nil), l.got...)
}

func (l *alertLog) events() []string {
	var out []string
	for _, a := range l.all() {
		out = append(out, a.Event)
	}
	return out
}

const interval = time.Minute

// newTestDebouncer returns a Debouncer with both opt-ins on: a minimum interval and
// recovery alerts.
func newTestDebouncer(t *testing.T) (*Debouncer[int], *fakeClock, *alertLog) {
	t.Helper()
	c, log := newFakeClock(), &alertLog{}
	d := NewDebouncer(DebouncerConfig[int]{MinInterval: interval, Recovery: true, Clock: c, Fire: log.fire})
	t.Cleanup(d.Close)
	return d, c, log
}

const (
	zero      = EventGroupZeroHealthy
	recovered = EventGroupRecovered
)

func TestDebouncerFallAndRecoveryOutsideTheInterval(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	d.Observe("web", 2, 1)
	d.Observe("web", 1, 2)
	require.Empty(t, log.all(), "1 of 2 healthy is not an outage")
	fell := c.Now()
	d.Observe("web", 0, 3)
	require.Equal(t, []string{zero}, log.events(), "a fall with no previous alert is sent at once")
	a := log.all()[0]
	require.Equal(t, Alert[int]{Group: "web", Event: zero, Since: fell, Falls: 1, Value: 3}, a)
	d.Observe("web", 0, 4)
	c.Advance(3 * interval)
	d.Observe("web", 0, 5)
	require.Len(t, log.all(), 1, "a group that stays down is reported once")

	back := c.Now()
	d.Observe("web", 1, 6)
	require.Equal(t, []string{zero, recovered}, log.events(), "the recovery of a reported fall is sent at once once the interval is over")
	require.Equal(t, Alert[int]{Group: "web", Event: recovered, Since: back, Falls: 0, Value: 6}, log.all()[1])
	d.Observe("web", 2, 7)
	c.Advance(2 * interval)
	d.Observe("web", 0, 8)
	require.Equal(t, []string{zero, recovered, zero}, log.events(), "a second fall is sent afresh")
	require.Zero(t, c.pendingTimers(), "nothing is held back")
}

// A member flapping 1,000 times in 24 ms gives one alert, then one more when the interval ends
// (reporting the state then), then nothing.
func TestDebouncerFloodGivesOneAlertPerInterval(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	start := c.Now()
	falls := 0
	for i := range 1000 {
		healthy := i % 2 // 0, 1, 0, 1, ... ending healthy
		if healthy == 0 && i > 0 {
			falls++
		}
		d.Observe("web", healthy, i)
		c.Advance(24 * time.Microsecond)
	}
	d.Observe("web", 0, 1000) // ends down
	falls++
	require.Len(t, log.all(), 1, "the whole flood gives one alert")
	first := log.all()[0]
	require.Equal(t, zero, first.Event)
	require.Equal(t, start.Add(2*24*time.Microsecond), first.Since, "sent at the first fall")
	c.Advance(first.Since.Add(interval).Sub(c.Now()) - time.Nanosecond)
	require.Len(t, log.all(), 1, "nothing more until the interval ends")

	c.Advance(time.Nanosecond)
	got := log.all()
	require.Len(t, got, 2, "the change held back is reported when the interval ends")
	require.Equal(t, zero, got[1].Event, "the group is down when the interval ends")
	require.Equal(t, falls-1, got[1].Falls, "every fall after the first alert is counted in the next one")
	require.Equal(t, 1000, got[1].Value, "the latest value")
	require.GreaterOrEqual(t, got[1].Since.Sub(start), 24*time.Millisecond, "since the last fall, at the end of the flood")

	c.Advance(10 * interval)
	require.Len(t, log.all(), 2, "nothing more is due")
}

// However a group flaps for a long time, its alerts are at least MinInterval apart.
func TestDebouncerAlertsAreAtLeastTheIntervalApart(t *testing.T) {
	c := newFakeClock()
	var at []time.Time
	d := NewDebouncer(DebouncerConfig[int]{MinInterval: interval, Recovery: true, Clock: c, Fire: func(Alert[int]) { at = append(at, c.Now()) }})
	defer d.Close()
	step := 7 * time.Second
	total := 30 * interval
	for i := 0; time.Duration(i)*step < total; i++ {
		d.Observe("web", i%3, i) // 0, 1, 2, 0, 1, 2, ...
		c.Advance(step)
	}
	c.Advance(interval)
	require.Greater(t, len(at), 1)
	require.LessOrEqual(t, len(at), int(total/interval)+2)
	for i := 1; i < len(at); i++ {
		require.GreaterOrEqual(t, at[i].Sub(at[i-1]), interval, "alerts %d and %d", i-1, i)
	}
}

func TestDebouncerFallRecoveryFallInsideTheIntervalIsReportedAtItsEnd(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	d.Observe("web", 1, 0)
	d.Observe("web", 0, 1) // alert 1
	first := c.Now()
	c.Advance(time.Second)
	d.Observe("web", 1, 2) // recovered: held back
	c.Advance(time.Second)
	fellAgain := c.Now()
	d.Observe("web", 0, 3) // fell again: held back
	require.Equal(t, []string{zero}, log.events())

	c.Advance(first.Add(interval).Sub(c.Now()) - time.Nanosecond)
	require.Len(t, log.all(), 1, "nothing before the interval ends")
	c.Advance(time.Nanosecond)
	require.Equal(t, []string{zero, zero}, log.events(), "the new outage is reported when the interval ends")
	require.Equal(t, Alert[int]{Group: "web", Event: zero, Since: fellAgain, Falls: 1, Value: 3}, log.all()[1])
}

func TestDebouncerRecoveryInsideTheIntervalIsReportedAtItsEnd(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	d.Observe("web", 1, 0)
	d.Observe("web", 0, 1)
	c.Advance(time.Second)
	back := c.Now()
	d.Observe("web", 3, 2)
	require.Equal(t, []string{zero}, log.events())
	c.Advance(interval)
	require.Equal(t, []string{zero, recovered}, log.events())
	require.Equal(t, Alert[int]{Group: "web", Event: recovered, Since: back, Value: 2}, log.all()[1])

	// An outage that begins and ends inside the next interval is not lost: the recovery is
	// reported, with the fall counted.
	c.Advance(time.Second)
	d.Observe("web", 0, 3)
	c.Advance(time.Second)
	d.Observe("web", 1, 4)
	require.Len(t, log.all(), 2)
	c.Advance(interval)
	require.Equal(t, []string{zero, recovered, recovered}, log.events())
	require.Equal(t, 1, log.all()[2].Falls)
}

func TestDebouncerNeverHealthyGroupDoesNotFire(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	d.Observe("cold", 0, 0)
	d.Observe("cold", 0, 1)
	c.Advance(2 * interval)
	require.Empty(t, log.all(), "a pool that never came up did not fall to zero")
	d.Observe("cold", 1, 2)
	require.Empty(t, log.all(), "coming up for the first time is not a recovery")
	d.Observe("cold", 0, 3)
	require.Equal(t, []string{zero}, log.events(), "after its first healthy member, a fall fires")
}

func TestDebouncerNegativeCountIsZero(t *testing.T) {
	d, _, log := newTestDebouncer(t)
	d.Observe("web", 1, 0)
	d.Observe("web", -1, 1)
	require.Equal(t, []string{zero}, log.events())
}

func TestDebouncerGroupsAreIndependent(t *testing.T) {
	d, _, log := newTestDebouncer(t)
	d.Observe("a", 1, 0)
	d.Observe("b", 1, 0)
	d.Observe("a", 0, 0)
	d.Observe("b", 0, 0)
	got := log.all()
	require.Len(t, got, 2, "b's alert is not held back by a's interval")
	require.Equal(t, "a", got[0].Group)
	require.Equal(t, "b", got[1].Group)
}

// A group removed and re-created under the same key stays within its interval, and a removed
// group's state is forgotten once its interval is over.
func TestDebouncerRemoveKeepsTheIntervalThenForgets(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	for range 100 { // a member that joins healthy and leaves, over and over
		d.Observe("web", 1, 0)
		d.Observe("web", 0, 1)
		d.Remove("web")
	}
	require.Equal(t, []string{zero}, log.events(), "re-creating the group does not reset its interval")
	c.Advance(interval)
	require.Equal(t, []string{zero, zero}, log.events(), "the falls held back are reported when the interval ends")
	require.Len(t, d.groups, 1, "kept for one more interval after its last alert")
	c.Advance(interval)
	require.Len(t, log.all(), 2)
	require.Empty(t, d.groups, "a removed group is forgotten once its interval is over")
	require.Zero(t, c.pendingTimers())

	// Never-alerted groups are forgotten at once; many of them leave nothing behind.
	for i := range 1000 {
		g := "g" + strconv.Itoa(i)
		d.Observe(g, 0, 0)
		d.Remove(g)
	}
	require.Empty(t, d.groups)
	require.Zero(t, c.pendingTimers())
}

func TestDebouncerRecreatedGroupReportsItsRecovery(t *testing.T) {
	d, c, log := newTestDebouncer(t)
	d.Observe("web", 1, 0)
	d.Observe("web", 0, 1) // the last member left: alert
	d.Remove("web")
	c.Advance(time.Second)
	d.Observe("web", 0, 2) // re-created, its member's probe not passed yet
	d.Observe("web", 1, 3) // up again
	c.Advance(interval)
	require.Equal(t, []string{zero, recovered}, log.events())
}

func TestDebouncerCloseCancelsHeldAlerts(t *testing.T) {
	c, log := newFakeClock(), &alertLog{}
	d := NewDebouncer(DebouncerConfig[int]{MinInterval: interval, Recovery: true, Clock: c, Fire: log.fire})
	d.Observe("web", 1, 0)
	d.Observe("web", 0, 0)
	d.Observe("web", 1, 0) // held back
	d.Close()
	d.Close() // idempotent
	c.Advance(2 * interval)
	d.Observe("web", 0, 0)
	d.Remove("web")
	require.Equal(t, []string{zero}, log.events())
}

func TestDebouncerConcurrentObserve(t *testing.T) {
	d, _, log := newTestDebouncer(t)
	const groups, goroutines = 8, 16
	for g := range groups {
		d.Observe("g"+strconv.Itoa(g), 3, 0)
	}
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			for g := range groups {
				d.Observe("g"+strconv.Itoa((g+i)%groups), 0, i)
				d.Observe("g"+strconv.Itoa((g+i)%groups), i%2, i)
			}
		})
	}
	wg.Wait()
	fired := map[string]int{}
	for _, a := range log.all() {
		fired[a.Group]++
	}
	for g := range groups {
		require.Equal(t, 1, fired["g"+strconv.Itoa(g)], "group g%d fires once within its interval", g)
	}
}

// With the wall clock, an alert held back is sent by a timer when the interval ends.
func TestDebouncerWallClockSendsHeldAlert(t *testing.T) {
	got := make(chan Alert[int], 4)
	const short = 50 * time.Millisecond
	d := NewDebouncer(DebouncerConfig[int]{MinInterval: short, Recovery: true, Fire: func(a Alert[int]) { got <- a }})
	defer d.Close()
	d.Observe("web", 1, 0)
	start := time.Now()
	d.Observe("web", 0, 1)
	d.Observe("web", 1, 2)
	require.Equal(t, zero, (<-got).Event, "sent from Observe")
	select {
	case a := <-got:
		require.Equal(t, recovered, a.Event)
		require.GreaterOrEqual(t, time.Since(start), short, "not before the interval ends")
	case <-time.After(5 * time.Second):
		t.Fatal("the held-back recovery was never sent")
	}
}

// The alert document's rule with the zero DebouncerConfig: every fall of a group that had
// been up alerts at once, a group that stays down alerts once, and a recovery sends nothing.
func TestDebouncerDefaultAlertsEveryFallAtOnce(t *testing.T) {
	c, log := newFakeClock(), &alertLog{}
	var rose []string
	d := NewDebouncer(DebouncerConfig[int]{Clock: c, Fire: log.fire, Recovered: func(g string) { rose = append(rose, g) }})
	defer d.Close()
	d.Observe("web", 2, 0)
	fell := c.Now()
	d.Observe("web", 0, 1) // down
	c.Advance(time.Second)
	d.Observe("web", 0, 2) // still down
	require.Equal(t, []string{zero}, log.events(), "the fall alerts at once; staying down adds nothing")
	c.Advance(time.Second)
	d.Observe("web", 1, 3) // up: nothing
	require.Equal(t, []string{zero}, log.events(), "a recovery sends nothing")
	c.Advance(time.Second)
	fellAgain := c.Now()
	d.Observe("web", 0, 4) // down again, 3 s after the first fall
	d.Observe("web", 1, 5) // up
	require.Equal(t, []string{zero, zero}, log.events(), "each downward edge alerts at once")
	require.Equal(t, []Alert[int]{
		{Group: "web", Event: zero, Since: fell, Falls: 1, Value: 1},
		{Group: "web", Event: zero, Since: fellAgain, Falls: 1, Value: 4},
	}, log.all())
	require.Zero(t, c.pendingTimers(), "nothing is held back")
	require.Equal(t, []string{"web", "web"}, rose, "each recovery is recorded (coming up the first time is none)")

	// A flood: one alert per fall, each at once.
	for i := range 1000 {
		d.Observe("web", i%2, i) // 0, 1, 0, 1, ...
	}
	require.Len(t, log.all(), 2+500)
	require.Zero(t, c.pendingTimers())
}

func TestDebouncerNegativeIntervalIsNone(t *testing.T) {
	c, log := newFakeClock(), &alertLog{}
	d := NewDebouncer(DebouncerConfig[int]{MinInterval: -time.Minute, Clock: c, Fire: log.fire})
	defer d.Close()
	for _, healthy := range []int{1, 0, 1, 0} {
		d.Observe("web", healthy, 0)
	}
	require.Equal(t, []string{zero, zero}, log.events())
}

// Recovery without an interval: each fall and each recovery of a reported fall alerts at once.
func TestDebouncerRecoveryWithoutIntervalAlertsAtOnce(t *testing.T) {
	c, log := newFakeClock(), &alertLog{}
	d := NewDebouncer(DebouncerConfig[int]{Recovery: true, Clock: c, Fire: log.fire})
	defer d.Close()
	d.Observe("web", 0, 0) // never up: nothing
	d.Observe("web", 2, 1) // first up: not a recovery
	d.Observe("web", 0, 2)
	d.Observe("web", 0, 3)
	c.Advance(time.Second)
	back := c.Now()
	d.Observe("web", 1, 4)
	d.Observe("web", 2, 5)
	d.Observe("web", 0, 6)
	d.Observe("web", 1, 7)
	require.Equal(t, []string{zero, recovered, zero, recovered}, log.events())
	require.Equal(t, Alert[int]{Group: "web", Event: recovered, Since: back, Value: 4}, log.all()[1])
	require.Zero(t, c.pendingTimers())
}

// An interval without Recovery: falls held back are reported as one zero-healthy alert when
// the interval ends, even when the group is up again by then; recoveries never alert.
func TestDebouncerIntervalWithoutRecoveryReportsHeldFalls(t *testing.T) {
	c, log := newFakeClock(), &alertLog{}
	d := NewDebouncer(DebouncerConfig[int]{MinInterval: interval, Clock: c, Fire: log.fire})
	defer d.Close()
	d.Observe("web", 1, 0)
	first := c.Now()
	d.Observe("web", 0, 1) // alert at once
	c.Advance(time.Second)
	d.Observe("web", 1, 2)
	c.Advance(time.Second)
	fellAgain := c.Now()
	d.Observe("web", 0, 3) // held back
	c.Advance(time.Second)
	d.Observe("web", 1, 4) // up again before the interval ends
	require.Equal(t, []string{zero}, log.events())
	c.Advance(first.Add(interval).Sub(c.Now()))
	require.Equal(t, []Alert[int]{
		{Group: "web", Event: zero, Since: first, Falls: 1, Value: 1},
		{Group: "web", Event: zero, Since: fellAgain, Falls: 1, Value: 4},
	}, log.all(), "the held fall is reported, with when it began")
	c.Advance(10 * interval)
	require.Len(t, log.all(), 2, "the recovery is not an alert")
	d.Observe("web", 0, 5)
	require.Equal(t, []string{zero, zero, zero}, log.events(), "a fall after the interval alerts at once")
}

// Without an interval a removed group is forgotten at once: created again, it is a new group,
// whose first coming up is no recovery and whose first fall alerts.
func TestDebouncerDefaultForgetsARemovedGroupAtOnce(t *testing.T) {
	c, log := newFakeClock(), &alertLog{}
	d := NewDebouncer(DebouncerConfig[int]{Recovery: true, Clock: c, Fire: log.fire})
	defer d.Close()
	d.Observe("web", 1, 0)
	d.Observe("web", 0, 1)
	d.Remove("web")
	require.Empty(t, d.groups)
	require.Zero(t, c.pendingTimers())
	d.Observe("web", 0, 2) // re-created, its member's probe not passed yet
	d.Observe("web", 1, 3)
	d.Observe("web", 0, 4)
	require.Equal(t, []string{zero, zero}, log.events())
	d.Remove("web")
	require.Empty(t, d.groups)
}
