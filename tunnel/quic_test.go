package tunnel

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
