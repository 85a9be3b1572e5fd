package tunnel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/webhook"
)

// receiver records the alerts POSTed to it.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	got  []webhook.Payload
	hold chan struct{} // when non-nil, each request waits for it
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var p webhook.Payload
		if err := json.Unmarshal(body, &p); err != nil || req.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad alert", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, p)
		hold := r.hold
		r.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-req.Context().Done():
			}
		}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) alerts() []webhook.Payload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]webhook.Payload(nil), r.got...)
}

// switchable is a health check the test turns on and off. Its check returns at once; the
// timeout is generous so that a loaded machine (a starved goroutine) never fails it.
type switchable struct{ down atomic.Bool }

func (s *switchable) spec() *health.Spec {
	return &health.Spec{Type: health.TypeFunc, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, MaxFailed: 1,
		Check: func(context.Context) error {
			if s.down.Load() {
				return errors.New("switched off")
			}
			return nil
		}}
}

func selectable(e *testEdge, sub string) func() int {
	return func() int {
		g := e.registry.LookupHTTP(sub)
		if g == nil {
			return -1
		}
		_, _, n := g.Counts()
		return n
	}
}

// events returns the Event of each alert r received, in order.
func (r *receiver) events() []string {
	var out []string
	for _, p := range r.alerts() {
		out = append(out, p.Event)
	}
	return out
}

// With recovery alerts asked for and no interval, every fall and every recovery is posted
// once to the operator and to each unique tenant URL.
func TestAlertOnEveryFallAndRecovery(t *testing.T) {
	op, t1, t2 := newReceiver(t), newReceiver(t), newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, RegionID: "eu", Alerts: Alerts{WebhookURL: op.URL, AllowPrivateWebhooks: true, OnRecovery: true}})
	b := backend(t, "b")
	var ha, hb, hc switchable
	for _, m := range []struct {
		h   *switchable
		url string
	}{{&ha, t1.URL}, {&hb, t2.URL}, {&hc, t2.URL}} {
		spec := pool("pool")
		spec.Health, spec.AlertWebhook = m.h.spec(), m.url
		_, err := e.connect().Forward(ctxT(t), spec, hostPort(b.URL))
		require.NoError(t, err)
	}
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 3 }, 5*time.Second, 5*time.Millisecond)
	require.Empty(t, op.alerts(), "members coming up for the first time is not a recovery")

	ha.down.Store(true)
	hb.down.Store(true)
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	hc.down.Store(true)
	require.Eventually(t, func() bool { return n() == 0 }, 5*time.Second, 5*time.Millisecond)

	want := func(r *receiver, events ...string) {
		t.Helper()
		require.Eventually(t, func() bool { return len(r.alerts()) == len(events) }, 5*time.Second, 5*time.Millisecond)
		require.Equal(t, events, r.events())
	}
	for _, r := range []*receiver{op, t1, t2} {
		want(r, webhook.EventGroupZeroHealthy) // t2 is shared by two members: posted once
	}
	p := op.alerts()[0]
	require.Equal(t, "group_zero_healthy", p.Event)
	require.Equal(t, "eu", p.RegionID)
	require.Equal(t, "http", p.Protocol)
	require.Equal(t, "pool", p.Label)
	require.Equal(t, "web", p.GroupName)
	require.Equal(t, e.registry.LookupHTTP("pool").KeyHash().Short(), p.KeyHashShort)
	require.Len(t, p.KeyHashShort, 8)
	require.Equal(t, 3, p.MemberCount)
	_, err := time.Parse(time.RFC3339, p.At)
	require.NoError(t, err)

	// A recovery is posted; so is the next fall.
	ha.down.Store(false)
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	for _, r := range []*receiver{op, t1, t2} {
		want(r, webhook.EventGroupZeroHealthy, webhook.EventGroupRecovered)
	}
	require.Equal(t, "group_recovered", op.alerts()[1].Event)
	ha.down.Store(true)
	require.Eventually(t, func() bool { return n() == 0 }, 5*time.Second, 5*time.Millisecond)
	for _, r := range []*receiver{op, t1, t2} {
		want(r, webhook.EventGroupZeroHealthy, webhook.EventGroupRecovered, webhook.EventGroupZeroHealthy)
	}
	// Staying down fires nothing more.
	time.Sleep(100 * time.Millisecond) // several probe intervals of steady state; nothing to await
	require.Len(t, op.alerts(), 3)
}

