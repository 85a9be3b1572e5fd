package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

const oneTunnel = "tunnels:\n  web: {proto: http, local_port: 3000, subdomain: web}\n"

func TestConnectorTransportDefaultsToTCP(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte("server: edge.example.com:4040\n"+oneTunnel))
	require.NoError(t, err)
	require.Equal(t, config.TransportTCP, c.Transport)
	require.Equal(t, []string{"edge.example.com:4040"}, c.DialAddrs())
}

// transport: websocket takes the edge as a wss:// URL: TLS is on, verified by the URL's host,
// and the session dials the host's port 443 with the URL's path.
func TestConnectorOverWebSocket(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte("transport: websocket\nserver: wss://edge.example.com/_warren/connect\n"+oneTunnel))
	require.NoError(t, err)
	require.Equal(t, config.TransportWebSocket, c.Transport)
	require.True(t, c.TLS.Enabled, "wss:// is TLS")
	require.Equal(t, "edge.example.com", c.TLS.ServerName)
	require.Equal(t, []string{"edge.example.com:443"}, c.DialAddrs())
	require.Equal(t, []string{"wss://edge.example.com/_warren/connect"}, c.Edges())
	_, err = c.DialOptions()
	require.NoError(t, err)

	c, err = config.ParseConnector("config.yml", []byte("transport: websocket\nservers: [\"ws://a.example.com:8080/ws\", \"ws://b.example.com/ws\"]\n"+oneTunnel))
	require.NoError(t, err)
	require.False(t, c.TLS.Enabled, "ws:// is plain")
	require.Equal(t, []string{"a.example.com:8080", "b.example.com:80"}, c.DialAddrs())
}

func TestConnectorTransportProblems(t *testing.T) {
	_, err := config.ParseConnector("config.yml", []byte("transport: carrier-pigeon\nserver: edge.example.com:4040\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{1, "transport", config.ErrInvalid, `"carrier-pigeon" is not a transport`})

	_, err = config.ParseConnector("config.yml", []byte("server: wss://edge.example.com/_warren/connect\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{1, "server", config.ErrInvalid, "needs transport: websocket"})

	_, err = config.ParseConnector("config.yml", []byte("transport: websocket\nserver: edge.example.com:443\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{2, "server", config.ErrInvalid, "not a ws:// or wss:// URL"})

	_, err = config.ParseConnector("config.yml", []byte("transport: websocket\nserver: wss://edge.example.com\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{2, "server", config.ErrInvalid, "has no path"})

	_, err = config.ParseConnector("config.yml", []byte("transport: websocket\nservers: [\"wss://a.example.com/ws\", \"wss://b.example.com/other\"]\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{2, "servers[1]", config.ErrInvalid, "same scheme and path"})

	_, err = config.ParseConnector("config.yml", []byte("transport: websocket\nserver: wss://edge.example.com/ws\ntls: {enabled: false}\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{3, "tls.enabled", config.ErrInvalid, "wss:// server is reached over TLS"})
}

// transport: quic takes the edge's QUIC address as host:port: TLS is on without a tls
// mapping, verified by the host's name, and the session dials with tunnel.WithQUIC.
func TestConnectorOverQUIC(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte("transport: quic\nserver: edge.example.com:4443\n"+oneTunnel))
	require.NoError(t, err)
	require.Equal(t, config.TransportQUIC, c.Transport)
	require.True(t, c.TLS.Enabled, "QUIC is TLS")
	require.Equal(t, "edge.example.com", c.TLS.ServerName)
	require.Equal(t, []string{"edge.example.com:4443"}, c.DialAddrs())
	_, err = c.DialOptions()
	require.NoError(t, err)

	c, err = config.ParseConnector("config.yml", []byte("transport: quic\nservers: [a.example.com:4443, b.example.com:4443]\ntls: {server_name: edge.example.com}\n"+oneTunnel))
	require.NoError(t, err)
	require.Equal(t, config.ConnectorTLS{Enabled: true, ServerName: "edge.example.com"}, c.TLS)
	require.Equal(t, []string{"a.example.com:4443", "b.example.com:4443"}, c.DialAddrs())
}

func TestConnectorQUICProblems(t *testing.T) {
	_, err := config.ParseConnector("config.yml", []byte("transport: quic\nserver: edge.example.com:4443\nproxy_url: http://proxy.corp:3128\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{3, "proxy_url", config.ErrInvalid, "does not apply to transport quic"})

	_, err = config.ParseConnector("config.yml", []byte("transport: quic\nserver: edge.example.com:4443\ntls: {enabled: false}\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{3, "tls.enabled", config.ErrInvalid, "QUIC is always TLS 1.3"})

	_, err = config.ParseConnector("config.yml", []byte("transport: quic\nserver: quic://edge.example.com:4443\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{2, "server", config.ErrInvalid, "with transport quic give the edge's QUIC address"})
}

func TestServerWebSocketPath(t *testing.T) {
	s, err := config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nhttp_port = 8080\nwebsocket_path = \"/_warren/connect\"\nwebsocket_on_http = true\n"))
	require.NoError(t, err)
	require.Equal(t, "/_warren/connect", s.Server.WebSocketPath)

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nhttp_port = 8080\nwebsocket_path = \"_warren\"\nwebsocket_on_http = true\n"))
	requireProblems(t, err, "server.toml", want{4, "server.websocket_path", config.ErrInvalid, `must begin with "/"`})

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nwebsocket_path = \"/_warren/connect\"\n"))
	requireProblems(t, err, "server.toml", want{3, "server.websocket_path", config.ErrInvalid, "served on the public HTTPS port"})

	s, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\n"))
	require.NoError(t, err)
	require.Empty(t, s.Server.WebSocketPath, "off by default")
}

// quic_port is a UDP port, off by default, that needs [tls] and package tunnel/quic linked
// into the program (this test's is not: the refusal names the import).
func TestServerQUICPort(t *testing.T) {
	s, err := config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\n"))
	require.NoError(t, err)
	require.Zero(t, s.Server.QUICPort, "off by default")

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nquic_port = 4443\n"))
	requireProblems(t, err, "server.toml",
		want{3, "server.quic_port", config.ErrInvalid, "needs a [tls] table"},
		want{3, "server.quic_port", config.ErrInvalid, `add import _ "github.com/warren-tunnel/warren/tunnel/quic" to the program`})

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nquic_port = 70000\n"))
	requireProblems(t, err, "server.toml", want{3, "server.quic_port", config.ErrInvalid, "out of range"},
		want{3, "server.quic_port", config.ErrInvalid, "needs the QUIC transport linked in"})
}
