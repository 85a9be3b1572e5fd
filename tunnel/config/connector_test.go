package config_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/config"
)

const clientSample = "../../examples/connector/config.example.yml"

// tunnelDoc returns a client file whose only tunnel "a" holds lines; the
// first of them is on line 4.
func tunnelDoc(lines ...string) string {
	doc := "server: localhost:4040\ntunnels:\n  a:\n"
	for _, l := range lines {
		doc += "    " + l + "\n"
	}
	return doc
}

// healthDoc returns a client file whose tcp tunnel "a" has a health_check
// (on line 6) holding lines; the first of them is on line 7.
func healthDoc(lines ...string) string {
	doc := tunnelDoc("proto: tcp", "local_port: 3000", "health_check:")
	for _, l := range lines {
		doc += "      " + l + "\n"
	}
	return doc
}

func TestClientSampleParses(t *testing.T) {
	cfg, err := config.LoadConnector(clientSample)
	require.NoError(t, err)
	require.Equal(t, clientSample, cfg.File)
	require.Equal(t, "localhost:4040", cfg.Server)
	require.Len(t, cfg.Tunnels, 2)
	for i, tun := range cfg.Tunnels {
		require.Equal(t, []string{"a", "b"}[i], tun.Name)
		require.Equal(t, group.ProtoHTTP, tun.Proto)
		require.Equal(t, "pool", tun.Subdomain)
		require.Equal(t, "web", tun.Group)
		require.NotNil(t, tun.HealthCheck)
		require.Equal(t, config.HealthTCP, tun.HealthCheck.Type)
	}
	require.Equal(t, "127.0.0.1:3000", cfg.Tunnels[0].LocalAddr())
	require.NoError(t, cfg.Validate())

	// The sample's token is one the sample edge accepts.
	srv, err := config.LoadServer(serverSample)
	require.NoError(t, err)
	require.Contains(t, srv.Auth.Tokens, cfg.AuthToken)
	require.Equal(t, fmt.Sprintf("%s:%d", srv.Server.Domain, srv.Server.ControlPort), cfg.Server)
}

func TestClientDefaults(t *testing.T) {
	cfg, err := config.ParseConnector("config.yml", []byte(tunnelDoc("proto: tcp", "local_port: 3000")))
	require.NoError(t, err)
	require.Equal(t, &config.Connector{
		File:         "config.yml",
		Server:       "localhost:4040",
		Transport:    "tcp",
		DrainTimeout: 30 * time.Second,
		Tunnels:      []config.Tunnel{{Name: "a", Proto: "tcp", LocalHost: "127.0.0.1", LocalPort: 3000}},
	}, cfg)

	cfg, err = config.ParseConnector("config.yml", []byte(healthDoc("type: tcp")))
	require.NoError(t, err)
	require.Equal(t, &config.HealthCheck{
		Type: "tcp", Interval: 10 * time.Second, Timeout: 3 * time.Second, MaxFailed: 3, Expect2xx: true,
	}, cfg.Tunnels[0].HealthCheck)

	cfg, err = config.ParseConnector("config.yml", []byte("tls: {}\n"+tunnelDoc("proto: tcp", "local_port: 3000")))
	require.NoError(t, err)
	require.Equal(t, config.ConnectorTLS{Enabled: true, ServerName: "localhost"}, cfg.TLS, "a tls mapping turns TLS on")

	cfg, err = config.ParseConnector("config.yml", []byte("tls:\n  enabled: false\n  server_name: edge.internal\n"+tunnelDoc("proto: tcp", "local_port: 3000")))
	require.NoError(t, err)
	require.False(t, cfg.TLS.Enabled)

	cfg, err = config.ParseConnector("config.yml", []byte("tls: ~\nauth_token: null\n"+tunnelDoc("proto: tcp", "local_port: 3000", "health_check:")))
	require.NoError(t, err, "null values count as absent")
	require.False(t, cfg.TLS.Enabled)
	require.Nil(t, cfg.Tunnels[0].HealthCheck)
}

