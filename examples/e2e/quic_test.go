package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// quicEdge starts the example edge with [tls] (a self-signed certificate for localhost) and
// quic_port, a UDP port with the number of its control port (UDP and TCP ports are apart),
// and returns it with that port and the path of the certificate (the connector's
// tls.ca_path).
func quicEdge(t *testing.T) (e *edge, quicPort int, caPath string) {
	t.Helper()
	certPath, keyPath := localhostCertFiles(t)
	quicPort = freeUDPPort(t)
	e = startEdgeWith(t, false, edgeExtra{server: []string{
		fmt.Sprintf("quic_port = %d", quicPort),
		"",
		"[tls]",
		fmt.Sprintf("cert_path = %q", certPath),
		fmt.Sprintf("key_path = %q", keyPath),
	}})
	return e, quicPort, certPath
}

// freeUDPPort returns a loopback UDP port nothing listens on.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

// TestConnectorOverQUIC: the example programs with the YAML and TOML keys: an edge with
// quic_port, a connector with transport: quic and the edge's QUIC address; both tunnels serve
// (the TCP one over the session's QUIC streams), curl gets through the HTTP one, and
// `connector status` (text and --json), the admin API and the metrics say the session's
// transport.
func TestConnectorOverQUIC(t *testing.T) {
	e, quicPort, ca := quicEdge(t)
	var b strings.Builder
	fmt.Fprintf(&b, "transport: quic\nserver: localhost:%d\ntls:\n  ca_path: %q\n", quicPort, ca)
	fmt.Fprintf(&b, "auth_token: %q\ndrain_timeout_secs: 1\n", token)
	fmt.Fprintf(&b, "tunnels:\n  web:\n    proto: http\n    subdomain: web\n    local_port: %d\n", httpBackend(t, "web-backend"))
	fmt.Fprintf(&b, "  echo:\n    proto: tcp\n    local_port: %d\n", echoBackend(t, "echo-backend"))
	path := filepath.Join(t.TempDir(), "connector.yml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))

	c := start(t, "connector", "connector", "start", "--config", path)
	c.line(t, "tunnel echo: ")
	requireServes(t, e, "web-backend")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "curl", "-sS", "--max-time", "10",
		"--resolve", fmt.Sprintf("web.localhost:%d:127.0.0.1", e.http), fmt.Sprintf("http://web.localhost:%d/", e.http)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "web-backend", string(out))

	require.Contains(t, connectorStatus(t, path), "transport:  quic\n")
	require.Contains(t, connectorStatus(t, path, "--json"), `"transport": "quic"`)
	require.Equal(t, 2, strings.Count(adminTunnels(t, e), `"transport":"quic"`), adminTunnels(t, e))
	m := metrics(t, e)
	require.Contains(t, m, `warren_connector_sessions{transport="quic"} 1`)
	require.Contains(t, m, `warren_connector_sessions{transport="tcp"} 0`)
}

// TestConnectorOverQUICRefusesAProxy: proxy_url with transport quic is refused when the
// file is loaded, saying why: a proxy carries TCP, QUIC is UDP.
func TestConnectorOverQUICRefusesAProxy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "connector.yml")
	require.NoError(t, os.WriteFile(path, []byte("transport: quic\nserver: localhost:4443\nproxy_url: http://proxy.example:3128\n"+
		"tunnels:\n  web: {proto: http, subdomain: web, local_port: 3000}\n"), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "connector"), "start", "--config", path).CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), "proxy_url: does not apply to transport quic", "%s", out)
}
