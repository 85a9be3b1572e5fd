package tunnel

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/webhook"
)

// alerter turns group events into alerts: a Debouncer (one group_zero_healthy alert per fall;
// with the opt-ins, group_recovered alerts and at most one alert per pool per
// Alerts.MinInterval) and a Sender with one bounded queue per destination, neither of which
// ever blocks frame handling or dispatch.
type alerter struct {
	srv      *Server
	debounce *webhook.Debouncer[alertInfo]
	sender   *webhook.Sender

	stopped atomic.Bool // the edge is closing: groups vanish without an outage

	mu      sync.Mutex
	results map[webhook.Result]uint64
	fired   map[string]uint64 // alerts decided, by event
	// claims holds, per pool, the cluster claims (ClaimAlert) waiting for the one under
	// way; a pool has a key while a goroutine works through them. See inOrder.
	claims map[string][]func()
}

// maxPendingClaims bounds the cluster claims one pool may have waiting: a member flapping
// faster than NATS answers makes its later alerts dropped, not goroutines and memory grow.
const maxPendingClaims = 64

// alertInfo is what an alert says about its group, as of the group's latest event.
type alertInfo struct {
	pool                         string // poolKey
	proto, label, name, keyShort string
	members                      int
	tenantURLs                   []string
}

func newAlerter(s *Server) *alerter {
	a := &alerter{srv: s, results: map[webhook.Result]uint64{}, fired: map[string]uint64{}, claims: map[string][]func(){}}
	a.sender = webhook.NewSender(webhook.SenderConfig{
		Timeout:      s.cfg.Alerts.Timeout,
		AllowPrivate: s.cfg.Alerts.AllowPrivateWebhooks,
		Logger:       s.log.Named("alerts"),
		OnResult:     a.count,
	})
	dc := webhook.DebouncerConfig[alertInfo]{
		MinInterval: s.cfg.Alerts.MinInterval,
		Recovery:    s.cfg.Alerts.OnRecovery,
		Fire:        a.fire,
	}
	if s.cluster != nil && !s.cfg.Alerts.OnRecovery {
		dc.Recovered = a.recordRecovery
	}
	a.debounce = webhook.NewDebouncer(dc)
	return a
}

// poolKey identifies a pool across re-creations and key rotations, so that a pool whose
// members join and leave over and over stays within one alert per interval (when there is
// one) and is one record in a cluster's alerts bucket: an HTTP pool by its subdomain (one
// pool at a time), a TCP pool by its name and public port (pools of one name with different
// keys live side by side on their own ports; a rotating pool keeps its port).
func poolKey(g group.Info) string {
	if g.Kind == group.KindTCP {
		return string(g.Proto) + "\x00" + g.Label + "\x00" + strconv.Itoa(g.Port)
	}
	return string(g.Proto) + "\x00" + g.Label
}

// observe runs for every group event, with no lock held: it only records and decides;
// sending is queued.
func (a *alerter) observe(ev group.Event) {
	g := ev.Group
	if g.Solo() || a.stopped.Load() {
		return
	}
	key := poolKey(g)
	a.debounce.Observe(key, ev.SelectableCount, alertInfo{
		pool: key, proto: string(g.Proto), label: g.Label, name: g.Name, keyShort: g.KeyHash.Short(),
		members: ev.MemberCount, tenantURLs: ev.AlertWebhooks,
	})
	if ev.GroupRemoved {
		a.debounce.Remove(key)
	}
}

// fire sends one alert the debouncer decided on, at once or when its interval ended.
func (a *alerter) fire(al webhook.Alert[alertInfo]) {
	if a.stopped.Load() {
		return
	}
	v := al.Value
	p := webhook.Payload{
		Event:        al.Event,
		RegionID:     a.srv.cfg.RegionID,
		Protocol:     v.proto,
		Label:        v.label,
		GroupName:    v.name,
		KeyHashShort: v.keyShort,
		MemberCount:  v.members,
		At:           webhook.FormatTime(al.Since),
	}
	a.mu.Lock()
	a.fired[al.Event]++
	a.mu.Unlock()
	if c := a.srv.cluster; c != nil {
		// Every edge sees the pool fall; the first to record the alert sends it. That is
		// a NATS round trip: not on the registry's event path.
		a.inOrder(v.pool, func() {
			if c.ClaimAlert(v.pool, al.Event) {
				a.send(al, p)
			}
		})
		return
	}
	a.send(al, p)
}

// recordRecovery tells the cluster that pool has a healthy member again, when recoveries are
// not alerts: the cluster takes a fall alert for another edge's copy of the last one it
// recorded, so without this record a pool that falls again soon after (within a lease)
// would alert nobody.
func (a *alerter) recordRecovery(pool string) {
	if a.stopped.Load() {
		return
	}
	c := a.srv.cluster
	a.inOrder(pool, func() { c.ClaimAlert(pool, webhook.EventGroupRecovered) })
}

// inOrder runs claim, a cluster claim for pool, after the ones pool already has waiting, in
// a goroutine of the edge's: each claim reads the record the previous one wrote (a fall
// claimed before the recovery before it was recorded would be taken for a copy of the
// previous fall), and one pool's claims never contend with each other for its record.
func (a *alerter) inOrder(pool string, claim func()) {
	a.mu.Lock()
	q, busy := a.claims[pool]
	if len(q) >= maxPendingClaims {
		a.mu.Unlock()
		a.srv.log.Warn("alert dropped: the cluster has not answered this pool's earlier alerts yet",
			zap.String("pool", strings.ReplaceAll(pool, "\x00", "/")))
		return
	}
	a.claims[pool] = append(q, claim)
	a.mu.Unlock()
	if busy {
		return
	}
	work := func() {
		for {
			a.mu.Lock()
			q := a.claims[pool]
			if len(q) == 0 || a.stopped.Load() {
				delete(a.claims, pool)
				a.mu.Unlock()
				return
			}
			next := q[0]
			q[0] = nil // the closure and its alert go once run
			a.claims[pool] = q[1:]
			a.mu.Unlock()
			next()
		}
	}
	if !a.srv.spawn(work) {
		a.mu.Lock()
		delete(a.claims, pool)
		a.mu.Unlock()
	}
}

// send logs and queues one alert.
func (a *alerter) send(al webhook.Alert[alertInfo], p webhook.Payload) {
	v := al.Value
	dests := webhook.Destinations(a.srv.cfg.Alerts.WebhookURL, v.tenantURLs)
	msg := "group has no healthy member"
	if al.Event == webhook.EventGroupRecovered {
		msg = "group has a healthy member again"
	}
	a.srv.log.Warn(msg, zap.String("group", v.name), zap.String("label", v.label),
		zap.String("key", v.keyShort), zap.Int("members", v.members), zap.Int("destinations", len(dests)),
		zap.Int("falls", al.Falls), zap.Time("since", al.Since))
	if len(dests) > 0 {
		a.sender.Send(dests, p)
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

// decided returns how many alerts were decided, by event.
func (a *alerter) decided() map[string]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]uint64, len(a.fired))
	for k, v := range a.fired {
		out[k] = v
	}
	return out
}

// stop makes the alerter ignore the events of an edge that is closing.
func (a *alerter) stop() { a.stopped.Store(true) }

// close cancels the alerts still held back and releases the sender.
func (a *alerter) close() error {
	a.debounce.Close()
	return a.sender.Close()
}