func TestAlertFiresWhenTheLastHealthyMemberLeaves(t *testing.T) {
	op := newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, OnRecovery: true}})
	b := backend(t, "b")
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, sess.Close())
	require.Eventually(t, func() bool { return len(op.alerts()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, op.alerts()[0].MemberCount, "the pool reached zero when its last member started draining")

	// The pool is created again (a new pool, with no interval to keep the old one's state,
	// so its coming up is not a recovery), and its member vanishes without a goodbye
	// (connection cut): that fires too.
	var raw net.Conn
	cut, err := Dial(ctxT(t), e.controlAddr, WithReconnect(false), WithDialer(func(ctx context.Context, n, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, n, a)
		raw = c
		return c, err
	}))
	require.NoError(t, err)
	defer cut.Close()
	_, err = cut.Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, raw.Close())
	require.Eventually(t, func() bool { return len(op.alerts()) == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{webhook.EventGroupZeroHealthy, webhook.EventGroupZeroHealthy}, op.events())
	require.Equal(t, 0, op.alerts()[1].MemberCount)

	// Solo tunnels are not pools: no alert.
	solo := e.connect()
	_, err = solo.Forward(ctxT(t), TunnelSpec{Subdomain: "solo"}, hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, solo.Close())
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("solo") == nil }, 5*time.Second, 5*time.Millisecond)
	require.Len(t, op.alerts(), 2)
}

// With the interval asked for, a member flapping as fast as its connector can send health
// frames gives one alert to the operator and to its tenant per interval, not one per fall.
func TestAlertFloodFromAFlappingMemberIsOneAlert(t *testing.T) {
	op, tenant := newReceiver(t), newReceiver(t)
	var falls atomic.Int32
	var up atomic.Bool
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, AllowPrivateWebhooks: true, MinInterval: time.Hour, OnRecovery: true},
		Logger: zap.NewNop(),
		OnEvent: func(ev group.Event) { // after the alerter has seen the event
			if ev.Group.Label != "pool" {
				return
			}
			if ev.SelectableCount > 0 {
				up.Store(true)
			} else if up.Swap(false) {
				falls.Add(1)
			}
		}})
	b := backend(t, "b")
	sess := e.connect(WithLogger(zap.NewNop()))
	spec := pool("pool")
	spec.AlertWebhook = tenant.URL
	spec.Health = &health.Spec{Type: health.TypeFunc, Interval: time.Hour, Timeout: time.Second, MaxFailed: 1,
		Check: func(context.Context) error { return nil }} // reports healthy once, then never again
	tun, err := sess.Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)

	c, err := sess.liveConn(ctxT(t))
	require.NoError(t, err)
	const frames = 1000
	start := time.Now()
	for i := range frames {
		require.NoError(t, c.send(healthFrame(tun.ID(), i%2 == 1))) // down, up, down, ... ends up
	}
	t.Logf("%d health frames sent in %v", frames, time.Since(start))
	// The control stream is read in order: once a later registration is answered, every
	// health frame before it has been handled, and its events delivered.
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "barrier"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Greater(t, falls.Load(), int32(100), "the member flapped")
	require.Equal(t, map[string]uint64{webhook.EventGroupZeroHealthy: 1}, e.alerts.decided(), "one alert for the whole flood")
	for _, r := range []*receiver{op, tenant} {
		require.Eventually(t, func() bool { return len(r.alerts()) == 1 }, 5*time.Second, 5*time.Millisecond)
	}
	require.Equal(t, map[webhook.Result]uint64{webhook.ResultSuccess: 2}, e.alerts.deliveries())
}

// With the interval and recovery alerts asked for, a group that fell, recovered and fell
// again inside the interval is reported down again when the interval ends; a recovery inside
// the interval is reported when it ends.
func TestAlertRecoveryAndSecondFallInsideTheIntervalAreNotLost(t *testing.T) {
	op := newReceiver(t)
	const interval = 300 * time.Millisecond
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, MinInterval: interval, OnRecovery: true}})
	b := backend(t, "b")
	var h switchable
	spec := pool("pool")
	spec.Health = h.spec()
	_, err := e.connect().Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)

	flip := func(down bool, want int) {
		t.Helper()
		h.down.Store(down)
		require.Eventually(t, func() bool { return n() == want }, 5*time.Second, time.Millisecond)
	}
	received := func(count int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(op.alerts()) == count }, 5*time.Second, time.Millisecond)
	}
	first := time.Now() // before the first alert is decided
	flip(true, 0)
	received(1)
	flip(false, 1)
	flip(true, 0) // fell again: held back
	if got := len(op.alerts()); time.Since(first) < interval {
		require.Equal(t, 1, got, "nothing more inside the interval")
	}
	received(2)
	require.GreaterOrEqual(t, time.Since(first), interval, "the second alert waited for the interval")
	require.Equal(t, []string{webhook.EventGroupZeroHealthy, webhook.EventGroupZeroHealthy}, op.events(),
		"the second outage is reported")

	flip(false, 1) // recovered: held back until the interval since the second alert ends
	received(3)
	require.GreaterOrEqual(t, time.Since(first), 2*interval, "the third alert waited for the interval after the second")
	require.Equal(t, []string{webhook.EventGroupZeroHealthy, webhook.EventGroupZeroHealthy, webhook.EventGroupRecovered}, op.events())
}

