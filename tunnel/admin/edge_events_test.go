package admin

// The live group event streams of a Plane over a live edge (moved from package tunnel's
// events_test.go, with the event stream tests of owner_test.go, reload_test.go and
// connector_regress_test.go).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/tunnel"
)

// sseRead is one item read from an event stream: an event (name and data) or a comment.
type sseRead struct{ name, data, comment string }

// sseStream is one live event stream opened with a real HTTP client.
type sseStream struct {
	t     *testing.T
	resp  *http.Response
	items chan sseRead
	stop  chan struct{}
	done  sync.WaitGroup
	once  sync.Once
}

// openStream opens GET path on the admin listener at addr. It does not read the body until
// read is called. The stream is closed at cleanup.
func openStream(t *testing.T, addr, token, path string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *sseStream {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true, DialContext: dial, ResponseHeaderTimeout: 5 * time.Second}
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	s := &sseStream{t: t, resp: resp, items: make(chan sseRead), stop: make(chan struct{})}
	t.Cleanup(func() {
		s.close()
		tr.CloseIdleConnections()
	})
	return s
}

// read starts parsing the stream; items then arrive on s.items, which is closed at the end
// of the stream.
func (s *sseStream) read() *sseStream {
	s.done.Go(func() {
		defer close(s.items)
		sc := bufio.NewScanner(s.resp.Body)
		var cur sseRead
		for sc.Scan() {
			line := sc.Text()
			var emit *sseRead
			switch {
			case line == "":
				if cur.name != "" || cur.data != "" {
					ev := cur
					emit, cur = &ev, sseRead{}
				}
			case strings.HasPrefix(line, ":"):
				emit = &sseRead{comment: strings.TrimSpace(line[1:])}
			case strings.HasPrefix(line, "event: "):
				cur.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				cur.data = line[len("data: "):]
			}
			if emit != nil {
				select {
				case s.items <- *emit:
				case <-s.stop:
					return
				}
			}
		}
	})
	return s
}

func (s *sseStream) close() {
	s.once.Do(func() {
		close(s.stop)
		_ = s.resp.Body.Close()
		s.done.Wait()
	})
}

// next returns the next item, comments included.
func (s *sseStream) next() sseRead {
	s.t.Helper()
	select {
	case it, ok := <-s.items:
		require.True(s.t, ok, "the stream ended")
		return it
	case <-time.After(5 * time.Second):
		s.t.Fatal("no event within 5 s")
	}
	return sseRead{}
}

// nextEvent returns the next event, skipping comments.
func (s *sseStream) nextEvent() sseRead {
	s.t.Helper()
	for {
		if it := s.next(); it.comment == "" {
			return it
		}
	}
}

// nextGroupEvent returns the next event, which must be a group_event.
func (s *sseStream) nextGroupEvent() GroupEvent {
	s.t.Helper()
	it := s.nextEvent()
	require.Equal(s.t, "group_event", it.name, "data: %s", it.data)
	var ev GroupEvent
	require.NoError(s.t, json.Unmarshal([]byte(it.data), &ev))
	return ev
}

func TestGroupEventsStreamHealthTransitions(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{EventKeepAlive: 50 * time.Millisecond})
	b := backend(t, "b")
	var ha, hb, ho switchable
	add := func(h *switchable, spec tunnel.TunnelSpec) *tunnel.Tunnel {
		spec.Health = h.spec()
		tun, err := e.connect().Forward(ctxT(t), spec, hostPort(b.URL))
		require.NoError(t, err)
		return tun
	}
	ta := add(&ha, pool("pool"))
	add(&hb, pool("pool"))
	add(&ho, pool("other"))
	require.Eventually(t, func() bool { return selectable(e, "pool")() == 2 && selectable(e, "other")() == 1 },
		5*time.Second, 5*time.Millisecond)

	st := openStream(t, e.adminAddr, "", "/api/groups/http/pool/events", nil)
	require.Equal(t, http.StatusOK, st.resp.StatusCode)
	require.Equal(t, "text/event-stream", st.resp.Header.Get("Content-Type"))
	require.Equal(t, "no-cache", st.resp.Header.Get("Cache-Control"))
	st.read()
	require.Equal(t, "group events of http/pool", st.next().comment)

	ha.down.Store(true)
	ev := st.nextGroupEvent()
	require.Equal(t, tunnel.ProtoHTTP, ev.Protocol)
	require.Equal(t, "pool", ev.Label)
	require.Equal(t, "web", ev.Group)
	require.Equal(t, keyShort(t, e, "pool"), ev.KeyHashShort)
	require.Equal(t, ta.ID(), ev.TunnelID)
	require.False(t, ev.Healthy)
	require.Contains(t, ev.Reason, "switched off")
	require.Equal(t, 1, ev.HealthyCount)
	require.Equal(t, 2, ev.MemberCount)
	require.WithinDuration(t, time.Now(), ev.At, time.Minute)

	// Another group's transition is not on this stream: the next event is ta's recovery.
	ho.down.Store(true)
	require.Eventually(t, func() bool { return selectable(e, "other")() == 0 }, 5*time.Second, 5*time.Millisecond)
	ha.down.Store(false)
	ev = st.nextGroupEvent()
	require.Equal(t, ta.ID(), ev.TunnelID)
	require.True(t, ev.Healthy)
	require.Equal(t, 2, ev.HealthyCount)
	require.Equal(t, 2, ev.MemberCount)

	// With nothing to say, the stream sends keep-alive comments.
	for {
		it := st.next()
		require.Empty(t, it.name, "no event expected, got %s %s", it.name, it.data)
		if it.comment == "keep-alive" {
			break
		}
	}
}

