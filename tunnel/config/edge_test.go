package config_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/cluster"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// edgeOf parses text and makes its edge.
func edgeOf(t *testing.T, text string) *config.Edge {
	t.Helper()
	c, err := config.ParseServer("server.toml", []byte(text))
	require.NoError(t, err)
	e, err := c.Edge(zap.NewNop())
	require.NoError(t, err)
	return e
}

func TestServerConfigMapsEveryKey(t *testing.T) {
	c, err := config.ParseServer("server.toml", []byte(`
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
`))
	require.NoError(t, err)
	log := zap.NewNop()
	e, err := c.Edge(log)
	require.NoError(t, err)
	sc := e.Config
	require.Equal(t, "tunnel.example.com", sc.Domain)
	require.Equal(t, "eu", sc.RegionID)
	require.Same(t, log, sc.Logger)
	require.Equal(t, "127.0.0.1:4041", sc.ControlAddr)
	require.Equal(t, "127.0.0.1:8081", sc.Public.HTTPAddr)
	require.Empty(t, sc.Public.HTTPSAddr, "port 0 is off")
	require.Empty(t, e.AdminAddr, "port 0 is off")
	require.Equal(t, 8081, sc.Public.URLHTTPPort)
	require.Zero(t, sc.Public.URLHTTPSPort)
	require.Equal(t, group.PortRange{Lo: 21000, Hi: 21010}, sc.TCP.Ports)
	require.Equal(t, "127.0.0.1", sc.TCP.BindHost)
	require.Equal(t, 4, sc.Limits.MaxTunnelsPerSession)
	require.Equal(t, int64(1024), sc.RequestBody.MaxBytes)
	require.Equal(t, 2500*time.Millisecond, sc.Timeouts.Drain)
	require.True(t, sc.LoadBalancing.Enabled)
	require.Equal(t, "random", sc.LoadBalancing.Strategy)
	require.Nil(t, sc.Auth, "require_auth defaults to false: every connector is accepted")
	require.Nil(t, sc.TLSConfig)
	require.Nil(t, sc.Store, "the program opens the store of StateDir")
	require.Equal(t, tunnel.ServerConfig{}.WithDefaults().Timeouts.Open, sc.Timeouts.Open, "what no key sets has the library's default")

	srv, err := tunnel.NewServer(sc)
	require.NoError(t, err, "the edge accepts what the file produces")
	require.NoError(t, srv.Close()) // NewServer starts a janitor goroutine

	e = edgeOf(t, "[server]\ndomain = \"localhost\"\nadmin_port = 9191\n[auth]\nadmin_token = \"admin-token-0123456789\"\n")
	require.Equal(t, "127.0.0.1:9191", e.AdminAddr, "the admin listener is on loopback unless admin_bind says otherwise")
	require.Equal(t, "admin-token-0123456789", e.AdminToken)
}

func TestServerConfigAuth(t *testing.T) {
	sc := edgeOf(t, `
[server]
domain = "localhost"
[auth]
require_auth = true
tokens = ["plain-token-0123456789"]
[[auth.tenants]]
name = "acme"
token = "acme-token-0123456789"
`).Config
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
	_, err = c.Edge(zap.NewNop())
	require.ErrorContains(t, err, path+": tls: loading cert_path and key_path")
}

