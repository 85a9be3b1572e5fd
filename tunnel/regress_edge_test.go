package tunnel

// Regression tests for defects found in review of the edge: each asserts the behaviour a user
// relies on, and failed before the fix.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// stallConn is a connector's end of an in-memory connection that stops reading once
// stalled: the edge's writes to it then block (net.Pipe has no buffer), as they do to a
// connector whose network stopped moving. Close ends a stalled read.
type stallConn struct {
	net.Conn
	closed chan struct{}
	once   sync.Once

	mu      sync.Mutex
	stalled bool
	reading bool // a Read is under way (it takes the next write, then the reads stall)
}

func (c *stallConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.stalled {
		c.mu.Unlock()
		<-c.closed
		return 0, net.ErrClosed
	}
	c.reading = true
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
	return n, err
}

// stall stops reading; it reports whether a read under way will still take one write.
func (c *stallConn) stall() (reading bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stalled = true
	return c.reading
}

func (c *stallConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// stalledConnector connects a hand-made connector to e in memory, says hello and stops
// reading: from then on every write of the edge to it blocks. With busy, it also sends a
// registration the edge must refuse, so that the session's control writer is left blocked
// on that answer.
func stalledConnector(t *testing.T, e *testEdge, logs *logBuffer, busy bool) {
	t.Helper()
	c, err := e.DialContext(context.Background(), "", "")
	require.NoError(t, err)
	sc := &stallConn{Conn: c, closed: make(chan struct{})}
	mux, err := yamux.Client(sc, mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mux.Close() })
	st, err := mux.OpenStream()
	require.NoError(t, err)
	_ = st.SetDeadline(time.Now().Add(5 * time.Second))
	hello(t, st)
	refused := func(req uint32) {
		require.NoError(t, wire.WriteFrame(st, &wire.Register{Req: req, Proto: "http", Label: "Bad_Name"}))
	}
	if sc.stall() {
		// The read under way takes the edge's next write: let it be this refusal.
		refused(1)
		m, err := wire.ReadFrame(st)
		require.NoError(t, err)
		require.IsType(t, &wire.Rejected{}, m)
	}
	if busy {
		before := strings.Count(logs.String(), "registration rejected")
		refused(2)
		// The edge logs the refusal, then blocks writing it.
		require.Eventually(t, func() bool { return strings.Count(logs.String(), "registration rejected") > before },
			2*time.Second, time.Millisecond)
	}
}

// Close stops the edge at once, even when connectors stopped reading (a stuck goodbye must
// not hold it, nor one stalled connector the others).
func TestCloseWithStalledConnectorsIsPrompt(t *testing.T) {
	var logs logBuffer
	e := startEdge(t, ServerConfig{Logger: logs.logger()})
	for i := range 3 {
		stalledConnector(t, e, &logs, i > 0)
	}
	start := time.Now()
	require.NoError(t, e.Close())
	require.Less(t, time.Since(start), time.Second, "Close waited for connectors that stopped reading")
}

// Shutdown returns within its context and about a second (the bounded goodbye), however
// many connectors stopped reading, whether or not the edge was writing to them already.
func TestShutdownWithStalledConnectorsHonoursItsContext(t *testing.T) {
	var logs logBuffer
	e := startEdge(t, ServerConfig{Logger: logs.logger()})
	stalledConnector(t, e, &logs, false) // the goodbye to it blocks
	stalledConnector(t, e, &logs, true)  // its control writer is busy: no goodbye
	const grace = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	start := time.Now()
	err := e.Shutdown(ctx)
	took := time.Since(start)
	if err != nil {
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	require.Less(t, took, grace+1500*time.Millisecond, "Shutdown overran its context by more than the goodbye bound")
}

// holdingConnector is a hand-made connector with one http tunnel for sub: it accepts every
// data stream the edge opens, acknowledges it, reports it on the returned channel and holds
// it open without answering. The edge's streams to it end at cleanup.
func holdingConnector(t *testing.T, e *testEdge, sub string) (ctrl net.Conn, id string, held <-chan struct{}) {
	t.Helper()
	mux, ctrl := rawControl(t, e.controlAddr)
	hello(t, ctrl)
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Register{Req: 1, Proto: "http", Label: sub}))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	require.IsType(t, &wire.Registered{}, m)
	h := make(chan struct{}, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			ds, err := mux.AcceptStream()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer ds.Close()
				if _, err := wire.ReadEnvelope(ds); err != nil {
					return
				}
				if _, err := ds.Write([]byte{byte(wire.AckOK)}); err != nil {
					return
				}
				h <- struct{}{}
				_, _ = io.Copy(io.Discard, ds)
			})
		}
	})
	t.Cleanup(func() {
		_ = mux.Close()
		wg.Wait()
	})
	return ctrl, m.(*wire.Registered).TunnelID, h
}

