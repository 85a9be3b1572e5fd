package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// TestClientTLSPassthrough: proto tls takes a subdomain (required), groups, client_ip
// affinity and a tcp probe; cookie or header affinity, backend_protocol h2c and an http
// probe are refused, and so is a subdomain shared with an https tunnel of the same pool.
func TestClientTLSPassthrough(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte(`server: localhost:4040
tunnels:
  api-1:
    proto: tls
    local_port: 8443
    subdomain: api
    group: api
    group_key: k
    affinity: client_ip
    health_check: {type: tcp}
  api-2: {proto: tls, local_port: 8444, subdomain: api, group: api, group_key: k, affinity: client_ip}
`))
	require.NoError(t, err)
	require.Len(t, c.Tunnels, 2)
	for _, tn := range c.Tunnels {
		require.Equal(t, group.ProtoTLS, tn.Proto)
		require.Equal(t, "api", tn.Subdomain)
	}
	require.Equal(t, config.HealthTCP, c.Tunnels[0].HealthCheck.Type)

	_, err = config.ParseConnector("config.yml", []byte(`server: localhost:4040
tunnels:
  a: {proto: tls, local_port: 8443}
  b: {proto: tls, local_port: 8443, subdomain: b, group: b, group_key: k, affinity: cookie}
  c: {proto: tls, local_port: 8443, subdomain: c, backend_protocol: h2c}
  d: {proto: tls, local_port: 8443, subdomain: d, health_check: {type: http, path: /}}
  e: {proto: tls, local_port: 8443, subdomain: e, group: e, group_key: k}
  f: {proto: https, local_port: 8443, subdomain: e, group: e, group_key: k}
  g: {proto: tls, local_port: 8443, subdomain: g, group: g, group_key: k, affinity: "header:X-User"}
`))
	requireProblems(t, err, "config.yml",
		want{3, "tunnels.a.subdomain", config.ErrRequired, `required when the protocol is "tls"`},
		want{4, "tunnels.b.affinity", config.ErrInvalid, "a TLS passthrough pool (no HTTP is seen) takes client_ip"},
		want{5, "tunnels.c.backend_protocol", config.ErrInvalid, "a TLS passthrough tunnel carries bytes"},
		want{6, "tunnels.d.health_check.type", config.ErrInvalid, "use tcp"},
		want{8, "tunnels.f.proto", config.ErrInvalid, "members of one group must use the same protocol"},
		want{9, "tunnels.g.affinity", config.ErrInvalid, "takes client_ip"},
	)
}

func TestServerTLSPassthroughEndpoint(t *testing.T) {
	c, err := config.ParseServer("server.toml", []byte(serverDoc("[[endpoints]]\nproto = \"tls\"\nsubdomain = \"api\"\ngroup = \"api\"\n")))
	require.NoError(t, err)
	require.Equal(t, "tls", c.Endpoints[0].Proto)
	_, err = config.ParseServer("server.toml", []byte(serverDoc("[[endpoints]]\nproto = \"udp\"\nsubdomain = \"api\"\ngroup = \"api\"\n")))
	requireProblems(t, err, "server.toml", want{4, "endpoints[0].proto", config.ErrInvalid, `use "http", "https", "tls" or "tcp"`})
}
