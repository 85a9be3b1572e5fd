package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

func TestTunnelSpec(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte(`
server: localhost:4040
tunnels:
  web:
    proto: http
    local_port: 3000
    subdomain: pool
    group: web
    group_key: k
    health_check:
      type: http
      path: /healthz
      interval_secs: 0.5
      timeout_secs: 0.25
      max_failed: 2
      expect_2xx: false
      alert_webhook: https://hooks.example.com/a
  db:
    proto: tcp
    local_port: 5432
`))
	require.NoError(t, err)

	web := c.Tunnels[0].Spec()
	require.Equal(t, tunnel.TunnelSpec{
		Proto: tunnel.ProtoHTTP, Subdomain: "pool", Name: "web", Group: "web", GroupKey: "k",
		Health: &health.Spec{Type: health.TypeHTTP, Path: "/healthz", Interval: 500 * time.Millisecond,
			Timeout: 250 * time.Millisecond, MaxFailed: 2, AnyStatus: true},
		AlertWebhook: "https://hooks.example.com/a",
	}, web)

	db := c.Tunnels[1].Spec()
	require.Equal(t, tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "db"}, db, "a tunnel is named after its key")
	require.Equal(t, "127.0.0.1:5432", c.Tunnels[1].LocalAddr())
}

func TestTunnelSpecExpect2xxDefault(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte(`
server: localhost:4040
tunnels:
  a: {proto: http, local_port: 3000, subdomain: a, health_check: {type: tcp}}
`))
	require.NoError(t, err)
	spec := c.Tunnels[0].Spec()
	require.NotNil(t, spec.Health)
	require.False(t, spec.Health.AnyStatus, "expect_2xx defaults to true")
	require.NoError(t, spec.Health.Validate())
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not PEM"), 0o600))
	_, err := config.ConnectorTLS{Enabled: true, CAPath: bad}.Config()
	require.ErrorContains(t, err, "tls.ca_path")

	_, err = config.ConnectorTLS{Enabled: true, CAPath: filepath.Join(dir, "missing.pem")}.Config()
	require.ErrorContains(t, err, "tls.ca_path")

	ca := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(ca, selfSigned(t), 0o600))
	tc, err := config.ConnectorTLS{Enabled: true, CAPath: ca, ServerName: "edge.example.com"}.Config()
	require.NoError(t, err)
	require.NotNil(t, tc.RootCAs)
	require.Equal(t, "edge.example.com", tc.ServerName)
	require.False(t, tc.InsecureSkipVerify)

	tc, err = config.ConnectorTLS{Enabled: true}.Config()
	require.NoError(t, err)
	require.Nil(t, tc.RootCAs, "the system roots")
	require.False(t, tc.InsecureSkipVerify)

	tc, err = config.ConnectorTLS{Enabled: true, InsecureSkipVerify: true}.Config()
	require.NoError(t, err)
	require.True(t, tc.InsecureSkipVerify, "only when the file says so")
}

func selfSigned(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestDialOptions: the session's options are the file's; a CA bundle that does not load is
// an error naming the file and the key.
func TestDialOptions(t *testing.T) {
	c, err := config.ParseConnector("config.yml", []byte("server: localhost:4040\ntunnels:\n  a: {proto: tcp, local_port: 3000}\n"))
	require.NoError(t, err)
	opts, err := c.DialOptions()
	require.NoError(t, err)
	require.Len(t, opts, 3, "token, drain timeout, data read buffer; no TLS")
	require.Equal(t, tunnel.DefaultDrainTimeout, c.DrainTimeout, "the library's default")

	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not PEM"), 0o600))
	c.TLS = config.ConnectorTLS{Enabled: true, CAPath: bad}
	_, err = c.DialOptions()
	require.ErrorContains(t, err, "config.yml: tls.ca_path")
}

// hostname: the host name sent with each tunnel (tunnel.WithHostname) when given, refused
// when it holds what the edge would not show as it is; each tunnel's name goes with it,
// whatever its protocol.
func TestConnectorHostnameAndTunnelNames(t *testing.T) {
	const base = "server: localhost:4040\ntunnels:\n  web-a: {proto: http, local_port: 3000, subdomain: pool}\n  db: {proto: tcp, local_port: 5432}\n"
	c, err := config.ParseConnector("config.yml", []byte(base))
	require.NoError(t, err)
	require.Empty(t, c.Hostname)
	opts, err := c.DialOptions()
	require.NoError(t, err)
	require.Len(t, opts, 3, "no host name option: the session's default, the machine's name")
	require.Equal(t, "web-a", c.Tunnels[0].Spec().Name, "an HTTP tunnel's name is sent too")
	require.Equal(t, "db", c.Tunnels[1].Spec().Name)

	c, err = config.ParseConnector("config.yml", []byte("hostname: box-1.example\n"+base))
	require.NoError(t, err)
	require.Equal(t, "box-1.example", c.Hostname)
	opts, err = c.DialOptions()
	require.NoError(t, err)
	require.Len(t, opts, 4)

	for _, bad := range []string{`"<b>box</b>"`, `"my box"`, strings.Repeat("h", 254)} {
		_, err = config.ParseConnector("config.yml", []byte("hostname: "+bad+"\n"+base))
		require.ErrorContains(t, err, "config.yml:1: hostname", bad)
		require.ErrorIs(t, err, config.ErrInvalid)
	}
}