// serveAsync runs one public request through the edge's handler until ctx ends; the
// returned channel is closed when the handler has returned.
func serveAsync(ctx context.Context, e *testEdge, sub string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, e.url(sub, "/"), nil)
		e.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}()
	return done
}

// However many Drain frames a connector repeats for one tunnel, the edge waits for that
// tunnel's drain once: the frames do not pile up goroutines (and timers) for Timeouts.Drain.
func TestRepeatedDrainFramesStartOneWaiter(t *testing.T) {
	e := startEdge(t, ServerConfig{Timeouts: Timeouts{Drain: 20 * time.Second}})
	ctrl, id, held := holdingConnector(t, e, "flood")
	ctx, cancel := context.WithCancel(context.Background())
	served := serveAsync(ctx, e, "flood")
	defer func() { cancel(); <-served }()
	select {
	case <-held: // a request is in flight: the drain cannot finish
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached the connector")
	}

	before := runtime.NumGoroutine()
	const n = 2000
	var frames bytes.Buffer
	for range n {
		require.NoError(t, wire.WriteFrame(&frames, &wire.Drain{TunnelID: id}))
	}
	_, err := ctrl.Write(frames.Bytes())
	require.NoError(t, err)
	// The edge handles control frames in order: once this registration is answered, every
	// Drain before it has been handled.
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Register{Req: 2, Proto: "http", Label: "marker"}))
	for {
		m, err := wire.ReadFrame(ctrl)
		require.NoError(t, err)
		if r, ok := m.(*wire.Registered); ok && r.Req == 2 {
			break
		}
	}
	grew := runtime.NumGoroutine() - before
	require.Less(t, grew, 50, "%d Drain frames for one tunnel left %d more goroutines", n, grew)
	require.True(t, e.registry.LookupHTTP("flood").Members()[0].Draining())
}

// A backend that answers a plain request with 101 Switching Protocols gets a 502, and the
// member's stream slot is released: the request is over.
func TestUnrequestedSwitchingProtocolsReleasesTheStreamSlot(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	addr := tcpBackend(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		if _, err := c.Read(buf); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n")
		_, _ = io.Copy(io.Discard, c)
	})
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "up"}, addr)
	require.NoError(t, err)
	m := e.registry.LookupHTTP("up").Members()[0]
	for range 3 {
		code, _ := e.get("up", "/")
		require.Equal(t, http.StatusBadGateway, code)
		require.Eventually(t, func() bool { return m.Active() == 0 }, 2*time.Second, 5*time.Millisecond,
			"the request is over; its stream slot must be released")
	}
}

// When the drain timeout removes a tunnel, the streams still open on it end with it: the
// edge does not keep carrying connections of a tunnel that no longer exists.
func TestDrainTimeoutEndsStreamsOfTheRemovedTunnel(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(46100), BindHost: "127.0.0.1"}, Timeouts: Timeouts{Drain: 200 * time.Millisecond}})
	sess := e.connect()
	addr, _ := echoBackend(t)
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "echo"}, addr)
	require.NoError(t, err)
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", tun.Port()))
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))

	// The connection stays open: the drain runs into its timeout, and Shutdown returns once
	// the edge removed the tunnel.
	require.NoError(t, tun.Shutdown(ctxT(t)))
	_, _ = c.Write([]byte("pong"))
	n, err := io.ReadFull(c, buf)
	require.Error(t, err, "the connection outlived its tunnel (read %q)", buf[:n])
	require.False(t, isTimeout(err), "the edge did not end the connection: %v", err)
	require.Eventually(t, func() bool { return e.activeStreams() == 0 }, 2*time.Second, 5*time.Millisecond)
}

