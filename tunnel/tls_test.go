package tunnel

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// testPKI is a throwaway CA and a server certificate it signed for 127.0.0.1 and "edge.test".
type testPKI struct {
	pool   *x509.CertPool
	server tls.Certificate
	name   string // the name to verify the server by ("" : edge.test)
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "warren test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "edge.test"},
		DNSNames:     []string{"edge.test"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{pool: pool, server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

func TestTLSControlChannelVerifiesTheEdge(t *testing.T) {
	pki := newTestPKI(t)
	srv, err := NewServer(ServerConfig{Domain: testDomain, Logger: zaptest.NewLogger(t),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}})
	require.NoError(t, err)
	l := listenLoopback(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(tls.NewListener(l, srv.cfg.TLSConfig)) }()
	defer func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-served, ErrServerClosed)
	}()
	addr := l.Addr().String()

	// Trusted CA: connects and serves.
	sess, err := Dial(ctxT(t), addr, WithTLS(&tls.Config{RootCAs: pki.pool}))
	require.NoError(t, err)
	ln, err := sess.Listen(ctxT(t), TunnelSpec{Subdomain: "secure"})
	require.NoError(t, err)
	serveListener(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }))
	require.NoError(t, sess.Close())

	// Unknown CA (the system roots do not know ours): refused, not silently accepted.
	_, err = Dial(ctxT(t), addr, WithTLS(&tls.Config{}))
	var unknown x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknown), "got %v", err)

	// The name must match too.
	_, err = Dial(ctxT(t), addr, WithTLS(&tls.Config{RootCAs: pki.pool, ServerName: "other.test"}))
	var badName x509.HostnameError
	require.True(t, errors.As(err, &badName), "got %v", err)

	// Skipping verification is an explicit opt-in.
	insecure, err := Dial(ctxT(t), addr, WithTLS(&tls.Config{InsecureSkipVerify: true}))
	require.NoError(t, err)
	require.NoError(t, insecure.Close())

	// A plain-TCP connector against a TLS edge fails cleanly.
	_, err = Dial(ctxT(t), addr)
	require.Error(t, err)
}