// smallWriteBuffers shrinks the kernel send buffer of every connection it accepts, so that a
// client that stops reading blocks the edge's writes to it soon.
type smallWriteBuffers struct{ net.Listener }

func (l smallWriteBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// smallReadBuffer dials with a small kernel receive buffer.
func smallReadBuffer(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096)
	}
	return c, err
}

// tallyUntil reads group_event and lagged events until the events received plus the events
// reported missed reach n. It returns the names of what it read, in order, and the reason of
// the last group_event.
func (s *sseStream) tallyUntil(n int) (got, missed int, order []string, lastReason string) {
	s.t.Helper()
	for got+missed < n {
		it := s.nextEvent()
		order = append(order, it.name)
		switch it.name {
		case "group_event":
			var ev GroupEvent
			require.NoError(s.t, json.Unmarshal([]byte(it.data), &ev))
			lastReason = ev.Reason
			got++
		case "lagged":
			var l LaggedEvent
			require.NoError(s.t, json.Unmarshal([]byte(it.data), &l))
			require.Positive(s.t, l.Missed)
			missed += l.Missed
		default:
			s.t.Fatalf("unexpected event %q", it.name)
		}
	}
	require.Equal(s.t, n, got+missed, "no event is both delivered and reported missed")
	return got, missed, order, lastReason
}

func TestGroupEventsSlowConsumerLagsAlone(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Logger: zap.NewNop()}, Options{EventBuffer: 4})
	slowAdmin := smallWriteBuffers{listenLoopback(t)}
	e.serveAdminOn(slowAdmin)
	id, ctrl := rawMember(t, e, "", probedRegister("lag", "web", "k"))

	fast := openStream(t, e.adminAddr, "", "/api/groups/http/lag/events", nil).read()
	require.Equal(t, "group events of http/lag", fast.next().comment)
	slow := openStream(t, slowAdmin.Addr().String(), "", "/api/groups/http/lag/events", smallReadBuffer)
	require.Equal(t, http.StatusOK, slow.resp.StatusCode)

	// Far more transitions than the slow client's socket buffers and its 4-event buffer
	// hold. The edge makes them all, in order, without waiting for any consumer: each report
	// flips the member (a probed member starts unhealthy), so each is one event.
	const n = 5000
	for i := range n {
		setHealth(t, ctrl, id, i%2 == 0, fmt.Sprintf("flip %d", i))
	}

	// The fast consumer has everything accounted for while the slow one has read nothing.
	got, missed, _, _ := fast.tallyUntil(n)
	t.Logf("fast consumer: %d events, %d missed", got, missed)
	require.Positive(t, got)

	slow.read()
	require.Equal(t, "group events of http/lag", slow.next().comment)
	got, missed, order, last := slow.tallyUntil(n)
	t.Logf("slow consumer: %d events, %d missed", got, missed)
	require.Positive(t, got, "what was queued before the gap is delivered")
	require.Positive(t, missed)
	require.Equal(t, "group_event", order[0])
	// The gap is reported where it is: when the last transitions were missed, the stream
	// ends with the lagged event; when the consumer happened to have room for them (its
	// writer drained while the edge was flipping), it ends with the last transition.
	if last == fmt.Sprintf("flip %d", n-1) {
		require.Equal(t, "group_event", order[len(order)-1])
	} else {
		require.Equal(t, "lagged", order[len(order)-1], "the last transitions were missed: the stream ends with the gap")
	}

	// The next transition reaches both consumers, after the gap.
	setHealth(t, ctrl, id, n%2 == 0, "after the gap")
	for _, s := range []*sseStream{fast, slow} {
		ev := s.nextGroupEvent()
		require.Equal(t, "after the gap", ev.Reason)
		require.Equal(t, id, ev.TunnelID)
		require.Equal(t, 1, ev.MemberCount)
	}
}

