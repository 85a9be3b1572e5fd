package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
)

// This harness runs an edge and its connectors in this process, through the library's
// public API as an embedding program does: for the tests that need a client library
// (grpc-go) which the library's own module does not require.

// inprocDomain is the domain of the in-process edges. Clients dial the edge's listeners
// directly, so no name under it has to resolve.
const inprocDomain = "warren.test"

// inprocEdge is a tunnel.Server serving on loopback listeners in this process.
type inprocEdge struct {
	*tunnel.Server
	t           *testing.T
	controlAddr string
	publicAddr  string // ServePublic: HTTP, and h2c with ServerConfig.Public.H2C
	httpsAddr   string // ServePublicTLS, when ServerConfig.TLSConfig is set
	client      *http.Client
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return l
}

// ctxT is a context for one step of a test, canceled when the test ends.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startInprocEdge starts an edge for inprocDomain with cfg: connectors on one listener,
// public HTTP on another, and public HTTPS (terminated, or passed through to tls tunnels)
// on a third when cfg.TLSConfig is set. Close runs at cleanup, and every Serve must have
// returned ErrServerClosed by then.
func startInprocEdge(t *testing.T, cfg tunnel.ServerConfig) *inprocEdge {
	t.Helper()
	cfg.Domain = inprocDomain
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	ctl, pub := listenLoopback(t), listenLoopback(t)
	// Known before the first registration: a tunnel's URL names the public port.
	cfg.Public.URLHTTPPort = pub.Addr().(*net.TCPAddr).Port
	srv, err := tunnel.NewServer(cfg)
	require.NoError(t, err)
	e := &inprocEdge{Server: srv, t: t, controlAddr: ctl.Addr().String(), publicAddr: pub.Addr().String()}
	type serving struct {
		l     net.Listener
		serve func(net.Listener) error
	}
	serves := []serving{{ctl, srv.Serve}, {pub, srv.ServePublic}}
	if cfg.TLSConfig != nil {
		l := listenLoopback(t)
		e.httpsAddr = l.Addr().String()
		serves = append(serves, serving{l, srv.ServePublicTLS})
	}
	var served sync.WaitGroup
	for _, sv := range serves {
		served.Go(func() {
			if err := sv.serve(sv.l); !errors.Is(err, tunnel.ErrServerClosed) {
				t.Errorf("Serve on %s returned %v, want ErrServerClosed", sv.l.Addr(), err)
			}
		})
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, e.publicAddr) // as DNS would for *.warren.test
	}}
	e.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		require.NoError(t, srv.Close())
		served.Wait()
	})
	return e
}

// connect dials a connector session to the edge; Close runs at cleanup, before the edge's.
func (e *inprocEdge) connect() *tunnel.Session {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := tunnel.Dial(ctx, e.controlAddr,
		tunnel.WithLogger(zaptest.NewLogger(e.t)), tunnel.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// get fetches http://<sub>.warren.test<path> through the edge's public HTTP listener.
func (e *inprocEdge) get(sub, path string) (int, string) {
	e.t.Helper()
	resp, err := e.client.Get(fmt.Sprintf("http://%s.%s%s", sub, inprocDomain, path))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(b)
}

// plainBackend is a loopback HTTP/1.1 server that names itself in every answer; it returns
// its address.
func plainBackend(t *testing.T, name string) string {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	return strings.TrimPrefix(b.URL, "http://")
}

// switchable is a health check the test turns on and off. Its check returns at once; the
// timeout is generous so that a loaded machine (a starved goroutine) never fails it.
type switchable struct{ down atomic.Bool }

func (s *switchable) spec() *health.Spec {
	return &health.Spec{Type: health.TypeFunc, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, MaxFailed: 1,
		Check: func(context.Context) error {
			if s.down.Load() {
				return errors.New("switched off")
			}
			return nil
		}}
}

// countingListener counts the connections an in-process backend accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// selfSigned returns a self-signed certificate named cn for names (server and client use)
// and a pool that trusts it.
// localhostCertFiles writes a self-signed certificate for localhost and its key as PEM files
// (an edge's [tls] cert_path and key_path; the certificate is also the connector's ca_path).
func localhostCertFiles(t *testing.T) (certPath, keyPath string) {
	t.Helper()
	cert, _ := selfSigned(t, "localhost", "localhost")
	dir := t.TempDir()
	certPath, keyPath = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600))
	require.NoError(t, os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600))
	return certPath, keyPath
}

func selfSigned(t *testing.T, cn string, names ...string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		DNSNames:              names,
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// edgeTLS is an edge's TLSConfig with cert, as an embedding program sets it.
func edgeTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}
