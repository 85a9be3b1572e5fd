package config_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/dispatch"
	"github.com/warren-tunnel/warren/tunnel/config"
	"github.com/warren-tunnel/warren/webhook"
)

const serverSample = "../../examples/edge/server.example.toml"

func TestServerSampleParses(t *testing.T) {
	cfg, err := config.LoadServer(serverSample)
	require.NoError(t, err)
	require.Equal(t, serverSample, cfg.File)
	require.Equal(t, "localhost", cfg.Server.Domain)
	require.Equal(t, netip.MustParseAddr("127.0.0.1"), cfg.Server.Bind)
	require.Equal(t, 8080, cfg.Server.HTTPPort)
	require.Equal(t, 4040, cfg.Server.ControlPort)
	require.Equal(t, 9090, cfg.Server.AdminPort)
	require.True(t, cfg.LoadBalancing.Enabled)
	require.False(t, cfg.TLS.Enabled())
	require.NoError(t, cfg.Validate())
}

func TestServerDefaults(t *testing.T) {
	cfg, err := config.ParseServer("server.toml", []byte("[server]\ndomain = \"tunnel.example.com\"\n"))
	require.NoError(t, err)
	require.Equal(t, &config.Server{
		File: "server.toml",
		Server: config.ServerSection{
			Domain:      "tunnel.example.com",
			Bind:        netip.MustParseAddr("0.0.0.0"),
			HTTPPort:    8080,
			HTTPSPort:   0,
			ControlPort: 4040,
			AdminPort:   9090,
			RegionID:    "local",
		},
		Limits: config.Limits{
			Quotas:               config.Quotas{MaxSessions: 64, MaxTunnels: 1024, MaxTCPPorts: 16, MaxEventStreams: 8, MaxRoutes: 1024},
			RouteTTL:             24 * time.Hour,
			TCPPortRange:         config.PortRange{Low: 20000, High: 20100},
			MaxTunnelsPerSession: 16,
			DrainTimeout:         30 * time.Second,

			RequestBodyTimeout:      60 * time.Second,
			RequestBodyMinRate:      1024,
			RequestBodyMinRateGrace: 10 * time.Second,

			ResponseStallTimeout:           60 * time.Second,
			MaxStalledResponseBytes:        256 << 20,
			MaxStalledResponseBytesPerConn: 16 << 20,
			MaxStalledResponseBytesPerIP:   32 << 20,

			MaxPreAuthConns:      256,
			MaxPreAuthConnsPerIP: 16,
			HelloTimeout:         5 * time.Second,
			MaxAuthFailuresPerIP: 10,
			AuthFailureWindow:    10 * time.Minute,
			AuthBlock:            15 * time.Minute,
		},
		LoadBalancing: config.LoadBalancing{Strategy: dispatch.NameLeastStreams},
	}, cfg)
	require.Equal(t, "0.0.0.0:8080", cfg.Server.Addr(cfg.Server.HTTPPort))
	require.Equal(t, "", cfg.Server.Addr(cfg.Server.HTTPSPort))
}

func TestServerEveryKey(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeFile(t, dir, "edge.crt"), writeFile(t, dir, "edge.key")
	doc := fmt.Sprintf(`
[server]
domain = "edge.example.org"
bind = "::1"
http_port = 0
https_port = 8443
control_port = 7000
admin_port = 0
region_id = "eu-1"
state_dir = "/var/lib/warren"
data_read_buffer = 8388608

[tls]
cert_path = '%s'
key_path = '%s'

[auth]
require_auth = true
tokens = ["connector-token-1", "connector-token-2"]
admin_token = "admin-token-0123456789"
[[auth.tenants]]
name = "acme"
token = "acme-token-0123456789"
[[auth.tenants]]
name = "globex"
token = "globex-token-0123456789"
max_tunnels = 7

[limits]
route_ttl_secs = 3600
max_sessions = 2
max_tunnels = 3
max_tcp_ports = 4
max_event_streams = 5
max_routes = 6
tcp_port_range = [30000, 30000]
max_tunnels_per_session = 1
request_body_max_bytes = 1048576
drain_timeout_secs = 0.05
max_concurrent_per_member = 8
request_body_timeout_secs = 0
request_body_min_rate = 512
request_body_min_rate_grace_secs = 2.5
response_stall_timeout_secs = 7.5
max_stalled_response_bytes = 100000000
max_stalled_response_bytes_per_conn = 0
max_stalled_response_bytes_per_ip = 20000000
max_preauth_conns = 100
max_preauth_conns_per_ip = 4
hello_timeout_secs = 2.5
max_auth_failures_per_ip = 5
auth_failure_window_secs = 60
auth_block_secs = 3600

[load_balancing]
enabled = true
strategy = "random"
alert_webhook_url = "https://hooks.example.com/ops?x=1"
allow_private_alert_webhooks = true
retry_unread_requests = true
alert_min_interval_secs = 1.5
alert_on_recovery = true

[[endpoints]]
subdomain = "pool"
tenant = "acme"
group = "web"
allow_cidrs = ["203.0.113.0/24"]
deny_cidrs = ["203.0.113.7/32"]
rate_limit = 2.5
rate_burst = 5
max_concurrent = 9

[[endpoints]]
proto = "tcp"
group = "db"
port = 30000
tenant = "globex"
key_sha256 = "5fbf9bf10407864eb8562d42e245fd6435ebebff6cdea8cae46bec8da0b11e9a"
`, cert, key)
	cfg, err := config.ParseServer("edge.toml", []byte(doc))
	require.NoError(t, err)
	require.Equal(t, &config.Server{
		File: "edge.toml",
		Server: config.ServerSection{
			Domain: "edge.example.org", Bind: netip.MustParseAddr("::1"),
			HTTPSPort: 8443, ControlPort: 7000, RegionID: "eu-1", StateDir: "/var/lib/warren",
			DataReadBuffer: 8 << 20,
		},
		TLS: config.ServerTLS{CertPath: cert, KeyPath: key},
		Auth: config.Auth{
			RequireAuth: true,
			Tokens:      []string{"connector-token-1", "connector-token-2"},
			AdminToken:  "admin-token-0123456789",
			Tenants:     []config.Tenant{{Name: "acme", Token: "acme-token-0123456789"}, {Name: "globex", Token: "globex-token-0123456789", Quotas: config.Quotas{MaxTunnels: 7}}},
		},
		Limits: config.Limits{
			Quotas:                 config.Quotas{MaxSessions: 2, MaxTunnels: 3, MaxTCPPorts: 4, MaxEventStreams: 5, MaxRoutes: 6},
			RouteTTL:               time.Hour,
			TCPPortRange:           config.PortRange{Low: 30000, High: 30000},
			MaxTunnelsPerSession:   1,
			RequestBodyMaxBytes:    1 << 20,
			DrainTimeout:           50 * time.Millisecond,
			MaxConcurrentPerMember: 8,

			RequestBodyTimeout:      0,
			RequestBodyMinRate:      512,
			RequestBodyMinRateGrace: 2500 * time.Millisecond,

			ResponseStallTimeout:           7500 * time.Millisecond,
			MaxStalledResponseBytes:        100_000_000,
			MaxStalledResponseBytesPerConn: 0,
			MaxStalledResponseBytesPerIP:   20_000_000,

			MaxPreAuthConns:      100,
			MaxPreAuthConnsPerIP: 4,
			HelloTimeout:         2500 * time.Millisecond,
			MaxAuthFailuresPerIP: 5,
			AuthFailureWindow:    time.Minute,
			AuthBlock:            time.Hour,
		},
		LoadBalancing: config.LoadBalancing{
			Enabled: true, Strategy: dispatch.NameRandom,
			AlertWebhookURL:           "https://hooks.example.com/ops?x=1",
			AllowPrivateAlertWebhooks: true,
			RetryUnreadRequests:       true,
			AlertMinInterval:          1500 * time.Millisecond,
			AlertOnRecovery:           true,
		},
		Endpoints: []config.Endpoint{
			{Subdomain: "pool", Tenant: "acme", Group: "web", AllowCIDRs: []string{"203.0.113.0/24"},
				DenyCIDRs: []string{"203.0.113.7/32"}, RateLimit: 2.5, RateBurst: 5, MaxConcurrent: 9},
			{Proto: "tcp", Group: "db", Port: 30000, Tenant: "globex",
				KeySHA256: "5fbf9bf10407864eb8562d42e245fd6435ebebff6cdea8cae46bec8da0b11e9a"},
		},
	}, cfg)
	require.True(t, cfg.TLS.Enabled())
	require.Equal(t, "[::1]:8443", cfg.Server.Addr(cfg.Server.HTTPSPort))
	require.True(t, cfg.Limits.TCPPortRange.Contains(30000))
	require.False(t, cfg.Limits.TCPPortRange.Contains(30001))
}

