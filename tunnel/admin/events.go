package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// GroupEvent is the data of one "group_event" on a live group event stream: one member's
// health bit changed. For a tenant the counts cover only that tenant's members.
type GroupEvent struct {
	// Protocol and Label name the group as in GroupInfo.
	Protocol group.Proto `json:"protocol"`
	Label    string      `json:"label"`
	// Group is the group's name; KeyHashShort tells apart TCP pools that share it.
	Group        string `json:"group"`
	KeyHashShort string `json:"key_hash_short"`
	// TunnelID is the member whose health bit changed; Healthy and Reason are its new state.
	TunnelID string `json:"tunnel_id"`
	Healthy  bool   `json:"healthy"`
	Reason   string `json:"reason"`
	// Ejection marks the ejection of a member by passive outlier detection, and its end.
	Ejection bool `json:"ejection,omitempty"`
	// HealthyCount and MemberCount are the group's counts after the change.
	HealthyCount int `json:"healthy_count"`
	MemberCount  int `json:"member_count"`
	// At is when the edge recorded the change.
	At time.Time `json:"at"`
}

// LaggedEvent is the data of a "lagged" event: the subscriber read too slowly and Missed
// group events were dropped for it, just before this point in the stream. Resynchronise
// with GET /api/groups.
type LaggedEvent struct {
	Missed int `json:"missed"`
}

// sseWriteTimeout bounds one write to an event stream, so that a consumer that stopped
// reading does not hold its handler for ever.
const sseWriteTimeout = 10 * time.Second

// broker fans group health transitions out to the live event streams. publish never blocks, and a subscriber whose buffer is full misses the event
// instead of delaying the edge or the other subscribers.
type broker struct {
	buffer int

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	// tenants counts each pool's members (and healthy members) per tenant, kept up to date
	// from the events, so that a tenant's stream can carry the tenant's own counts without
	// taking the group's lock.
	tenants map[string]map[string]*tally // group id → tenant → counts
	counted map[string]bool              // member ids counted as healthy in tenants
}

type tally struct{ members, healthy int }

// subscriber is one live event stream.
type subscriber struct {
	ref groupRef
	sc  scope
	ch  chan sseItem
	// guarded by broker.mu: lagged is set when an event was dropped, and cleared once the
	// "lagged" marker is queued (or handed over by takeLag).
	lagged bool
	missed int
}

// sseItem is a queued group event, or with missed > 0 a "lagged" marker.
type sseItem struct {
	ev     GroupEvent
	missed int
}

func newBroker(buffer int) *broker {
	return &broker{buffer: buffer, subs: map[*subscriber]struct{}{}, tenants: map[string]map[string]*tally{},
		counted: map[string]bool{}}
}

