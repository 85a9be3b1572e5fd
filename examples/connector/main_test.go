package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/examples/internal/config"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestTunnelSpec(t *testing.T) {
	c, err := config.ParseClient("config.yml", []byte(`
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

	web := tunnelSpec(c.Tunnels[0])
	require.Equal(t, tunnel.TunnelSpec{
		Proto: tunnel.ProtoHTTP, Subdomain: "pool", Group: "web", GroupKey: "k",
		Health: &health.Spec{Type: health.TypeHTTP, Path: "/healthz", Interval: 500 * time.Millisecond,
			Timeout: 250 * time.Millisecond, MaxFailed: 2, AnyStatus: true},
		AlertWebhook: "https://hooks.example.com/a",
	}, web)

	db := tunnelSpec(c.Tunnels[1])
	require.Equal(t, tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Name: "db"}, db, "a tcp tunnel is named after its key")
	require.Equal(t, "127.0.0.1:5432", c.Tunnels[1].LocalAddr())
}

func TestTunnelSpecExpect2xxDefault(t *testing.T) {
	c, err := config.ParseClient("config.yml", []byte(`
server: localhost:4040
tunnels:
  a: {proto: http, local_port: 3000, subdomain: a, health_check: {type: tcp}}
`))
	require.NoError(t, err)
	spec := tunnelSpec(c.Tunnels[0])
	require.NotNil(t, spec.Health)
	require.False(t, spec.Health.AnyStatus, "expect_2xx defaults to true")
	require.NoError(t, spec.Health.Validate())
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	require.NoError(t, os.WriteFile(bad, []byte("not PEM"), 0o600))
	_, err := tlsConfig(config.ClientTLS{Enabled: true, CAPath: bad})
	require.ErrorContains(t, err, "tls.ca_path")

	_, err = tlsConfig(config.ClientTLS{Enabled: true, CAPath: filepath.Join(dir, "missing.pem")})
	require.ErrorContains(t, err, "tls.ca_path")

	ca := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(ca, selfSigned(t), 0o600))
	tc, err := tlsConfig(config.ClientTLS{Enabled: true, CAPath: ca, ServerName: "edge.example.com"})
	require.NoError(t, err)
	require.NotNil(t, tc.RootCAs)
	require.Equal(t, "edge.example.com", tc.ServerName)
	require.False(t, tc.InsecureSkipVerify)

	tc, err = tlsConfig(config.ClientTLS{Enabled: true})
	require.NoError(t, err)
	require.Nil(t, tc.RootCAs, "the system roots")
	require.False(t, tc.InsecureSkipVerify)

	tc, err = tlsConfig(config.ClientTLS{Enabled: true, InsecureSkipVerify: true})
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

func TestTunnelError(t *testing.T) {
	rej := &tunnel.RejectedError{Code: "group_key_mismatch", Message: "group key does not match for subdomain 'pool'"}
	require.Equal(t, "tunnel b rejected: group key does not match for subdomain 'pool'", tunnelError("b", rej))
	require.Equal(t, "tunnel b: tunnel: session closed", tunnelError("b", tunnel.ErrSessionClosed))
}

func TestRunUsageAndConfigErrors(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{nil, {"stop"}, {"--config", "x.yml"}, {"start", "extra"}, {"start", "--bogus"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, run(ctx, args, &stdout, &stderr), "args %q", args)
		require.Contains(t, stderr.String(), "usage: connector start", "args %q", args)
		require.Empty(t, stdout.String())
	}

	path := filepath.Join(t.TempDir(), "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: localhost:4040\ntunnels:\n  a:\n    proto: htp\n    local_port: 3000\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run(ctx, []string{"start", "--config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), path+":4: tunnels.a.proto")
	require.Empty(t, stdout.String())
}

func TestRunEdgeDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there any more

	path := filepath.Join(t.TempDir(), "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: "+addr+"\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"start", "--config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "connector: tunnel: dial "+addr)
	require.Empty(t, stdout.String())
}
