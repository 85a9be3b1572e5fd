package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
)

func TestWrongTokenIsRejectedAndOthersKeepServing(t *testing.T) {
	e := startEdge(t, ServerConfig{Auth: mustStaticTokens(t, []string{"good-connector-token"}, map[string]string{"acme": "acme-token-0123456789"})})
	b := backend(t, "b")
	good := e.connect(WithToken("good-connector-token"))
	_, err := good.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	for _, tok := range []string{"", "bad", "good-connector-token "} {
		_, err := Dial(ctxT(t), e.controlAddr, WithToken(tok))
		require.ErrorIs(t, err, ErrUnauthorized, "token %q", tok)
		require.ErrorContains(t, err, "invalid auth token")
	}
	tenant := e.connect(WithToken("acme-token-0123456789"))
	_, err = tenant.Forward(ctxT(t), TunnelSpec{Subdomain: "acme"}, hostPort(b.URL))
	require.NoError(t, err, "a tenant's token authenticates its connectors")

	code, body := e.get("app", "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "b /", body)
}

func TestCloseIsIdempotentAndServeAfterCloseFails(t *testing.T) {
	srv, err := NewServer(ServerConfig{})
	require.NoError(t, err)
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close())
	l := listenLoopback(t)
	require.ErrorIs(t, srv.Serve(l), ErrServerClosed)
	require.ErrorIs(t, srv.ServePublic(listenLoopback(t)), ErrServerClosed)
	_, err = srv.DialContext(context.Background(), "", "")
	require.ErrorIs(t, err, ErrServerClosed)
	require.NoError(t, srv.Shutdown(context.Background()))
}

func TestServerConfigValidation(t *testing.T) {
	_, err := NewServer(ServerConfig{LoadBalancing: LoadBalancing{Strategy: "round_robin"}})
	require.ErrorContains(t, err, `LoadBalancing.Strategy: "round_robin" is not a strategy`)
	_, err = NewServer(ServerConfig{TCP: TCPTunnels{Ports: tcpRange(70000)}})
	require.ErrorContains(t, err, "TCP.Ports: low port 70000 is out of range 1-65535")

	// Validate names every setting it refuses, each a FieldError.
	err = ServerConfig{
		TCP:       TCPTunnels{Ports: group.PortRange{Lo: 30000, Hi: 20000}},
		Alerts:    Alerts{WebhookURL: "ftp://alerts.example.com/x"},
		Endpoints: []Endpoint{{Subdomain: "a", Group: "web"}, {Subdomain: "b"}, {Subdomain: "a", Group: "api"}},
	}.Validate()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		require.ErrorAs(t, e, &fe)
		fields = append(fields, fe.Field)
	}
	require.Equal(t, []string{"TCP.Ports", "Alerts.WebhookURL", "Endpoints[1].Group", "Endpoints[2]"}, fields, "%v", err)
	require.NoError(t, ServerConfig{}.Validate(), "the zero value is valid")

	// Two TCP endpoints on one port, whoever's: the second's clients would reach the first's
	// pool. NewServer and Reload refuse it.
	twoOnOnePort := ServerConfig{
		TCP: TCPTunnels{Ports: group.PortRange{Lo: 45300, Hi: 45309}},
		Endpoints: []Endpoint{
			{Proto: ProtoTCP, Group: "db", Port: 45301, KeyHash: group.HashKey("k"), Tenant: "acme"},
			{Proto: ProtoTCP, Group: "cache", Port: 45302, KeyHash: group.HashKey("k2"), Tenant: "globex"},
			{Proto: ProtoTCP, Group: "queue", Port: 45301, KeyHash: group.HashKey("k3"), Tenant: "globex"},
		},
	}
	err = twoOnOnePort.Validate()
	require.ErrorContains(t, err, "Endpoints[2].Port: port 45301 is reserved by Endpoints[0] too, for tcp/db")
	_, err = NewServer(twoOnOnePort)
	require.ErrorContains(t, err, "Endpoints[2].Port")
	require.NoError(t, ServerConfig{}.WithDefaults().Validate(), "and so are the defaults")
}

func TestShutdownWaitsForInFlightRequests(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	started := make(chan struct{})
	release := make(chan struct{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		_, _ = w.Write([]byte("finished"))
	}))
	defer b.Close()
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "slow"}, hostPort(b.URL))
	require.NoError(t, err)

	type result struct {
		code int
		body string
	}
	got := make(chan result, 1)
	go func() {
		code, body := e.get("slow", "/")
		got <- result{code, body}
	}()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- e.Shutdown(ctxT(t)) }()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	r := <-got
	require.Equal(t, http.StatusOK, r.code)
	require.Equal(t, "finished", r.body)
	require.NoError(t, <-shut)
	select {
	case <-sess.Done():
		t.Fatal("a shutting-down edge is not a permanent failure: the connector keeps retrying")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, sess.Err())
}

// restartableEdge serves an edge on fixed loopback addresses and can be replaced by a new
// edge on the same addresses, as a restarted process would be.
type restartableEdge struct {
	t               *testing.T
	control, public string
	cur             *Server
	served          sync.WaitGroup
	cfg             ServerConfig
	// quic and pki: over QUIC (quic_test.go), the UDP address and the edge's certificate,
	// the same across restarts.
	quic string
	pki  testPKI
}

