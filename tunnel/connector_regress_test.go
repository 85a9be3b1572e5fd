package tunnel

// Connector regression tests: each asserts a behaviour a user relies on and failed before the
// fix that made it hold. Most script the edge with fakeEdge.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/wire"
)

// A Forward called while the session is reconnecting registers its tunnel once on the new
// connection: the reconnect logic does not register it a second time (which would leave an
// orphan member on the edge).
func TestForwardDuringReconnectRegistersOnce(t *testing.T) {
	fe := newFakeEdge(t, func(fc *fakeConn, m wire.Message) {
		switch r := m.(type) {
		case *wire.Register:
			_ = fc.registered(r, fmt.Sprintf("t%d-%d", fc.n, r.Req))
		case *wire.Drain:
			_ = fc.drained(r)
		}
	})
	release := fe.holdWelcomes()
	t.Cleanup(release)
	b := backend(t, "b")
	sess := dialFake(t, fe)
	c1 := fe.nextConn(t, time.Second)
	_ = c1.raw.Close()
	// The connector reconnects; its second connection waits for its welcome.
	require.Eventually(t, func() bool { return fe.accepted() == 2 }, 2*time.Second, time.Millisecond)

	type result struct {
		tun *Tunnel
		err error
	}
	done := make(chan result, 1)
	go func() {
		tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "late"}, hostPort(b.URL))
		done <- result{tun, err}
	}()
	// Forward has added the tunnel to the session and waits for the connection.
	require.Eventually(t, func() bool {
		sess.mu.Lock()
		defer sess.mu.Unlock()
		return len(sess.tunnels) == 1
	}, 2*time.Second, time.Millisecond)
	release()
	c2 := fe.nextConn(t, 2*time.Second)
	var res result
	select {
	case res = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Forward did not return after the reconnect")
	}
	require.NoError(t, res.err)
	m, ok := c2.waitFor(time.Second, isRegister("late"))
	require.True(t, ok)
	require.Equal(t, fmt.Sprintf("t2-%d", m.(*wire.Register).Req), res.tun.ID())
	// A second registration would follow at once; give it time to show up.
	require.Never(t, func() bool { return c2.count(isRegister("late")) > 1 }, 300*time.Millisecond, 5*time.Millisecond,
		"the tunnel was registered twice on the new connection")
}

// A connection lost while the connector re-registers its tunnels is noticed at once: the
// connector reconnects after its backoff, not after the 30 s registration timeout, and the
// tunnel is registered on the next connection.
func TestConnectionLostDuringReregistrationIsRetriedPromptly(t *testing.T) {
	fe := newFakeEdge(t, func(fc *fakeConn, m wire.Message) {
		switch r := m.(type) {
		case *wire.Register:
			if fc.n == 2 {
				// The edge dies while the registration is pending: the connector has long
				// finished sending it (the sleep makes that condition) and waits for the answer.
				time.Sleep(20 * time.Millisecond)
				_ = fc.raw.Close()
				return
			}
			_ = fc.registered(r, fmt.Sprint("t", fc.n))
		case *wire.Drain:
			_ = fc.drained(r)
		}
	})
	b := backend(t, "b")
	sess := dialFake(t, fe)
	c1 := fe.nextConn(t, time.Second)
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Equal(t, "t1", tun.ID())

	_ = c1.raw.Close()
	c2 := fe.nextConn(t, 2*time.Second)
	_, ok := c2.waitFor(2*time.Second, isRegister("app"))
	require.True(t, ok, "the tunnel was not re-registered after the first reconnect")
	fe.nextConn(t, 2*time.Second) // well under the 30 s registration timeout
	require.Eventually(t, func() bool { return tun.ID() == "t3" }, 2*time.Second, 5*time.Millisecond)
	select {
	case <-tun.Done():
		t.Fatalf("the tunnel ended: %v", tun.Err())
	default:
	}
}

