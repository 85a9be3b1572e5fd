package tunnel

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/health"
)

// Tests of what a status display reads from the connector API: Tunnel.Health,
// Tunnel.ActiveStreams, Session.Connected and Session.Reconnects.

// TestStatusHealthFollowsProbes: a tunnel without a health check says so; one with a check
// turns Known and healthy after its first probe, as the edge sees it, turns unhealthy with
// the probe's reason when its backend dies, and healthy again when it is back.
func TestStatusHealthFollowsProbes(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	sess := e.connect()
	b := newRestartableBackend(t, "A")

	plain, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "plain"}, b.addr)
	require.NoError(t, err)
	require.Equal(t, TunnelHealth{}, plain.Health(), "no health check: nothing checked, nothing known")

	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app", Health: tcpCheck(20*time.Millisecond, 2)}, b.addr)
	require.NoError(t, err)
	require.True(t, tun.Health().Checked)
	var up TunnelHealth
	require.Eventually(t, func() bool { up = tun.Health(); return up.Known }, 10*time.Second, 5*time.Millisecond,
		"the first probe's result is known")
	require.True(t, up.Checked)
	require.True(t, up.Healthy, "%+v", up)
	require.Equal(t, health.ReasonSucceeded, up.Reason)
	require.False(t, up.Since.IsZero())
	require.False(t, up.Since.After(time.Now()))
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("app").Members()[0].Healthy() }, 10*time.Second, 5*time.Millisecond,
		"the edge heard the same report")

	b.stop()
	var down TunnelHealth
	require.Eventually(t, func() bool { down = tun.Health(); return !down.Healthy }, 10*time.Second, 5*time.Millisecond,
		"a dead backend turns the tunnel unhealthy")
	require.True(t, down.Checked)
	require.True(t, down.Known)
	require.Contains(t, down.Reason, "2 consecutive probe failures")
	require.Contains(t, down.Reason, "refused")
	require.True(t, down.Since.After(up.Since), "Since is the time of the change: %v, then %v", up.Since, down.Since)
	require.Eventually(t, func() bool { return !e.registry.LookupHTTP("app").Members()[0].Healthy() }, 10*time.Second, 5*time.Millisecond)

	b.start()
	require.Eventually(t, func() bool { h := tun.Health(); return h.Known && h.Healthy && h.Reason == health.ReasonSucceeded },
		10*time.Second, 5*time.Millisecond, "healthy again once the backend is back")
	require.Equal(t, TunnelHealth{}, plain.Health(), "the other tunnel is not affected")
}

// TestStatusHealthUnknownUntilFirstProbe: while the first probe has not finished the health
// is checked but not known (and not healthy); its result makes it known.
func TestStatusHealthUnknownUntilFirstProbe(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	sess := e.connect()
	gate := make(chan struct{})
	check := func(ctx context.Context) error {
		select {
		case <-gate:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l, err := sess.Listen(ctxT(t), TunnelSpec{Subdomain: "app",
		Health: &health.Spec{Type: health.TypeFunc, Check: check, Interval: 20 * time.Millisecond, Timeout: 30 * time.Second}})
	require.NoError(t, err)
	serveListener(t, l, http.NotFoundHandler())

	time.Sleep(100 * time.Millisecond) // the first probe has started and waits at the gate
	h := l.Health()
	require.Equal(t, TunnelHealth{Checked: true}, h, "no result yet: unknown, not healthy, no reason, no time")
	close(gate)
	require.Eventually(t, func() bool { h = l.Health(); return h.Known }, 10*time.Second, 5*time.Millisecond)
	require.True(t, h.Healthy)
	require.Equal(t, health.ReasonSucceeded, h.Reason)
}

// TestStatusActiveStreamsListen: a Listen tunnel counts the request held in its handler,
// and nothing once the stream has ended (the handler answers "Connection: close", so the
// server closes its conn; otherwise the edge would keep the stream for the next request).
func TestStatusActiveStreamsListen(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	sess := e.connect()
	l, err := sess.Listen(ctxT(t), TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	started, release := make(chan struct{}, 1), make(chan struct{})
	serveListener(t, l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "done")
	}))
	require.Zero(t, l.ActiveStreams())

	got := make(chan int, 1)
	go func() {
		resp, err := e.client.Get(e.url("app", "/"))
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the request did not reach the handler")
	}
	require.Equal(t, 1, l.ActiveStreams(), "the stream held in the handler")
	close(release)
	require.Equal(t, http.StatusOK, <-got)
	require.Eventually(t, func() bool { return l.ActiveStreams() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the stream ended")
}

// TestStatusActiveStreamsForward: a Forward tunnel counts every stream in flight, exactly,
// and nothing once they have ended (the backend closes its connections after answering).
func TestStatusActiveStreamsForward(t *testing.T) {
	const n = 3
	e := startEdge(t, ServerConfig{})
	sess := e.connect()
	started, release := make(chan struct{}, n), make(chan struct{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "done")
	}))
	defer b.Close()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Zero(t, tun.ActiveStreams())

	got := make(chan int, n)
	for range n {
		go func() {
			resp, err := e.client.Get(e.url("app", "/"))
			if err != nil {
				got <- 0
				return
			}
			resp.Body.Close()
			got <- resp.StatusCode
		}()
	}
	for range n {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the requests did not reach the backend")
		}
	}
	require.Equal(t, n, tun.ActiveStreams(), "one stream per request in flight")
	close(release)
	for range n {
		require.Equal(t, http.StatusOK, <-got)
	}
	require.Eventually(t, func() bool { return tun.ActiveStreams() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the streams ended")
}

// TestStatusReconnects: a session counts each connection re-established after the first,
// and is not Connected while the edge is down nor after Close; its tunnel's health starts
// over with each registration and turns healthy again.
func TestStatusReconnects(t *testing.T) {
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	r.start()
	running := true
	defer func() {
		if running {
			r.stop()
		}
	}()
	b := backend(t, "b")
	sess, err := Dial(ctxT(t), r.control, WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	require.NoError(t, err)
	defer sess.Close()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app", Health: tcpCheck(20*time.Millisecond, 1)}, hostPort(b.URL))
	require.NoError(t, err)
	require.True(t, sess.Connected())
	require.Zero(t, sess.Reconnects(), "the first connection is not a reconnect")
	require.Eventually(t, func() bool { return tun.Health().Healthy }, 10*time.Second, 5*time.Millisecond)

	for i := 1; i <= 2; i++ {
		old := tun.ID()
		r.stop()
		running = false
		require.Eventually(t, func() bool { return !sess.Connected() }, 10*time.Second, 5*time.Millisecond,
			"not connected once the edge is gone")
		require.Eventually(t, func() bool { return tun.Health() == TunnelHealth{Checked: true} }, 10*time.Second, 5*time.Millisecond,
			"no registration: health unknown")
		time.Sleep(100 * time.Millisecond) // several attempts fail meanwhile
		require.False(t, sess.Connected(), "still down")
		require.Equal(t, i-1, sess.Reconnects(), "failed attempts are not counted")

		r.start() // on the same address
		running = true
		require.Eventually(t, func() bool { return sess.Connected() }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, i, sess.Reconnects())
		require.Eventually(t, func() bool { id := tun.ID(); return id != "" && id != old }, 10*time.Second, 5*time.Millisecond)
		require.Eventually(t, func() bool { h := tun.Health(); return h.Known && h.Healthy }, 10*time.Second, 5*time.Millisecond,
			"the new registration's prober reports")
	}

	require.NoError(t, sess.Close())
	require.False(t, sess.Connected(), "a closed session is not connected")
	require.Equal(t, 2, sess.Reconnects())
}
