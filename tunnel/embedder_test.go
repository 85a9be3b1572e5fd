package tunnel_test

// Traps an embedder falls into when using the connector as an outside module does: only the
// exported API, an in-memory edge (Server.DialContext) and net/http.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/tunnel"
)

const embedDomain = "embed.test"

// inMemoryEdge starts an edge with no sockets; it is closed at cleanup.
func inMemoryEdge(t *testing.T) *tunnel.Server {
	t.Helper()
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: embedDomain})
	require.NoError(t, err)
	t.Cleanup(func() { _ = edge.Close() })
	return edge
}

// dialInMemory connects a connector to edge through its DialContext, with the default drain
// timeout (30 s) unless opts say otherwise; the session is closed at cleanup.
func dialInMemory(t *testing.T, edge *tunnel.Server, opts ...tunnel.Option) *tunnel.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts = append([]tunnel.Option{tunnel.WithDialer(edge.DialContext), tunnel.WithBackoff(10*time.Millisecond, 50*time.Millisecond)}, opts...)
	sess, err := tunnel.Dial(ctx, "in-memory", opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// blockingApp is an in-process backend whose requests wait until release is closed.
type blockingApp struct {
	entered chan struct{} // receives once per request that reached the handler
	release chan struct{}
}

// newBlockingApp returns an app that is unblocked at cleanup (before any cleanup registered
// earlier, such as a server's Close that waits for its handlers).
func newBlockingApp(t *testing.T) *blockingApp {
	a := &blockingApp{entered: make(chan struct{}, 16), release: make(chan struct{})}
	t.Cleanup(a.unblock)
	return a
}

// noLeaks checks, after every other cleanup of the test, that no goroutine the test started
// is left. Call it first.
func noLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

func (a *blockingApp) unblock() {
	select {
	case <-a.release:
	default:
		close(a.release)
	}
}

func (a *blockingApp) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.entered <- struct{}{}
	<-a.release
	_, _ = io.WriteString(w, "finished")
}

// startRequest sends GET / for subdomain sub through the edge's public handler and returns
// where its recorder arrives when the request has ended.
func startRequest(edge *tunnel.Server, sub string) <-chan *httptest.ResponseRecorder {
	got := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		edge.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://"+sub+"."+embedDomain+"/", nil))
		got <- rec
	}()
	return got
}

func waitFor[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
		var zero T
		return zero
	}
}

// http.Server.Close closes its listener first. On a Listen tunnel that must not wait for the
// drain (up to the drain timeout, 30 s by default): the listener closes at once, Serve
// returns, and the request in flight still finishes while the edge drains the tunnel in the
// background.
func TestListenerCloseDoesNotWaitForTheDrain(t *testing.T) {
	noLeaks(t)
	edge := inMemoryEdge(t)
	sess := dialInMemory(t, edge)
	ln, err := sess.Listen(context.Background(), tunnel.TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	app := newBlockingApp(t)
	hs := &http.Server{Handler: app}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	got := startRequest(edge, "app")
	waitFor(t, app.entered, 5*time.Second, "the request reaching the app")

	closed := make(chan error, 1)
	go func() { closed <- ln.Close() }()
	require.NoError(t, waitFor(t, closed, 2*time.Second, "Listener.Close with a request in flight"))
	require.ErrorIs(t, waitFor(t, served, 2*time.Second, "Serve after Listener.Close"), net.ErrClosed)

	app.unblock()
	rec := waitFor(t, got, 5*time.Second, "the request in flight")
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "finished", rec.Body.String())
	waitFor(t, ln.Done(), 5*time.Second, "the end of the drain")
	require.NoError(t, ln.Err())

	// The tunnel has left the edge: the next request finds no tunnel.
	rec = waitFor(t, startRequest(edge, "app"), 5*time.Second, "a request after the drain")
	require.Equal(t, http.StatusNotFound, rec.Code)
	require.NoError(t, hs.Close())
	require.NoError(t, sess.Close())
}

