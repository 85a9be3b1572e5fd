package tunnel

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An embedder that serves Handler() on an HTTPS server of its own accepts connectors over
// WebSocket at ServerConfig.Public.WebSocketPath, and routes the tunnels' traffic on the same
// server.
func TestHandlerServesConnectorWebSocket(t *testing.T) {
	pki := newTestPKI(t)
	e := startEdge(t, ServerConfig{Public: PublicHTTP{WebSocketPath: wsPath}})
	own := httptest.NewUnstartedServer(e.Handler())
	own.TLS = &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	own.StartTLS()
	t.Cleanup(own.Close)
	addr := own.Listener.Addr().String()

	d := &net.Dialer{Timeout: 5 * time.Second}
	toOwn := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sess, err := Dial(ctx, testDomain+":443",
		WithWebSocket(wsPath),
		WithTLS(&tls.Config{RootCAs: pki.pool, ServerName: "edge.test"}),
		WithDialer(toOwn))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	require.Equal(t, TransportWebSocket, sess.Transport())
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     toOwn,
		TLSClientConfig: &tls.Config{RootCAs: pki.pool, ServerName: "edge.test"},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("https://app." + testDomain + "/through-own-server")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "b /through-own-server", string(body))
	require.Equal(t, int64(1), e.Operator().Counters().Sessions[TransportWebSocket])
}

// Without a WebSocketPath, Handler() routes the path like any other: a connector's upgrade
// on the edge's own domain is not accepted.
func TestHandlerWithoutWebSocketPathRefusesConnectors(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	own := httptest.NewServer(e.Handler())
	t.Cleanup(own.Close)
	req, err := http.NewRequest(http.MethodGet, own.URL+wsPath, nil)
	require.NoError(t, err)
	req.Host = testDomain
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := own.Client().Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.NotEqual(t, http.StatusSwitchingProtocols, resp.StatusCode)
}