// A tunnel closed while the connector re-registers it leaves no registration behind: when
// the edge's answer arrives the connector deregisters it, and refuses its streams.
func TestTunnelClosedDuringReregistrationIsDeregistered(t *testing.T) {
	held := make(chan struct{})
	answer := make(chan struct{})
	var once sync.Once
	letAnswer := func() { once.Do(func() { close(answer) }) }
	fe := newFakeEdge(t, func(fc *fakeConn, m wire.Message) {
		r, ok := m.(*wire.Register)
		if !ok {
			return
		}
		if fc.n == 2 {
			close(held)
			<-answer
		}
		_ = fc.registered(r, fmt.Sprint("t", fc.n))
	})
	t.Cleanup(letAnswer) // before the fake edge's cleanup waits for its connections
	b := backend(t, "b")
	sess := dialFake(t, fe)
	c1 := fe.nextConn(t, time.Second)
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	_ = c1.raw.Close()
	c2 := fe.nextConn(t, 2*time.Second)
	select {
	case <-held: // the re-registration is on the wire, unanswered
	case <-time.After(2 * time.Second):
		t.Fatal("the tunnel was not re-registered")
	}
	require.NoError(t, tun.Close()) // not registered at this moment: returns at once
	letAnswer()

	_, ok := c2.waitFor(2*time.Second, isDeregisterOf("t2"))
	require.True(t, ok, "the closed tunnel stays registered on the edge")
	ack, err := c2.openData("t2")
	require.NoError(t, err)
	require.Equal(t, wire.AckUnknownTunnel, ack, "a closed tunnel served a stream")
	require.NoError(t, sess.Err())
}

// Listen and Forward called while Close is draining the session's tunnels are refused with
// ErrSessionClosed: nothing is registered that would outlive the session.
func TestListenAndForwardDuringCloseAreRefused(t *testing.T) {
	draining := make(chan string, 1)
	fe := newFakeEdge(t, func(fc *fakeConn, m wire.Message) {
		switch r := m.(type) {
		case *wire.Register:
			_ = fc.registered(r, "t-"+r.Label)
		case *wire.Drain:
			select {
			case draining <- r.TunnelID: // the test answers it
			default:
			}
		}
	})
	b := backend(t, "b")
	sess := dialFake(t, fe, WithDrainTimeout(5*time.Second))
	fc := fe.nextConn(t, time.Second)
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "a"}, hostPort(b.URL))
	require.NoError(t, err)

	closed := make(chan error, 1)
	go func() { closed <- sess.Close() }()
	var id string
	select {
	case id = <-draining: // Close is under way
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not drain the tunnel")
	}
	_, err = sess.Listen(ctxT(t), TunnelSpec{Subdomain: "late"})
	require.ErrorIs(t, err, ErrSessionClosed, "Listen during Close")
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "later"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrSessionClosed, "Forward during Close")
	require.Zero(t, fc.count(isRegister("late"))+fc.count(isRegister("later")), "a tunnel was registered during Close")

	// The drain's end lets Close close the connection at once, and it may do so before yamux
	// on this side has reported the frame written: the send then fails with "session
	// shutdown" although the frame went out. Whether it arrived is what Close's return shows.
	if err := fc.send(&wire.Deregistered{TunnelID: id, Reason: "drained"}); err != nil {
		require.ErrorIs(t, err, yamux.ErrSessionShutdown)
	}
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return after the drain")
	}
	select {
	case <-sess.Done():
	default:
		t.Fatal("the session is not done after Close")
	}
}

// cutDialer connects a connector to the edge through an in-memory pipe that the test can cut
// on the connector's side only, as a NAT that drops the mapping or a laptop changing
// networks does: the edge's TCP connection stays open, and the edge does not notice.
type cutDialer struct {
	mu    sync.Mutex
	near  []net.Conn // the proxy's end of each pipe
	far   []net.Conn // each TCP connection to the edge
	wg    sync.WaitGroup
	ended bool
}

