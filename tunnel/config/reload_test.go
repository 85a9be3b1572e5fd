package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// parse parses server.toml text that must be valid.
func parse(t *testing.T, text string) *Server {
	t.Helper()
	c, err := ParseServer("server.toml", []byte(text))
	require.NoError(t, err)
	return c
}

// lines are the changes' lines, as the example edge logs them.
func lines(changes []Change) []string {
	var out []string
	for _, c := range changes {
		out = append(out, c.String())
	}
	return out
}

// TestReloadDiffs: the live limits and tenant quotas are reported as applied, the other
// [limits] keys as not applied, with their file keys and values.
func TestReloadDiffs(t *testing.T) {
	start := parse(t, `
[server]
domain = "localhost"
[auth]
require_auth = true
tokens = ["connector-token-0123456789"]
[[auth.tenants]]
name = "acme"
token = "acme-token-0123456789"
max_tunnels = 2
[limits]
max_sessions = 5
`)
	next := parse(t, `
[server]
domain = "localhost"
[auth]
require_auth = true
tokens = ["connector-token-0123456789"]
[[auth.tenants]]
name = "acme"
token = "acme-token-0123456789"
max_tunnels = 3
[limits]
max_sessions = 4
tcp_port_range = [21000, 21010]
`)
	applied := limitsApplied(start, next)
	require.Equal(t, []string{
		"limits.max_sessions (5 -> 4): from the next session, registration or event stream; what is held stays",
		"auth.tenants[acme].max_tunnels (2 -> 3): from the next session, registration or event stream; what is held stays",
	}, lines(applied))
	require.Equal(t, Change{Key: "limits.max_sessions", From: "5", To: "4", Applied: true, Reason: quotaApplies}, applied[0])
	notApplied := fileDiff(start, next)
	require.Equal(t, []string{
		"limits.tcp_port_range ([20000, 20100] -> [21000, 21010]): the edge reads it only when it starts; restart the edge to apply it",
	}, lines(notApplied))
	require.False(t, notApplied[0].Applied)
}

const edgesToken = "edges-secret-0123456789"

func clusterTable(natsURL, id string, peer int, extra string) string {
	return fmt.Sprintf("[cluster]\nnats_urls = [%q]\nedge_id = %q\nadvertise = \"127.0.0.1:%d\"\ntoken = %q\nlease_secs = 1\n%s",
		natsURL, id, peer, edgesToken, extra)
}

// TestReloadCluster: a changed [cluster] is reported as not applied, key by key, the token
// without its values.
func TestReloadCluster(t *testing.T) {
	const base = "[server]\ndomain = \"localhost\"\n"
	single := parse(t, base)
	one := parse(t, base+clusterTable("nats://127.0.0.1:4222", "a", 7443, ""))
	two := parse(t, base+strings.Replace(clusterTable("nats://127.0.0.1:4223", "a", 7443, "replicas = 3\n"), edgesToken, "other-edges-secret-0123", 1))
	require.Empty(t, fileDiff(one, one))
	require.Equal(t, []string{"cluster (off -> on): the edge runs alone; restart the edge to join the cluster"}, lines(fileDiff(single, one)))
	require.Equal(t, []string{"cluster (on -> off): the edge stays in the cluster; restart the edge to run it alone"}, lines(fileDiff(one, single)))
	diff := lines(fileDiff(one, two))
	require.Equal(t, []string{
		"cluster.nats_urls ([nats://127.0.0.1:4222] -> [nats://127.0.0.1:4223]): the edge joined the cluster with it; restart the edge to apply it",
		"cluster.token: the edge joined the cluster with it; restart the edge to apply it",
		"cluster.replicas (1 -> 3): the edge joined the cluster with it; restart the edge to apply it",
	}, diff)
	require.NotContains(t, strings.Join(diff, "\n"), "secret")

	three := parse(t, base+strings.Replace(clusterTable("nats://127.0.0.1:4222", "a", 7443, "[cluster.tls]\nca_path = \"\"\n"), "lease_secs = 1", "lease_secs = 2", 1))
	require.Equal(t, []string{"cluster.lease_secs (1s -> 2s): the edge joined the cluster with it; restart the edge to apply it"}, lines(fileDiff(one, three)))
}

// TestReloadWebSocketPath: a changed websocket_path is reported as not applied.
func TestReloadWebSocketPath(t *testing.T) {
	start := parse(t, "[server]\ndomain = \"localhost\"\n")
	next := parse(t, "[server]\ndomain = \"localhost\"\nwebsocket_path = \"/_warren/connect\"\nwebsocket_on_http = true\n")
	require.Equal(t, []string{
		"server.websocket_path ( -> /_warren/connect): the public listeners serve the path they started with; restart the edge to apply it",
		"server.websocket_on_http (false -> true): the public listeners serve the path they started with; restart the edge to apply it",
	}, lines(fileDiff(start, next)))
}