func TestServerAlternativeSyntax(t *testing.T) {
	// Dotted keys, inline tables and an inline array of tenants are the
	// same document to TOML and must read the same.
	doc := `server.domain = "localhost"
limits = { drain_timeout_secs = 2, tcp_port_range = [
  21000,
  21010,
] }
auth.tenants = [ { name = "a", token = "tenant-a-token-0123" }, { name = "b", token = "tenant-b-token-0123" } ]
`
	cfg, err := config.ParseServer("server.toml", []byte(doc))
	require.NoError(t, err)
	require.Equal(t, "localhost", cfg.Server.Domain)
	require.Equal(t, 2*time.Second, cfg.Limits.DrainTimeout)
	require.Equal(t, config.PortRange{Low: 21000, High: 21010}, cfg.Limits.TCPPortRange)
	require.Equal(t, []config.Tenant{{Name: "a", Token: "tenant-a-token-0123"}, {Name: "b", Token: "tenant-b-token-0123"}}, cfg.Auth.Tenants)

	_, err = config.ParseServer("server.toml", []byte(doc+"auth.tenants = 1\n"))
	requireProblems(t, err, "server.toml", want{7, "auth.tenants", config.ErrSyntax, "already"})
}

func TestServerDurations(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{
		{"5", 5 * time.Second},
		{"0.05", 50 * time.Millisecond},
		{"1.5", 1500 * time.Millisecond},
		{"1e-9", time.Nanosecond},
		{"86400", 24 * time.Hour},
	} {
		t.Run(tc.value, func(t *testing.T) {
			cfg, err := config.ParseServer("s.toml", []byte("[server]\ndomain = \"localhost\"\n[limits]\ndrain_timeout_secs = "+tc.value+"\n"))
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Limits.DrainTimeout)
		})
	}
}

// serverDoc prefixes a valid [server] table (lines 1-2) to rest, which
// therefore starts on line 3.
func serverDoc(rest string) string {
	return "[server]\ndomain = \"localhost\"\n" + rest
}

func TestServerErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		// [server]
		{"domain missing", "[server]\nbind = \"127.0.0.1\"\n",
			[]want{{1, "server.domain", config.ErrRequired, "required"}}},
		{"server table missing", "[limits]\nmax_tunnels_per_session = 2\n",
			[]want{{1, "server.domain", config.ErrRequired, "required"}}},
		{"domain empty", "[server]\ndomain = \"\"\n",
			[]want{{2, "server.domain", config.ErrRequired, "must not be empty"}}},
		{"domain uppercase", "[server]\ndomain = \"Tunnel.example.com\"\n",
			[]want{{2, "server.domain", config.ErrInvalid, "must be lowercase"}}},
		{"domain empty label", "[server]\ndomain = \"a..b\"\n",
			[]want{{2, "server.domain", config.ErrInvalid, "empty label"}}},
		{"domain trailing dot", "[server]\ndomain = \"example.com.\"\n",
			[]want{{2, "server.domain", config.ErrInvalid, "empty label"}}},
		{"domain bad character", "[server]\ndomain = \"a_b.example.com\"\n",
			[]want{{2, "server.domain", config.ErrInvalid, "may only hold"}}},
		{"domain leading hyphen", "[server]\ndomain = \"-a.example.com\"\n",
			[]want{{2, "server.domain", config.ErrInvalid, "must not start or end"}}},
		{"domain IP", "[server]\ndomain = \"127.0.0.1\"\n",
			[]want{{2, "server.domain", config.ErrInvalid, "IP address"}}},
		{"bind not an IP", serverDoc("bind = \"localhost\"\n"),
			[]want{{3, "server.bind", config.ErrInvalid, `"localhost" is not an IP address`}}},
		{"http port too big", serverDoc("http_port = 70000\n"),
			[]want{{3, "server.http_port", config.ErrInvalid, "70000 is out of range 0-65535"}}},
		{"https port negative", serverDoc("https_port = -1\n"),
			[]want{{3, "server.https_port", config.ErrInvalid, "-1 is out of range 0-65535"}}},
		{"admin port too big", serverDoc("admin_port = 65536\n"),
			[]want{{3, "server.admin_port", config.ErrInvalid, "out of range"}}},
		{"control port zero", serverDoc("control_port = 0\n"),
			[]want{{3, "server.control_port", config.ErrInvalid, "0 is out of range 1-65535"}}},
		{"ports not distinct", serverDoc("http_port = 9000\nadmin_port = 9000\n"),
			[]want{{4, "server.admin_port", config.ErrInvalid, "port 9000 is already used by server.http_port (line 3)"}}},
		{"port clashes with a default", serverDoc("admin_port = 4040\n"),
			[]want{{3, "server.admin_port", config.ErrInvalid, "already used by server.control_port"}}},
		{"port inside tcp range", serverDoc("http_port = 20050\n"),
			[]want{{3, "server.http_port", config.ErrInvalid, "inside limits.tcp_port_range 20000-20100"}}},
		{"https without tls", serverDoc("https_port = 8443\n"),
			[]want{{3, "server.https_port", config.ErrInvalid, "needs a [tls] table"}}},
		{"region empty", serverDoc("region_id = \"\"\n"),
			[]want{{3, "server.region_id", config.ErrInvalid, "must not be empty"}}},
		{"data read buffer negative", serverDoc("data_read_buffer = -4096\n"),
			[]want{{3, "server.data_read_buffer", config.ErrInvalid, "must be 0 (the kernel's autotuning) to 268435456 bytes, got -4096"}}},

		// [auth]
		{"require_auth without tokens", serverDoc("[auth]\nrequire_auth = true\n"),
			[]want{{4, "auth.require_auth", config.ErrInvalid, "neither auth.tokens nor auth.tenants"}}},
		{"require_auth with empty token list", serverDoc("[auth]\nrequire_auth = true\ntokens = []\n"),
			[]want{{4, "auth.require_auth", config.ErrInvalid, "no connector could authenticate"}}},
		{"empty token", serverDoc("[auth]\ntokens = [\n  \"connector-token-a\",\n  \"\",\n]\n"),
			[]want{{6, "auth.tokens[1]", config.ErrInvalid, "must not be empty"}}},
		{"token twice in tokens", serverDoc("[auth]\ntokens = [\"connector-token-a\", \"connector-token-b\",\n  \"connector-token-a\"]\n"),
			[]want{{5, "auth.tokens[2]", config.ErrInvalid, "already used by auth.tokens[0] (line 4)"}}},
		{"tenant token equals token", serverDoc("[auth]\ntokens = [\"s3cret-token-0123\"]\n[[auth.tenants]]\nname = \"acme\"\ntoken = \"s3cret-token-0123\"\n"),
			[]want{{7, "auth.tenants[0].token", config.ErrInvalid, "already used by auth.tokens[0]"}}},
		{"admin token equals tenant token", serverDoc("[auth]\nadmin_token = \"s3cret-token-0123\"\n[[auth.tenants]]\nname = \"acme\"\ntoken = \"s3cret-token-0123\"\n"),
			[]want{{4, "auth.admin_token", config.ErrInvalid, "already used by auth.tenants[0].token (line 7)"}}},
		{"tenant name missing", serverDoc("[[auth.tenants]]\ntoken = \"tenant-token-0123\"\n"),
			[]want{{3, "auth.tenants[0].name", config.ErrRequired, "non-empty name"}}},
		{"tenant name empty", serverDoc("[[auth.tenants]]\nname = \"\"\ntoken = \"tenant-token-0123\"\n"),
			[]want{{4, "auth.tenants[0].name", config.ErrRequired, "non-empty name"}}},
		{"tenant token missing", serverDoc("[[auth.tenants]]\nname = \"acme\"\n"),
			[]want{{3, "auth.tenants[0].token", config.ErrRequired, "non-empty token"}}},
		{"tenant names not unique", serverDoc("[[auth.tenants]]\nname = \"acme\"\ntoken = \"tenant-token-a-0123\"\n[[auth.tenants]]\nname = \"acme\"\ntoken = \"tenant-token-b-0123\"\n"),
			[]want{{7, "auth.tenants[1].name", config.ErrInvalid, `tenant "acme" is already defined by auth.tenants[0] (line 3)`}}},
		{"secrets stay out of messages", serverDoc("[auth]\ntokens = [\"hunter2-hunter2-hunter2\", \"hunter2-hunter2-hunter2\"]\n"),
			[]want{{4, "auth.tokens[1]", config.ErrInvalid, "every token must be distinct"}}},
		{"short connector token", serverDoc("[auth]\nrequire_auth = true\ntokens = [\n  \"connector-token-a\",\n  \"hunter2\",\n]\n"),
			[]want{{7, "auth.tokens[1]", config.ErrInvalid, "is 7 characters long; a token needs at least 16"}}},
		{"short admin token", serverDoc("[auth]\nadmin_token = \"hunter2\"\n"),
			[]want{{4, "auth.admin_token", config.ErrInvalid, "is 7 characters long; a token needs at least 16"}}},
		{"short tenant token", serverDoc("[[auth.tenants]]\nname = \"acme\"\ntoken = \"hunter2\"\n[[auth.tenants]]\nname = \"globex\"\ntoken = \"0123456789abcdef\"\n"),
			[]want{{5, "auth.tenants[0].token", config.ErrInvalid, "is 7 characters long; a token needs at least 16 (e.g. the output of `openssl rand -hex 16`)"}}},
		{"short tokens, two of them the same", serverDoc("[auth]\ntokens = [\"hunter2\", \"hunter2\"]\n"),
			[]want{{4, "auth.tokens[0]", config.ErrInvalid, "at least 16"}, {4, "auth.tokens[1]", config.ErrInvalid, "at least 16"}}},

		// [limits]
		{"tcp range reversed", serverDoc("[limits]\ntcp_port_range = [30000, 20000]\n"),
			[]want{{4, "limits.tcp_port_range", config.ErrInvalid, "low port 30000 is above high port 20000"}}},
		{"tcp range low zero", serverDoc("[limits]\ntcp_port_range = [0, 10]\n"),
			[]want{{4, "limits.tcp_port_range", config.ErrInvalid, "low port 0 is out of range 1-65535"}}},
		{"tcp range high too big", serverDoc("[limits]\ntcp_port_range = [10, 65536]\n"),
			[]want{{4, "limits.tcp_port_range", config.ErrInvalid, "high port 65536 is out of range 1-65535"}}},
		{"tcp range one value", serverDoc("[limits]\ntcp_port_range = [10]\n"),
			[]want{{4, "limits.tcp_port_range", config.ErrInvalid, "must be two ports [low, high], got 1 values"}}},
		{"tcp range string element", serverDoc("[limits]\ntcp_port_range = [\"a\", 10]\n"),
			[]want{{4, "limits.tcp_port_range[0]", config.ErrType, "expected an integer, got a string"}}},
		{"max tunnels zero", serverDoc("[limits]\nmax_tunnels_per_session = 0\n"),
			[]want{{4, "limits.max_tunnels_per_session", config.ErrInvalid, "must be at least 1, got 0"}}},
		{"body limit negative", serverDoc("[limits]\nrequest_body_max_bytes = -1\n"),
			[]want{{4, "limits.request_body_max_bytes", config.ErrInvalid, "must be 0 (unlimited) or more, got -1"}}},
		{"drain zero", serverDoc("[limits]\ndrain_timeout_secs = 0\n"),
			[]want{{4, "limits.drain_timeout_secs", config.ErrInvalid, "must be greater than 0 seconds, got 0"}}},
		{"drain negative fraction", serverDoc("[limits]\ndrain_timeout_secs = -0.5\n"),
			[]want{{4, "limits.drain_timeout_secs", config.ErrInvalid, "got -0.5"}}},
		{"drain not a number", serverDoc("[limits]\ndrain_timeout_secs = nan\n"),
			[]want{{4, "limits.drain_timeout_secs", config.ErrInvalid, "finite"}}},
		{"drain infinite", serverDoc("[limits]\ndrain_timeout_secs = inf\n"),
			[]want{{4, "limits.drain_timeout_secs", config.ErrInvalid, "finite"}}},
		{"drain too long", serverDoc("[limits]\ndrain_timeout_secs = 1e300\n"),
			[]want{{4, "limits.drain_timeout_secs", config.ErrInvalid, "too long"}}},
		{"drain below resolution", serverDoc("[limits]\ndrain_timeout_secs = 1e-12\n"),
			[]want{{4, "limits.drain_timeout_secs", config.ErrInvalid, "1ns resolution"}}},
		{"concurrency negative", serverDoc("[limits]\nmax_concurrent_per_member = -3\n"),
			[]want{{4, "limits.max_concurrent_per_member", config.ErrInvalid, "got -3"}}},
		{"admin host an address", serverDoc("admin_hosts = [\"admin.internal\", \"10.0.0.1\", \"no such name!\"]\n"),
			[]want{{3, "server.admin_hosts[1]", config.ErrInvalid, "is an IP address"},
				{3, "server.admin_hosts[2]", config.ErrInvalid, "neither an IP address nor a host name"}}},
		{"locality negative", serverDoc("[load_balancing]\nprefer_local_streams = -1\n"),
			[]want{{4, "load_balancing.prefer_local_streams", config.ErrInvalid, "must be 0 (off) or more, got -1"}}},
		{"preauth cap zero", serverDoc("[limits]\nmax_preauth_conns = 0\n"),
			[]want{{4, "limits.max_preauth_conns", config.ErrInvalid, "must be at least 1, got 0"}}},
		{"preauth per-ip cap zero", serverDoc("[limits]\nmax_preauth_conns_per_ip = 0\n"),
			[]want{{4, "limits.max_preauth_conns_per_ip", config.ErrInvalid, "must be at least 1, got 0"}}},
		{"preauth per-ip cap above the total", serverDoc("[limits]\nmax_preauth_conns = 8\nmax_preauth_conns_per_ip = 9\n"),
			[]want{{5, "limits.max_preauth_conns_per_ip", config.ErrInvalid, "9 is above limits.max_preauth_conns 8 (line 4)"}}},
		{"preauth per-ip cap above the default total", serverDoc("[limits]\nmax_preauth_conns_per_ip = 300\n"),
			[]want{{4, "limits.max_preauth_conns_per_ip", config.ErrInvalid, "300 is above limits.max_preauth_conns 256"}}},
		{"hello timeout zero", serverDoc("[limits]\nhello_timeout_secs = 0\n"),
			[]want{{4, "limits.hello_timeout_secs", config.ErrInvalid, "must be greater than 0 and at most 30 seconds, got 0"}}},
		{"hello timeout too long", serverDoc("[limits]\nhello_timeout_secs = 31\n"),
			[]want{{4, "limits.hello_timeout_secs", config.ErrInvalid, "at most 30 seconds, got 31"}}},
		{"auth failures zero", serverDoc("[limits]\nmax_auth_failures_per_ip = 0\n"),
			[]want{{4, "limits.max_auth_failures_per_ip", config.ErrInvalid, "must be at least 1, got 0"}}},
		{"auth window negative", serverDoc("[limits]\nauth_failure_window_secs = -1\n"),
			[]want{{4, "limits.auth_failure_window_secs", config.ErrInvalid, "must be greater than 0 seconds, got -1"}}},
		{"auth block zero", serverDoc("[limits]\nauth_block_secs = 0\n"),
			[]want{{4, "limits.auth_block_secs", config.ErrInvalid, "must be greater than 0 seconds, got 0"}}},
		{"body timeout negative", serverDoc("[limits]\nrequest_body_timeout_secs = -1\n"),
			[]want{{4, "limits.request_body_timeout_secs", config.ErrInvalid, "must be 0 (no limit) or more seconds, got -1"}}},
		{"body timeout not a number", serverDoc("[limits]\nrequest_body_timeout_secs = nan\n"),
			[]want{{4, "limits.request_body_timeout_secs", config.ErrInvalid, "finite"}}},
		{"body min rate negative", serverDoc("[limits]\nrequest_body_min_rate = -5\n"),
			[]want{{4, "limits.request_body_min_rate", config.ErrInvalid, "must be 0 (no minimum) or more bytes per second, got -5"}}},
		{"body min rate grace zero", serverDoc("[limits]\nrequest_body_min_rate_grace_secs = 0\n"),
			[]want{{4, "limits.request_body_min_rate_grace_secs", config.ErrInvalid, "must be greater than 0 seconds, got 0"}}},
		{"response stall timeout negative", serverDoc("[limits]\nresponse_stall_timeout_secs = -1\n"),
			[]want{{4, "limits.response_stall_timeout_secs", config.ErrInvalid, "must be 0 (no limit) or more seconds, got -1"}}},
		{"response stall timeout infinite", serverDoc("[limits]\nresponse_stall_timeout_secs = inf\n"),
			[]want{{4, "limits.response_stall_timeout_secs", config.ErrInvalid, "finite"}}},
		{"stalled bytes negative", serverDoc("[limits]\nmax_stalled_response_bytes = -1\nmax_stalled_response_bytes_per_ip = -2\nmax_stalled_response_bytes_per_conn = -3\n"),
			[]want{
				{4, "limits.max_stalled_response_bytes", config.ErrInvalid, "must be 0 (no bound) or more bytes, got -1"},
				{5, "limits.max_stalled_response_bytes_per_ip", config.ErrInvalid, "must be 0 (no bound) or more bytes, got -2"},
				{6, "limits.max_stalled_response_bytes_per_conn", config.ErrInvalid, "must be 0 (no bound) or more bytes, got -3"},
			}},
		{"stalled bytes per ip above the total", serverDoc("[limits]\nmax_stalled_response_bytes = 30000000\nmax_stalled_response_bytes_per_ip = 40000000\n"),
			[]want{{5, "limits.max_stalled_response_bytes_per_ip", config.ErrInvalid, "40000000 is above limits.max_stalled_response_bytes 30000000 (line 4)"}}},
		{"stalled bytes per conn above the default per ip", serverDoc("[limits]\nmax_stalled_response_bytes_per_conn = 100000000\n"),
			[]want{{4, "limits.max_stalled_response_bytes_per_conn", config.ErrInvalid, "100000000 is above limits.max_stalled_response_bytes_per_ip 33554432"}}},
		{"stalled bytes per conn above the total, no per ip", serverDoc("[limits]\nmax_stalled_response_bytes_per_ip = 0\nmax_stalled_response_bytes_per_conn = 300000000\n"),
			[]want{{5, "limits.max_stalled_response_bytes_per_conn", config.ErrInvalid, "300000000 is above limits.max_stalled_response_bytes 268435456"}}},

		// [load_balancing]
		{"unknown strategy", serverDoc("[load_balancing]\nstrategy = \"round_robin\"\n"),
			[]want{{4, "load_balancing.strategy", config.ErrInvalid, `"round_robin" is not a strategy; use "least_streams" or "random"`}}},
		{"webhook not http", serverDoc("[load_balancing]\nalert_webhook_url = \"ftp://hooks.example.com/x\"\n"),
			[]want{{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "absolute http:// or https:// URL"}}},
		{"webhook relative", serverDoc("[load_balancing]\nalert_webhook_url = \"hooks.example.com/x\"\n"),
			[]want{{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "absolute http:// or https:// URL"}}},
		{"webhook without host", serverDoc("[load_balancing]\nalert_webhook_url = \"https:///x\"\n"),
			[]want{{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "invalid URL: missing host"}}},
		{"webhook bad port", serverDoc("[load_balancing]\nalert_webhook_url = \"https://h:99999/\"\n"),
			[]want{{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "invalid port"}}},
		{"webhook unparsable", serverDoc("[load_balancing]\nalert_webhook_url = \"http://[::1\"\n"),
			[]want{{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "invalid URL: cannot be parsed"}}},
		{"webhook too long", serverDoc("[load_balancing]\nalert_webhook_url = \"" + longURL(webhook.MaxURLLength+1) + "\"\n"),
			[]want{{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "longer than 2048 bytes"}}},
		{"alert interval negative", serverDoc("[load_balancing]\nalert_min_interval_secs = -60\n"),
			[]want{{4, "load_balancing.alert_min_interval_secs", config.ErrInvalid, "must be 0 (off) or more seconds, got -60"}}},
		{"alert interval infinite", serverDoc("[load_balancing]\nalert_min_interval_secs = inf\n"),
			[]want{{4, "load_balancing.alert_min_interval_secs", config.ErrInvalid, "finite"}}},

		// Several problems are all reported, in line order.
		{"all problems collected", "[limits]\nmax_tunnels_per_session = 0\n[server]\ndomain = \"X\"\nhttp_port = 1.5\n",
			[]want{
				{2, "limits.max_tunnels_per_session", config.ErrInvalid, "at least 1"},
				{4, "server.domain", config.ErrInvalid, "lowercase"},
				{5, "server.http_port", config.ErrType, "expected an integer, got a floating-point number"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.ParseServer("server.toml", []byte(tc.doc))
			require.Nil(t, cfg)
			requireProblems(t, err, "server.toml", tc.wants...)
			if tc.name == "secrets stay out of messages" {
				require.NotContains(t, err.Error(), "hunter2")
			}
		})
	}
}