// subscribe adds a subscriber, unless a tenant caller already has max streams open (0: no
// cap; the admin is never capped).
func (b *broker) subscribe(ref groupRef, sc scope, max int) (*subscriber, bool) {
	sub := &subscriber{ref: ref, sc: sc, ch: make(chan sseItem, b.buffer)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if max > 0 && !sc.admin {
		n := 0
		for s := range b.subs {
			if !s.sc.admin && s.sc.tenant == sc.tenant {
				n++
			}
		}
		if n >= max {
			return nil, false
		}
	}
	b.subs[sub] = struct{}{}
	return sub, true
}

func (b *broker) subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

func (b *broker) unsubscribe(sub *subscriber) {
	b.mu.Lock()
	delete(b.subs, sub)
	b.mu.Unlock()
}

// publish records ev's effect on the per-tenant counts and offers a health transition to
// every subscriber of its group that may see the member.
func (b *broker) publish(ev group.Event) {
	g := ev.Group
	if g.Solo() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.count(ev)
	if ev.Kind != group.EventHealth || len(b.subs) == 0 {
		return
	}
	base := GroupEvent{
		Protocol:     g.Proto,
		Label:        g.Label,
		Group:        g.Name,
		KeyHashShort: g.KeyHash.Short(),
		TunnelID:     ev.Member.ID,
		Healthy:      ev.Healthy,
		Reason:       ev.Reason,
		Ejection:     ev.Ejection,
		HealthyCount: ev.HealthyCount,
		MemberCount:  ev.MemberCount,
		At:           ev.At,
	}
	for sub := range b.subs {
		if !sub.ref.matches(g) || !sub.sc.sees(ev.Member) {
			continue
		}
		e := base
		if !sub.sc.admin {
			t := b.tenants[g.ID][sub.sc.tenant] // exists: the member is the tenant's
			e.HealthyCount, e.MemberCount = t.healthy, t.members
		}
		sub.offer(e)
	}
}

// count keeps b.tenants; the caller holds b.mu.
func (b *broker) count(ev group.Event) {
	g, m, tenant := ev.Group.ID, ev.Member.ID, ev.Member.Tenant
	if ev.GroupRemoved {
		delete(b.tenants, g)
		delete(b.counted, m)
		return
	}
	if tenant == "" {
		return
	}
	per := b.tenants[g]
	if per == nil {
		per = map[string]*tally{}
		b.tenants[g] = per
	}
	t := per[tenant]
	if t == nil {
		t = &tally{}
		per[tenant] = t
	}
	// counted remembers whether each member is counted as healthy, so that only real flips
	// move the tally (a probed member's first verdict may confirm it is unhealthy).
	was := b.counted[m]
	switch ev.Kind {
	case group.EventJoined:
		t.members++
		if ev.Healthy {
			t.healthy++
			b.counted[m] = true
		}
	case group.EventHealth:
		switch {
		case ev.Healthy && !was:
			t.healthy++
			b.counted[m] = true
		case !ev.Healthy && was:
			t.healthy--
			delete(b.counted, m)
		}
	case group.EventLeft:
		t.members--
		if was {
			t.healthy--
		}
		delete(b.counted, m)
		if t.members <= 0 {
			delete(per, tenant)
		}
	}
}

// offer queues e without blocking; the caller holds the broker's lock. After a drop, the
// next item that fits is the "lagged" marker, so the consumer learns exactly where the gap is.
func (sub *subscriber) offer(e GroupEvent) {
	if sub.lagged {
		select {
		case sub.ch <- sseItem{missed: sub.missed}:
			sub.lagged, sub.missed = false, 0
		default:
			sub.missed++
			return
		}
	}
	select {
	case sub.ch <- sseItem{ev: e}:
	default:
		sub.lagged = true
		sub.missed++
	}
}

// takeLag hands over a pending "lagged" marker once the subscriber has read everything
// queued before the gap, so that a consumer learns of it even when no event follows.
func (b *broker) takeLag(sub *subscriber) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !sub.lagged || len(sub.ch) > 0 {
		return 0, false
	}
	n := sub.missed
	sub.lagged, sub.missed = false, 0
	return n, true
}

// apiGroupEvents serves GET /api/groups/{protocol}/{label}/events: a Server-Sent Events
// stream of the group's health transitions, with a keep-alive comment every
// Config.EventKeepAlive. It ends when the client goes away or the edge shuts down.
func (p *Plane) apiGroupEvents(w http.ResponseWriter, r *http.Request) {
	sc := scopeOf(r)
	ref, ok := parseGroupRef(r.PathValue("protocol"), r.PathValue("label"))
	notFound := fmt.Sprintf("no group %s/%s", r.PathValue("protocol"), r.PathValue("label"))
	if !ok {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	// Subscribe before looking, so that no transition falls between the look and the stream.
	events := p.events
	max := 0
	if p.cfg.MaxEventStreams != nil {
		max = p.cfg.MaxEventStreams(sc.tenant)
	}
	sub, ok := events.subscribe(ref, sc, max)
	if !ok {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many open event streams for this tenant (max_event_streams %d)", max))
		return
	}
	defer events.unsubscribe(sub)
	if !p.groupVisible(ref, sc) {
		writeError(w, http.StatusNotFound, notFound)
		return
	}
	if p.cfg.ShuttingDown() {
		writeError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}

	rc := http.NewResponseController(w)
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	send := func(format string, args ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout)) // not every ResponseWriter can
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if !send(": group events of %s/%s\n\n", ref.proto, ref.label) {
		p.log.Debug("admin API: event stream ended before its first event (the ResponseWriter must flush)")
		return
	}

	keepAlive := time.NewTicker(p.cfg.EventKeepAlive)
	defer keepAlive.Stop()
	for {
		var it sseItem
		select {
		case it = <-sub.ch:
		default:
			n, lagged := events.takeLag(sub)
			if lagged {
				it = sseItem{missed: n}
			} else {
				select {
				case it = <-sub.ch:
				case <-keepAlive.C:
					if !send(": keep-alive\n\n") {
						return
					}
					continue
				case <-r.Context().Done():
					return
				case <-p.cfg.Done:
					return
				}
			}
		}
		var ok bool
		if it.missed > 0 {
			data, _ := json.Marshal(LaggedEvent{Missed: it.missed})
			ok = send("event: lagged\ndata: %s\n\n", data)
		} else {
			data, _ := json.Marshal(it.ev)
			ok = send("event: group_event\ndata: %s\n\n", data)
		}
		if !ok {
			p.log.Debug("admin API: event stream ended", zap.String("group", string(ref.proto)+"/"+ref.label))
			return
		}
	}
}