// newCutDialer returns a cutDialer whose links all end at cleanup. Register it before the
// session that uses it, so that the session closes first.
func newCutDialer(t *testing.T) *cutDialer {
	d := &cutDialer{}
	t.Cleanup(d.close)
	return d
}

func (d *cutDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	far, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	client, near := net.Pipe()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ended {
		_ = far.Close()
		return nil, net.ErrClosed
	}
	d.near, d.far = append(d.near, near), append(d.far, far)
	d.wg.Go(func() { _, _ = io.Copy(far, near) })
	d.wg.Go(func() { _, _ = io.Copy(near, far) })
	return client, nil
}

// dials is how many connections were made.
func (d *cutDialer) dials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.near)
}

// cutConnectorSide ends every link on the connector's side only.
func (d *cutDialer) cutConnectorSide() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.near {
		_ = c.Close()
	}
}

// cut ends every link on both sides.
func (d *cutDialer) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range append(d.near, d.far...) {
		_ = c.Close()
	}
}

func (d *cutDialer) close() {
	d.mu.Lock()
	d.ended = true
	d.mu.Unlock()
	d.cut()
	d.wg.Wait()
}

// getCode fetches a public URL and returns its status, or 0 if the request failed; it does
// not fail the test, so that a polled condition may call it.
func (e *testEdge) getCode(sub string) int {
	resp, err := e.client.Get(e.url(sub, "/"))
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// A solo tunnel survives a cut the connector notices before the edge does: the connector's
// next hello names its previous session, the edge ends it, and the tunnel registers again
// (instead of being refused for good as "already in use" by its own old registration).
func TestSoloTunnelSurvivesClientSideCut(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	b := backend(t, "b")
	cd := newCutDialer(t)
	sess := e.connect(WithDialer(cd.dial))
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	first := tun.ID()
	require.Equal(t, http.StatusOK, e.getCode("app"))

	cd.cutConnectorSide()
	require.Eventually(t, func() bool { id := tun.ID(); return id != "" && id != first }, 3*time.Second, 5*time.Millisecond,
		"the tunnel did not register again after the cut")
	select {
	case <-tun.Done():
		t.Fatalf("the tunnel ended after a network blip: %v", tun.Err())
	default:
	}
	require.Equal(t, http.StatusOK, e.getCode("app"))
	require.Equal(t, 2, cd.dials())
	require.Eventually(t, func() bool {
		e.sessions.mu.Lock()
		defer e.sessions.mu.Unlock()
		return len(e.sessions.all) == 1
	}, 2*time.Second, 5*time.Millisecond, "the edge kept the connector's old session")
}

// The edge may open a stream to a new member the moment it has sent Registered, before the
// connector has read that answer: such first streams are served, not refused as unknown.
func TestFirstStreamsToANewTunnelAreServed(t *testing.T) {
	type opened struct {
		ack wire.Ack
		err error
	}
	acks := make(chan opened, 1)
	fe := newFakeEdge(t, func(fc *fakeConn, m wire.Message) {
		switch r := m.(type) {
		case *wire.Register:
			id := "t-" + r.Label
			if err := fc.registered(r, id); err != nil {
				acks <- opened{err: err}
				return
			}
			ack, err := fc.openData(id) // at once, as a busy edge does
			acks <- opened{ack, err}
		case *wire.Drain:
			_ = fc.drained(r)
		}
	})
	addr := tcpBackend(t, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	sess := dialFake(t, fe)
	fe.nextConn(t, time.Second)
	for i := range 100 {
		tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: fmt.Sprint("n", i)}, addr)
		require.NoError(t, err)
		select {
		case o := <-acks:
			require.NoError(t, o.err)
			require.Equal(t, wire.AckOK, o.ack, "the first stream to tunnel %d was refused", i)
		case <-time.After(5 * time.Second):
			t.Fatal("the fake edge got no acknowledgement")
		}
		require.NoError(t, tun.Close())
	}
}