func TestServerErrorFormat(t *testing.T) {
	doc := "[server]\ndomain = \"localhost\"\n\n[load_balancing]\nenabled = true\n\n\n\n\n\n\n\n[limits]\ntcp_port_range = [30000, 20000]\n"
	_, err := config.ParseServer("server.toml", []byte(doc))
	require.EqualError(t, err, "server.toml:14: limits.tcp_port_range: low port 30000 is above high port 20000")

	_, err = config.ParseServer("server.toml", []byte("[server]\n\ndomian = \"x\"\ndomain = \"x\"\n"))
	require.EqualError(t, err, `server.toml:3: server.domian: unknown key; did you mean "domain"?`)
}

func TestServerUnknownKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want want
	}{
		{"root table", serverDoc("[serve]\nx = 1\n"), want{3, "serve", config.ErrUnknownKey, `did you mean "server"?`}},
		{"root key", "domain = \"localhost\"\n" + serverDoc(""), want{1, "domain", config.ErrUnknownKey, "expected one of: auth, cluster, endpoints, limits, load_balancing, server, tls"}},
		{"server", serverDoc("http-port = 1\n"), want{3, "server.http-port", config.ErrUnknownKey, `did you mean "http_port"?`}},
		{"server camelCase", serverDoc("controlPort = 1\n"), want{3, "server.controlPort", config.ErrUnknownKey, `did you mean "control_port"?`}},
		{"tls", serverDoc("[tls]\ncert = \"x\"\n"), want{4, "tls.cert", config.ErrUnknownKey, "unknown key"}},
		{"auth", serverDoc("[auth]\ntoken = \"x\"\n"), want{4, "auth.token", config.ErrUnknownKey, `did you mean "tokens"?`}},
		{"tenant", serverDoc("[[auth.tenants]]\nname = \"a\"\ntoken = \"tenant-token-a-0123\"\nrole = \"admin\"\n"), want{6, "auth.tenants[0].role", config.ErrUnknownKey, "expected one of: max_event_streams, max_routes, max_sessions, max_tcp_ports, max_tunnels, name, token"}},
		{"second tenant", serverDoc("[[auth.tenants]]\nname = \"a\"\ntoken = \"tenant-token-a-0123\"\n[[auth.tenants]]\nname = \"b\"\ntoken = \"tenant-token-b-0123\"\nrole = 1\n"), want{9, "auth.tenants[1].role", config.ErrUnknownKey, "unknown key"}},
		{"limits", serverDoc("[limits]\nmax_tunnel = 3\n"), want{4, "limits.max_tunnel", config.ErrUnknownKey, `did you mean "max_tunnels"?`}},
		{"endpoint", serverDoc("[[endpoints]]\nsubdomain = \"pool\"\ngroup = \"web\"\nrate = 3\n"), want{6, "endpoints[0].rate", config.ErrUnknownKey, "unknown key"}},
		{"load_balancing", serverDoc("[load_balancing]\nenable = true\n"), want{4, "load_balancing.enable", config.ErrUnknownKey, `did you mean "enabled"?`}},
		{"load_balancing alert key", serverDoc("[load_balancing]\nalert_on_recover = true\n"), want{4, "load_balancing.alert_on_recover", config.ErrUnknownKey, `did you mean "alert_on_recovery"?`}},
		{"dotted key", "limits.foo.bar = 1\n" + serverDoc(""), want{1, "limits.foo", config.ErrUnknownKey, "unknown key"}},
		{"inline table", "load_balancing = { enabled = true,\n  stratgy = \"random\" }\n" + serverDoc(""), want{2, "load_balancing.stratgy", config.ErrUnknownKey, `did you mean "strategy"?`}},
		{"quoted key", serverDoc("\"region.id\" = \"x\"\n"), want{3, `server."region.id"`, config.ErrUnknownKey, "unknown key"}},
		{"sub-table of a scalar section", serverDoc("[server.extra]\nx = 1\n"), want{3, "server.extra", config.ErrUnknownKey, "unknown key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseServer("server.toml", []byte(tc.doc))
			requireProblems(t, err, "server.toml", tc.want)
		})
	}
}

