package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

func TestClientBackendProtocol(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte(`server: localhost:4040
tunnels:
  api: {proto: https, local_port: 50051, subdomain: api, backend_protocol: h2c}
  web: {proto: http, local_port: 3000, subdomain: web, backend_protocol: http1}
  old: {proto: http, local_port: 3001, subdomain: old}
`))
	require.NoError(t, err)
	got := map[string]string{}
	for _, tn := range c.Tunnels {
		got[tn.Name] = tn.BackendProtocol
	}
	require.Equal(t, map[string]string{"api": "h2c", "web": "http1", "old": ""}, got)

	_, err = config.ParseConnector("config.yml", []byte(`server: localhost:4040
tunnels:
  a: {proto: http, local_port: 3000, subdomain: a, backend_protocol: h2}
  b: {proto: tcp, local_port: 5432, backend_protocol: h2c}
`))
	requireProblems(t, err, "config.yml",
		want{3, "tunnels.a.backend_protocol", config.ErrInvalid, `"h2" is not a backend protocol (want http1 or h2c)`},
		want{4, "tunnels.b.backend_protocol", config.ErrInvalid, "for http and https tunnels"},
	)
}

func TestServerH2C(t *testing.T) {
	s, err := config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\nh2c = true\n"))
	require.NoError(t, err)
	require.True(t, s.Server.H2C)
	s, err = config.ParseServer("server.toml", []byte("[server]\ndomain = \"localhost\"\n"))
	require.NoError(t, err)
	require.False(t, s.Server.H2C, "off by default")
}