// A backend may answer before it has read the request body (401, 413, ...). A client that
// waits for that answer before it sends the rest of its upload gets it through the edge, as
// it does from the backend directly.
func TestEarlyAnswerReachesClientWithPausedUpload(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, "no")
	}))
	defer b.Close()
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "early"}, hostPort(b.URL))
	require.NoError(t, err)

	for _, via := range []struct {
		name, url string
		client    *http.Client
	}{{"direct", b.URL + "/", b.Client()}, {"through the edge", e.url("early", "/"), e.client}} {
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPost, via.url, pr)
		require.NoError(t, err)
		type answer struct {
			code int
			body string
			err  error
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := via.client.Do(req)
			if err != nil {
				done <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			done <- answer{resp.StatusCode, string(body), err}
		}()
		_, err = pw.Write([]byte("first piece"))
		require.NoError(t, err)
		select {
		case a := <-done:
			_ = pw.Close()
			require.NoError(t, a.err, via.name)
			require.Equal(t, http.StatusUnauthorized, a.code, via.name)
			require.Equal(t, "no", a.body, via.name)
		case <-time.After(3 * time.Second):
			pw.CloseWithError(io.ErrUnexpectedEOF)
			<-done
			t.Fatalf("%s: no answer while the client waits with its upload open", via.name)
		}
	}
}

// Shutting the edge down ends every session and so every group, but that is not an outage:
// no group_zero_healthy alert is sent.
func TestGracefulShutdownSendsNoZeroHealthyAlert(t *testing.T) {
	op := newReceiver(t)
	var logs logBuffer
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, Alerts: Alerts{WebhookURL: op.URL}, Logger: logs.logger()})
	b := backend(t, "b")
	sess := e.connect()
	for _, sub := range []string{"a", "b", "c"} {
		_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: sub, Group: "web-" + sub, GroupKey: "k"}, hostPort(b.URL))
		require.NoError(t, err)
	}
	require.Len(t, e.registry.Groups(), 3)
	require.NoError(t, e.Shutdown(ctxT(t)))
	// Every group left the registry before Shutdown returned, and the alert decision is
	// taken (and logged) as a group changes.
	require.Empty(t, e.registry.Groups())
	require.Zero(t, strings.Count(logs.String(), "group has no healthy member"), "alerts decided on shutdown")
	require.Empty(t, e.alerts.deliveries())
	require.Empty(t, op.alerts())
}

// corkConn holds back everything written to it until uncork, then sends it in one write.
type corkConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    bytes.Buffer
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		return c.buf.Write(p)
	}
	return c.Conn.Write(p)
}

func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	_, err := c.Conn.Write(c.buf.Bytes())
	return err
}

// A connector opens one stream, its control stream. Streams it opens besides, before its
// hello, are never left pending on the edge (each could pin a window of buffered data):
// either the edge has seen them when it takes the control stream, and cuts the connector
// off with a protocol error, or they arrive after its go-away, and yamux refuses them.
func TestExtraStreamsBeforeHelloAreNotKept(t *testing.T) {
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: 5 * time.Second}})
	raw, err := net.Dial("tcp", e.controlAddr)
	require.NoError(t, err)
	cc := &corkConn{Conn: raw, corked: true}
	mux, err := yamux.Client(cc, mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	defer mux.Close()
	ctrl, err := mux.OpenStream()
	require.NoError(t, err)
	for range 3 {
		extra, err := mux.OpenStream()
		require.NoError(t, err)
		_, err = extra.Write(make([]byte, 1024))
		require.NoError(t, err)
	}
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version}))
	require.NoError(t, cc.uncork()) // all four streams and the hello reach the edge together

	_ = ctrl.SetDeadline(time.Now().Add(5 * time.Second))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	switch m := m.(type) {
	case *wire.Error:
		require.Equal(t, wire.CodeProtocol, m.Code)
		select {
		case <-mux.CloseChan():
		case <-time.After(5 * time.Second):
			t.Fatal("the edge kept the connection open")
		}
	case *wire.Welcome:
		// The edge handled the extra streams before the hello that follows them: they were
		// refused, and the session holds its control stream only.
		e.sessions.mu.Lock()
		defer e.sessions.mu.Unlock()
		require.Len(t, e.sessions.all, 1)
		for s := range e.sessions.all {
			require.Equal(t, 1, s.mux.NumStreams(), "the edge keeps streams the connector opened besides its control stream")
		}
	default:
		t.Fatalf("unexpected answer to the hello: %T", m)
	}
}