func TestServerWrongTypes(t *testing.T) {
	for _, tc := range []struct {
		table, key, value, msg string
	}{
		{"server", "domain", "1", "expected a string, got an integer"},
		{"server", "bind", "true", "expected a string, got a boolean"},
		{"server", "http_port", `"8080"`, "expected an integer, got a string"},
		{"server", "https_port", "443.0", "expected an integer, got a floating-point number"},
		{"server", "control_port", "[4040]", "expected an integer, got an array"},
		{"server", "admin_port", "{ port = 1 }", "expected an integer, got a table"},
		{"server", "region_id", "1979-05-27", "expected a string, got a date"},
		{"tls", "cert_path", "1", "expected a string, got an integer"},
		{"tls", "key_path", "false", "expected a string, got a boolean"},
		{"auth", "require_auth", `"yes"`, "expected a boolean (true or false), got a string"},
		{"auth", "tokens", `"abc"`, "expected an array of strings, got a string"},
		{"auth", "admin_token", "12", "expected a string, got an integer"},
		{"auth", "tenants", `"acme"`, "expected an array, got a string"},
		{"limits", "tcp_port_range", "20000", "expected an array, got an integer"},
		{"limits", "max_tunnels_per_session", `"16"`, "expected an integer, got a string"},
		{"limits", "request_body_max_bytes", "1.5", "expected an integer, got a floating-point number"},
		{"limits", "drain_timeout_secs", `"30"`, "expected a number of seconds, got a string"},
		{"limits", "drain_timeout_secs", "true", "expected a number of seconds, got a boolean"},
		{"limits", "max_concurrent_per_member", "[]", "expected an integer, got an array"},
		{"limits", "max_preauth_conns", `"256"`, "expected an integer, got a string"},
		{"limits", "max_preauth_conns_per_ip", "1.5", "expected an integer, got a floating-point number"},
		{"limits", "hello_timeout_secs", `"5"`, "expected a number of seconds, got a string"},
		{"limits", "max_auth_failures_per_ip", "true", "expected an integer, got a boolean"},
		{"limits", "auth_failure_window_secs", "[600]", "expected a number of seconds, got an array"},
		{"limits", "auth_block_secs", `"900"`, "expected a number of seconds, got a string"},
		{"limits", "response_stall_timeout_secs", `"60"`, "expected a number of seconds, got a string"},
		{"limits", "max_stalled_response_bytes", "1.5", "expected an integer, got a floating-point number"},
		{"limits", "max_stalled_response_bytes_per_conn", `"16MiB"`, "expected an integer, got a string"},
		{"limits", "max_stalled_response_bytes_per_ip", "true", "expected an integer, got a boolean"},
		{"load_balancing", "enabled", `"true"`, "expected a boolean (true or false), got a string"},
		{"load_balancing", "strategy", "1", "expected a string, got an integer"},
		{"load_balancing", "alert_webhook_url", "07:32:00", "expected a string, got a time"},
		{"load_balancing", "allow_private_alert_webhooks", "1", "expected a boolean (true or false), got an integer"},
		{"load_balancing", "alert_min_interval_secs", `"60"`, "expected a number of seconds, got a string"},
		{"load_balancing", "alert_on_recovery", `"yes"`, "expected a boolean (true or false), got a string"},
	} {
		t.Run(tc.table+"."+tc.key+"="+tc.value, func(t *testing.T) {
			doc := "[server]\n"
			if tc.key != "domain" {
				doc += "domain = \"localhost\"\n"
			}
			if tc.table != "server" {
				doc += "[" + tc.table + "]\n"
			}
			doc += tc.key + " = " + tc.value + "\n"
			line := strings.Count(doc, "\n")
			// Exactly one problem: a wrong type must not cause follow-up
			// complaints such as "required".
			_, err := config.ParseServer("server.toml", []byte(doc))
			requireProblems(t, err, "server.toml", want{line, tc.table + "." + tc.key, config.ErrType, tc.msg})
		})
	}

	t.Run("element types", func(t *testing.T) {
		_, err := config.ParseServer("server.toml", []byte(serverDoc("[auth]\ntokens = [\"a\", 1]\n")))
		requireProblems(t, err, "server.toml", want{4, "auth.tokens[1]", config.ErrType, "expected a string, got an integer"})
		_, err = config.ParseServer("server.toml", []byte(serverDoc("[auth]\ntenants = [1]\n")))
		requireProblems(t, err, "server.toml", want{4, "auth.tenants[0]", config.ErrType, "expected a table, got an integer"})
		_, err = config.ParseServer("server.toml", []byte(serverDoc("[[auth.tenants]]\nname = 1\ntoken = \"tenant-token-a-0123\"\n")))
		requireProblems(t, err, "server.toml", want{4, "auth.tenants[0].name", config.ErrType, "expected a string, got an integer"})
	})
	t.Run("sections", func(t *testing.T) {
		_, err := config.ParseServer("server.toml", []byte("server = \"localhost\"\n"))
		requireProblems(t, err, "server.toml", want{1, "server", config.ErrType, "expected a table, got a string"})
		_, err = config.ParseServer("server.toml", []byte(serverDoc("limits = 5\n")))
		requireProblems(t, err, "server.toml", want{3, "server.limits", config.ErrUnknownKey, "unknown key"})
		_, err = config.ParseServer("server.toml", []byte("limits = 5\n"+serverDoc("")))
		requireProblems(t, err, "server.toml", want{1, "limits", config.ErrType, "expected a table, got an integer"})
	})
}

func TestServerSyntaxErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want want
	}{
		{"unclosed header", "[server\ndomain = \"x\"\n", want{1, "", config.ErrSyntax, "invalid TOML"}},
		{"missing value", serverDoc("http_port =\n"), want{3, "", config.ErrSyntax, "invalid TOML"}},
		{"unterminated string", serverDoc("region_id = \"eu\n"), want{3, "", config.ErrSyntax, "invalid TOML"}},
		{"duplicate key", serverDoc("\ndomain = \"y\"\n"), want{4, "server.domain", config.ErrSyntax, "already defined"}},
		{"duplicate table", serverDoc("[limits]\n[server]\n"), want{4, "server", config.ErrSyntax, "already"}},
		{"integer overflow", serverDoc("http_port = 99999999999999999999\n"), want{3, "server.http_port", config.ErrSyntax, "64-bit"}},
		{"invalid UTF-8", serverDoc("region_id = \"\xff\"\n"), want{3, "", config.ErrSyntax, "invalid TOML"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseServer("server.toml", []byte(tc.doc))
			var list config.ErrorList
			require.ErrorAs(t, err, &list)
			require.Len(t, list, 1, "%v", err)
			e := list[0]
			require.Equal(t, "server.toml", e.File)
			require.Equal(t, tc.want.line, e.Line, "%v", e)
			if tc.want.key != "" {
				require.Equal(t, tc.want.key, e.Key, "%v", e)
			}
			require.ErrorIs(t, e, tc.want.err)
			require.Contains(t, e.Msg, tc.want.msg)
		})
	}
}

