package throttle

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Defaults of AuthConfig.
const (
	DefaultMaxFailures     = 10
	DefaultFailureWindow   = 10 * time.Minute
	DefaultBlock           = 15 * time.Minute
	DefaultFailureDelay    = 250 * time.Millisecond
	DefaultMaxFailureDelay = 2 * time.Second
	DefaultMaxKeys         = 10000
	DefaultLogInterval     = time.Minute
)

// AuthConfig configures an Auth. A zero field takes its default.
type AuthConfig struct {
	// MaxFailures is how many failed authentications an address may have within Window:
	// the failure that reaches it blocks the address for Block. Attempts still being checked
	// count too, so an address never has more than MaxFailures tokens checked in a window,
	// however many it sends at once. Default 10.
	MaxFailures int
	// Window is the period failures are counted over, from an address's first failure in
	// it. Default 10 min.
	Window time.Duration
	// Block is how long a blocked address is refused, counted from the failure that blocked
	// it, without its token being checked. Default 15 min.
	Block time.Duration
	// Delay is how long an attempt from an address with one failure in its window waits
	// before its token is checked; each further failure doubles it, up to MaxDelay.
	// Defaults 250 ms and 2 s; a negative Delay means no delay.
	Delay, MaxDelay time.Duration
	// MaxKeys bounds the addresses remembered; past it the least recently seen is
	// forgotten (its counts are logged first). Default 10,000.
	MaxKeys int
	// LogInterval is the least time between two log lines about one address: failures and
	// refusals in between are counted into the next line. Default 1 min.
	LogInterval time.Duration
	// Logger receives the lines. Default none.
	Logger *zap.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Sleep waits for d or until ctx ends, whichever is first, and returns ctx's error in
	// the second case. Default a timer.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Auth throttles failed authentications per source address (Key). Call Begin before checking
// a token, then Fail or Done on the Attempt it returns. A nil *Auth throttles nothing. It is
// safe for concurrent use.
type Auth struct {
	cfg AuthConfig

	mu    sync.Mutex
	byKey map[Key]*entry
	lru   list.List // of *entry, most recently seen first
}

// entry is what Auth remembers of one address.
type entry struct {
	key          Key
	el           *list.Element
	failures     int       // in the window that began at windowStart
	windowStart  time.Time // the window's first failure
	pending      int       // attempts begun and not yet finished
	blockedUntil time.Time
	// failed and refused count since the last log line about this address; nextLog is
	// when the next may be written.
	failed, refused int
	nextLog         time.Time
}

// NewAuth returns an Auth configured by cfg.
func NewAuth(cfg AuthConfig) *Auth {
	if cfg.MaxFailures <= 0 {
		cfg.MaxFailures = DefaultMaxFailures
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultFailureWindow
	}
	if cfg.Block <= 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.Delay == 0 {
		cfg.Delay = DefaultFailureDelay
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = DefaultMaxFailureDelay
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = DefaultLogInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	return &Auth{cfg: cfg, byKey: map[Key]*entry{}}
}

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

// RefusedError is Begin's answer for an address that may not try now: its token must not be
// checked. Error is fit to show the client.
type RefusedError struct {
	Key Key
	// RetryAfter is how long until the address may try again.
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("throttle: too many failed authentications from %s; try again in %s", e.Key, RoundUp(e.RetryAfter))
}

// Attempt is one token check, begun by Begin. Call Wait before checking the token, then
// exactly one of Fail (the token was wrong) or Done (anything else, also when the check
// could not be made). A nil *Attempt does nothing.
type Attempt struct {
	a     *Auth
	e     *entry
	delay time.Duration
	ended bool // guarded by a.mu
}

// Begin starts an attempt from key. It returns a *RefusedError, and no Attempt, when key is
// blocked or already has MaxFailures failures and attempts under way in its window. The zero
// Key is never refused.
func (a *Auth) Begin(key Key) (*Attempt, error) {
	if a == nil || key.IsZero() {
		return nil, nil
	}
	a.mu.Lock()
	now := a.cfg.Now()
	e, lines := a.touch(key, now)
	a.expire(e, now)
	var err error
	switch {
	case now.Before(e.blockedUntil):
		e.refused++
		err = &RefusedError{Key: key, RetryAfter: e.blockedUntil.Sub(now)}
	case e.failures+e.pending >= a.cfg.MaxFailures:
		// The attempts under way may block the address: wait for their verdict.
		e.refused++
		err = &RefusedError{Key: key, RetryAfter: a.cfg.MaxDelay}
	}
	var at *Attempt
	if err == nil {
		e.pending++
		at = &Attempt{a: a, e: e, delay: a.delay(e.failures)}
	}
	a.mu.Unlock()
	emit(a.cfg.Logger, lines)
	return at, err
}

// Delay is how long Wait waits: 0 for an address with no failure in its window.
func (t *Attempt) Delay() time.Duration {
	if t == nil {
		return 0
	}
	return t.delay
}

// Wait waits for Delay, or until ctx ends, whichever is first; in the second case it ends the
// attempt as Done does and returns ctx's error: the token must then not be checked.
func (t *Attempt) Wait(ctx context.Context) error {
	if t == nil || t.delay <= 0 {
		return nil
	}
	if err := t.a.cfg.Sleep(ctx, t.delay); err != nil {
		t.Done()
		return err
	}
	return nil
}

// Fail records a failed authentication: the token was checked and is not valid. The failure
// that reaches MaxFailures blocks the address for Block, and is logged at once.
func (t *Attempt) Fail() {
	if t == nil {
		return
	}
	a := t.a
	a.mu.Lock()
	if t.ended {
		a.mu.Unlock()
		return
	}
	t.ended = true
	now := a.cfg.Now()
	e, lines := t.e, []line(nil)
	if a.byKey[e.key] == e {
		e.pending--
	} else { // forgotten meanwhile: the failure still counts
		e, lines = a.touch(e.key, now)
	}
	a.expire(e, now)
	if e.failures == 0 {
		e.windowStart = now
	}
	e.failures++
	e.failed++
	switch {
	case e.failures >= a.cfg.MaxFailures:
		e.blockedUntil = now.Add(a.cfg.Block)
		e.failures = 0
		lines = append(lines, a.report(e, now, "address blocked after too many failed authentications"))
	case !now.Before(e.nextLog):
		lines = append(lines, a.report(e, now, "failed authentications"))
	}
	a.mu.Unlock()
	emit(a.cfg.Logger, lines)
}

// Done ends an attempt that did not fail: the token was valid, or was never checked.
func (t *Attempt) Done() {
	if t == nil {
		return
	}
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	if e := t.e; a.byKey[e.key] == e {
		e.pending--
		if a.idle(e, a.cfg.Now()) {
			a.remove(e)
		}
	}
}

// Flush writes the line of every address with failures or refusals not yet logged whose
// LogInterval has passed (with force, of every such address), and forgets the addresses
// that have nothing left to count. Run it every LogInterval, and with force when the edge
// stops.
func (a *Auth) Flush(force bool) {
	if a == nil {
		return
	}
	a.mu.Lock()
	now := a.cfg.Now()
	var lines []line
	for el := a.lru.Front(); el != nil; {
		e, next := el.Value.(*entry), el.Next()
		if (e.failed > 0 || e.refused > 0) && (force || !now.Before(e.nextLog)) {
			lines = append(lines, a.report(e, now, "failed authentications"))
		}
		if a.idle(e, now) {
			a.remove(e)
		}
		el = next
	}
	a.mu.Unlock()
	emit(a.cfg.Logger, lines)
}

// Len is the number of addresses remembered.
func (a *Auth) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byKey)
}