// An Authenticator that cannot check tokens for a while (its store is down) returns an error
// that does not wrap ErrUnauthorized: that is not a verdict on the token. Dial fails without
// ErrUnauthorized, and a running connector keeps retrying through the outage and connects
// again once the authenticator works.
func TestAuthenticatorOutageIsRetriedByTheConnector(t *testing.T) {
	var down atomic.Bool
	failed := make(chan struct{}, 64)
	auth := AuthenticatorFunc(func(ctx context.Context, token string) (string, error) {
		if token != "tok" {
			return "", ErrUnauthorized
		}
		if down.Load() {
			select {
			case failed <- struct{}{}:
			default:
			}
			return "", errors.New("token store unreachable")
		}
		return "acme", nil
	})
	e := startEdge(t, ServerConfig{Auth: auth})
	b := backend(t, "b")

	_, err := Dial(ctxT(t), e.controlAddr, WithToken("wrong"), WithReconnect(false))
	require.ErrorIs(t, err, ErrUnauthorized, "a bad token is still refused for good")
	down.Store(true)
	_, err = Dial(ctxT(t), e.controlAddr, WithToken("tok"))
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrUnauthorized, "an authenticator outage is not an invalid token")
	down.Store(false)

	cd := newCutDialer(t)
	sess := e.connect(WithToken("tok"), WithDialer(cd.dial))
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	for len(failed) > 0 {
		<-failed
	}
	down.Store(true)
	cd.cut() // the connection drops; every reconnect meets the outage
	for i := range 2 {
		select {
		case <-failed:
		case <-sess.Done():
			t.Fatalf("the session stopped for good on an authenticator outage: %v", sess.Err())
		case <-time.After(3 * time.Second):
			t.Fatalf("the connector stopped retrying after %d attempts", i)
		}
	}
	down.Store(false)
	require.Eventually(t, func() bool { return e.getCode("app") == http.StatusOK }, 3*time.Second, 10*time.Millisecond,
		"the tunnel did not come back once the authenticator worked")
	require.NoError(t, sess.Err())
}

// A spec whose fields exceed the wire limits is refused at once with ErrInvalid; the session
// keeps its one connection (it is not torn down and redialled over a frame it cannot send).
func TestOverlongSpecFieldsAreInvalidAndKeepTheConnection(t *testing.T) {
	var logs logBuffer
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	b := backend(t, "b")
	sess := e.connect(WithLogger(logs.logger()))
	long := func(n int) string { return strings.Repeat("n", n) }
	for _, c := range []struct {
		name string
		spec TunnelSpec
	}{
		{"tcp name", TunnelSpec{Proto: ProtoTCP, Name: long(wire.MaxLabelLen + 1)}},
		{"group", TunnelSpec{Subdomain: "g", Group: long(wire.MaxGroupLen + 1), GroupKey: "k"}},
		{"alert webhook", TunnelSpec{Subdomain: "w", Group: "web", GroupKey: "k", AlertWebhook: "https://alerts.example/" + long(wire.MaxURLLen)}},
		{"health path", TunnelSpec{Subdomain: "h", Health: &health.Spec{Type: health.TypeHTTP, Path: "/" + long(wire.MaxURLLen),
			Interval: time.Second, Timeout: time.Second, MaxFailed: 1}}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := sess.Forward(ctx, c.spec, hostPort(b.URL))
		cancel()
		require.ErrorIs(t, err, ErrInvalid, c.name)
	}
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, e.getCode("app"))
	require.Equal(t, 1, strings.Count(logs.String(), "connected to edge"), "the session reconnected")
	require.NoError(t, sess.Err())
}