// http.Server.Close on a Listen tunnel returns at once even with a request in flight (that
// request is cut, as http.Server.Close promises).
func TestHTTPServerCloseOnAListenerReturnsPromptly(t *testing.T) {
	noLeaks(t)
	edge := inMemoryEdge(t)
	sess := dialInMemory(t, edge)
	ln, err := sess.Listen(context.Background(), tunnel.TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	app := newBlockingApp(t)
	hs := &http.Server{Handler: app}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	got := startRequest(edge, "app")
	waitFor(t, app.entered, 5*time.Second, "the request reaching the app")

	closed := make(chan error, 1)
	go func() { closed <- hs.Close() }()
	require.NoError(t, waitFor(t, closed, 2*time.Second, "http.Server.Close with a request in flight"))
	require.ErrorIs(t, waitFor(t, served, 2*time.Second, "Serve after Close"), http.ErrServerClosed)
	app.unblock()
	rec := waitFor(t, got, 5*time.Second, "the cut request")
	require.Equal(t, http.StatusBadGateway, rec.Code)
	require.NoError(t, sess.Close())
}

// Tunnel.Close on a Forward tunnel returns at once too; Session.Close afterwards still ends
// everything the session started (the goroutine check above each test holds it to that).
func TestTunnelCloseDoesNotWaitForTheDrain(t *testing.T) {
	noLeaks(t)
	app := &blockingApp{entered: make(chan struct{}, 16), release: make(chan struct{})}
	backend := httptest.NewServer(app)
	t.Cleanup(backend.Close)
	t.Cleanup(app.unblock) // first: backend.Close waits for the handler
	edge := inMemoryEdge(t)
	sess := dialInMemory(t, edge)
	tun, err := sess.Forward(context.Background(), tunnel.TunnelSpec{Subdomain: "fwd"}, backend.Listener.Addr().String())
	require.NoError(t, err)
	got := startRequest(edge, "fwd")
	waitFor(t, app.entered, 5*time.Second, "the request reaching the backend")

	closed := make(chan error, 1)
	go func() { closed <- tun.Close() }()
	require.NoError(t, waitFor(t, closed, 2*time.Second, "Tunnel.Close with a request in flight"))
	select {
	case <-tun.Done():
		t.Fatal("the tunnel ended with a request still in flight")
	default:
	}
	app.unblock()
	rec := waitFor(t, got, 5*time.Second, "the request in flight")
	require.Equal(t, http.StatusOK, rec.Code)
	waitFor(t, tun.Done(), 5*time.Second, "the end of the drain")
	require.NoError(t, sess.Close())
}

// Tunnel.Shutdown is the waiting form, on a Listener too: it returns once the request in
// flight has finished and the edge has removed the tunnel.
func TestListenerShutdownWaitsForTheDrain(t *testing.T) {
	noLeaks(t)
	edge := inMemoryEdge(t)
	sess := dialInMemory(t, edge)
	ln, err := sess.Listen(context.Background(), tunnel.TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	app := newBlockingApp(t)
	hs := &http.Server{Handler: app}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	got := startRequest(edge, "app")
	waitFor(t, app.entered, 5*time.Second, "the request reaching the app")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- ln.Shutdown(ctx) }()
	_, err = ln.Accept()
	require.ErrorIs(t, err, net.ErrClosed, "Accept once the drain began")
	select {
	case <-shut:
		t.Fatal("Shutdown returned with a request in flight")
	case <-time.After(100 * time.Millisecond): // a negative check: nothing to await
	}
	app.unblock()
	require.NoError(t, waitFor(t, shut, 5*time.Second, "Shutdown after the request finished"))
	require.Equal(t, http.StatusOK, waitFor(t, got, time.Second, "the request").Code)
	select {
	case <-ln.Done():
	default:
		t.Fatal("the tunnel is not done after Shutdown")
	}
	require.NoError(t, sess.Close())
}

// Session.Close bounds what it owns: with a tunnel still draining in the background (its
// request never ends), Shutdown with a short context cuts the drain and returns, and no
// goroutine is left behind.
func TestSessionShutdownBoundsABackgroundDrain(t *testing.T) {
	noLeaks(t)
	edge := inMemoryEdge(t)
	sess := dialInMemory(t, edge)
	ln, err := sess.Listen(context.Background(), tunnel.TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	app := newBlockingApp(t)
	hs := &http.Server{Handler: app}
	go func() { _ = hs.Serve(ln) }()
	got := startRequest(edge, "app")
	waitFor(t, app.entered, 5*time.Second, "the request reaching the app")
	closed := make(chan error, 1)
	go func() { closed <- ln.Close() }()
	require.NoError(t, waitFor(t, closed, 2*time.Second, "Listener.Close with a request in flight"))

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- sess.Shutdown(ctx) }()
	require.NoError(t, waitFor(t, shut, 5*time.Second, "Session.Shutdown bounded by its context"))
	waitFor(t, ln.Done(), time.Second, "the tunnel's end")
	waitFor(t, sess.Done(), time.Second, "the session's end")
	app.unblock()
	waitFor(t, got, 5*time.Second, "the cut request")
	require.NoError(t, hs.Close())
}

// A session dialed through an in-memory edge's DialContext ends when that edge is closed:
// the dialer answers ErrServerClosed, which is permanent, instead of reconnecting for ever.
func TestInMemorySessionEndsWhenTheEdgeCloses(t *testing.T) {
	noLeaks(t)
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: embedDomain})
	require.NoError(t, err)
	sess := dialInMemory(t, edge)
	ln, err := sess.Listen(context.Background(), tunnel.TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)

	require.NoError(t, edge.Close())
	waitFor(t, sess.Done(), 5*time.Second, "the session's end after the edge closed")
	require.ErrorIs(t, sess.Err(), tunnel.ErrServerClosed)
	waitFor(t, ln.Done(), time.Second, "the tunnel's end")
	require.ErrorIs(t, ln.Err(), tunnel.ErrServerClosed)
	_, err = sess.Listen(context.Background(), tunnel.TunnelSpec{Subdomain: "again"})
	require.ErrorIs(t, err, tunnel.ErrServerClosed)
	require.NoError(t, sess.Close())
}

// The same holds for any dialer: an error wrapping ErrServerClosed ends the session.
func TestDialerErrServerClosedIsPermanent(t *testing.T) {
	noLeaks(t)
	edge := inMemoryEdge(t)
	gone := make(chan struct{})
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-gone:
			return nil, errors.Join(errors.New("edge retired"), tunnel.ErrServerClosed)
		default:
			return edge.DialContext(ctx, network, addr)
		}
	}
	sess := dialInMemory(t, edge, tunnel.WithDialer(dial))
	close(gone)
	_ = edge.Close()
	waitFor(t, sess.Done(), 5*time.Second, "the session's end")
	require.ErrorIs(t, sess.Err(), tunnel.ErrServerClosed)
}
