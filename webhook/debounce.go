package webhook

import (
	"sync"
	"time"
)

// Clock is the time source of a Debouncer; tests inject a fake one.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f, in a goroutine of its own, once d has passed. The
	// returned stop function cancels the call and reports whether it did
	// (false if f has already been called or started).
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// Alert is one alert a Debouncer decided to send.
type Alert[T any] struct {
	// Group is the key the group was observed under.
	Group string
	// Event is EventGroupZeroHealthy or, only with DebouncerConfig.Recovery,
	// EventGroupRecovered; see the rules of Debouncer.
	Event string
	// Since is when the group entered the state Event reports: for
	// EventGroupZeroHealthy its latest fall to zero healthy members, for
	// EventGroupRecovered the moment it had a healthy member again.
	Since time.Time
	// Falls counts the group's falls to zero healthy members since its
	// previous alert (those held back by the interval included).
	Falls int
	// Value is the value of the group's latest observation.
	Value T
}

// DebouncerConfig configures a Debouncer. The zero value (with Fire set)
// follows the alert document's rule: every fall to zero healthy members
// alerts at once, nothing else does.
type DebouncerConfig[T any] struct {
	// MinInterval, when above 0, is the shortest time between two alerts of
	// one group, however fast it flaps; changes inside it are held back and
	// reported when it ends. 0 (the default; a negative value is 0) sets no
	// interval: each fall alerts at once. An opt-in rate limit.
	MinInterval time.Duration
	// Recovery makes a group's recovery an alert too (EventGroupRecovered).
	// Off by default, as in the alert document, whose only event is
	// EventGroupZeroHealthy: a recovery is then only recorded, so that the
	// group's next fall alerts again.
	Recovery bool
	// Recovered, when set, is called each time a group that was down has a
	// healthy member again, whether Recovery makes that an alert or not,
	// from Observe with the Debouncer's lock released. Callers that share
	// alert decisions with other processes use it to record that the
	// group's next fall is a new one. The rules of Fire apply to it.
	Recovered func(group string)
	// Clock is the time source. Default: the wall clock.
	Clock Clock
	// Fire is called once per alert, either from Observe or Remove (an
	// alert due at once) or from a timer goroutine (an alert held back until
	// the end of its group's interval), never with the Debouncer's lock held.
	// It must not block for long and must not call the Debouncer.
	Fire func(Alert[T])
}

// Debouncer turns a stream of "group G now has N healthy members"
// observations into alerts. By default it applies the alert document's
// rule: one alert per fall to zero healthy members, sent at once, however
// often the group falls, and none while it stays down; DebouncerConfig's
// MinInterval (a rate limit) and Recovery (recovery alerts) are opt-ins. It
// is safe for concurrent use; create it with NewDebouncer and stop it with
// Close. T is whatever the caller needs to build an alert (names,
// destinations); the latest observed value is handed back in each Alert.
//
// The rules, per group:
//
//   - A group is down when it has zero healthy members after having had at
//     least one, and up otherwise. A group that has never had a healthy
//     member is not down (members with a health check start unhealthy), so
//     it does not alert until it has been up once. Negative counts are zero.
//   - Without Recovery, every alert is EventGroupZeroHealthy, and one is due
//     when the group fell to zero since its previous alert: a group that
//     stays down is reported once, and after it has had a healthy member
//     again its next fall is reported afresh.
//   - With Recovery, each alert reports the group's state when it is sent:
//     EventGroupZeroHealthy when down, EventGroupRecovered when up. One is
//     due when the group fell to zero since its previous alert, or when its
//     state differs from the one its previous alert reported (a group with
//     no previous alert counts as reported up). So a fall is always
//     reported, a recovery is reported once the fall was, and a group that
//     stays down is reported once.
//   - With no MinInterval, a due alert is sent at once, and a removed group
//     (Remove) is forgotten at once: created again under the same key, it
//     is a new group.
//   - With a MinInterval, a due alert is sent at once when the group's
//     previous alert is at least MinInterval old (or there is none).
//     Otherwise it is sent when MinInterval has passed since the previous
//     alert: with Recovery, reporting the state at that moment (a group
//     that fell, recovered and fell again inside the interval gets a
//     zero-healthy alert when the interval ends, and one that fell and
//     recovered inside it gets a recovered alert); without it, a
//     zero-healthy alert for the falls held back, whose Since is the latest
//     of them, even if the group is up again by then. A removed group keeps
//     its state until MinInterval has passed since its last alert, so that
//     a group removed and re-created under the same key cannot alert more
//     often; an alert still due is sent then. Its state is forgotten
//     afterwards.
type Debouncer[T any] struct {
	interval  time.Duration
	recovery  bool
	clock     Clock
	fire      func(Alert[T])
	recovered func(string)

	mu     sync.Mutex
	closed bool
	groups map[string]*debounceState[T]
	firing sync.WaitGroup // Fire and Recovered calls under way
}

