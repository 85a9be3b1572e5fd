package throttle

import (
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Defaults of ConnsConfig.
const (
	DefaultMaxConns       = 256
	DefaultMaxConnsPerKey = 16
)

// ConnsConfig configures a Conns. A zero field takes its default.
type ConnsConfig struct {
	// Max caps the connections held in all; MaxPerKey those from one address. The zero Key
	// counts toward Max only. Defaults 256 and 16.
	Max, MaxPerKey int
	// LogInterval is the least time between two log lines about refused connections: the
	// refusals in between are counted into the next line. Default 1 min.
	LogInterval time.Duration
	// What names the connections in the log line, e.g. "control connections waiting to
	// authenticate".
	What string
	// Logger receives the lines. Default none.
	Logger *zap.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Conns caps connections in a state, such as waiting to authenticate, in total and per
// source address (Key). It is safe for concurrent use.
type Conns struct {
	cfg ConnsConfig

	mu    sync.Mutex
	total int
	byKey map[Key]int // only addresses holding at least one
	// overMax and overKey count the refusals since the last log line, last is the address
	// of the latest; nextLog is when the next line may be written.
	overMax, overKey int
	last             Key
	nextLog          time.Time
}

// NewConns returns a Conns configured by cfg.
func NewConns(cfg ConnsConfig) *Conns {
	if cfg.Max <= 0 {
		cfg.Max = DefaultMaxConns
	}
	if cfg.MaxPerKey <= 0 {
		cfg.MaxPerKey = DefaultMaxConnsPerKey
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = DefaultLogInterval
	}
	if cfg.What == "" {
		cfg.What = "connections"
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Conns{cfg: cfg, byKey: map[Key]int{}}
}

// Slot is one connection Conns holds, until Release.
type Slot struct {
	c        *Conns
	key      Key
	released atomic.Bool
}

// Acquire takes a slot for a connection from key, or returns nil when that would exceed Max
// or MaxPerKey: the connection should then be closed at once. Refusals are logged in
// aggregate: the first after a quiet LogInterval at once, the others in the next line.
func (c *Conns) Acquire(key Key) *Slot {
	c.mu.Lock()
	switch {
	case c.total >= c.cfg.Max:
		c.overMax++
	case !key.IsZero() && c.byKey[key] >= c.cfg.MaxPerKey:
		c.overKey++
	default:
		c.total++
		if !key.IsZero() {
			c.byKey[key]++
		}
		c.mu.Unlock()
		return &Slot{c: c, key: key}
	}
	c.last = key
	var lines []line
	if now := c.cfg.Now(); !now.Before(c.nextLog) {
		lines = append(lines, c.report(now))
	}
	c.mu.Unlock()
	emit(c.cfg.Logger, lines)
	return nil
}

// Release gives the slot back. Only the first call counts; a nil *Slot does nothing.
func (s *Slot) Release() {
	if s == nil || s.released.Swap(true) {
		return
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total--
	if s.key.IsZero() {
		return
	}
	if n := c.byKey[s.key] - 1; n > 0 {
		c.byKey[s.key] = n
	} else {
		delete(c.byKey, s.key)
	}
}

// Flush writes the line of the refusals not yet logged once LogInterval has passed since the
// last (with force, at once). Run it every LogInterval, and with force when the edge stops.
func (c *Conns) Flush(force bool) {
	c.mu.Lock()
	var lines []line
	if now := c.cfg.Now(); c.overMax+c.overKey > 0 && (force || !now.Before(c.nextLog)) {
		lines = append(lines, c.report(now))
	}
	c.mu.Unlock()
	emit(c.cfg.Logger, lines)
}

// Held returns the connections held in all and from key.
func (c *Conns) Held(key Key) (total, fromKey int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, c.byKey[key]
}

func (c *Conns) report(now time.Time) line {
	l := line{msg: "refused " + c.cfg.What + " over the caps", fields: []zap.Field{
		zap.Int("over_total_cap", c.overMax), zap.Int("total_cap", c.cfg.Max),
		zap.Int("over_per_address_cap", c.overKey), zap.Int("per_address_cap", c.cfg.MaxPerKey),
		zap.Stringer("last_remote", c.last),
	}}
	c.overMax, c.overKey = 0, 0
	c.nextLog = now.Add(c.cfg.LogInterval)
	return l
}
