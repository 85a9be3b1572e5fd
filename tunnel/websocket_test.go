package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/throttle"
)

const wsPath = "/_warren/connect"

// wsEdge is a test edge that also serves public HTTPS (a self-signed test CA) with
// connectors accepted over WebSocket at wsPath.
type wsEdge struct {
	*testEdge
	httpsAddr string
	pki       testPKI

	mu    sync.Mutex
	conns []net.Conn // every connection the connectors dialled to httpsAddr
}

func startWSEdge(t *testing.T, cfg ServerConfig) *wsEdge {
	t.Helper()
	pki := newTestPKI(t)
	cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	if cfg.Public.WebSocketPath == "" {
		cfg.Public.WebSocketPath = wsPath
	}
	l := listenLoopback(t)
	cfg.Public.URLHTTPSPort = l.Addr().(*net.TCPAddr).Port
	e := &wsEdge{testEdge: startEdge(t, cfg), httpsAddr: l.Addr().String(), pki: pki}
	e.served.Go(func() {
		if err := e.ServePublicTLS(l); !errors.Is(err, ErrServerClosed) {
			t.Errorf("ServePublicTLS returned %v, want ErrServerClosed", err)
		}
	})
	return e
}

// wsOptions make a connector reach e over WebSocket: the edge's domain as the address (the
// Host of the upgrade), every dial going to the HTTPS listener, as DNS would send it.
func (e *wsEdge) wsOptions() []Option {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return []Option{
		WithWebSocket(wsPath),
		WithTLS(&tls.Config{RootCAs: e.pki.pool, ServerName: "edge.test"}),
		WithDialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, e.httpsAddr)
			if err == nil {
				e.mu.Lock()
				e.conns = append(e.conns, c)
				e.mu.Unlock()
			}
			return c, err
		}),
	}
}

// dialWS connects a connector over WebSocket; Close runs at cleanup.
func (e *wsEdge) dialWS(t *testing.T, opts ...Option) (*Session, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts = append(append([]Option{WithBackoff(10*time.Millisecond, 100*time.Millisecond)}, e.wsOptions()...), opts...)
	s, err := Dial(ctx, testDomain+":443", opts...)
	if err == nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

// cut drops every connection the connectors dialled to the HTTPS listener, as a network
// failure would.
func (e *wsEdge) cut() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.conns {
		_ = c.Close()
	}
	e.conns = nil
}

// httpsClient sends every request to the edge's HTTPS listener, trusting the test CA.
func (e *wsEdge) httpsClient() *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, e.httpsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.pki.pool, ServerName: "edge.test"},
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: tr}
}

func (e *wsEdge) memberTransports() map[string]string {
	out := map[string]string{}
	for _, g := range e.Registry().Groups() {
		for _, m := range g.Members {
			out[m.ID] = m.Transport
		}
	}
	return out
}

func TestWebSocketConnectorServesHTTPTunnel(t *testing.T) {
	e := startWSEdge(t, ServerConfig{})
	sess, err := e.dialWS(t)
	require.NoError(t, err)
	require.Equal(t, TransportWebSocket, sess.Transport())
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)

	code, body := e.get("app", "/over-ws")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "b /over-ws", body)
	require.Equal(t, map[string]string{tun.ID(): TransportWebSocket}, e.memberTransports())
	require.Equal(t, map[string]int64{TransportTCP: 0, TransportWebSocket: 1, TransportQUIC: 0}, e.Operator().Counters().Sessions)

	tcp := e.connect()
	require.Equal(t, TransportTCP, tcp.Transport())
	require.Eventually(t, func() bool { return e.Operator().Counters().Sessions[TransportTCP] == 1 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, sess.Close())
	require.Eventually(t, func() bool { return e.Operator().Counters().Sessions[TransportWebSocket] == 0 }, 5*time.Second, 10*time.Millisecond)
}

// A TCP tunnel over a WebSocket session: its connections ride the session's streams (no
// data connection is opened), byte-exact, with half-close carried.
func TestWebSocketConnectorServesTCPTunnel(t *testing.T) {
	e := startWSEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(46200), BindHost: "127.0.0.1"}})
	sess, err := e.dialWS(t)
	require.NoError(t, err)
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	for range 3 {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port())))
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := strings.Repeat("websocket ", 100_000) // 1 MB
		_, err = io.WriteString(c, msg)
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		reply, err := io.ReadAll(c)
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(string(reply), fmt.Sprintf("%d ", len(msg))), "reply %q", reply)
		_ = c.Close()
	}
	require.Zero(t, e.data.stats.Accepted.Load(), "no data connection over WebSocket")
	e.mu.Lock()
	require.Len(t, e.conns, 1, "one WebSocket carries everything")
	e.mu.Unlock()
}

