package tunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wire"
	_ "github.com/warren-tunnel/warren/tunnel/quic"
)

// testTransport is the transport the harness's connectors use (testEdge.connect): "" (TCP)
// or "quic", from WARREN_TEST_TRANSPORT; TestOverQUIC runs a set of this package's tests
// with it set.
var testTransport = os.Getenv("WARREN_TEST_TRANSPORT")

// quicEdgeConfig, when the tests run over QUIC, gives cfg a TLS certificate (unless it has
// one) and returns the UDP socket the edge is to accept connectors on, with the PKI that
// verifies the edge.
func quicEdgeConfig(t testing.TB, cfg *ServerConfig) (testPKI, net.PacketConn) {
	if testTransport != TransportQUIC {
		return testPKI{}, nil
	}
	var pki testPKI
	if cfg.TLSConfig == nil {
		pki = newTestPKI(t)
		cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.server}}
	} else {
		// The test's own edge certificate: the connector trusts it as it is.
		leaf, err := x509.ParseCertificate(cfg.TLSConfig.Certificates[0].Certificate[0])
		require.NoError(t, err)
		pki.pool = x509.NewCertPool()
		pki.pool.AddCert(leaf)
		pki.name = strings.Replace(leaf.DNSNames[0], "*", "edge", 1)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	return pki, pc
}

// serveQUIC accepts connectors over QUIC on pc until the edge closes.
func (e *testEdge) serveQUIC(pc net.PacketConn, pki testPKI) {
	e.quicAddr, e.quicPKI = pc.LocalAddr().String(), pki
	e.served.Go(func() {
		if err := ServeQUIC(e.Server, pc); !errors.Is(err, ErrServerClosed) {
			e.t.Errorf("ServeQUIC returned %v, want ErrServerClosed", err)
		}
	})
}

// connectorAddr is the address the harness's connectors dial.
func (e *testEdge) connectorAddr() string {
	if e.quicAddr != "" {
		return e.quicAddr
	}
	return e.controlAddr
}

// transportOptions are the options that make a connector use the tests' transport.
func (e *testEdge) transportOptions() []Option {
	if e.quicAddr == "" {
		return nil
	}
	opts := []Option{WithQUIC()}
	if e.quicPKI.pool != nil {
		name := e.quicPKI.name
		if name == "" {
			name = "edge.test"
		}
		opts = append(opts, WithTLS(&tls.Config{RootCAs: e.quicPKI.pool, ServerName: name}))
	}
	return opts
}

// quicConfig, over QUIC, gives cfg the edge's certificate and returns the UDP socket to
// serve QUIC on, at the address of the edge's previous start if it had one.
func (r *restartableEdge) quicConfig(cfg *ServerConfig) net.PacketConn {
	if testTransport != TransportQUIC {
		return nil
	}
	if r.pki.pool == nil {
		r.pki = newTestPKI(r.t)
		r.quic = "127.0.0.1:0"
	}
	cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{r.pki.server}}
	pc, err := net.ListenPacket("udp", r.quic)
	require.NoError(r.t, err)
	r.quic = pc.LocalAddr().String()
	return pc
}

func (r *restartableEdge) connectorAddr() string {
	if r.quic != "" {
		return r.quic
	}
	return r.control
}

func (r *restartableEdge) transportOptions() []Option {
	if r.quic == "" {
		return nil
	}
	return []Option{WithQUIC(), WithTLS(&tls.Config{RootCAs: r.pki.pool, ServerName: "edge.test"})}
}