func TestEveryKeyIsWired(t *testing.T) {
	e := edgeOf(t, `
[server]
domain = "localhost"
state_dir = "/var/lib/warren"
admin_hosts = ["admin.internal"]
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
response_stall_timeout_secs = 7
max_stalled_response_bytes = 0
max_stalled_response_bytes_per_conn = 8388608
max_stalled_response_bytes_per_ip = 33554432
[load_balancing]
alert_webhook_url = "https://hooks.example.com/x"
allow_private_alert_webhooks = true
retry_unread_requests = true
prefer_local_streams = 2
`)
	sc := e.Config
	require.Equal(t, "/var/lib/warren", e.StateDir)
	require.Equal(t, []string{"admin.internal"}, e.AdminHosts)
	require.Equal(t, "https://hooks.example.com/x", sc.Alerts.WebhookURL)
	require.True(t, sc.Alerts.AllowPrivateWebhooks)
	require.True(t, sc.LoadBalancing.RetryUnreadRequests)
	require.Equal(t, 3, sc.LoadBalancing.MaxConcurrentPerMember)
	require.Equal(t, 2, sc.LoadBalancing.PreferLocalStreams)
	require.Equal(t, 64, sc.PreAuth.MaxConns)
	require.Equal(t, 4, sc.PreAuth.MaxConnsPerIP)
	require.Equal(t, 2*time.Second, sc.PreAuth.HelloTimeout)
	require.Equal(t, 5, sc.PreAuth.MaxAuthFailuresPerIP)
	require.Equal(t, time.Minute, sc.PreAuth.AuthFailureWindow)
	require.Equal(t, 2*time.Minute, sc.PreAuth.AuthBlockDuration)
	require.Equal(t, 7*time.Second, sc.StalledResponses.Timeout)
	require.Equal(t, int64(-1), sc.StalledResponses.MaxBytes, "0 in the file: no bound")
	require.Equal(t, int64(8<<20), sc.StalledResponses.MaxBytesPerConn)
	require.Equal(t, int64(32<<20), sc.StalledResponses.MaxBytesPerIP)

	// 0 in the file turns the stall timeout off, and the defaults are the edge's.
	sc = edgeOf(t, "[server]\ndomain = \"localhost\"\n[limits]\nresponse_stall_timeout_secs = 0\n").Config
	require.Negative(t, sc.StalledResponses.Timeout)
	require.Equal(t, int64(tunnel.DefaultMaxStalledResponseBytes), sc.StalledResponses.MaxBytes)
	require.Equal(t, int64(tunnel.DefaultMaxStalledResponseBytesPerConn), sc.StalledResponses.MaxBytesPerConn)
	require.Equal(t, int64(tunnel.DefaultMaxStalledResponseBytesPerIP), sc.StalledResponses.MaxBytesPerIP)
}

// The alert keys: by default the alert document's rule (no interval, no recovery alerts);
// 0 is accepted and means no interval; the opt-ins map to the edge's Alerts; a negative
// interval is refused with its file, line and key.
func TestAlertKeys(t *testing.T) {
	sc := edgeOf(t, "[server]\ndomain = \"localhost\"\n").Config
	require.Zero(t, sc.Alerts.MinInterval, "no interval by default")
	require.False(t, sc.Alerts.OnRecovery, "no recovery alerts by default")

	sc = edgeOf(t, "[server]\ndomain = \"localhost\"\n[load_balancing]\nalert_min_interval_secs = 0\nalert_on_recovery = false\n").Config
	require.Zero(t, sc.Alerts.MinInterval, "0 is off")
	require.False(t, sc.Alerts.OnRecovery)

	sc = edgeOf(t, "[server]\ndomain = \"localhost\"\n[load_balancing]\nalert_min_interval_secs = 60\nalert_on_recovery = true\n").Config
	require.Equal(t, time.Minute, sc.Alerts.MinInterval)
	require.True(t, sc.Alerts.OnRecovery)
	srv, err := tunnel.NewServer(sc)
	require.NoError(t, err, "the edge accepts the opt-ins")
	require.NoError(t, srv.Close())

	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\n[load_balancing]\nalert_min_interval_secs = -1\n"))
	require.EqualError(t, err, "server.toml:4: load_balancing.alert_min_interval_secs: must be 0 (off) or more seconds, got -1")
	_, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\n[load_balancing]\nalert_on_recovery = 1\n"))
	require.EqualError(t, err, "server.toml:4: load_balancing.alert_on_recovery: expected a boolean (true or false), got an integer")
}

