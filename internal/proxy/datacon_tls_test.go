package proxy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tlsDataPair returns the two ends of a TLS connection over loopback TCP, each over
// TLSBase as the edge's and the connector's data connections are.
func tlsDataPair(t *testing.T) (client, server *tls.Conn) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edge.test"}, DNSNames: []string{"edge.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	a, b := tcpPair(t)
	client = tls.Client(TLSBase(a), &tls.Config{RootCAs: roots, ServerName: "edge.test"})
	server = tls.Server(TLSBase(b), &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, server.Handshake()) })
	require.NoError(t, client.Handshake())
	wg.Wait()
	for _, c := range []*tls.Conn{client, server} {
		_ = c.SetDeadline(time.Time{})
	}
	return client, server
}

// TestJoinDataTLS: a public connection joined to a TLS data connection at both ends (as
// the edge and the connector do) carries a bulk transfer both ways intact, then small
// exchanges without delay (nothing is held back once the copy went idle), then a clean end.
func TestJoinDataTLS(t *testing.T) {
	client, public := tcpPair(t)
	local, backend := tcpPair(t)
	edgeData, connData := tlsDataPair(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	wg.Go(func() { JoinData(ctx, public, edgeData, nil) })
	wg.Go(func() { JoinData(ctx, local, connData, nil) })
	wg.Go(func() { _, _ = io.Copy(backend, backend); _ = backend.CloseWrite() }) // echo
	t.Cleanup(wg.Wait)
	for _, c := range []*net.TCPConn{client, backend} {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	}

	sent := make([]byte, 8<<20)
	for i := range sent {
		sent[i] = byte(mrand.Uint32())
	}
	go func() {
		for rest := sent; len(rest) > 0; {
			n := min(len(rest), 1+mrand.IntN(300<<10))
			if _, err := client.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
	}()
	got := make([]byte, len(sent))
	_, err := io.ReadFull(client, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(sent, got), "the bulk transfer came back intact")

	for i := range 20 {
		msg := []byte{'p', 'i', 'n', 'g', byte(i)}
		_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := client.Write(msg)
		require.NoError(t, err)
		back := make([]byte, len(msg))
		_, err = io.ReadFull(client, back)
		require.NoError(t, err, "a small message after the bulk transfer is not held back")
		require.Equal(t, msg, back)
	}
	require.NoError(t, client.CloseWrite())
	n, err := client.Read(make([]byte, 1))
	require.Zero(t, n)
	require.ErrorIs(t, err, io.EOF, "the clean end reached the client")
}