// A tenant whose alert URL hangs, flooded with alerts from its many pools, delays and drops
// only its own alerts: another tenant's outage alert arrives at once.
func TestHangingTenantAlertURLDoesNotSuppressAnotherTenantsAlert(t *testing.T) {
	op, good := newReceiver(t), newReceiver(t)
	hanging := newReceiver(t)
	hanging.hold = make(chan struct{})
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, AllowPrivateWebhooks: true, Timeout: time.Minute}})
	defer close(hanging.hold) // before the edge closes and waits for the deliveries in flight
	b := backend(t, "b")

	// Tenant A: 12 pools, all alerting to the hanging URL, all falling at once.
	a := e.connect()
	for i := range 12 {
		spec := TunnelSpec{Subdomain: fmt.Sprintf("a%d", i), Group: fmt.Sprintf("a%d", i), GroupKey: "k", AlertWebhook: hanging.URL}
		_, err := a.Forward(ctxT(t), spec, hostPort(b.URL))
		require.NoError(t, err)
	}
	require.NoError(t, a.Close())
	require.Eventually(t, func() bool { return len(hanging.alerts()) == 1 && len(op.alerts()) == 12 }, 5*time.Second, time.Millisecond)

	// Tenant B's pool falls: its alert is not stuck behind A's.
	var h switchable
	spec := pool("pool")
	spec.Health, spec.AlertWebhook = h.spec(), good.URL
	_, err := e.connect().Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	h.down.Store(true)
	require.Eventually(t, func() bool { return len(good.alerts()) == 1 && len(op.alerts()) == 13 }, 5*time.Second, time.Millisecond)
	require.Len(t, hanging.alerts(), 1, "the hanging URL still holds its first alert; the others wait in its own queue")
	require.Zero(t, e.alerts.deliveries()[webhook.ResultDropped], "nothing dropped")
}

func TestPrivateTenantAlertURLsAreRefusedByDefault(t *testing.T) {
	op, tenant := newReceiver(t), newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL}})
	b := backend(t, "b")
	spec := pool("pool")
	spec.AlertWebhook = tenant.URL
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, sess.Close())
	require.Eventually(t, func() bool {
		d := e.alerts.deliveries()
		return d[webhook.ResultSuccess] == 1 && d[webhook.ResultRefused] == 1
	}, 5*time.Second, 5*time.Millisecond)
	require.Len(t, op.alerts(), 1, "the operator URL is trusted")
	require.Empty(t, tenant.alerts(), "a tenant URL on loopback is refused")

	_, err = e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "x", AlertWebhook: "ftp://example.com/hook"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "alert webhook")
}

func TestSlowAlertReceiverDoesNotDelayDispatch(t *testing.T) {
	op := newReceiver(t)
	op.hold = make(chan struct{})
	defer close(op.hold)
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, Timeout: 30 * time.Second}})
	b := backend(t, "b")
	var h switchable
	spec := pool("pool")
	spec.Health = h.spec()
	_, err := e.connect().Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	h.down.Store(true)
	require.Eventually(t, func() bool { return len(op.alerts()) == 1 }, 5*time.Second, 5*time.Millisecond)

	// The receiver is now stuck on our alert. Frames and dispatch carry on.
	h.down.Store(false)
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	for range 20 {
		code, _ := e.get("pool", "/")
		require.Equal(t, http.StatusOK, code)
	}
	select {
	case <-op.hold:
		t.Fatal("unreachable")
	default: // the alert is still being held while all of the above happened
	}
}

// The alert document's rule by default: a pool that flaps (down, up, down) alerts every
// destination once per fall, at once, and never with group_recovered. The scenario:
// one operator URL and one tenant URL, a pool of two, both members down (2 POSTs), one back
// up and down again a moment later (2 more POSTs, not held back for a minute).
func TestAlertEveryFallOfAFlappingPoolByDefault(t *testing.T) {
	op, tenant := newReceiver(t), newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, AllowPrivateWebhooks: true}})
	b := backend(t, "b")
	var h [2]switchable
	for i := range h {
		spec := pool("pool")
		spec.Health, spec.AlertWebhook = h[i].spec(), tenant.URL
		_, err := e.connect().Forward(ctxT(t), spec, hostPort(b.URL))
		require.NoError(t, err)
	}
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 2 }, 5*time.Second, 5*time.Millisecond)
	flip := func(i int, down bool, want int) {
		t.Helper()
		h[i].down.Store(down)
		require.Eventually(t, func() bool { return n() == want }, 5*time.Second, time.Millisecond)
	}
	// received waits for count alerts at each destination; 5 s is well within the 60 s an
	// interval would hold a second fall back.
	received := func(count int) {
		t.Helper()
		for _, r := range []*receiver{op, tenant} {
			require.Eventually(t, func() bool { return len(r.alerts()) >= count }, 5*time.Second, time.Millisecond)
		}
	}

	flip(0, true, 1)
	flip(1, true, 0)
	received(1)
	flip(0, false, 1)
	flip(0, true, 0)
	received(2)
	// Each destination's POSTs are made one at a time, in order: a recovery alert would
	// have arrived before the second fall's.
	for _, r := range []*receiver{op, tenant} {
		require.Equal(t, []string{webhook.EventGroupZeroHealthy, webhook.EventGroupZeroHealthy}, r.events())
	}
	require.Equal(t, map[string]uint64{webhook.EventGroupZeroHealthy: 2}, e.alerts.decided())
	require.Eventually(t, func() bool { // counted once the receiver's answer is read
		return e.alerts.deliveries()[webhook.ResultSuccess] == 4
	}, 5*time.Second, time.Millisecond)
	require.Equal(t, map[webhook.Result]uint64{webhook.ResultSuccess: 4}, e.alerts.deliveries())
}

