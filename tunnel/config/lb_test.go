package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/config"
)

func TestClientLoadBalancingSettings(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte(`server: localhost:4040
tunnels:
  web:
    proto: http
    local_port: 3000
    subdomain: pool
    group: web
    group_key: new-key
    previous_group_keys: [old-key]
    weight: 3
    priority: 1
    slow_start_secs: 30
    affinity: header:x-user
    retry_idempotent: true
  db: {proto: tcp, local_port: 5432, group: db, group_key: k, affinity: client_ip}
`))
	require.NoError(t, err)
	web := c.Tunnels[0]
	require.Equal(t, 3, web.Weight)
	require.Equal(t, 1, web.Priority)
	require.Equal(t, 30*time.Second, web.SlowStart)
	require.Equal(t, "header:x-user", web.Affinity)
	require.True(t, web.RetryIdempotent)
	require.Equal(t, []string{"old-key"}, web.PreviousGroupKeys)
	require.Equal(t, "client_ip", c.Tunnels[1].Affinity)
}

func TestClientLoadBalancingErrors(t *testing.T) {
	_, err := config.ParseConnector("config.yml", []byte(`server: localhost:4040
tunnels:
  a:
    proto: http
    local_port: 3000
    subdomain: a
    weight: 101
    priority: -1
    slow_start_secs: 7200
    affinity: sticky
    previous_group_keys: [old]
  b:
    proto: tcp
    local_port: 5432
    group: db
    group_key: k
    affinity: cookie
    previous_group_keys: [k]
  c:
    proto: http
    local_port: 3000
    subdomain: c
    previous_group_keys: old
`))
	requireProblems(t, err, "config.yml",
		want{7, "tunnels.a.weight", config.ErrInvalid, "101 is out of range 1-100"},
		want{8, "tunnels.a.priority", config.ErrInvalid, "-1 is out of range 0-100"},
		want{9, "tunnels.a.slow_start_secs", config.ErrInvalid, "out of range"},
		want{10, "tunnels.a.affinity", config.ErrInvalid, `affinity "sticky": want cookie, client_ip or header:<Name>`},
		want{11, "tunnels.a.previous_group_keys", config.ErrInvalid, "needs a group and its key"},
		want{17, "tunnels.b.affinity", config.ErrInvalid, "a TCP pool takes client_ip"},
		want{18, "tunnels.b.previous_group_keys", config.ErrInvalid, "must not hold group_key itself"},
		want{23, "tunnels.c.previous_group_keys", config.ErrType, "expected a list of strings"},
	)
}