// quicSuite names the tests of this package that TestOverQUIC runs over QUIC: a
// representative set of what a connector relies on, each written once for every transport
// (the harness's connect dials the tests' transport).
var quicSuite = []string{
	// HTTP tunnels: a request, keep-alive, a failing backend, streaming, upgrades.
	"TestHTTPForwardOverLoopback", "TestKeepAliveReusesStreams", "TestBadGatewayWhenBackendFails",
	"TestStreamingUploadAndServerSentEvents", "TestUpgradeCarriedEndToEnd",
	// Pools: two members and more, retry, a rolling restart, draining.
	"TestSeedScenarioHTTPGroup", "TestSeedScenarioTCPGroupSharesAPort", "TestRetryAvoidsADeadBackend",
	"TestRollingRestartLosesNothing", "TestUpgradedConnectionStaysOnItsMemberWhileItDrains",
	"TestDrainTimeoutEndsStreamsOfTheRemovedTunnel",
	// TCP tunnels and TLS passthrough.
	"TestTCPHalfCloseCarriesTheReply", "TestTCPLargeTransferIsByteExact", "TestTCPWithoutHealthyMemberClosesAtOnce",
	"TestTLSPassthroughPool",
	// Health.
	"TestKilledBackendLeavesAndReturns", "TestHTTPProbeStatusThroughTheEdge",
	// Lifecycle: a wrong token, shutdown, close, resume after the edge restarts.
	"TestWrongTokenIsRejectedAndOthersKeepServing", "TestShutdownWaitsForInFlightRequests",
	"TestSessionCloseDeregisters", "TestConnectorReconnectsAfterEdgeRestart",
	// Cut and aborted bodies, unread notices, slow clients.
	"TestAbortedDownloadsEndTheirBackendConnections", "TestAbortedPassthroughEndsItsBackendConnection",
	"TestUnreadNoticeNeverInsideAResponseBody", "TestHTTP1ClientThatStopsReadingIsCut",
	"TestStalledDownloadsLeaveTheConnectorsOtherRequestsAlone",
}

// TestOverQUIC runs quicSuite again with the connectors over QUIC: this test binary, with
// WARREN_TEST_TRANSPORT=quic.
func TestOverQUIC(t *testing.T) {
	if testTransport != "" {
		t.Skip("this run is over " + testTransport + " already")
	}
	args := []string{"-test.run=^(" + strings.Join(quicSuite, "|") + ")$", "-test.count=1", "-test.timeout=5m", "-test.v"}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), "WARREN_TEST_TRANSPORT="+TransportQUIC)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the suite over QUIC failed: %v\n%s", err, out)
	}
	for _, name := range quicSuite {
		require.Contains(t, string(out), "--- PASS: "+name+" ", "a test of the suite did not run")
	}
}

// startQUICEdge starts a test edge that also accepts connectors over QUIC, whatever
// WARREN_TEST_TRANSPORT says.
func startQUICEdge(t *testing.T, cfg ServerConfig) *testEdge {
	t.Helper()
	if testTransport == TransportQUIC {
		return startEdge(t, cfg)
	}
	pki := newTestPKI(t)
	cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.server}}
	e := startEdge(t, cfg)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	e.serveQUIC(pc, pki)
	return e
}

// dialQUIC connects a connector to e over QUIC; Close runs at cleanup.
func (e *testEdge) dialQUIC(opts ...Option) *Session {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts = append(append([]Option{WithLogger(zaptest.NewLogger(e.t)), WithBackoff(10*time.Millisecond, 100*time.Millisecond)}, e.transportOptions()...), opts...)
	s, err := Dial(ctx, e.quicAddr, opts...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// Over QUIC an HTTP and a TCP tunnel serve, next to a member of the same pool over TCP; the
// session, its members and the edge's counters say quic; its TCP connections ride its
// streams (the connector opens no data connection).
func TestQUICConnectorServesNextToATCPOne(t *testing.T) {
	e := startQUICEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(46300), BindHost: "127.0.0.1"}, LoadBalancing: LoadBalancing{Enabled: true}})
	q := e.dialQUIC()
	require.Equal(t, TransportQUIC, q.Transport())
	spec := TunnelSpec{Subdomain: "pool", Group: "pool", GroupKey: "k"}
	overQUIC, err := q.Forward(ctxT(t), spec, hostPort(backend(t, "quic").URL))
	require.NoError(t, err)
	tcp, err := Dial(ctxT(t), e.controlAddr, WithLogger(zaptest.NewLogger(t)))
	require.NoError(t, err)
	defer tcp.Close()
	overTCP, err := tcp.Forward(ctxT(t), spec, hostPort(backend(t, "tcp").URL))
	require.NoError(t, err)

	seen := map[string]bool{}
	for range 20 {
		code, body := e.get("pool", "/x")
		require.Equal(t, http.StatusOK, code)
		seen[body] = true
	}
	require.Equal(t, map[string]bool{"quic /x": true, "tcp /x": true}, seen, "both members serve")
	transports := map[string]string{}
	for _, g := range e.Registry().Groups() {
		for _, m := range g.Members {
			transports[m.ID] = m.Transport
		}
	}
	require.Equal(t, map[string]string{overQUIC.ID(): TransportQUIC, overTCP.ID(): TransportTCP}, transports)
	require.Equal(t, map[string]int64{TransportTCP: 1, TransportWebSocket: 0, TransportQUIC: 1}, e.Operator().Counters().Sessions)

	tun, err := q.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port())))
	require.NoError(t, err)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	msg := strings.Repeat("quic ", 200_000) // 1 MB
	_, err = io.WriteString(c, msg)
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	reply, err := io.ReadAll(c)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(reply), fmt.Sprintf("%d ", len(msg))), "reply %q", reply)
	_ = c.Close()
	require.Zero(t, e.data.stats.Accepted.Load(), "a session over QUIC opens no data connection")

	require.NoError(t, q.Close())
	require.Eventually(t, func() bool { return e.Operator().Counters().Sessions[TransportQUIC] == 0 }, 5*time.Second, 10*time.Millisecond)
}