// A connector that never acknowledges the streams the edge opens (wedged, or hostile) is cut
// off after 9/10 of OpenTimeout: requests to it end instead of blocking for ever once yamux's
// limit of unacknowledged opens is reached.
func TestStreamOpenToUnacknowledgingConnectorIsBounded(t *testing.T) {
	e := startEdge(t, ServerConfig{Timeouts: Timeouts{Open: 300 * time.Millisecond}})
	ym, ctrl := rawControl(t, e.controlAddr)
	hello(t, ctrl)
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Register{Req: 1, Proto: "http", Label: "wedged"}))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	require.IsType(t, &wire.Registered{}, m)
	// Nobody calls ym.AcceptStream: the edge's opens are never acknowledged.

	n := mux.ServerConfig(zap.NewNop(), time.Second).AcceptBacklog + 16 // more than yamux lets be unacknowledged at once
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			e.Handler().ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, e.url("wedged", "/"), nil))
			codes[i] = rec.Code
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(3 * time.Second):
		_ = ym.Close() // lets the blocked requests end, for the leak check
		<-finished
		t.Fatal("requests to a connector that acknowledges no stream did not end")
	}
	for i, code := range codes {
		require.GreaterOrEqual(t, code, 500, "request %d", i)
	}
	select {
	case <-ym.CloseChan():
	case <-time.After(2 * time.Second):
		t.Fatal("the edge kept the session of a connector that acknowledges no stream")
	}
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("wedged") == nil }, 2*time.Second, 5*time.Millisecond)
}

// A backend closes keep-alive connections idle for its own timeout (5 s in Node). With
// Timeouts.IdleStream shorter than that, the edge never sends a request on a pooled stream
// whose backend connection is closing, so requests arriving around that timeout never get
// a 502 (which the edge cannot retry: the backend may have read the request).
func TestIdleStreamTimeoutBelowBackendKeepAliveAvoids502(t *testing.T) {
	const backendIdle = 20 * time.Millisecond
	e := startEdge(t, ServerConfig{Timeouts: Timeouts{IdleStream: backendIdle / 2}})
	var served atomic.Int64
	l := listenLoopback(t)
	b := &http.Server{IdleTimeout: backendIdle, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "ok")
	})}
	backendDone := make(chan struct{})
	go func() { defer close(backendDone); _ = b.Serve(l) }()
	defer func() { _ = b.Close(); <-backendDone }()
	sess := e.connect()
	subs := []string{"ka1", "ka2", "ka3"} // three tunnels, three pools, probed side by side
	for _, sub := range subs {
		_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: sub}, l.Addr().String())
		require.NoError(t, err)
	}

	const perTunnel = 20
	var bad atomic.Int64
	errs := make(chan error, len(subs))
	var wg sync.WaitGroup
	for _, sub := range subs {
		wg.Go(func() {
			for i := range perTunnel {
				// Idle for about the backend's keep-alive timeout, so that its close races
				// the next request (the sleep makes the condition under test).
				time.Sleep(backendIdle - 2*time.Millisecond + time.Duration(i%9)*500*time.Microsecond)
				resp, err := e.client.Get(e.url(sub, "/"))
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	n := int64(len(subs) * perTunnel)
	require.Zero(t, bad.Load(), "%d of %d requests failed", bad.Load(), n)
	require.Equal(t, n, served.Load())
}

// A connector that opened its control stream and has not said hello yet, and an edge Close:
// the session's control stream is set and read under the same lock (go test -race).
func TestCloseDuringHelloHasNoControlStreamRace(t *testing.T) {
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: 5 * time.Second}})
	c, err := e.DialContext(context.Background(), "", "")
	require.NoError(t, err)
	fc := &firstReadConn{Conn: c, first: make(chan struct{})}
	mux, err := yamux.Client(fc, mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	defer mux.Close()
	_, err = mux.OpenStream() // and never say hello
	require.NoError(t, err)
	select {
	case <-fc.first: // the edge accepted the control stream (it acknowledged it)
	case <-time.After(5 * time.Second):
		t.Fatal("the edge never accepted the control stream")
	}
	start := time.Now()
	require.NoError(t, e.Close())
	require.Less(t, time.Since(start), time.Second)
	select {
	case <-mux.CloseChan():
	case <-time.After(2 * time.Second):
		t.Fatal("the connector's connection outlived the edge")
	}
}

// firstReadConn closes first when the first bytes arrive from the peer.
type firstReadConn struct {
	net.Conn
	first chan struct{}
	once  sync.Once
}

func (c *firstReadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(func() { close(c.first) })
	}
	return n, err
}