// By default a member flapping as fast as its connector can send health frames gives one
// alert per fall, each sent: what the destinations' bounded queues cannot hold is dropped and
// counted, never buffered without bound, and frames and dispatch carry on.
func TestAlertFloodByDefaultIsOneAlertPerFall(t *testing.T) {
	op, tenant := newReceiver(t), newReceiver(t)
	var falls atomic.Int32
	var up atomic.Bool
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL, AllowPrivateWebhooks: true},
		Logger: zap.NewNop(),
		OnEvent: func(ev group.Event) { // after the alerter has seen the event
			if ev.Group.Label != "pool" {
				return
			}
			if ev.SelectableCount > 0 {
				up.Store(true)
			} else if up.Swap(false) {
				falls.Add(1)
			}
		}})
	b := backend(t, "b")
	sess := e.connect(WithLogger(zap.NewNop()))
	spec := pool("pool")
	spec.AlertWebhook = tenant.URL
	spec.Health = &health.Spec{Type: health.TypeFunc, Interval: time.Hour, Timeout: time.Second, MaxFailed: 1,
		Check: func(context.Context) error { return nil }} // reports healthy once, then never again
	tun, err := sess.Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	n := selectable(e, "pool")
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)

	c, err := sess.liveConn(ctxT(t))
	require.NoError(t, err)
	const frames = 1000
	for i := range frames {
		require.NoError(t, c.send(healthFrame(tun.ID(), i%2 == 1))) // down, up, down, ... ends up
	}
	// The control stream is read in order: once a later registration is answered, every
	// health frame before it has been handled, and its events delivered.
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "barrier"}, hostPort(b.URL))
	require.NoError(t, err)
	f := uint64(falls.Load())
	require.Greater(t, f, uint64(100), "the member flapped")
	require.Equal(t, map[string]uint64{webhook.EventGroupZeroHealthy: f}, e.alerts.decided(), "one alert per fall")
	require.Eventually(t, func() bool {
		d := e.alerts.deliveries()
		return d[webhook.ResultSuccess]+d[webhook.ResultDropped] == 2*f
	}, 10*time.Second, 5*time.Millisecond, "every delivery made or dropped: %v", e.alerts.deliveries())
	d := e.alerts.deliveries()
	require.Equal(t, d[webhook.ResultSuccess], uint64(len(op.alerts())+len(tenant.alerts())))
	require.GreaterOrEqual(t, len(tenant.alerts()), 1)
	t.Logf("%d falls: operator got %d, tenant %d, %d dropped", f, len(op.alerts()), len(tenant.alerts()), d[webhook.ResultDropped])
	code, _ := e.get("barrier", "/")
	require.Equal(t, http.StatusOK, code)
}

// A cluster claims a pool's alerts one at a time, in the order they were decided (a fall is
// never claimed before the recovery before it), with at most maxPendingClaims waiting; other
// pools' claims do not wait for them.
func TestAlertClaimsOfAPoolRunInOrderAndAreBounded(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	a := e.alerts
	var mu sync.Mutex
	var ran []int
	record := func(i int) { mu.Lock(); ran = append(ran, i); mu.Unlock() }
	started, release := make(chan struct{}), make(chan struct{})
	a.inOrder("p", func() { close(started); <-release; record(0) })
	<-started
	for i := 1; i <= 2*maxPendingClaims; i++ {
		a.inOrder("p", func() { record(i) })
	}
	other := make(chan struct{})
	a.inOrder("q", func() { close(other) })
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("another pool's claim waited for this one's")
	}
	close(release)
	want := make([]int, maxPendingClaims+1)
	for i := range want {
		want[i] = i
	}
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.claims) == 0
	}, 5*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, want, ran, "in order; those past the bound dropped")
}