// What cannot go with WithQUIC is refused before anything is dialled; the proxy variables
// are not read.
func TestWithQUICRefusals(t *testing.T) {
	ctx := ctxT(t)
	for name, opts := range map[string][]Option{
		"proxy":     {WithProxy(&url.URL{Scheme: "http", Host: "proxy.example:3128"})},
		"websocket": {WithWebSocket("/_warren/connect")},
		"dialer":    {WithDialer(func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("unused") })},
	} {
		_, err := Dial(ctx, "127.0.0.1:1", append([]Option{WithQUIC()}, opts...)...)
		require.ErrorIs(t, err, ErrInvalid, name)
	}

	e := startQUICEdge(t, ServerConfig{})
	t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1") // nothing listens there
	s := e.dialQUIC()
	require.Equal(t, TransportQUIC, s.Transport(), "the session connected directly")
}

// ServeQUIC and ListenAndServe's QUICAddr need TLSConfig; with it, ListenAndServe accepts
// connectors over QUIC, and its UDP socket is closed once Close returns.
func TestListenAndServeQUIC(t *testing.T) {
	plain, err := NewServer(ServerConfig{Domain: testDomain})
	require.NoError(t, err)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	require.ErrorIs(t, ServeQUIC(plain, pc), ErrInvalid)
	require.NoError(t, plain.Close())

	addr := pc.LocalAddr().String() // closed by ServeQUIC: free again
	pki := newTestPKI(t)
	srv, err := NewServer(ServerConfig{Domain: testDomain, ControlAddr: "127.0.0.1:0", QUICAddr: addr,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pki.server}}, Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	s, err := Dial(ctxT(t), addr, WithQUIC(), WithTLS(&tls.Config{RootCAs: pki.pool, ServerName: "edge.test"}),
		WithLogger(zaptest.NewLogger(t)), WithReconnect(false))
	require.NoError(t, err)
	require.Equal(t, TransportQUIC, s.Transport())
	require.NoError(t, s.Close())
	require.NoError(t, srv.Close())
	require.ErrorIs(t, <-served, ErrServerClosed)
	again, err := net.ListenPacket("udp", addr)
	require.NoError(t, err, "the edge's UDP socket is closed")
	require.NoError(t, again.Close())
}

