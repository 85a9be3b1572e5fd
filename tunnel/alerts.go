package tunnel

import (
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/webhook"
)

// alerter turns group events into group_zero_healthy alerts: a Debouncer per group, and
// a bounded Sender that never blocks frame handling or dispatch.
type alerter struct {
	srv      *Server
	debounce *webhook.Debouncer
	sender   *webhook.Sender

	stopped atomic.Bool // the edge is closing: groups vanish without an outage

	mu      sync.Mutex
	results map[webhook.Result]uint64
}

func newAlerter(s *Server) *alerter {
	a := &alerter{srv: s, debounce: webhook.NewDebouncer(), results: map[webhook.Result]uint64{}}
	a.sender = webhook.NewSender(webhook.SenderConfig{
		Timeout:      s.cfg.AlertTimeout,
		AllowPrivate: s.cfg.AllowPrivateAlertWebhooks,
		Logger:       s.log.Named("alerts"),
		OnResult:     a.count,
	})
	return a
}

// observe runs for every group event, under the group's lock: it only decides and queues.
func (a *alerter) observe(ev group.Event) {
	g := ev.Group
	if g.Solo() || a.stopped.Load() {
		return
	}
	if a.debounce.Observe(g.ID, ev.SelectableCount) {
		p := webhook.Payload{
			Event:        webhook.EventGroupZeroHealthy,
			RegionID:     a.srv.cfg.RegionID,
			Protocol:     string(g.Proto),
			Label:        g.Label,
			GroupName:    g.Name,
			KeyHashShort: g.KeyHash.Short(),
			MemberCount:  ev.MemberCount,
			At:           webhook.FormatTime(ev.At),
		}
		dests := webhook.Destinations(a.srv.cfg.AlertWebhookURL, ev.AlertWebhooks)
		a.srv.log.Warn("group has no healthy member", zap.String("group", g.Name), zap.String("label", g.Label),
			zap.String("key", p.KeyHashShort), zap.Int("members", ev.MemberCount), zap.Int("destinations", len(dests)),
			zap.String("cause", ev.Kind.String()))
		if len(dests) > 0 {
			a.sender.Send(dests, p)
		}
	}
	if ev.GroupRemoved {
		a.debounce.Forget(g.ID)
	}
}

func (a *alerter) count(_ webhook.Destination, r webhook.Result, _ error) {
	a.mu.Lock()
	a.results[r]++
	a.mu.Unlock()
}

// deliveries returns how many alert deliveries ended with each result.
func (a *alerter) deliveries() map[webhook.Result]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[webhook.Result]uint64, len(a.results))
	for k, v := range a.results {
		out[k] = v
	}
	return out
}

// stop makes the alerter ignore the events of an edge that is closing.
func (a *alerter) stop() { a.stopped.Store(true) }

func (a *alerter) close() error { return a.sender.Close() }