// debounceState is one group's state.
type debounceState[T any] struct {
	everUp   bool      // has had a healthy member
	down     bool      // at zero after having been up
	reported bool      // the previous alert reported down
	falls    int       // falls since the previous alert
	since    time.Time // when the current state (down or up) began
	fell     time.Time // when the latest fall began
	last     time.Time // when the previous alert was decided; zero: never
	removed  bool
	value    T
	stop     func() bool // cancels the armed timer; nil when none
	gen      uint64      // identifies the armed timer
}

// NewDebouncer returns a Debouncer with cfg's defaults applied.
func NewDebouncer[T any](cfg DebouncerConfig[T]) *Debouncer[T] {
	if cfg.MinInterval < 0 {
		cfg.MinInterval = 0
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Fire == nil {
		cfg.Fire = func(Alert[T]) {}
	}
	return &Debouncer[T]{interval: cfg.MinInterval, recovery: cfg.Recovery, clock: cfg.Clock, fire: cfg.Fire,
		recovered: cfg.Recovered, groups: make(map[string]*debounceState[T])}
}

// Observe records that group now has healthy healthy members, with v as the
// value later alerts of the group carry, and sends the alert this makes due
// if the group's interval allows. A group removed earlier is live again.
// After Close, Observe does nothing.
func (d *Debouncer[T]) Observe(group string, healthy int, v T) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	now := d.clock.Now()
	st := d.groups[group]
	if st == nil {
		st = &debounceState[T]{since: now}
		d.groups[group] = st
	}
	st.value, st.removed = v, false
	rose := false
	switch {
	case healthy > 0:
		st.everUp = true
		if st.down {
			st.down, st.since = false, now
			rose = d.recovered != nil
		}
	case st.everUp && !st.down:
		st.down, st.since, st.fell = true, now, now
		st.falls++
	}
	if rose {
		d.firing.Add(1) // before step releases the lock: Close waits for the call
		defer func() {
			defer d.firing.Done()
			d.recovered(group)
		}()
	}
	d.step(group, st, now)
}

// Remove records that group no longer exists; see the rules of Debouncer.
func (d *Debouncer[T]) Remove(group string) {
	d.mu.Lock()
	st := d.groups[group]
	if d.closed || st == nil {
		d.mu.Unlock()
		return
	}
	st.removed = true
	d.step(group, st, d.clock.Now())
}

// Close cancels every alert still held back and waits for the Fire calls
// under way. Later Observe and Remove calls do nothing. It is idempotent.
func (d *Debouncer[T]) Close() {
	d.mu.Lock()
	d.closed = true
	for _, st := range d.groups {
		d.disarm(st)
	}
	d.groups = map[string]*debounceState[T]{}
	d.mu.Unlock()
	d.firing.Wait()
}

// step applies the rules to st at now: it sends the due alert, arms the timer
// for the end of the interval, or forgets a removed group. d.mu is held and
// step releases it.
func (d *Debouncer[T]) step(group string, st *debounceState[T], now time.Time) {
	due := st.falls > 0 || (d.recovery && st.down != st.reported)
	end := st.last.Add(d.interval)
	open := st.last.IsZero() || !now.Before(end)
	switch {
	case due && open:
		a := Alert[T]{Group: group, Event: EventGroupZeroHealthy, Since: st.fell, Falls: st.falls, Value: st.value}
		if d.recovery && !st.down {
			a.Event, a.Since = EventGroupRecovered, st.since
		}
		st.reported, st.falls, st.last = st.down, 0, now
		d.disarm(st)
		switch {
		case st.removed && d.interval > 0:
			d.arm(group, st, d.interval) // forget it when this interval ends
		case st.removed:
			delete(d.groups, group)
		}
		d.firing.Add(1)
		d.mu.Unlock()
		defer d.firing.Done()
		d.fire(a)
		return
	case due || (st.removed && !open):
		d.arm(group, st, end.Sub(now))
	case st.removed:
		d.disarm(st)
		delete(d.groups, group)
	}
	d.mu.Unlock()
}

// arm makes the timer call step for group after wait, unless one is armed.
// d.mu is held.
func (d *Debouncer[T]) arm(group string, st *debounceState[T], wait time.Duration) {
	if st.stop != nil {
		return
	}
	st.gen++
	gen := st.gen
	st.stop = d.clock.AfterFunc(wait, func() {
		d.mu.Lock()
		if d.closed || d.groups[group] != st || st.gen != gen {
			d.mu.Unlock()
			return
		}
		st.stop = nil
		d.step(group, st, d.clock.Now())
	})
}

// disarm cancels st's timer; d.mu is held.
func (d *Debouncer[T]) disarm(st *debounceState[T]) {
	if st.stop != nil {
		st.stop()
		st.stop = nil
	}
	st.gen++
}