// LogInterval is the configured interval between two lines about one address.
func (a *Auth) LogInterval() time.Duration { return a.cfg.LogInterval }

// touch returns key's entry, made if need be, as the most recently seen. Making one when
// MaxKeys are remembered forgets the least recently seen, whose counts are logged first.
func (a *Auth) touch(key Key, now time.Time) (*entry, []line) {
	if e := a.byKey[key]; e != nil {
		a.lru.MoveToFront(e.el)
		return e, nil
	}
	var lines []line
	for len(a.byKey) >= a.cfg.MaxKeys {
		old := a.lru.Back().Value.(*entry)
		if old.failed > 0 || old.refused > 0 {
			lines = append(lines, a.report(old, now, "failed authentications"))
		}
		a.remove(old)
	}
	e := &entry{key: key}
	e.el = a.lru.PushFront(e)
	a.byKey[key] = e
	return e, lines
}

func (a *Auth) remove(e *entry) {
	a.lru.Remove(e.el)
	delete(a.byKey, e.key)
}

// expire ends e's window once it is over.
func (a *Auth) expire(e *entry, now time.Time) {
	if e.failures > 0 && now.Sub(e.windowStart) >= a.cfg.Window {
		e.failures = 0
	}
}

// idle reports whether e holds nothing worth remembering.
func (a *Auth) idle(e *entry, now time.Time) bool {
	a.expire(e, now)
	return e.pending == 0 && e.failures == 0 && e.failed == 0 && e.refused == 0 && !now.Before(e.blockedUntil)
}

// delay is the wait before checking a token from an address with failures in its window.
func (a *Auth) delay(failures int) time.Duration {
	if failures == 0 || a.cfg.Delay <= 0 {
		return 0
	}
	d := a.cfg.Delay
	for i := 1; i < failures && d < a.cfg.MaxDelay; i++ {
		d *= 2
	}
	return min(d, a.cfg.MaxDelay)
}

// report makes e's log line and starts its next interval.
func (a *Auth) report(e *entry, now time.Time, msg string) line {
	fields := []zap.Field{zap.Stringer("remote", e.key), zap.Int("failed", e.failed), zap.Int("refused", e.refused)}
	if now.Before(e.blockedUntil) {
		fields = append(fields, zap.Time("blocked_until", e.blockedUntil))
	}
	e.failed, e.refused = 0, 0
	e.nextLog = now.Add(a.cfg.LogInterval)
	return line{msg: msg, fields: fields}
}
