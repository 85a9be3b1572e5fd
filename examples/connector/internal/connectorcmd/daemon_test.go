package connectorcmd

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/tunnel/config"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestReloadKeepsTheEdges: a reload that changes the edges says the change needs a restart
// (the session keeps its edges); server: x and servers: [x] are the same edges.
func TestReloadKeepsTheEdges(t *testing.T) {
	prev := &config.Connector{Servers: []string{"a:1", "b:1"}}
	require.Equal(t, []string{"server (a:1, b:1 -> a:1, c:1): the connector keeps its session with a:1, b:1; restart it to move"},
		notAppliedSettings(prev, &config.Connector{Servers: []string{"a:1", "c:1"}}))
	require.Empty(t, notAppliedSettings(&config.Connector{Server: "a:1"}, &config.Connector{Servers: []string{"a:1"}}))
}

// TestProxyInStatusAndReload: the status table names the proxy (never its credentials: the
// session gives scheme://host:port), and a reload that changes proxy_url says it needs a
// restart without quoting either URL.
func TestProxyInStatusAndReload(t *testing.T) {
	var b strings.Builder
	printStatus(&b, &StatusReply{Edge: "edge.example.com:4040", Proxy: "http://proxy.corp:3128", Connected: true})
	require.Contains(t, b.String(), "proxy:      http://proxy.corp:3128\n")
	b.Reset()
	printStatus(&b, &StatusReply{Edge: "edge.example.com:4040", Connected: true})
	require.NotContains(t, b.String(), "proxy:")

	got := notAppliedSettings(&config.Connector{Server: "a:1", ProxyURL: "http://u:old@p:3128"},
		&config.Connector{Server: "a:1", ProxyURL: "http://u:new@p:3128"})
	require.Equal(t, []string{"proxy_url: the session keeps the proxy it connected through; restart the connector to change it"}, got)
}

// TestTransportInStatusAndReload: the status table says how the session reaches the edge,
// and a reload that changes transport says it needs a restart.
func TestTransportInStatusAndReload(t *testing.T) {
	var b strings.Builder
	printStatus(&b, &StatusReply{Edge: "edge.example.com:443", Transport: "websocket", Connected: true})
	require.Contains(t, b.String(), "transport:  websocket\n")

	require.Empty(t, notAppliedSettings(&config.Connector{Server: "a:1"}, &config.Connector{Server: "a:1", Transport: "tcp"}), "tcp is the default")
	got := notAppliedSettings(&config.Connector{Server: "a:1"},
		&config.Connector{Server: "wss://a/ws", Transport: "websocket"})
	require.Contains(t, got, "transport (tcp -> websocket): the session keeps the transport it connected over; restart the connector to change it")
}