// A QUIC connection holds a place among those not yet authenticated until its Hello: over
// MaxConnsPerIP the edge refuses it, and HelloTimeout ends one that says nothing.
func TestQUICPreAuthCapsAndHelloTimeout(t *testing.T) {
	e := startQUICEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: 2 * time.Second, MaxConnsPerIP: 2}})
	q := mux.RegisteredQUIC()
	raw := func() mux.Session {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := q.Dial(ctx, e.quicAddr, &tls.Config{RootCAs: e.quicPKI.pool, ServerName: "edge.test"})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	held := []mux.Session{raw(), raw()}
	require.Eventually(t, func() bool {
		_, fromIP := e.preAuth.Held(throttle.KeyOfIP(netip.MustParseAddr("127.0.0.1")))
		return fromIP == 2
	}, 5*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := q.Dial(ctx, e.quicAddr, &tls.Config{RootCAs: e.quicPKI.pool, ServerName: "edge.test"})
	require.ErrorContains(t, err, "CONNECTION_REFUSED", "a connection over the per-address cap is refused")
	for _, s := range held {
		select {
		case <-s.CloseChan(): // HelloTimeout: no control stream came
		case <-time.After(10 * time.Second):
			t.Fatal("a connection that never said hello outlived HelloTimeout")
		}
	}
	s := e.dialQUIC()
	require.Equal(t, TransportQUIC, s.Transport(), "the places are free again")
	total, fromIP := e.preAuth.Held(throttle.KeyOfIP(netip.MustParseAddr("127.0.0.1")))
	require.Zero(t, total+fromIP, "a connector welcomed holds no pre-auth place")
}

// A QUIC connection holds its place among those not yet authenticated from its first packet,
// not only once its handshake completed: handshakes under way from one address count toward
// MaxConnsPerIP, and one over it is refused before the edge spends a handshake on it.
func TestQUICHandshakesCountTowardThePreAuthCaps(t *testing.T) {
	e := startQUICEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: 20 * time.Second, MaxConnsPerIP: 2}})
	q := mux.RegisteredQUIC()
	release := make(chan struct{})
	var verified atomic.Int32
	// The client stalls its side of the handshake once it has the edge's certificate: the
	// edge's side stays under way.
	stalling := &tls.Config{RootCAs: e.quicPKI.pool, ServerName: "edge.test",
		VerifyPeerCertificate: func([][]byte, [][]*x509.Certificate) error {
			verified.Add(1)
			<-release
			return errors.New("tunnel test: the handshake was stalled")
		}}
	var dials sync.WaitGroup
	results := make(chan error, 3)
	dial := func() {
		dials.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			s, err := q.Dial(ctx, e.quicAddr, stalling)
			if s != nil {
				_ = s.Close()
			}
			results <- err
		})
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
		dials.Wait()
	}()
	dial()
	dial()
	require.Eventually(t, func() bool { return verified.Load() == 2 }, 5*time.Second, 10*time.Millisecond)
	_, fromIP := e.preAuth.Held(throttle.KeyOfIP(netip.MustParseAddr("127.0.0.1")))
	require.Equal(t, 2, fromIP, "the handshakes under way hold places")
	dial()
	select {
	case err := <-results:
		require.Error(t, err, "a handshake over the per-address cap was refused")
	case <-time.After(5 * time.Second):
		t.Fatal("a handshake over the per-address cap went on")
	}
	require.EqualValues(t, 2, verified.Load(), "the edge spent no handshake on the refused connection")

	// Handshakes that fail give their places back.
	released = true
	close(release)
	dials.Wait()
	require.Eventually(t, func() bool {
		_, fromIP := e.preAuth.Held(throttle.KeyOfIP(netip.MustParseAddr("127.0.0.1")))
		return fromIP == 0
	}, 10*time.Second, 10*time.Millisecond)
}

// A connector over QUIC learns why the edge refused it, as over TCP: the edge's last word on
// the control stream reaches it before the connection closes.
func TestQUICConnectorLearnsWhyItWasRefused(t *testing.T) {
	e := startQUICEdge(t, ServerConfig{Auth: mustStaticTokens(t, []string{"good-connector-token"}, nil), PreAuth: PreAuthLimits{AuthFailureDelay: -1}})
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := Dial(ctx, e.quicAddr, append(e.transportOptions(), WithToken("bad"))...)
		cancel()
		require.ErrorIs(t, err, ErrUnauthorized)
		require.ErrorContains(t, err, "invalid auth token")
	}
}

// An edge shutting down tells its connectors over QUIC why, before it closes their sessions.
func TestQUICConnectorHearsTheShutdownGoodbye(t *testing.T) {
	e := startQUICEdge(t, ServerConfig{})
	core, logs := observer.New(zapcore.WarnLevel)
	e.dialQUIC(WithLogger(zap.New(core)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.Shutdown(ctx))
	require.Eventually(t, func() bool {
		for _, l := range logs.FilterMessage("edge closed the session").All() {
			if l.ContextMap()["code"] == wire.CodeShuttingDown {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "the connector did not hear the goodbye")
}