// A probe failure reason longer than the wire limit, in non-ASCII text, is cut on a
// character boundary: the edge records the verdict and the session keeps its connection
// (a reason cut inside a character grows when encoded, and the edge would call the frame a
// protocol error and close the session).
func TestLongNonASCIIProbeReasonKeepsTheSession(t *testing.T) {
	var logs logBuffer
	e := startEdge(t, ServerConfig{})
	sess := e.connect(WithLogger(logs.logger()))
	// Two tunnels, one byte apart, so that the wire limit falls inside a character in one.
	subs := []string{"odd", "even"}
	for i, sub := range subs {
		msg := strings.Repeat("a", wire.MaxReasonLen-100+i) + strings.Repeat("é", 100)
		_, err := sess.Listen(ctxT(t), TunnelSpec{Subdomain: sub, Health: &health.Spec{Type: health.TypeFunc,
			Interval: 20 * time.Millisecond, Timeout: time.Second, MaxFailed: 1,
			Check: func(context.Context) error { return errors.New(msg) }}})
		require.NoError(t, err)
	}
	for _, sub := range subs {
		var reason string
		require.Eventually(t, func() bool {
			g := e.registry.LookupHTTP(sub)
			if g == nil || len(g.Members()) != 1 {
				return false
			}
			for _, tr := range g.Members()[0].History() {
				if !tr.Healthy && strings.Contains(tr.Reason, "aaaa") {
					reason = tr.Reason
					return true
				}
			}
			return false
		}, 3*time.Second, 5*time.Millisecond, "the edge never recorded %s's failing probe", sub)
		require.True(t, utf8.ValidString(reason))
		require.LessOrEqual(t, len(reason), wire.MaxReasonLen)
		require.Greater(t, len(reason), wire.MaxReasonLen-4, "the reason was cut short")
	}
	require.Equal(t, 1, strings.Count(logs.String(), "connected to edge"), "the session reconnected")
	require.NoError(t, sess.Err())
}

// A Forward whose context ends just as the edge's Registered arrives returns an error, and
// leaves no registration on the edge: every tunnel id the edge handed out is deregistered
// (or drained, for the calls that succeeded and were closed).
func TestForwardCancelledAsTheAnswerArrivesLeavesNoOrphan(t *testing.T) {
	var mu sync.Mutex
	var cancelCaller context.CancelFunc
	var issued []string
	var pending sync.WaitGroup
	fe := newFakeEdge(t, func(fc *fakeConn, m wire.Message) {
		switch r := m.(type) {
		case *wire.Register:
			id := fmt.Sprint("t", r.Req)
			mu.Lock()
			issued = append(issued, id)
			cancel := cancelCaller
			mu.Unlock()
			// The caller gives up around the time the answer arrives: a few microseconds
			// before or after, varied with each request (the race under test).
			delay := time.Duration(r.Req%40) * 5 * time.Microsecond
			pending.Go(func() { time.Sleep(delay); cancel() })
			_ = fc.registered(r, id)
		case *wire.Drain:
			_ = fc.drained(r)
		}
	})
	t.Cleanup(pending.Wait)
	addr := tcpBackend(t, func(c net.Conn) {})
	sess := dialFake(t, fe)
	fc := fe.nextConn(t, time.Second)
	failed := 0
	const n = 400
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		mu.Lock()
		cancelCaller = cancel
		mu.Unlock()
		tun, err := sess.Forward(ctx, TunnelSpec{Proto: ProtoTCP, Name: fmt.Sprint("n", i)}, addr)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, context.Canceled)
			failed++
			continue
		}
		require.NoError(t, tun.Close())
	}
	t.Logf("%d of %d calls were cancelled", failed, n)
	mu.Lock()
	ids := append([]string(nil), issued...)
	mu.Unlock()
	require.Len(t, ids, n)
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if fc.count(isDeregisterOf(id)) == 0 && fc.count(isDrainOf(id)) == 0 {
				return false
			}
		}
		return true
	}, 2*time.Second, 10*time.Millisecond, "a registration outlived the call that gave up on it")
	for _, id := range ids {
		if fc.count(isDeregisterOf(id)) > 0 {
			ack, err := fc.openData(id)
			require.NoError(t, err)
			require.Equal(t, wire.AckUnknownTunnel, ack, "%s was deregistered but still serves", id)
			break
		}
	}
}
