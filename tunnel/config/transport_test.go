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
	_, err := config.ParseConnector("config.yml", []byte("transport: quic\nserver: edge.example.com:4040\n"+oneTunnel))
	requireProblems(t, err, "config.yml", want{1, "transport", config.ErrInvalid, "quic is not supported yet"})

	_, err = config.ParseConnector("config.yml", []byte("transport: carrier-pigeon\nserver: edge.example.com:4040\n"+oneTunnel))
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
