package tunnel

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

// switchable is a health check the test turns on and off.
type switchable struct{ down atomic.Bool }

func (s *switchable) spec() *health.Spec {
	return &health.Spec{Type: health.TypeFunc, Interval: 10 * time.Millisecond, Timeout: 50 * time.Millisecond, MaxFailed: 1,
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

func TestAlertFiresOncePerDownwardEdge(t *testing.T) {
	op, t1, t2 := newReceiver(t), newReceiver(t), newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: true, RegionID: "eu", AlertWebhookURL: op.URL, AllowPrivateAlertWebhooks: true})
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

	ha.down.Store(true)
	hb.down.Store(true)
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	hc.down.Store(true)
	require.Eventually(t, func() bool { return n() == 0 }, 5*time.Second, 5*time.Millisecond)

	wantOne := func(r *receiver, count int) {
		t.Helper()
		require.Eventually(t, func() bool { return len(r.alerts()) == count }, 5*time.Second, 5*time.Millisecond)
	}
	for _, r := range []*receiver{op, t1, t2} {
		wantOne(r, 1) // t2 is shared by two members: posted once
	}
	p := op.alerts()[0]
	require.Equal(t, "group_zero_healthy", p.Event)
	require.Equal(t, "eu", p.RegionID)
	require.Equal(t, "http", p.Protocol)
	require.Equal(t, "pool", p.Label)
	require.Equal(t, "web", p.GroupName)
	require.Equal(t, e.registry.LookupHTTP("pool").KeyHash.Short(), p.KeyHashShort)
	require.Len(t, p.KeyHashShort, 8)
	require.Equal(t, 3, p.MemberCount)
	_, err := time.Parse(time.RFC3339, p.At)
	require.NoError(t, err)

	// Recovery alone does not fire; the next fall does.
	ha.down.Store(false)
	require.Eventually(t, func() bool { return n() == 1 }, 5*time.Second, 5*time.Millisecond)
	ha.down.Store(true)
	require.Eventually(t, func() bool { return n() == 0 }, 5*time.Second, 5*time.Millisecond)
	wantOne(op, 2)
	wantOne(t1, 2)
	wantOne(t2, 2)
	// Staying down fires nothing more.
	time.Sleep(100 * time.Millisecond) // several probe intervals of steady state; nothing to await
	require.Len(t, op.alerts(), 2)
}

func TestAlertFiresWhenTheLastHealthyMemberLeaves(t *testing.T) {
	op := newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: true, AlertWebhookURL: op.URL})
	b := backend(t, "b")
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, sess.Close())
	require.Eventually(t, func() bool { return len(op.alerts()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, op.alerts()[0].MemberCount, "the pool reached zero when its last member started draining")

	// A member that vanishes without a goodbye (connection cut) fires too.
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
	require.Equal(t, 0, op.alerts()[1].MemberCount)

	// Solo tunnels are not pools: no alert.
	solo := e.connect()
	_, err = solo.Forward(ctxT(t), TunnelSpec{Subdomain: "solo"}, hostPort(b.URL))
	require.NoError(t, err)
	require.NoError(t, solo.Close())
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("solo") == nil }, 5*time.Second, 5*time.Millisecond)
	require.Len(t, op.alerts(), 2)
}

func TestPrivateTenantAlertURLsAreRefusedByDefault(t *testing.T) {
	op, tenant := newReceiver(t), newReceiver(t)
	e := startEdge(t, ServerConfig{LoadBalancing: true, AlertWebhookURL: op.URL})
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
	e := startEdge(t, ServerConfig{LoadBalancing: true, AlertWebhookURL: op.URL, AlertTimeout: 30 * time.Second})
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
