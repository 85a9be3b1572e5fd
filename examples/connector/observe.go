package main

import (
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
)

// The tunnel package does not export a session's connection state, its reconnect count or a
// tunnel's health bit; it logs each of them, once per change. observer reads those log
// entries (it is teed into the session's logger), so that `connector status` can show them.
// The messages it matches are those of tunnel/connector.go and health/prober.go; the tests
// of this package fail if they change.
const (
	msgConnected    = "connected to edge"                     // tunnel.Session.connect
	msgLost         = "connection to edge lost; reconnecting" // tunnel.Session.supervise
	msgHealth       = "health changed"                        // health.Prober.Run
	fieldTunnelID   = "tunnel"                                // the prober's logger names its tunnel
	fieldHealthy    = "healthy"
	fieldReason     = "reason"
	maxHealthMemory = 4096 // tunnel ids remembered at most (each reconnect makes new ones)
)

// healthState is the last health report of one tunnel id.
type healthState struct {
	healthy bool
	reason  string
	at      time.Time
}

// observer keeps what the session logged about itself.
type observer struct {
	mu        sync.Mutex
	connects  int  // successful connections, the first included
	connected bool // between a connect and a loss
	health    map[string]healthState
}

func newObserver() *observer { return &observer{health: map[string]healthState{}} }

// core returns the zapcore.Core to tee into the session's logger.
func (o *observer) core() zapcore.Core { return &obsCore{o: o} }

// reconnects is how many times the session connected again after losing the edge.
func (o *observer) state() (connected bool, reconnects int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.connected, max(0, o.connects-1)
}

// healthOf returns the last report for tunnel id, if any.
func (o *observer) healthOf(id string) (healthState, bool) {
	if id == "" {
		return healthState{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	h, ok := o.health[id]
	return h, ok
}

// forget drops the reports of every id not in live.
func (o *observer) forget(live map[string]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for id := range o.health {
		if !live[id] {
			delete(o.health, id)
		}
	}
}

func (o *observer) observe(e zapcore.Entry, fields []zapcore.Field) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch e.Message {
	case msgConnected:
		o.connects++
		o.connected = true
	case msgLost:
		o.connected = false
	case msgHealth:
		var id, reason string
		healthy, found := false, false
		for _, f := range fields {
			switch {
			case f.Key == fieldTunnelID && f.Type == zapcore.StringType:
				id = f.String
			case f.Key == fieldHealthy && f.Type == zapcore.BoolType:
				healthy, found = f.Integer == 1, true
			case f.Key == fieldReason && f.Type == zapcore.StringType:
				reason = f.String
			}
		}
		if id == "" || !found {
			return
		}
		if len(o.health) >= maxHealthMemory {
			clear(o.health)
		}
		o.health[id] = healthState{healthy: healthy, reason: reason, at: e.Time}
	}
}

// obsCore is a zapcore.Core that hands the entries observer reads to it, with the fields of
// the logger they were written with.
type obsCore struct {
	o      *observer
	fields []zapcore.Field
}

func (c *obsCore) Enabled(l zapcore.Level) bool { return l >= zapcore.InfoLevel }

func (c *obsCore) With(fields []zapcore.Field) zapcore.Core {
	all := make([]zapcore.Field, 0, len(c.fields)+len(fields))
	return &obsCore{o: c.o, fields: append(append(all, c.fields...), fields...)}
}

func (c *obsCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	switch e.Message {
	case msgConnected, msgLost, msgHealth:
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *obsCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	all := make([]zapcore.Field, 0, len(c.fields)+len(fields))
	c.o.observe(e, append(append(all, c.fields...), fields...))
	return nil
}

func (c *obsCore) Sync() error { return nil }