// A pool of two members, one connector over TCP and one over WebSocket, shares the load.
func TestWebSocketAndTCPMembersSharePool(t *testing.T) {
	e := startWSEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	spec := TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k3y-k3y-k3y-k3y"}
	overTCP := e.connect()
	_, err := overTCP.Forward(ctxT(t), spec, hostPort(backend(t, "tcp").URL))
	require.NoError(t, err)
	overWS, err := e.dialWS(t)
	require.NoError(t, err)
	_, err = overWS.Forward(ctxT(t), spec, hostPort(backend(t, "ws").URL))
	require.NoError(t, err)

	seen := map[string]int{}
	for range 20 {
		code, body := e.get("pool", "/")
		require.Equal(t, http.StatusOK, code)
		seen[strings.Fields(body)[0]]++
	}
	require.Positive(t, seen["tcp"], "%v", seen)
	require.Positive(t, seen["ws"], "%v", seen)
	var transports []string
	for _, tr := range e.memberTransports() {
		transports = append(transports, tr)
	}
	require.ElementsMatch(t, []string{TransportTCP, TransportWebSocket}, transports)
}

// When the WebSocket drops, the connector reconnects over WebSocket, resumes and registers
// its tunnel again.
func TestWebSocketConnectorReconnects(t *testing.T) {
	e := startWSEdge(t, ServerConfig{})
	sess, err := e.dialWS(t)
	require.NoError(t, err)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)
	code, _ := e.get("app", "/")
	require.Equal(t, http.StatusOK, code)

	e.cut()
	require.Eventually(t, func() bool {
		if sess.Reconnects() < 1 || !sess.Connected() {
			return false
		}
		code, _ := e.get("app", "/again")
		return code == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
	code, body := e.get("app", "/again")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "b /again", body)
	require.Equal(t, int64(1), e.Operator().Counters().Sessions[TransportWebSocket])
}

func TestWebSocketConnectorWrongTokenIsRefused(t *testing.T) {
	auth, err := NewStaticTokens([]string{"the-right-token-0123"}, nil)
	require.NoError(t, err)
	e := startWSEdge(t, ServerConfig{Auth: auth})
	_, err = e.dialWS(t, WithToken("a-wrong-token-012345"))
	require.ErrorIs(t, err, ErrUnauthorized)
	sess, err := e.dialWS(t, WithToken("the-right-token-0123"))
	require.NoError(t, err)
	require.True(t, sess.Connected())
}

// rawUpgrade opens a WebSocket to the edge's path by hand and sends nothing after it, as a
// client that never says hello; it returns the connection and the answer's status code.
// headers are more lines of the request ("X-Forwarded-For: 192.0.2.1").
func (e *wsEdge) rawUpgrade(t *testing.T, host string, headers ...string) (net.Conn, int) {
	c, err := tls.Dial("tcp", e.httpsAddr, &tls.Config{RootCAs: e.pki.pool, ServerName: "edge.test", NextProtos: []string{"http/1.1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n%s\r\n", wsPath, host, extraHeaders(headers))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode
}

// The pre-authentication caps count WebSocket connections too, with the control
// listener's: an upgrade over a cap is answered 503, a TCP connection over it is closed.
func TestWebSocketPreAuthCapsApply(t *testing.T) {
	e := startWSEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: time.Minute, MaxConnsPerIP: 2}})
	for range 2 {
		_, code := e.rawUpgrade(t, testDomain)
		require.Equal(t, http.StatusSwitchingProtocols, code)
	}
	require.Eventually(t, func() bool {
		_, held := e.preAuth.Held(throttle.KeyOfString("127.0.0.1"))
		return held == 2
	}, 5*time.Second, 10*time.Millisecond)
	_, code := e.rawUpgrade(t, testDomain)
	require.Equal(t, http.StatusServiceUnavailable, code, "over the per-address cap")
	_, err := e.dialWS(t, WithReconnect(false))
	require.Error(t, err)
	require.Equal(t, 1, closedAtOnce(dialFrom(t, "127.0.0.1", e.controlAddr)), "the control listener shares the caps")
}

func extraHeaders(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	return b.String()
}

