// Package policy admits or refuses public requests and connections to a reserved endpoint:
// client address rules (allow and deny CIDRs), a per-client-IP rate limit and a cap on
// concurrent exchanges. A Gate is safe for concurrent use and its memory is bounded however
// many client addresses it sees.
package policy

import (
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Rules configure a Gate. The zero Rules admit everything.
type Rules struct {
	// Allow, when not empty, are the only client addresses admitted; Deny are refused
	// (deny wins over allow).
	Allow, Deny []netip.Prefix
	// Rate is the requests or connections per second one client IP may make, with bursts
	// of Burst (0: Rate rounded up, at least 1); 0 means no limit.
	Rate  float64
	Burst int
	// MaxConcurrent caps the exchanges in flight at once (0: no cap).
	MaxConcurrent int
}

// Refusal is why a Gate turned an exchange away.
type Refusal struct {
	// Status is the HTTP status to answer: 403, 429 or 503.
	Status int
	// RetryAfter, when positive, is the Retry-After to send.
	RetryAfter time.Duration
	// Reason is a short sentence for the client.
	Reason string
}

// maxClients bounds the per-client rate limiters kept; past it the idlest half is dropped.
const maxClients = 16384

// Gate applies Rules.
type Gate struct {
	rules    Rules
	inFlight atomic.Int64
	now      func() time.Time

	mu      sync.Mutex
	clients map[netip.Addr]*client
}

type client struct {
	lim  *rate.Limiter
	seen time.Time
}

// New returns a Gate for rules.
func New(rules Rules) *Gate {
	if rules.Rate > 0 && rules.Burst <= 0 {
		rules.Burst = max(1, int(math.Ceil(rules.Rate)))
	}
	return &Gate{rules: rules, now: time.Now, clients: map[netip.Addr]*client{}}
}

// Admit decides on one exchange from addr. When it admits, the caller must call done once
// the exchange ends; when it refuses, done is nil.
func (g *Gate) Admit(addr netip.Addr) (done func(), refused *Refusal) {
	addr = addr.Unmap()
	r := &g.rules
	for _, p := range r.Deny {
		if p.Contains(addr) {
			return nil, &Refusal{Status: http.StatusForbidden, Reason: "your address is not allowed here"}
		}
	}
	if len(r.Allow) > 0 {
		ok := false
		for _, p := range r.Allow {
			ok = ok || p.Contains(addr)
		}
		if !ok {
			return nil, &Refusal{Status: http.StatusForbidden, Reason: "your address is not allowed here"}
		}
	}
	if r.Rate > 0 {
		if wait := g.take(addr); wait > 0 {
			return nil, &Refusal{Status: http.StatusTooManyRequests, RetryAfter: wait,
				Reason: fmt.Sprintf("rate limit of %g requests per second exceeded", r.Rate)}
		}
	}
	if r.MaxConcurrent > 0 {
		if g.inFlight.Add(1) > int64(r.MaxConcurrent) {
			g.inFlight.Add(-1)
			return nil, &Refusal{Status: http.StatusServiceUnavailable, RetryAfter: time.Second,
				Reason: fmt.Sprintf("the endpoint is at its limit of %d concurrent requests", r.MaxConcurrent)}
		}
		var once sync.Once
		return func() { once.Do(func() { g.inFlight.Add(-1) }) }, nil
	}
	return func() {}, nil
}

// take spends one token of addr's limiter and returns 0, or how long until one is due.
func (g *Gate) take(addr netip.Addr) time.Duration {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.clients[addr]
	if c == nil {
		if len(g.clients) >= maxClients {
			g.evict(now)
		}
		c = &client{lim: rate.NewLimiter(rate.Limit(g.rules.Rate), g.rules.Burst)}
		g.clients[addr] = c
	}
	c.seen = now
	res := c.lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return max(d, time.Second).Round(time.Second)
	}
	return 0
}

// evict drops the clients whose bucket has refilled (they lose nothing); if none has, every
// client starts again with a full bucket (a flood of fresh addresses costs the limiter its
// memory of who was limited, never unbounded memory). It runs once per maxClients new
// addresses at most, so its cost is constant per request. The caller holds g.mu.
func (g *Gate) evict(now time.Time) {
	full := time.Duration(float64(g.rules.Burst) / g.rules.Rate * float64(time.Second))
	for a, c := range g.clients {
		if now.Sub(c.seen) >= full {
			delete(g.clients, a)
		}
	}
	if len(g.clients) > maxClients/2 {
		clear(g.clients)
	}
}
