package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

// serversDoc is a client file whose first lines are head and whose tcp tunnel "a" follows.
func serversDoc(head string) string {
	return head + "tunnels:\n  a: {proto: tcp, local_port: 3000}\n"
}

func TestClientServers(t *testing.T) {
	cfg, err := config.ParseConnector("config.yml", []byte(serversDoc("servers: [a.example.com:4040, \"10.0.0.2:4040\"]\n")))
	require.NoError(t, err)
	require.Equal(t, []string{"a.example.com:4040", "10.0.0.2:4040"}, cfg.Servers)
	require.Empty(t, cfg.Server)
	require.Equal(t, cfg.Servers, cfg.Edges())
	require.NoError(t, cfg.Validate())

	// Block style too; with TLS each edge is verified by its own name: no server_name is
	// derived from the first one.
	cfg, err = config.ParseConnector("config.yml", []byte(serversDoc("servers:\n  - a.example.com:4040\n  - b.example.com:4040\ntls: {}\n")))
	require.NoError(t, err)
	require.Equal(t, []string{"a.example.com:4040", "b.example.com:4040"}, cfg.Edges())
	require.True(t, cfg.TLS.Enabled)
	require.Empty(t, cfg.TLS.ServerName)

	// server alone is one edge.
	cfg, err = config.ParseConnector("config.yml", []byte(serversDoc("server: localhost:4040\n")))
	require.NoError(t, err)
	require.Nil(t, cfg.Servers)
	require.Equal(t, []string{"localhost:4040"}, cfg.Edges())
}

func TestClientServersErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		head  string
		wants []want
	}{
		"both": {"server: a:1\nservers: [b:1]\n", []want{
			{2, "servers", config.ErrInvalid, "cannot be combined with server (line 1): give one edge as server or several as servers"}}},
		"both, server empty": {"server: \"\"\nservers: [b:1]\n", []want{{2, "servers", config.ErrInvalid, "cannot be combined with server"}}},
		"empty list":         {"servers: []\n", []want{{1, "servers", config.ErrInvalid, "must list at least one edge"}}},
		"neither": {"auth_token: x\n", []want{
			{1, "server", config.ErrRequired, "required: the edge's control address as host:port, e.g. \"tunnel.example.com:4040\" (or servers: a list of several edges)"}}},
		"not a list": {"servers: a:1\n", []want{{1, "servers", config.ErrType, "expected a list of strings, got a string"}}},
		"bad entries": {"servers:\n  - a:1\n  - nope\n  - a:1\n  - b:99999\n  - 7\n", []want{
			{3, "servers[1]", config.ErrInvalid, `"nope" is not host:port`},
			{4, "servers[2]", config.ErrInvalid, `"a:1" is listed twice (also servers[0])`},
			{5, "servers[3]", config.ErrInvalid, "port 99999 is out of range"},
			{6, "servers[4]", config.ErrType, "expected a string, got an integer"}}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := config.ParseConnector("config.yml", []byte(serversDoc(tc.head)))
			require.Nil(t, cfg)
			requireProblems(t, err, "config.yml", tc.wants...)
		})
	}
}

// TestClientServersValidate: a Connector built in Go follows the same rules.
func TestClientServersValidate(t *testing.T) {
	c := &config.Connector{File: "go", Servers: []string{"a:1", "b:1"}, DrainTimeout: time.Second,
		Tunnels: []config.Tunnel{{Name: "a", Proto: "tcp", LocalHost: "127.0.0.1", LocalPort: 1}}}
	require.NoError(t, c.Validate())
	c.Server = "c:1"
	requireProblems(t, c.Validate(), "go", want{0, "servers", config.ErrInvalid, "cannot be combined with server"})
	c.Server, c.Servers = "", []string{}
	requireProblems(t, c.Validate(), "go", want{0, "servers", config.ErrInvalid, "must list at least one edge"})
}