// Behind a trusted proxy (a CDN), the caps count each connector's own address, as the
// proxy's forwarding headers give it, not the proxy's: one client's flood does not lock the
// others out.
func TestWebSocketPreAuthCountsTheClientBehindATrustedProxy(t *testing.T) {
	e := startWSEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: time.Minute, MaxConnsPerIP: 2},
		Public: PublicHTTP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	for range 2 {
		_, code := e.rawUpgrade(t, testDomain, "X-Forwarded-For: 192.0.2.1")
		require.Equal(t, http.StatusSwitchingProtocols, code)
	}
	require.Eventually(t, func() bool {
		_, held := e.preAuth.Held(throttle.KeyOfString("192.0.2.1"))
		return held == 2
	}, 5*time.Second, 10*time.Millisecond)
	_, code := e.rawUpgrade(t, testDomain, "X-Forwarded-For: 192.0.2.1")
	require.Equal(t, http.StatusServiceUnavailable, code, "192.0.2.1 is over its cap")
	_, code = e.rawUpgrade(t, testDomain, "X-Forwarded-For: 192.0.2.2")
	require.Equal(t, http.StatusSwitchingProtocols, code, "another client behind the same proxy is not")
	sess, err := e.dialWS(t)
	require.NoError(t, err, "nor is a connector without forwarding headers (the proxy's own address)")
	require.True(t, sess.Connected())
}

// The path is the edge's only on its own domain: a tenant's tunnel serving the same path
// gets its requests, upgrades included.
func TestWebSocketPathOnTenantSubdomainGoesToTheTunnel(t *testing.T) {
	e := startWSEdge(t, ServerConfig{})
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "tenant").URL))
	require.NoError(t, err)

	hc := e.httpsClient()
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://app." + testDomain + wsPath)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "tenant "+wsPath, string(b))
	code, body := e.get("app", wsPath)
	require.Equal(t, http.StatusOK, code, "plain HTTP too")
	require.Equal(t, "tenant "+wsPath, body)

	_, code = e.rawUpgrade(t, "app."+testDomain)
	require.NotEqual(t, http.StatusSwitchingProtocols, code, "an upgrade for the tenant's host is the tenant's")

	// On the edge's own domain, a request that is not an upgrade is refused.
	resp, err = hc.Get("https://" + testDomain + wsPath)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUpgradeRequired, resp.StatusCode)
}

// The edge's plain HTTP listener serves the path only with WebSocketOnHTTP.
func TestWebSocketOnPlainHTTPIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			e := startEdge(t, ServerConfig{Public: PublicHTTP{WebSocketPath: wsPath, WebSocketOnHTTP: on}})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d := &net.Dialer{}
			sess, err := Dial(ctx, testDomain+":80", WithWebSocket(wsPath), WithReconnect(false),
				WithDialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
					return d.DialContext(ctx, network, e.publicAddr)
				}))
			if !on {
				require.ErrorContains(t, err, "404")
				return
			}
			require.NoError(t, err)
			defer sess.Close()
			_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
			require.NoError(t, err)
			code, _ := e.get("app", "/")
			require.Equal(t, http.StatusOK, code)
		})
	}
}

func TestWebSocketPathIsValidated(t *testing.T) {
	for path, want := range map[string]string{
		"_warren":          `must begin with "/"`,
		"/":                "not a path of its own",
		"/a/../b":          "not a clean path",
		"/a/":              "not a clean path",
		"/a?b":             "query",
		"/a b":             "space",
		"/_warren/connect": "",
	} {
		err := ServerConfig{Public: PublicHTTP{WebSocketPath: path}}.Validate()
		if want == "" {
			require.NoError(t, err, path)
			continue
		}
		require.ErrorContains(t, err, "Public.WebSocketPath", path)
		require.ErrorContains(t, err, want, path)
	}
	err := ServerConfig{Public: PublicHTTP{WebSocketOnHTTP: true}}.Validate()
	require.ErrorContains(t, err, "needs Public.WebSocketPath")

	_, err = Dial(ctxT(t), "127.0.0.1:1", WithWebSocket("connect"))
	require.ErrorIs(t, err, ErrInvalid)
}

// A connector behind an HTTP proxy reaches the edge over WebSocket through CONNECT.
func TestWebSocketConnectorThroughHTTPProxy(t *testing.T) {
	e := startWSEdge(t, ServerConfig{Domain: "localhost"})
	p := startFakeProxy(t, nil, nil)
	_, port, _ := net.SplitHostPort(e.httpsAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sess, err := Dial(ctx, "localhost:"+port, WithWebSocket(wsPath), WithProxy(p.url("http", "")),
		WithTLS(&tls.Config{RootCAs: e.pki.pool, ServerName: "edge.test"}))
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, "http://app.localhost/via-proxy", nil)
	require.NoError(t, err)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, "b /via-proxy", string(b))
	reqs := p.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, http.MethodConnect, reqs[0].Method)
	require.Equal(t, "localhost:"+port, reqs[0].Host)
}