func TestClientEveryKey(t *testing.T) {
	dir := t.TempDir()
	ca := writeFile(t, dir, "ca.pem")
	doc := fmt.Sprintf(`server: "[::1]:7000"
auth_token: "tok"
tls:
  enabled: true
  ca_path: '%s'
  server_name: edge.example.org
  insecure_skip_verify: false
drain_timeout_secs: 0.05
data_read_buffer: 4194304
proxy_url: "http://alice:p%%40ss@proxy.corp.example:3128"
tunnels:
  web-1:
    proto: https
    local_port: 8443
    local_host: backend.internal
    subdomain: shop
    group: shop
    group_key: k1
    health_check:
      type: http
      path: /healthz?deep=1
      interval_secs: 0.5
      timeout_secs: 0.05
      max_failed: 1
      expect_2xx: false
      alert_webhook: https://hooks.example.com/team
  db:
    proto: tcp
    local_port: 5432
`, ca)
	cfg, err := config.ParseConnector("c.yml", []byte(doc))
	require.NoError(t, err)
	require.Equal(t, &config.Connector{
		File:           "c.yml",
		Server:         "[::1]:7000",
		Transport:      "tcp",
		AuthToken:      "tok",
		TLS:            config.ConnectorTLS{Enabled: true, CAPath: ca, ServerName: "edge.example.org"},
		DrainTimeout:   50 * time.Millisecond,
		DataReadBuffer: 4 << 20,
		ProxyURL:       "http://alice:p%40ss@proxy.corp.example:3128",
		Tunnels: []config.Tunnel{
			{
				Name: "web-1", Proto: "https", LocalHost: "backend.internal", LocalPort: 8443,
				Subdomain: "shop", Group: "shop", GroupKey: "k1",
				HealthCheck: &config.HealthCheck{
					Type: "http", Path: "/healthz?deep=1", Interval: 500 * time.Millisecond,
					Timeout: 50 * time.Millisecond, MaxFailed: 1, Expect2xx: false,
					AlertWebhook: "https://hooks.example.com/team",
				},
			},
			{Name: "db", Proto: "tcp", LocalHost: "127.0.0.1", LocalPort: 5432},
		},
	}, cfg)
	require.Equal(t, "backend.internal:8443", cfg.Tunnels[0].LocalAddr())

	cfg, err = config.ParseConnector("c.yml", []byte("server: \"[::1]:7000\"\ntls: {enabled: true}\n"+strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1"), "\n", 2)[1]))
	require.NoError(t, err)
	require.Equal(t, "::1", cfg.TLS.ServerName, "server_name defaults to the host of server")
}

func TestClientTunnelOrder(t *testing.T) {
	doc := "server: localhost:4040\ntunnels:\n"
	names := []string{"zeta", "alpha", "mid", "b2", "a1"}
	for i, n := range names {
		doc += fmt.Sprintf("  %s:\n    proto: tcp\n    local_port: %d\n", n, 3000+i)
	}
	cfg, err := config.ParseConnector("config.yml", []byte(doc))
	require.NoError(t, err)
	var got []string
	for i, tun := range cfg.Tunnels {
		got = append(got, tun.Name)
		require.Equal(t, 3000+i, tun.LocalPort)
	}
	require.Equal(t, names, got)
}

func TestConnectorErrors(t *testing.T) {
	dir := t.TempDir()
	ca := writeFile(t, dir, "ca.pem")
	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		// server
		{"server missing", "tunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrRequired, "required: the edge's control address"}}},
		{"server empty", "server: \"\"\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrRequired, "must not be empty"}}},
		{"server without port", "server: tunnel.example.com\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrInvalid, `"tunnel.example.com" is not host:port (missing port in address)`}}},
		{"server port zero", "server: localhost:0\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrInvalid, "port 0 is out of range 1-65535"}}},
		{"server port name", "server: localhost:http\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrInvalid, `port "http" is not a port number`}}},
		{"server empty host", "server: \":4040\"\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrInvalid, "host must not be empty"}}},
		{"server bad host", "server: \"bad host:4040\"\ntunnels:\n  a: {proto: tcp, local_port: 1}\n",
			[]want{{1, "server", config.ErrInvalid, "neither an IP address nor a host name"}}},

		// tls
		{"ca missing on disk", "tls:\n  ca_path: " + filepath.Join(dir, "nope.pem") + "\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{2, "tls.ca_path", config.ErrInvalid, "no such file or directory"}}},
		{"ca with insecure", "tls:\n  ca_path: '" + ca + "'\n  insecure_skip_verify: true\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{3, "tls.insecure_skip_verify", config.ErrInvalid, "cannot be combined with tls.ca_path"}}},
		{"bad server with tls", "server: \"bad host:4040\"\ntls: {}\n" + strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1"), "\n", 2)[1],
			[]want{{1, "server", config.ErrInvalid, "neither an IP address nor a host name"}}},
		{"bad server name", "tls:\n  server_name: \"a b\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{2, "tls.server_name", config.ErrInvalid, "neither an IP address nor a host name"}}},

		// drain_timeout_secs
		{"drain zero", "drain_timeout_secs: 0\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "drain_timeout_secs", config.ErrInvalid, "must be greater than 0 seconds, got 0"}}},
		{"drain negative", "drain_timeout_secs: -2.5\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "drain_timeout_secs", config.ErrInvalid, "got -2.5"}}},
		{"drain infinite", "drain_timeout_secs: .inf\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "drain_timeout_secs", config.ErrInvalid, "finite"}}},

		// data_read_buffer
		{"data read buffer negative", "data_read_buffer: -1\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "data_read_buffer", config.ErrInvalid, "must be 0 (the kernel's autotuning) to 268435456 bytes, got -1"}}},
		{"data read buffer huge", "data_read_buffer: 268435457\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "data_read_buffer", config.ErrInvalid, "got 268435457"}}},

		// proxy_url: the messages never quote the URL, which may hold a password
		{"proxy scheme", "proxy_url: ftp://alice:s3cret@proxy:21\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, `scheme "ftp" is not one of http://, https://, socks5:// or socks5h://`}}},
		{"proxy socks4", "proxy_url: socks4://proxy:1080\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, `scheme "socks4" is not one of`}}},
		{"proxy without scheme", "proxy_url: proxy.corp:3128\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, "start it with http://"}}},
		{"proxy without host", "proxy_url: \"socks5://alice:s3cret@:1080\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, "has no host"}}},
		{"proxy bad port", "proxy_url: \"http://alice:s3cret@proxy:99999\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, "port 99999 is out of range 1-65535"}}},
		{"proxy not a URL", "proxy_url: \"http://alice:s3cret@proxy:3128/%zz\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, "is not a URL"}}},
		{"proxy with a path", "proxy_url: \"http://proxy:3128/path\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrInvalid, "without a path or query"}}},
		{"proxy not a string", "proxy_url: [a]\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "proxy_url", config.ErrType, ""}}},

		// tunnels
		{"tunnels missing", "server: localhost:4040\n",
			[]want{{1, "tunnels", config.ErrRequired, "at least one tunnel"}}},
		{"tunnels empty", "server: localhost:4040\n\ntunnels: {}\n",
			[]want{{3, "tunnels", config.ErrRequired, "at least one tunnel"}}},
		{"tunnel name uppercase", "server: localhost:4040\ntunnels:\n  Web:\n    proto: tcp\n    local_port: 1\n",
			[]want{{3, "tunnels.Web", config.ErrInvalid, `tunnel name "Web" must be lowercase`}}},
		{"tunnel name underscore", "server: localhost:4040\ntunnels:\n  web_1:\n    proto: tcp\n    local_port: 1\n",
			[]want{{3, "tunnels.web_1", config.ErrInvalid, "may only hold a-z, 0-9"}}},
		{"tunnel name too long", "server: localhost:4040\ntunnels:\n  " + strings.Repeat("a", 64) + ":\n    proto: tcp\n    local_port: 1\n",
			[]want{{3, "tunnels." + strings.Repeat("a", 64), config.ErrInvalid, "at most 63"}}},
		{"tunnel name with a dot", "server: localhost:4040\ntunnels:\n  a.b:\n    proto: tcp\n    local_port: 1\n",
			[]want{{3, `tunnels."a.b"`, config.ErrInvalid, "may only hold"}}},
		{"tunnel without body", "server: localhost:4040\ntunnels:\n  a:\n",
			[]want{
				{3, "tunnels.a.proto", config.ErrRequired, "required: http, https, tcp or tls"},
				{3, "tunnels.a.local_port", config.ErrRequired, "required"},
			}},
		{"proto missing", tunnelDoc("local_port: 1"),
			[]want{{3, "tunnels.a.proto", config.ErrRequired, "required: http, https, tcp or tls"}}},
		{"proto empty", tunnelDoc("proto: \"\"", "local_port: 1"),
			[]want{{4, "tunnels.a.proto", config.ErrInvalid, "must not be empty"}}},
		{"proto unknown", tunnelDoc("proto: udp", "local_port: 1"),
			[]want{{4, "tunnels.a.proto", config.ErrInvalid, `"udp" is not a protocol; use http, https, tcp or tls`}}},
		{"local port missing", tunnelDoc("proto: tcp"),
			[]want{{3, "tunnels.a.local_port", config.ErrRequired, "required: the port of the local service"}}},
		{"local port zero", tunnelDoc("proto: tcp", "local_port: 0"),
			[]want{{5, "tunnels.a.local_port", config.ErrInvalid, "0 is out of range 1-65535"}}},
		{"local port too big", tunnelDoc("proto: tcp", "local_port: 65536"),
			[]want{{5, "tunnels.a.local_port", config.ErrInvalid, "65536 is out of range 1-65535"}}},
		{"local host bad", tunnelDoc("proto: tcp", "local_port: 1", "local_host: \"not a host\""),
			[]want{{6, "tunnels.a.local_host", config.ErrInvalid, "neither an IP address nor a host name"}}},
		{"local host empty", tunnelDoc("proto: tcp", "local_port: 1", "local_host: ''"),
			[]want{{6, "tunnels.a.local_host", config.ErrInvalid, "must not be empty"}}},
		{"subdomain missing for http", tunnelDoc("proto: http", "local_port: 1"),
			[]want{{3, "tunnels.a.subdomain", config.ErrRequired, `required when the protocol is "http"`}}},
		{"subdomain missing for https", tunnelDoc("proto: https", "local_port: 1"),
			[]want{{3, "tunnels.a.subdomain", config.ErrRequired, `required when the protocol is "https"`}}},
		{"subdomain for tcp", tunnelDoc("proto: tcp", "local_port: 1", "subdomain: db"),
			[]want{{6, "tunnels.a.subdomain", config.ErrInvalid, `not allowed when proto is "tcp"`}}},
		{"subdomain uppercase", tunnelDoc("proto: http", "local_port: 1", "subdomain: Pool"),
			[]want{{6, "tunnels.a.subdomain", config.ErrInvalid, "must be lowercase"}}},
		{"subdomain with dot", tunnelDoc("proto: http", "local_port: 1", "subdomain: a.b"),
			[]want{{6, "tunnels.a.subdomain", config.ErrInvalid, "may only hold"}}},
		{"subdomain trailing hyphen", tunnelDoc("proto: http", "local_port: 1", "subdomain: pool-"),
			[]want{{6, "tunnels.a.subdomain", config.ErrInvalid, "must not start or end"}}},
		{"group without key", tunnelDoc("proto: tcp", "local_port: 1", "group: web"),
			[]want{{3, "tunnels.a.group_key", config.ErrRequired, "required with a group"}}},
		{"key without group", tunnelDoc("proto: tcp", "local_port: 1", "group_key: s3cret"),
			[]want{{3, "tunnels.a.group", config.ErrRequired, "required with a group key"}}},

		// health_check
		{"health type missing", healthDoc("interval_secs: 1"),
			[]want{{6, "tunnels.a.health_check.type", config.ErrRequired, "required: tcp or http"}}},
		{"health type unknown", healthDoc("type: icmp"),
			[]want{{7, "tunnels.a.health_check.type", config.ErrInvalid, `"icmp" is not a health check type`}}},
		{"http path missing", healthDoc("type: http"),
			[]want{{6, "tunnels.a.health_check.path", config.ErrRequired, `required when type is "http"`}}},
		{"http path relative", healthDoc("type: http", "path: healthz"),
			[]want{{8, "tunnels.a.health_check.path", config.ErrInvalid, `"healthz" must start with "/"`}}},
		{"http path with space", healthDoc("type: http", "path: /health check"),
			[]want{{8, "tunnels.a.health_check.path", config.ErrInvalid, "contains a space or control character"}}},
		{"tcp with path", healthDoc("type: tcp", "path: /healthz"),
			[]want{{8, "tunnels.a.health_check.path", config.ErrInvalid, `not allowed when type is "tcp"`}}},
		{"interval zero", healthDoc("type: tcp", "interval_secs: 0"),
			[]want{{8, "tunnels.a.health_check.interval_secs", config.ErrInvalid, "must be greater than 0 seconds, got 0"}}},
		{"timeout negative", healthDoc("type: tcp", "timeout_secs: -1"),
			[]want{{8, "tunnels.a.health_check.timeout_secs", config.ErrInvalid, "got -1"}}},
		{"max_failed zero", healthDoc("type: tcp", "max_failed: 0"),
			[]want{{8, "tunnels.a.health_check.max_failed", config.ErrInvalid, "must be at least 1, got 0"}}},
		{"alert webhook not a URL", healthDoc("type: tcp", "alert_webhook: hooks.example.com"),
			[]want{{8, "tunnels.a.health_check.alert_webhook", config.ErrInvalid, "absolute http:// or https:// URL"}}},

		// tunnels that would share a pool
		{"shared subdomain without group", "server: localhost:4040\ntunnels:\n  a: {proto: http, local_port: 1, subdomain: pool}\n  b: {proto: http, local_port: 2, subdomain: pool}\n",
			[]want{{4, "tunnels.b.subdomain", config.ErrInvalid, `"pool" is already used by tunnels.a (line 3)`}}},
		{"shared subdomain with different keys", "server: localhost:4040\ntunnels:\n  a: {proto: http, local_port: 1, subdomain: pool, group: web, group_key: k1}\n  b: {proto: http, local_port: 2, subdomain: pool, group: web, group_key: k2}\n",
			[]want{{4, "tunnels.b.group_key", config.ErrInvalid, "differs from the group_key of tunnels.a (line 3)"}}},
		{"shared subdomain with different protocols", "server: localhost:4040\ntunnels:\n  a: {proto: http, local_port: 1, subdomain: pool, group: web, group_key: k1}\n  b: {proto: https, local_port: 2, subdomain: pool, group: web, group_key: k1}\n",
			[]want{{4, "tunnels.b.proto", config.ErrInvalid, `"https" differs from "http" of tunnels.a`}}},

		// several problems, in line order
		{"all problems collected", "server: nowhere\ndrain_timeout_secs: 0\ntunnels:\n  a:\n    proto: ftp\n    local_port: 99999\n",
			[]want{
				{1, "server", config.ErrInvalid, "not host:port"},
				{2, "drain_timeout_secs", config.ErrInvalid, "greater than 0"},
				{5, "tunnels.a.proto", config.ErrInvalid, "not a protocol"},
				{6, "tunnels.a.local_port", config.ErrInvalid, "out of range"},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.ParseConnector("config.yml", []byte(tc.doc))
			require.Nil(t, cfg)
			requireProblems(t, err, "config.yml", tc.wants...)
		})
	}
}

func TestClientSecretsStayOutOfMessages(t *testing.T) {
	doc := "server: localhost:4040\ntunnels:\n  a: {proto: http, local_port: 1, subdomain: pool, group: web, group_key: hunter2}\n  b: {proto: http, local_port: 2, subdomain: pool, group: web, group_key: swordfish}\n"
	_, err := config.ParseConnector("config.yml", []byte(doc))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "swordfish")

	doc = "server: localhost:4040\ntunnels:\n  a: {proto: http, local_port: 1, subdomain: pool, group: web, group_key: k}\n  b: {proto: http, local_port: 2, subdomain: pool, group: other-name, group_key: k}\n"
	_, err = config.ParseConnector("config.yml", []byte(doc))
	require.NoError(t, err, "an HTTP pool is keyed by subdomain and key; the group name is display only")
}

func TestClientExampleErrorMessage(t *testing.T) {
	doc := `server: localhost:4040
tunnels:
  a:
    proto: http
    local_port: 3000
    subdomain: pool
    group: web
    group_key: shared-secret
    health_check:
      type: http
`
	_, err := config.ParseConnector("config.yml", []byte(doc))
	require.EqualError(t, err, `config.yml:9: tunnels.a.health_check.path: required when type is "http"`)
}

func TestClientUnknownKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want want
	}{
		{"root", "serverAddr: x\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "serverAddr", config.ErrUnknownKey, "unknown key; expected one of: auth_token, control_socket, data_read_buffer, drain_timeout_secs, hostname, proxy_url, server, servers, tls, transport, tunnels"}},
		{"proxy typo", "proxy_ur: http://p:3128\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "proxy_ur", config.ErrUnknownKey, `did you mean "proxy_url"?`}},
		{"root typo", "auth_tokn: x\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "auth_tokn", config.ErrUnknownKey, `did you mean "auth_token"?`}},
		{"tls", "tls:\n  verify: false\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{2, "tls.verify", config.ErrUnknownKey, "unknown key"}},
		{"tunnel", tunnelDoc("proto: tcp", "local_port: 1", "localIP: 10.0.0.1"),
			want{6, "tunnels.a.localIP", config.ErrUnknownKey, "expected one of: affinity, backend_protocol, group, group_key, health_check, local_host, local_port, previous_group_keys, priority, proto, retry_idempotent, slow_start_secs, subdomain, weight"}},
		{"health check", healthDoc("type: tcp", "retries: 3"),
			want{8, "tunnels.a.health_check.retries", config.ErrUnknownKey, "unknown key"}},
		{"health check typo", healthDoc("type: tcp", "interval_sec: 3"),
			want{8, "tunnels.a.health_check.interval_sec", config.ErrUnknownKey, `did you mean "interval_secs"?`}},
		{"quoted key", "\"tls.enabled\": true\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, `"tls.enabled"`, config.ErrUnknownKey, "unknown key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseConnector("config.yml", []byte(tc.doc))
			requireProblems(t, err, "config.yml", tc.want)
		})
	}

	// A misspelt required key is reported as unknown and as missing.
	_, err := config.ParseConnector("config.yml", []byte(tunnelDoc("proto: tcp", "localPort: 1")))
	requireProblems(t, err, "config.yml",
		want{3, "tunnels.a.local_port", config.ErrRequired, "required"},
		want{5, "tunnels.a.localPort", config.ErrUnknownKey, `did you mean "local_port"?`})

	// Unknown keys do not stop the other checks.
	_, err = config.ParseConnector("config.yml", []byte("serverr: localhost:4040\n"+strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1", "health_chek: {}"), "\n", 2)[1]))
	requireProblems(t, err, "config.yml",
		want{1, "serverr", config.ErrUnknownKey, `did you mean "server"?`},
		want{1, "server", config.ErrRequired, "required"},
		want{6, "tunnels.a.health_chek", config.ErrUnknownKey, `did you mean "health_check"?`},
	)
}

func TestClientWrongTypes(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want want
	}{
		{"server as integer", "server: 4040\n" + strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1"), "\n", 2)[1],
			want{1, "server", config.ErrType, "expected a string, got an integer (put the value in quotes"}},
		{"auth_token as number", "auth_token: 0123\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "auth_token", config.ErrType, "expected a string, got an integer"}},
		{"tls as string", "tls: yes\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "tls", config.ErrType, "expected a mapping, got a string"}},
		{"tls enabled as string", "tls:\n  enabled: \"true\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{2, "tls.enabled", config.ErrType, "expected a boolean (true or false), got a string"}},
		{"insecure as integer", "tls:\n  insecure_skip_verify: 1\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{2, "tls.insecure_skip_verify", config.ErrType, "expected a boolean"}},
		{"ca_path as list", "tls:\n  ca_path: [a]\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{2, "tls.ca_path", config.ErrType, "expected a string, got a sequence"}},
		{"drain as string", "drain_timeout_secs: \"30\"\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "drain_timeout_secs", config.ErrType, "expected a number of seconds, got a string"}},
		{"drain as timestamp", "drain_timeout_secs: 2001-12-14\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			want{1, "drain_timeout_secs", config.ErrType, "got a timestamp"}},
		{"tunnels as sequence", "server: localhost:4040\ntunnels:\n  - a\n",
			want{2, "tunnels", config.ErrType, "expected a mapping, got a sequence"}},
		{"tunnel as string", "server: localhost:4040\ntunnels:\n  a: web\n",
			want{3, "tunnels.a", config.ErrType, "expected a mapping, got a string"}},
		{"proto as boolean", tunnelDoc("proto: true", "local_port: 1"),
			want{4, "tunnels.a.proto", config.ErrType, "expected a string, got a boolean"}},
		{"local_port quoted", tunnelDoc("proto: tcp", "local_port: \"3000\""),
			want{5, "tunnels.a.local_port", config.ErrType, "expected an integer, got a string"}},
		{"local_port fraction", tunnelDoc("proto: tcp", "local_port: 30.5"),
			want{5, "tunnels.a.local_port", config.ErrType, "expected an integer, got a floating-point number"}},
		{"local_port huge", tunnelDoc("proto: tcp", "local_port: !!int 99999999999999999999"),
			want{5, "tunnels.a.local_port", config.ErrType, "expected an integer, got an integer outside the 64-bit range"}},
		{"local_host as number", tunnelDoc("proto: tcp", "local_port: 1", "local_host: 10"),
			want{6, "tunnels.a.local_host", config.ErrType, "expected a string"}},
		{"group_key as number", tunnelDoc("proto: tcp", "local_port: 1", "group: g", "group_key: 12345"),
			want{7, "tunnels.a.group_key", config.ErrType, "put the value in quotes to use it as a string"}},
		{"subdomain as null-ish tag", tunnelDoc("proto: http", "local_port: 1", "subdomain: !custom pool"),
			want{6, "tunnels.a.subdomain", config.ErrType, `got a value tagged "!custom"`}},
		{"health_check as string", tunnelDoc("proto: tcp", "local_port: 1", "health_check: tcp"),
			want{6, "tunnels.a.health_check", config.ErrType, "expected a mapping, got a string"}},
		{"max_failed as string", healthDoc("type: tcp", "max_failed: three"),
			want{8, "tunnels.a.health_check.max_failed", config.ErrType, "expected an integer, got a string"}},
		{"expect_2xx as integer", healthDoc("type: tcp", "expect_2xx: 1"),
			want{8, "tunnels.a.health_check.expect_2xx", config.ErrType, "expected a boolean"}},
		{"interval as mapping", healthDoc("type: tcp", "interval_secs: {s: 1}"),
			want{8, "tunnels.a.health_check.interval_secs", config.ErrType, "expected a number of seconds, got a mapping"}},
		{"alert_webhook as sequence", healthDoc("type: tcp", "alert_webhook: [x]"),
			want{8, "tunnels.a.health_check.alert_webhook", config.ErrType, "expected a string, got a sequence"}},
		{"document is a sequence", "- server: localhost:4040\n",
			want{1, "", config.ErrType, "expected a mapping, got a sequence"}},
		{"document is a string", "hello\n",
			want{1, "", config.ErrType, "expected a mapping, got a string"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseConnector("config.yml", []byte(tc.doc))
			requireProblems(t, err, "config.yml", tc.want)
		})
	}
}

func TestClientYAMLStructure(t *testing.T) {
	t.Run("anchors and merge keys", func(t *testing.T) {
		doc := `server: localhost:4040
x-probe: &probe
  type: tcp
  interval_secs: 2
tunnels:
  a:
    proto: tcp
    local_port: 1
    health_check: *probe
  b:
    proto: tcp
    local_port: 2
    health_check:
      <<: *probe
      interval_secs: 5
`
		_, err := config.ParseConnector("config.yml", []byte(doc))
		requireProblems(t, err, "config.yml", want{2, "x-probe", config.ErrUnknownKey, "unknown key"})

		doc = strings.Replace(doc, "x-probe: &probe\n  type: tcp\n  interval_secs: 2\n", "", 1)
		doc = strings.Replace(doc, "    health_check: *probe\n", "    health_check: &probe\n      type: tcp\n      interval_secs: 2\n", 1)
		cfg, err := config.ParseConnector("config.yml", []byte(doc))
		require.NoError(t, err)
		require.Equal(t, 2*time.Second, cfg.Tunnels[0].HealthCheck.Interval)
		require.Equal(t, "tcp", cfg.Tunnels[1].HealthCheck.Type, "merged from the anchor")
		require.Equal(t, 5*time.Second, cfg.Tunnels[1].HealthCheck.Interval, "explicit keys win over merged ones")
	})

	for _, tc := range []struct {
		name  string
		doc   string
		wants []want
	}{
		{"duplicate top-level key", "server: localhost:4040\nserver: other:1\n" + strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1"), "\n", 2)[1],
			[]want{{2, "server", config.ErrSyntax, "duplicate key (first defined on line 1)"}}},
		{"duplicate tunnel", "server: localhost:4040\ntunnels:\n  a: {proto: tcp, local_port: 1}\n  a: {proto: tcp, local_port: 2}\n",
			[]want{{4, "tunnels.a", config.ErrSyntax, "duplicate key (first defined on line 3)"}}},
		{"duplicate nested key", tunnelDoc("proto: tcp", "local_port: 1", "local_port: 2"),
			[]want{{6, "tunnels.a.local_port", config.ErrSyntax, "duplicate key (first defined on line 5)"}}},
		{"mapping as key", "server: localhost:4040\n? {a: 1}\n: x\n" + strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1"), "\n", 2)[1],
			[]want{{2, "", config.ErrSyntax, "a key must be a plain string, not a mapping"}}},
		{"merge of a scalar", "server: localhost:4040\n<<: 5\n" + strings.SplitN(tunnelDoc("proto: tcp", "local_port: 1"), "\n", 2)[1],
			[]want{{2, "", config.ErrSyntax, "merge key (<<) needs a mapping"}}},
		{"two documents", "# first\n" + tunnelDoc("proto: tcp", "local_port: 1") + "...\n---\n\n---\nserver: other:1\n",
			[]want{{10, "", config.ErrSyntax, "more than one YAML document"}}},
		{"two documents back to back", tunnelDoc("proto: tcp", "local_port: 1") + "---\nserver: other:1\n",
			[]want{{6, "", config.ErrSyntax, "more than one YAML document"}}},
		{"syntax error", "server: localhost:4040\ntunnels:\n  a: b: c\n",
			[]want{{3, "", config.ErrSyntax, "invalid YAML: mapping values are not allowed"}}},
		{"syntax error on line 1", "server: a: b\n",
			[]want{{1, "", config.ErrSyntax, "invalid YAML"}}},
		{"tab indentation", "server: localhost:4040\ntunnels:\n\ta: {}\n",
			[]want{{3, "", config.ErrSyntax, "invalid YAML"}}},
		{"invalid UTF-8", "server: localhost:4040\nauth_token: \"\xff\"\n",
			[]want{{2, "", config.ErrSyntax, "byte 0xff is not valid UTF-8"}}},
		{"invalid UTF-8 after CR LF", "server: localhost:4040\r\n\r\nauth_token: \"\xff\"\r\n",
			[]want{{3, "", config.ErrSyntax, "not valid UTF-8"}}},
		{"control character after a lone CR", "server: localhost:4040\rauth_token: \"\x02\"\n",
			[]want{{2, "", config.ErrSyntax, "control character U+0002"}}},
		{"control character", "server: localhost:4040\n\nauth_token: \"a\x01\"\n",
			[]want{{3, "", config.ErrSyntax, "control character U+0001"}}},
		{"unknown anchor", "server: *nowhere\n",
			[]want{{1, "", config.ErrSyntax, "unknown anchor"}}},
		// Only the values of known keys are decoded, and a value of the wrong
		// type is refused without walking into it.
		{"deep nesting", "auth_token: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "auth_token", config.ErrType, "expected a string, got a sequence"}}},
		{"self-referencing anchor", "auth_token: &a [*a]\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "auth_token", config.ErrType, "expected a string, got a sequence"}}},
		{"deep nesting under an unknown key", "x: " + strings.Repeat("[", 100) + strings.Repeat("]", 100) + "\n" + tunnelDoc("proto: tcp", "local_port: 1"),
			[]want{{1, "x", config.ErrUnknownKey, "unknown key"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.ParseConnector("config.yml", []byte(tc.doc))
			requireProblems(t, err, "config.yml", tc.wants...)
		})
	}

	t.Run("self-merging mapping", func(t *testing.T) {
		cfg, err := config.ParseConnector("config.yml", []byte("tls: &t {<<: *t, server_name: edge}\n"+tunnelDoc("proto: tcp", "local_port: 1")))
		require.NoError(t, err)
		require.Equal(t, "edge", cfg.TLS.ServerName)
	})

	t.Run("alias bomb", func(t *testing.T) {
		// Sequences and merge keys that would expand to 10^12 values.
		var b strings.Builder
		b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\nm0: &m0 {type: tcp}\n")
		for i := 1; i < 12; i++ {
			fmt.Fprintf(&b, "a%d: &a%d [", i, i)
			for j := 0; j < 10; j++ {
				if j > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "*a%d", i-1)
			}
			fmt.Fprintf(&b, "]\nm%d: &m%d {<<: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*m%d, ", i-1), 10), ", "))
		}
		b.WriteString("server: *a11\ntunnels:\n  a: {proto: tcp, local_port: 1, health_check: *m11}\n")
		start := time.Now()
		_, err := config.ParseConnector("config.yml", []byte(b.String()))
		var list config.ErrorList
		require.ErrorAs(t, err, &list)
		require.Len(t, list, 25, "24 unknown keys and the server: %v", err)
		require.ErrorIs(t, err, config.ErrUnknownKey)
		require.Contains(t, err.Error(), "config.yml:25: server: expected a string, got a sequence")
		require.Less(t, time.Since(start), 5*time.Second)
	})
}

func TestClientEmptyFile(t *testing.T) {
	for _, doc := range []string{"", "\n", "# nothing yet\n", "---\n", "~\n", "---\n---\n"} {
		_, err := config.ParseConnector("config.yml", []byte(doc))
		requireProblems(t, err, "config.yml",
			want{1, "server", config.ErrRequired, "required"},
			want{1, "tunnels", config.ErrRequired, "at least one tunnel"})
	}
}

func TestLoadClient(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "config.yml")
	_, err := config.LoadConnector(missing)
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.Contains(t, err.Error(), missing)

	require.NoError(t, os.Mkdir(filepath.Join(dir, "pki"), 0o755))
	ca := writeFile(t, filepath.Join(dir, "pki"), "ca.pem")
	doc := "tls:\n  ca_path: pki/ca.pem\n" + tunnelDoc("proto: tcp", "local_port: 1")
	require.NoError(t, os.WriteFile(missing, []byte(doc), 0o600))
	cfg, err := config.LoadConnector(missing)
	require.NoError(t, err)
	require.Equal(t, ca, cfg.TLS.CAPath, "a relative ca_path follows the file")

	bad := filepath.Join(dir, "bad.yml")
	require.NoError(t, os.WriteFile(bad, []byte(tunnelDoc("proto: tcp", "local_port: x")), 0o600))
	_, err = config.LoadConnector(bad)
	require.EqualError(t, err, bad+":5: tunnels.a.local_port: expected an integer, got a string")
}

func TestDefaultClientPath(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	p, err := config.DefaultConnectorPath()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(home, ".warren", "config.yml"), p)

	t.Setenv("HOME", "")
	_, err = config.DefaultConnectorPath()
	require.Error(t, err)
}

func TestClientValidate(t *testing.T) {
	cfg, err := config.LoadConnector(clientSample)
	require.NoError(t, err)

	cfg.Tunnels = append(cfg.Tunnels, cfg.Tunnels[0])
	cfg.Tunnels[1].HealthCheck = &config.HealthCheck{Type: "http", Interval: time.Second, Timeout: time.Second, MaxFailed: 1}
	err = cfg.Validate()
	requireProblems(t, err, clientSample,
		want{0, "tunnels.b.health_check.path", config.ErrRequired, `required when type is "http"`},
		want{0, "tunnels.a", config.ErrInvalid, "duplicate tunnel name"},
	)

	var zero config.Connector
	err = zero.Validate()
	require.ErrorIs(t, err, config.ErrRequired)

	var nilCfg *config.Connector
	require.ErrorIs(t, nilCfg.Validate(), config.ErrRequired)
}

func TestClientTrailingDocumentMarker(t *testing.T) {
	cfg, err := config.ParseConnector("config.yml", []byte("---\n"+tunnelDoc("proto: tcp", "local_port: 1")+"---\n"))
	require.NoError(t, err)
	require.Len(t, cfg.Tunnels, 1)
}

// Two TCP tunnels of one group name with different keys are two pools (each gets its own
// public port from the edge), from one file as from two.
func TestTCPGroupNameWithTwoKeysIsTwoPools(t *testing.T) {
	cfg, err := config.ParseConnector("config.yml", []byte("server: localhost:4040\ntunnels:\n  a: {proto: tcp, local_port: 1, group: db, group_key: k1}\n  b: {proto: tcp, local_port: 2, group: db, group_key: k2}\n"))
	require.NoError(t, err)
	require.Len(t, cfg.Tunnels, 2)
}

func TestProxyURLErrorsHideTheCredentials(t *testing.T) {
	for _, u := range []string{"ftp://alice:s3cret@proxy:21", "http://alice:s3cret@proxy:99999", "http://alice:s3cret@proxy:3128/%zz",
		"socks5://alice:s3cret@:1080", "http://alice:s3cret@proxy:3128/x?y"} {
		_, err := config.ParseConnector("c.yml", []byte("proxy_url: \""+u+"\"\n"+tunnelDoc("proto: tcp", "local_port: 1")))
		require.ErrorContains(t, err, "proxy_url")
		require.NotContains(t, err.Error(), "s3cret", u)
	}
}