// TestDefaultsAreTheLibrarys: a file that sets nothing but its domain gives the edge the
// library's own defaults, but for what the file has defaults of its own for (ports, bind,
// TCP range, tenant quotas).
func TestDefaultsAreTheLibrarys(t *testing.T) {
	sc := edgeOf(t, "[server]\ndomain = \"localhost\"\n").Config
	want := tunnel.ServerConfig{}.WithDefaults()
	require.Equal(t, want.Timeouts, sc.Timeouts)
	require.Equal(t, want.PreAuth, sc.PreAuth)
	require.Equal(t, want.RequestBody, sc.RequestBody)
	require.Equal(t, want.StalledResponses, sc.StalledResponses)
	require.Equal(t, want.Alerts, sc.Alerts)
	require.Equal(t, want.RouteTTL, sc.RouteTTL)
	require.Equal(t, want.LoadBalancing.Strategy, sc.LoadBalancing.Strategy)
	require.Equal(t, want.Limits.MaxTunnelsPerSession, sc.Limits.MaxTunnelsPerSession)
	require.Equal(t, want.RegionID, sc.RegionID)
	require.Equal(t, "0.0.0.0:4040", sc.ControlAddr)
	require.Equal(t, tunnel.TenantLimits{MaxSessions: 64, MaxTunnels: 1024, MaxTCPPorts: 16, MaxEventStreams: 8, MaxRoutes: 1024}, sc.Limits.Tenant)
}

const edgesToken = "edges-secret-0123456789"

// writeCert writes a self-signed certificate for localhost and its key into dir.
func writeCert(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edge"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPath, keyPath = filepath.Join(dir, "peer.crt"), filepath.Join(dir, "peer.key")
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	return certPath, keyPath
}

// TestServerConfigCluster: [cluster] maps onto cluster.Config, TLS files loaded; without it
// the edge has no cluster.
func TestServerConfigCluster(t *testing.T) {
	e := edgeOf(t, "[server]\ndomain = \"localhost\"\n")
	require.Nil(t, e.Config.Cluster)
	require.Nil(t, e.ClusterConfig)

	dir := t.TempDir()
	_, key := writeCert(t, dir)
	path := filepath.Join(dir, "server.toml")
	require.NoError(t, os.WriteFile(path, []byte(`[server]
domain = "localhost"
[cluster]
nats_urls = ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
edge_id = "edge-a"
advertise = "localhost:7443"
peer_addr = ":7443"
token = "`+edgesToken+`"
lease_secs = 3
bucket = "prod"
replicas = 3
timeout_secs = 2
[cluster.tls]
cert_path = "peer.crt"
key_path = "peer.key"
ca_path = "peer.crt"
`), 0o600))
	c, err := config.LoadServer(path)
	require.NoError(t, err)
	e, err = c.Edge(zap.NewNop())
	require.NoError(t, err)
	require.IsType(t, &cluster.Cluster{}, e.Config.Cluster)
	cc := e.ClusterConfig
	require.Equal(t, []string{"nats://10.0.0.1:4222", "nats://10.0.0.2:4222"}, cc.NATSURLs)
	require.Equal(t, "edge-a", cc.EdgeID)
	require.Equal(t, "localhost:7443", cc.Advertise)
	require.Equal(t, ":7443", cc.PeerAddr)
	require.Equal(t, edgesToken, cc.Token)
	require.Equal(t, 3*time.Second, cc.LeaseTTL)
	require.Equal(t, "prod", cc.Bucket)
	require.Equal(t, 3, cc.Replicas)
	require.Equal(t, 2*time.Second, cc.Timeout)
	require.NotNil(t, cc.PeerTLS)
	require.Len(t, cc.PeerTLS.Certificates, 1)
	require.NotNil(t, cc.PeerClientTLS)
	require.NotNil(t, cc.PeerClientTLS.RootCAs)

	// A key pair that does not load is refused, naming the file and the table.
	require.NoError(t, os.WriteFile(key, []byte("not a key"), 0o600))
	_, err = c.Edge(zap.NewNop())
	require.ErrorContains(t, err, path+": cluster: tls: loading cert_path and key_path")
}