func TestGroupEventsAreScopedToTheTenant(t *testing.T) {
	auth := mustStaticTokens(t, nil, map[string]string{"acme": "acme-token-0123456789", "globex": "globex-token-0123456789"})
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Auth: auth}, Options{Token: "admin-token-0123456789"})
	acmeID, acmeCtl := rawMember(t, e, "acme-token-0123456789", probedRegister("shared", "web", "k"))
	rawMember(t, e, "acme-token-0123456789", probedRegister("shared", "web", "k")) // stays unhealthy
	// A route belongs to one tenant: globex's pool is on its own subdomain.
	globexID, globexCtl := rawMember(t, e, "globex-token-0123456789", probedRegister("gshared", "web", "k"))
	flip := func(ctl net.Conn, id string, healthy bool) { setHealth(t, ctl, id, healthy, "reported") }

	require.Equal(t, http.StatusUnauthorized, openStream(t, e.adminAddr, "", "/api/groups/http/shared/events", nil).resp.StatusCode)
	require.Equal(t, http.StatusNotFound, openStream(t, e.adminAddr, "acme-token-0123456789", "/api/groups/http/gshared/events", nil).resp.StatusCode,
		"another tenant's group does not exist for acme")
	acme := openStream(t, e.adminAddr, "acme-token-0123456789", "/api/groups/http/shared/events", nil).read()
	admin := openStream(t, e.adminAddr, "admin-token-0123456789", "/api/groups/http/shared/events", nil).read()
	globexAdmin := openStream(t, e.adminAddr, "admin-token-0123456789", "/api/groups/http/gshared/events", nil).read()
	for _, s := range []*sseStream{acme, admin, globexAdmin} {
		require.Equal(t, http.StatusOK, s.resp.StatusCode)
		require.NotEmpty(t, s.next().comment)
	}

	flip(globexCtl, globexID, true)
	ev := globexAdmin.nextGroupEvent()
	require.Equal(t, globexID, ev.TunnelID)
	require.Equal(t, 1, ev.HealthyCount)
	require.Equal(t, 1, ev.MemberCount)

	flip(acmeCtl, acmeID, true)
	for _, s := range []*sseStream{admin, acme} { // globex's transition was sent to neither
		ev = s.nextGroupEvent()
		require.Equal(t, acmeID, ev.TunnelID)
		require.True(t, ev.Healthy)
		require.Equal(t, 1, ev.HealthyCount, "its two members, one healthy")
		require.Equal(t, 2, ev.MemberCount)
	}
}

func TestGroupEventsEndWithTheClientOrTheEdge(t *testing.T) {
	subscribers := func(e *testEdge) int {
		return e.plane.EventStreams()
	}
	t.Run("client goes away", func(t *testing.T) {
		e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
		rawMember(t, e, "", probedRegister("pool", "web", "k"))
		st := openStream(t, e.adminAddr, "", "/api/groups/http/pool/events", nil).read()
		require.NotEmpty(t, st.next().comment)
		require.Equal(t, 1, subscribers(e))
		st.close()
		require.Eventually(t, func() bool { return subscribers(e) == 0 }, 5*time.Second, 5*time.Millisecond)
	})
	t.Run("edge closes", func(t *testing.T) {
		e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
		rawMember(t, e, "", probedRegister("pool", "web", "k"))
		st := openStream(t, e.adminAddr, "", "/api/groups/http/pool/events", nil).read()
		require.NotEmpty(t, st.next().comment)
		require.NoError(t, e.Close())
		requireEnded(t, st)
		require.Zero(t, subscribers(e))
	})
	t.Run("edge shuts down", func(t *testing.T) {
		e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}}, Options{})
		rawMember(t, e, "", probedRegister("pool", "web", "k"))
		st := openStream(t, e.adminAddr, "", "/api/groups/http/pool/events", nil).read()
		require.NotEmpty(t, st.next().comment)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, e.Shutdown(ctx), "an open event stream does not hold Shutdown")
		requireEnded(t, st)
	})
}

