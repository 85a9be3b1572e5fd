package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/examples/internal/config"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func parse(t *testing.T, text string) *config.Server {
	t.Helper()
	c, err := config.ParseServer("server.toml", []byte(text))
	require.NoError(t, err)
	return c
}

func TestServerConfigMapsEveryKey(t *testing.T) {
	c := parse(t, `
[server]
domain = "tunnel.example.com"
bind = "127.0.0.1"
http_port = 8081
https_port = 0
control_port = 4041
admin_port = 0
region_id = "eu"

[limits]
tcp_port_range = [21000, 21010]
max_tunnels_per_session = 4
request_body_max_bytes = 1024
drain_timeout_secs = 2.5

[load_balancing]
enabled = true
strategy = "random"
`)
	log := zap.NewNop()
	sc, err := serverConfig(c, log)
	require.NoError(t, err)
	require.Equal(t, "tunnel.example.com", sc.Domain)
	require.Equal(t, "eu", sc.RegionID)
	require.Same(t, log, sc.Logger)
	require.Equal(t, "127.0.0.1:4041", sc.ControlAddr)
	require.Equal(t, "127.0.0.1:8081", sc.HTTPAddr)
	require.Empty(t, sc.HTTPSAddr, "port 0 is off")
	require.Empty(t, sc.AdminAddr, "port 0 is off")
	require.Equal(t, 8081, sc.PublicHTTPPort)
	require.Zero(t, sc.PublicHTTPSPort)
	require.Equal(t, group.PortRange{Lo: 21000, Hi: 21010}, sc.TCPPorts)
	require.Equal(t, "127.0.0.1", sc.TCPBindHost)
	require.Equal(t, 4, sc.MaxTunnelsPerSession)
	require.Equal(t, int64(1024), sc.RequestBodyMaxBytes)
	require.Equal(t, 2500*time.Millisecond, sc.DrainTimeout)
	require.True(t, sc.LoadBalancing)
	require.Equal(t, "random", sc.Strategy)
	require.Nil(t, sc.Auth, "require_auth defaults to false: every connector is accepted")
	require.Nil(t, sc.TLSConfig)

	srv, err := tunnel.NewServer(sc)
	require.NoError(t, err, "the edge accepts what the file produces")
	require.NoError(t, srv.Close()) // NewServer starts a janitor goroutine
}

func TestServerConfigAuth(t *testing.T) {
	c := parse(t, `
[server]
domain = "localhost"
[auth]
require_auth = true
tokens = ["plain-token-0123456789"]
[[auth.tenants]]
name = "acme"
token = "acme-token-0123456789"
`)
	sc, err := serverConfig(c, zap.NewNop())
	require.NoError(t, err)
	require.NotNil(t, sc.Auth)
	ctx := context.Background()

	tenant, err := sc.Auth.Authenticate(ctx, "plain-token-0123456789")
	require.NoError(t, err)
	require.Empty(t, tenant)
	tenant, err = sc.Auth.Authenticate(ctx, "acme-token-0123456789")
	require.NoError(t, err)
	require.Equal(t, "acme", tenant)
	_, err = sc.Auth.Authenticate(ctx, "wrong")
	require.ErrorIs(t, err, tunnel.ErrUnauthorized)
}

func TestServerConfigBadKeyPair(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert.pem"), []byte("not a certificate"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), []byte("not a key"), 0o600))
	path := filepath.Join(dir, "server.toml")
	require.NoError(t, os.WriteFile(path, []byte(`
[server]
domain = "localhost"
[tls]
cert_path = "cert.pem"
key_path = "key.pem"
`), 0o600))
	c, err := config.LoadServer(path)
	require.NoError(t, err)
	_, err = serverConfig(c, zap.NewNop())
	require.ErrorContains(t, err, path)
	require.ErrorContains(t, err, "tls")

	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", path}, &stderr))
	require.Contains(t, stderr.String(), path)
}

func TestEveryKeyIsWired(t *testing.T) {
	c := parse(t, `
[server]
domain = "localhost"
[auth]
admin_token = "admin-token-0123456789"
[limits]
max_concurrent_per_member = 3
max_preauth_conns = 64
max_preauth_conns_per_ip = 4
hello_timeout_secs = 2
max_auth_failures_per_ip = 5
auth_failure_window_secs = 60
auth_block_secs = 120
[load_balancing]
alert_webhook_url = "https://hooks.example.com/x"
allow_private_alert_webhooks = true
retry_unread_requests = true
`)
	sc, err := serverConfig(c, zap.NewNop())
	require.NoError(t, err)
	require.Equal(t, "admin-token-0123456789", sc.AdminToken)
	require.Equal(t, "https://hooks.example.com/x", sc.AlertWebhookURL)
	require.True(t, sc.AllowPrivateAlertWebhooks)
	require.True(t, sc.RetryUnreadRequests)
	require.Equal(t, 3, sc.MaxConcurrentPerMember)
	require.Equal(t, 64, sc.MaxPreAuthConns)
	require.Equal(t, 4, sc.MaxPreAuthConnsPerIP)
	require.Equal(t, 2*time.Second, sc.HelloTimeout)
	require.Equal(t, 5, sc.MaxAuthFailuresPerIP)
	require.Equal(t, time.Minute, sc.AuthFailureWindow)
	require.Equal(t, 2*time.Minute, sc.AuthBlockDuration)
}

func TestRunBadConfigExits2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.toml")
	require.NoError(t, os.WriteFile(path, []byte("[server]\ndomain = \"localhost\"\ndomian = \"x\"\n"), 0o600))
	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", path}, &stderr))
	require.Contains(t, stderr.String(), path+":3: server.domian: unknown key")

	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", filepath.Join(t.TempDir(), "missing.toml")}, &stderr))
	require.Contains(t, stderr.String(), "missing.toml")

	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", path, "extra"}, &stderr))
	require.Contains(t, stderr.String(), "usage: edge")
}