func TestServerEmptyFile(t *testing.T) {
	for _, doc := range []string{"", "\n\n", "# only a comment\n"} {
		_, err := config.ParseServer("server.toml", []byte(doc))
		requireProblems(t, err, "server.toml", want{1, "server.domain", config.ErrRequired, "required"})
	}
}

func TestServerTLSFiles(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeFile(t, dir, "edge.crt"), writeFile(t, dir, "edge.key")
	missing := filepath.Join(dir, "missing.pem")
	tlsDoc := func(lines string) string { return serverDoc("[tls]\n" + lines) }

	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		{"cert without key", tlsDoc("cert_path = '" + cert + "'\n"),
			[]want{{3, "tls.key_path", config.ErrRequired, "required when tls.cert_path is set"}}},
		{"key without cert", tlsDoc("key_path = '" + key + "'\n"),
			[]want{{3, "tls.cert_path", config.ErrRequired, "required when tls.key_path is set"}}},
		{"cert missing on disk", tlsDoc("cert_path = '" + missing + "'\nkey_path = '" + key + "'\n"),
			[]want{{4, "tls.cert_path", config.ErrInvalid, "no such file or directory"}}},
		{"key is a directory", tlsDoc("cert_path = '" + cert + "'\nkey_path = '" + dir + "'\n"),
			[]want{{5, "tls.key_path", config.ErrInvalid, "is a directory"}}},
		{"https with half a tls table", serverDoc("https_port = 8443\n[tls]\ncert_path = '" + cert + "'\n"),
			[]want{
				{3, "server.https_port", config.ErrInvalid, "needs a [tls] table"},
				{4, "tls.key_path", config.ErrRequired, "required"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseServer("server.toml", []byte(tc.doc))
			requireProblems(t, err, "server.toml", tc.wants...)
		})
	}

	t.Run("both empty means off", func(t *testing.T) {
		cfg, err := config.ParseServer("server.toml", []byte(tlsDoc("cert_path = \"\"\nkey_path = \"\"\n")))
		require.NoError(t, err)
		require.False(t, cfg.TLS.Enabled())
	})

	t.Run("relative paths follow the file", func(t *testing.T) {
		require.NoError(t, os.Mkdir(filepath.Join(dir, "certs"), 0o755))
		writeFile(t, filepath.Join(dir, "certs"), "a.crt")
		writeFile(t, filepath.Join(dir, "certs"), "a.key")
		path := filepath.Join(dir, "server.toml")
		require.NoError(t, os.WriteFile(path, []byte(serverDoc("https_port = 8443\n[tls]\ncert_path = \"certs/a.crt\"\nkey_path = \"certs/a.key\"\n")), 0o600))
		cfg, err := config.LoadServer(path)
		require.NoError(t, err)
		require.Equal(t, filepath.Join(dir, "certs", "a.crt"), cfg.TLS.CertPath)
		require.Equal(t, filepath.Join(dir, "certs", "a.key"), cfg.TLS.KeyPath)

		// ParseServer has no file location: the same text resolves against
		// the working directory, where these files do not exist.
		_, err = config.ParseServer("server.toml", []byte(serverDoc("[tls]\ncert_path = \"certs/a.crt\"\nkey_path = \"certs/a.key\"\n")))
		requireProblems(t, err, "server.toml",
			want{4, "tls.cert_path", config.ErrInvalid, `cannot use "certs/a.crt"`},
			want{5, "tls.key_path", config.ErrInvalid, `cannot use "certs/a.key"`})
	})
}

func TestLoadServerFileErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.toml")
	_, err := config.LoadServer(missing)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.Contains(t, err.Error(), missing)
	var e *config.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, missing, e.File)

	_, err = config.LoadServer(dir)
	require.Error(t, err)
	require.Contains(t, err.Error(), dir+": cannot read the configuration file")

	big := filepath.Join(dir, "big.toml")
	require.NoError(t, os.WriteFile(big, []byte(strings.Repeat("# padding\n", 30_000)), 0o600))
	_, err = config.LoadServer(big)
	require.ErrorIs(t, err, config.ErrInvalid)
	require.Contains(t, err.Error(), "larger than")

	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[server]\ndomain = 1\n"), 0o600))
	_, err = config.LoadServer(bad)
	require.EqualError(t, err, bad+":2: server.domain: expected a string, got an integer")
}

func TestServerValidate(t *testing.T) {
	cfg, err := config.LoadServer(serverSample)
	require.NoError(t, err)

	cfg.Limits.TCPPortRange = config.PortRange{Low: 500, High: 400}
	cfg.LoadBalancing.Strategy = "fastest"
	cfg.Auth.Tenants = append(cfg.Auth.Tenants, config.Tenant{Name: "x", Token: cfg.Auth.Tokens[0]})
	err = cfg.Validate()
	requireProblems(t, err, serverSample,
		want{0, "auth.tenants[0].token", config.ErrInvalid, "already used by auth.tokens[0]"},
		want{0, "limits.tcp_port_range", config.ErrInvalid, "low port 500 is above high port 400"},
		want{0, "load_balancing.strategy", config.ErrInvalid, `"fastest" is not a strategy`},
	)
	require.Contains(t, err.Error(), serverSample+": limits.tcp_port_range: low port 500")

	var zero config.Server
	err = zero.Validate()
	require.ErrorIs(t, err, config.ErrRequired)
	require.ErrorIs(t, err, config.ErrInvalid)

	var nilCfg *config.Server
	require.ErrorIs(t, nilCfg.Validate(), config.ErrRequired)
}

