package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// wsEdge starts the example edge with public HTTPS (a self-signed certificate for
// localhost) and websocket_path = "/_warren/connect", and returns it with its HTTPS port and
// the path of the certificate (the connector's tls.ca_path).
func wsEdge(t *testing.T) (e *edge, httpsPort int, caPath string) {
	t.Helper()
	certPath, keyPath := localhostCertFiles(t)
	httpsPort = freePorts(t, 1)[0]
	e = startEdgeWith(t, false, edgeExtra{server: []string{
		fmt.Sprintf("https_port = %d", httpsPort),
		`websocket_path = "/_warren/connect"`,
		"",
		"[tls]",
		fmt.Sprintf("cert_path = %q", certPath),
		fmt.Sprintf("key_path = %q", keyPath),
	}})
	return e, httpsPort, certPath
}

// wsConnectorFile writes a connector file with transport: websocket for the edge's HTTPS
// port, an HTTP tunnel "web" to httpPort and a TCP tunnel "echo" to echoPort; extra are more
// top-level lines (proxy_url).
func wsConnectorFile(t *testing.T, httpsPort int, caPath string, httpPort, echoPort int, extra ...string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "transport: websocket\nserver: wss://localhost:%d/_warren/connect\ntls:\n  ca_path: %q\n", httpsPort, caPath)
	fmt.Fprintf(&b, "auth_token: %q\ndrain_timeout_secs: 1\n", token)
	for _, l := range extra {
		fmt.Fprintln(&b, l)
	}
	fmt.Fprintf(&b, "tunnels:\n  web:\n    proto: http\n    subdomain: web\n    local_port: %d\n", httpPort)
	fmt.Fprintf(&b, "  echo:\n    proto: tcp\n    local_port: %d\n", echoPort)
	path := filepath.Join(t.TempDir(), "connector.yml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// adminTunnels returns the body of the edge's GET /api/tunnels.
func adminTunnels(t *testing.T, e *edge) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/api/tunnels", e.admin), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// TestConnectorOverWebSocket: the example programs with the YAML and TOML keys: an edge with
// websocket_path on its HTTPS port, a connector with transport: websocket and a wss:// server
// URL; both tunnels serve (the TCP one over the session's streams), and `connector status`
// (text and --json), the admin API and the metrics say the session's transport.
func TestConnectorOverWebSocket(t *testing.T) {
	e, httpsPort, ca := wsEdge(t)
	path := wsConnectorFile(t, httpsPort, ca, httpBackend(t, "web-backend"), echoBackend(t, "echo-backend"))
	c := start(t, "connector", "connector", "start", "--config", path)
	c.line(t, "tunnel echo: ")
	requireServes(t, e, "web-backend")

	require.Contains(t, connectorStatus(t, path), "transport:  websocket\n")
	require.Contains(t, connectorStatus(t, path, "--json"), `"transport": "websocket"`)
	require.Equal(t, 2, strings.Count(adminTunnels(t, e), `"transport":"websocket"`), adminTunnels(t, e))
	require.Contains(t, metrics(t, e), `warren_connector_sessions{transport="websocket"} 1`)
}

// TestConnectorOverWebSocketThroughTinyproxy: the WebSocket goes through tinyproxy's
// CONNECT to the edge's HTTPS port, the one port such a proxy usually lets through.
func TestConnectorOverWebSocketThroughTinyproxy(t *testing.T) {
	e, httpsPort, ca := wsEdge(t)
	tp := startTinyproxy(t, "warren s3cret-pass", httpsPort)
	path := wsConnectorFile(t, httpsPort, ca, httpBackend(t, "web-backend"), echoBackend(t, "echo-backend"),
		fmt.Sprintf("proxy_url: %q", "http://warren:s3cret-pass@"+tp.addr()))
	c := start(t, "connector", "connector", "start", "--config", path)
	c.line(t, "tunnel echo: ")
	requireServes(t, e, "web-backend")
	require.Equal(t, 1, tp.connects(fmt.Sprintf("localhost:%d", httpsPort)), "one CONNECT: the WebSocket carries everything")
	st := connectorStatus(t, path)
	require.Contains(t, st, "transport:  websocket\n")
	require.Contains(t, st, "proxy:      http://"+tp.addr()+"\n")
}