// requireEnded waits for the end of the stream.
func requireEnded(t *testing.T, st *sseStream) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-st.items:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the stream did not end")
		}
	}
}

// A tenant's member whose first verdict is "unhealthy" was never counted as healthy: the
// tenant's live event stream keeps the right healthy_count (and recovers to the right one).
func TestTenantEventCountsAfterFirstUnhealthyVerdict(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		Auth: mustStaticTokens(t, nil, map[string]string{"acme": "acme-token-0123456789"})}, Options{EventKeepAlive: time.Hour})
	b := backend(t, "b")
	var ok, late switchable
	late.down.Store(true)
	sess := e.connect(tunnel.WithToken("acme-token-0123456789"))
	spec := pool("pool")
	spec.Health = ok.spec()
	_, err := sess.Forward(ctxT(t), spec, hostPort(b.URL))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return selectable(e, "pool")() == 1 }, 5*time.Second, 5*time.Millisecond)

	st := openStream(t, e.adminAddr, "acme-token-0123456789", "/api/groups/http/pool/events", nil)
	require.Equal(t, http.StatusOK, st.resp.StatusCode)
	st.read()
	spec.Health = late.spec()
	_, err = sess.Forward(ctxT(t), spec, hostPort(b.URL)) // its first verdict: unhealthy
	require.NoError(t, err)
	ev := st.nextGroupEvent()
	require.False(t, ev.Healthy)
	require.Equal(t, 2, ev.MemberCount)
	require.Equal(t, 1, ev.HealthyCount, "one member of two is healthy")
	late.down.Store(false)
	ev = st.nextGroupEvent()
	require.True(t, ev.Healthy)
	require.Equal(t, 2, ev.HealthyCount)
}

// max_event_streams caps a tenant's open live event streams (429 past it); the admin token
// is never capped, and closing a stream frees its place.
func TestEventStreamQuota(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Auth: tenantAuth(t),
		Limits: tunnel.Limits{Tenant: tunnel.TenantLimits{MaxEventStreams: 2}}}, Options{Token: "admin-token-0123456789"})
	rawMember(t, e, acmeToken, probedRegister("pool", "web", "k"))
	path := "/api/groups/http/pool/events"
	first := openStream(t, e.adminAddr, acmeToken, path, nil)
	second := openStream(t, e.adminAddr, acmeToken, path, nil)
	require.Equal(t, http.StatusOK, first.resp.StatusCode)
	require.Equal(t, http.StatusOK, second.resp.StatusCode)
	third := openStream(t, e.adminAddr, acmeToken, path, nil)
	require.Equal(t, http.StatusTooManyRequests, third.resp.StatusCode)
	require.NotEmpty(t, third.resp.Header.Get("Retry-After"))
	for range 3 {
		require.Equal(t, http.StatusOK, openStream(t, e.adminAddr, "admin-token-0123456789", path, nil).resp.StatusCode)
	}
	first.close()
	require.Eventually(t, func() bool {
		st := openStream(t, e.adminAddr, acmeToken, path, nil)
		defer st.close()
		return st.resp.StatusCode == http.StatusOK
	}, 5*time.Second, 20*time.Millisecond, "a closed stream frees its place")
}

// TestReloadEventStreamQuota: max_event_streams applies to the next stream a reload lets
// open; the streams open stay.
func TestReloadEventStreamQuota(t *testing.T) {
	cfg := tunnel.ServerConfig{Auth: tenantAuth(t), LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Domain: testDomain, Logger: zaptest.NewLogger(t)}
	e := startEdge(t, cfg, Options{})
	rawMember(t, e, acmeToken, probedRegister("pool", "web", "k"))
	path := "/api/groups/http/pool/events"
	first := openStream(t, e.adminAddr, acmeToken, path, nil)
	require.Equal(t, http.StatusOK, first.resp.StatusCode)

	next := cfg
	next.Limits.PerTenant = map[string]tunnel.TenantLimits{"acme": {MaxEventStreams: 1}}
	_, err := e.Reload(next)
	require.NoError(t, err)
	second := openStream(t, e.adminAddr, acmeToken, path, nil)
	require.Equal(t, http.StatusTooManyRequests, second.resp.StatusCode)

	_, err = e.Reload(cfg)
	require.NoError(t, err)
	third := openStream(t, e.adminAddr, acmeToken, path, nil)
	require.Equal(t, http.StatusOK, third.resp.StatusCode)
	first.close()
	third.close()
}