func (r *restartableEdge) start() {
	cfg := r.cfg
	cfg.Domain = testDomain
	cfg.Logger = zaptest.NewLogger(r.t)
	pc := r.quicConfig(&cfg)
	srv, err := NewServer(cfg)
	require.NoError(r.t, err)
	if pc != nil {
		r.served.Go(func() { _ = ServeQUIC(srv, pc) })
	}
	lc, err := net.Listen("tcp", r.control)
	require.NoError(r.t, err)
	lp, err := net.Listen("tcp", r.public)
	require.NoError(r.t, err)
	r.control, r.public = lc.Addr().String(), lp.Addr().String()
	r.served.Go(func() { _ = srv.Serve(lc) })
	r.served.Go(func() { _ = srv.ServePublic(lp) })
	r.cur = srv
}

func (r *restartableEdge) stop() {
	require.NoError(r.t, r.cur.Close())
	r.served.Wait()
}

func TestConnectorReconnectsAfterEdgeRestart(t *testing.T) {
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	r.start()
	defer func() { r.stop() }()
	b := backend(t, "b")
	sess, err := Dial(ctxT(t), r.connectorAddr(), append(r.transportOptions(), WithLogger(zaptest.NewLogger(t)), WithBackoff(10*time.Millisecond, 50*time.Millisecond))...)
	require.NoError(t, err)
	defer sess.Close()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	firstID := tun.ID()

	client := publicClient(r.public)
	defer client.CloseIdleConnections()
	get := func() int {
		resp, err := client.Get("http://app." + testDomain + "/")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, get())

	r.stop()
	r.start()
	client.CloseIdleConnections()
	require.Eventually(t, func() bool { return get() == http.StatusOK }, 10*time.Second, 20*time.Millisecond,
		"the connector re-registers its tunnel on the restarted edge")
	require.NotEqual(t, firstID, tun.ID(), "a new registration has a new id")
	select {
	case <-tun.Done():
		t.Fatal("the tunnel ended across the restart")
	default:
	}
}

func TestPermanentRejectionOnReconnectStopsTheSession(t *testing.T) {
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	r.start()
	sess, err := Dial(ctxT(t), r.control, WithToken("old"), WithLogger(zaptest.NewLogger(t)), WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	require.NoError(t, err)
	defer sess.Close()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, "127.0.0.1:9")
	require.NoError(t, err)

	r.stop()
	r.cfg.Auth = mustStaticTokens(t, []string{"new-connector-token"}, nil)
	r.start()
	defer r.stop()
	select {
	case <-sess.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session kept retrying a token the edge refuses")
	}
	require.ErrorIs(t, sess.Err(), ErrUnauthorized)
	<-tun.Done()
	require.ErrorIs(t, tun.Err(), ErrUnauthorized)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "late"}, "127.0.0.1:9")
	require.Error(t, err)
}

// A tunnel refused after a reconnect (here another connector took its subdomain while the
// edge restarted) keeps retrying with backoff, says why, and comes back once the route is
// free; the session and its other tunnels keep running meanwhile.
func TestRejectedOnReconnectKeepsRetrying(t *testing.T) {
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	r.start()
	defer func() { r.stop() }()
	b, other := backend(t, "b"), backend(t, "thief")
	var logs logBuffer
	sess, err := Dial(ctxT(t), r.control, WithLogger(logs.logger()), WithBackoff(50*time.Millisecond, 100*time.Millisecond))
	require.NoError(t, err)
	defer sess.Close()
	keep, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "keep"}, hostPort(b.URL))
	require.NoError(t, err)
	lose, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "taken"}, hostPort(b.URL))
	require.NoError(t, err)

	r.stop()
	r.start()
	// Another connector takes "taken" before ours comes back.
	thief, err := Dial(ctxT(t), r.control, WithDialer((&net.Dialer{}).DialContext))
	require.NoError(t, err)
	thiefTun, err := thief.Forward(ctxT(t), TunnelSpec{Subdomain: "taken"}, hostPort(other.URL))
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "subdomain 'taken' is already in use")
	}, 10*time.Second, 10*time.Millisecond, "the refusal is logged with the edge's words")
	require.Eventually(t, func() bool { return keep.ID() != "" }, 10*time.Second, 10*time.Millisecond)
	select {
	case <-lose.Done():
		t.Fatal("the refused tunnel ended instead of retrying")
	case <-keep.Done():
		t.Fatal("the other tunnel ended")
	case <-sess.Done():
		t.Fatal("the session ended")
	default:
	}

	require.NoError(t, thiefTun.Shutdown(ctxT(t)))
	client := publicClient(r.public)
	require.Eventually(t, func() bool {
		resp, err := client.Get("http://taken." + testDomain + "/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && string(body) == "b /"
	}, 10*time.Second, 20*time.Millisecond, "the tunnel is back once the route is free")
	require.NoError(t, thief.Close())
}

func TestSessionCloseDeregisters(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	b := backend(t, "b")
	var logs logBuffer
	sess := e.connect(WithLogger(logs.logger()))
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	require.NotNil(t, e.registry.LookupHTTP("app"))
	require.NoError(t, sess.Close())
	require.NoError(t, sess.Close(), "Close is idempotent")
	require.Eventually(t, func() bool { return e.registry.LookupHTTP("app") == nil }, 5*time.Second, 10*time.Millisecond)
	code, _ := e.get("app", "/")
	require.Equal(t, http.StatusNotFound, code)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "again"}, hostPort(b.URL))
	require.ErrorIs(t, err, ErrSessionClosed)
	require.NotContains(t, logs.String(), "reconnecting", "a clean Close is not a lost connection")
}

func TestDialFailsWhenEdgeIsDown(t *testing.T) {
	l := listenLoopback(t)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	_, err := Dial(ctxT(t), addr)
	require.Error(t, err)
	require.False(t, errors.Is(err, ErrUnauthorized))
}