func TestErrorFormatting(t *testing.T) {
	for _, tc := range []struct {
		err  config.Error
		want string
	}{
		{config.Error{File: "a.toml", Line: 3, Key: "server.x", Msg: "m"}, "a.toml:3: server.x: m"},
		{config.Error{File: "a.toml", Line: 3, Msg: "m"}, "a.toml:3: m"},
		{config.Error{File: "a.toml", Key: "k", Msg: "m"}, "a.toml: k: m"},
		{config.Error{Key: "k", Msg: "m"}, "k: m"},
	} {
		require.Equal(t, tc.want, tc.err.Error())
	}
	list := config.ErrorList{
		{File: "f", Line: 1, Key: "a", Msg: "x", Err: config.ErrInvalid},
		{File: "f", Line: 2, Key: "b", Msg: "y", Err: config.ErrType},
	}
	require.Equal(t, "f:1: a: x\nf:2: b: y", list.Error())
	require.ErrorIs(t, list, config.ErrType)
	require.False(t, errors.Is(list, config.ErrSyntax))
}

// writeFile creates an empty file named name in dir and returns its path.
func writeFile(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte("-----BEGIN PLACEHOLDER-----\n"), 0o600))
	return p
}

func TestServerCRLF(t *testing.T) {
	sample, err := os.ReadFile(serverSample)
	require.NoError(t, err)
	crlf := strings.ReplaceAll(string(sample), "\n", "\r\n")
	_, err = config.ParseServer("server.toml", []byte(crlf))
	require.NoError(t, err)

	_, err = config.ParseServer("server.toml", []byte("[server]\r\ndomain = \"localhost\"\r\n\r\nhttp_port = -5\r\n"))
	requireProblems(t, err, "server.toml", want{4, "server.http_port", config.ErrInvalid, "-5 is out of range"})
}

// longURL returns an https URL of exactly n bytes.
func longURL(n int) string {
	const prefix = "https://hooks.example.com/"
	return prefix + strings.Repeat("a", n-len(prefix))
}

func TestWebhookURLLengthLimit(t *testing.T) {
	// The limit is the webhook package's: a URL the edge would refuse at
	// registration is refused by the file already.
	require.Equal(t, 2048, webhook.MaxURLLength)
	for _, n := range []int{webhook.MaxURLLength, webhook.MaxURLLength + 1} {
		u := longURL(n)
		_, srvErr := config.ParseServer("server.toml", []byte(serverDoc("[load_balancing]\nalert_webhook_url = '"+u+"'\n")))
		_, cliErr := config.ParseConnector("config.yml", []byte(healthDoc("type: tcp", "alert_webhook: "+u)))
		if n <= webhook.MaxURLLength {
			require.NoError(t, srvErr)
			require.NoError(t, cliErr)
			continue
		}
		requireProblems(t, srvErr, "server.toml", want{4, "load_balancing.alert_webhook_url", config.ErrInvalid, "longer than 2048 bytes"})
		requireProblems(t, cliErr, "config.yml", want{8, "tunnels.a.health_check.alert_webhook", config.ErrInvalid, "longer than 2048 bytes"})
		require.NotContains(t, srvErr.Error()+cliErr.Error(), u, "the URL may hold a secret")
	}
}

func TestServerEndpointAndQuotaErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		{"bad subdomain", serverDoc("[[endpoints]]\nsubdomain = \"Pool\"\ngroup = \"web\"\n"),
			[]want{{4, "endpoints[0].subdomain", config.ErrInvalid, "must be lowercase"}}},
		{"unknown tenant", serverDoc("[[endpoints]]\nsubdomain = \"pool\"\ngroup = \"web\"\ntenant = \"nobody\"\n"),
			[]want{{6, "endpoints[0].tenant", config.ErrInvalid, `"nobody" is not a tenant`}}},
		{"no group", serverDoc("[[endpoints]]\nsubdomain = \"pool\"\n"),
			[]want{{3, "endpoints[0].group", config.ErrRequired, "required"}}},
		{"bad cidr", serverDoc("[[endpoints]]\nsubdomain = \"pool\"\ngroup = \"web\"\nallow_cidrs = [\"10.0.0.0/8\", \"10.0.0.300/8\"]\n"),
			[]want{{6, "endpoints[0].allow_cidrs[1]", config.ErrInvalid, "not a CIDR prefix"}}},
		{"tcp port outside the range", serverDoc("[[endpoints]]\nproto = \"tcp\"\ngroup = \"db\"\nport = 80\nkey_sha256 = \"" + strings.Repeat("ab", 32) + "\"\n"),
			[]want{{6, "endpoints[0].port", config.ErrInvalid, "outside the TCP port range 20000-20100"}}},
		{"tcp without key", serverDoc("[[endpoints]]\nproto = \"tcp\"\ngroup = \"db\"\nport = 20001\n"),
			[]want{{3, "endpoints[0].key_sha256", config.ErrRequired, "required for a TCP endpoint"}}},
		{"key not hex", serverDoc("[[endpoints]]\nsubdomain = \"pool\"\ngroup = \"web\"\nkey_sha256 = \"the-key\"\n"),
			[]want{{6, "endpoints[0].key_sha256", config.ErrInvalid, "64 hex digits"}}},
		{"route reserved twice", serverDoc("[[endpoints]]\nsubdomain = \"pool\"\ngroup = \"web\"\n[[endpoints]]\nsubdomain = \"pool\"\ngroup = \"web\"\n"),
			[]want{{6, "endpoints[1]", config.ErrInvalid, "reserves the route http/pool, as endpoints[0] (line 3) does"}}},
		{"tcp port reserved twice", serverDoc("[[endpoints]]\nproto = \"tcp\"\ngroup = \"db\"\nport = 20005\nkey_sha256 = \"" + strings.Repeat("ab", 32) + "\"\n" +
			"[[endpoints]]\nproto = \"tcp\"\ngroup = \"cache\"\nport = 20005\nkey_sha256 = \"" + strings.Repeat("cd", 32) + "\"\n"),
			[]want{{11, "endpoints[1].port", config.ErrInvalid, "port 20005 is reserved by endpoints[0] (line 3) too, for tcp/db"}}},
		{"negative quota", serverDoc("[limits]\nmax_tunnels = -1\n"),
			[]want{{4, "limits.max_tunnels", config.ErrInvalid, "must be 0 (no cap) or more"}}},
		{"zero route ttl", serverDoc("[limits]\nroute_ttl_secs = 0\n"),
			[]want{{4, "limits.route_ttl_secs", config.ErrInvalid, "greater than 0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseServer("server.toml", []byte(tc.doc))
			requireProblems(t, err, "server.toml", tc.wants...)
		})
	}
}
