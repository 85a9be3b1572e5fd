package tunnel

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
)

// selfSigned returns a self-signed certificate named cn for names (server and client use)
// and a pool that trusts it.
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

func fingerprint(der []byte) string { s := sha256.Sum256(der); return fmt.Sprintf("%x", s[:8]) }

// passthroughEdge is an edge with load balancing whose HTTPS certificate names
// *.warren.test; it returns the edge, its HTTPS address and its certificate.
func passthroughEdge(t *testing.T, cfg ServerConfig) (*testEdge, string, tls.Certificate, *x509.CertPool) {
	t.Helper()
	cert, pool := selfSigned(t, "edge", "*."+testDomain, "edge.test")
	cfg.LoadBalancing.Enabled = true
	e, addr := startTLSEdge(t, testPKI{pool: pool, server: cert}, cfg)
	return e, addr, cert, pool
}

// tlsBackend is an HTTPS server with its own certificate (for pool.warren.test), speaking
// HTTP/2 and HTTP/1.1, that names itself, the protocol and the client certificate's name.
func tlsBackend(t *testing.T, name string, cert tls.Certificate, clientCAs *x509.CertPool) *httptest.Server {
	t.Helper()
	b := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := "-"
		if len(r.TLS.PeerCertificates) > 0 {
			client = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		fmt.Fprintf(w, "%s %s alpn=%s client=%s sni=%s", name, r.Proto, r.TLS.NegotiatedProtocol, client, r.TLS.ServerName)
	}))
	b.EnableHTTP2 = true
	b.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	if clientCAs != nil {
		b.TLS.ClientAuth, b.TLS.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs
	}
	b.StartTLS()
	t.Cleanup(b.Close)
	return b
}

// sniClient is an HTTPS client that dials addr (the edge's HTTPS listener) for every URL and
// opens a new connection for each request; protos: "h1" and/or "h2".
func sniClient(t *testing.T, addr string, cfg *tls.Config, protos ...string) *http.Client {
	t.Helper()
	var p http.Protocols
	for _, proto := range protos {
		p.SetHTTP1(p.HTTP1() || proto == "h1")
		p.SetHTTP2(p.HTTP2() || proto == "h2")
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		Protocols:         &p,
		TLSClientConfig:   cfg,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestTLSPassthroughPool: a tls pool of two connectors, each in front of an HTTPS backend
// with its own certificate for pool.warren.test. A client connecting to the edge's HTTPS
// port with that server name handshakes with the backend (its certificate, not the
// edge's), negotiates h2 or http/1.1 with it by ALPN, and its connections are spread over
// both members. The edge's registry shows proto tls (its admin API and metrics too:
// tunnel/admin's TestTLSPassthroughPoolInTheAdminAPI).
func TestTLSPassthroughPool(t *testing.T) {
	e, httpsAddr, edgeCert, _ := passthroughEdge(t, ServerConfig{})
	beCert, bePool := selfSigned(t, "pool backend", "pool."+testDomain)
	spec := TunnelSpec{Proto: ProtoTLS, Subdomain: "pool", Group: "pool", GroupKey: "k", Health: &health.Spec{Type: health.TypeTCP, Interval: 100 * time.Millisecond}}
	var tuns []*Tunnel
	for _, name := range []string{"a", "b"} {
		be := tlsBackend(t, name, beCert, nil)
		tun, err := e.connect().Forward(ctxT(t), spec, be.Listener.Addr().String())
		require.NoError(t, err)
		tuns = append(tuns, tun)
	}
	require.True(t, strings.HasPrefix(tuns[0].URL(), "tls://pool."+testDomain), tuns[0].URL())
	require.Eventually(t, func() bool { // the tcp probes passed
		g, ok := e.Registry().LookupHTTP("pool")
		return ok && len(g.Members) == 2 && g.Members[0].Healthy && g.Members[1].Healthy
	}, 5*time.Second, 10*time.Millisecond)
	g, _ := e.Registry().LookupHTTP("pool")
	require.Equal(t, ProtoTLS, g.Proto)

	for _, protos := range [][]string{{"h2"}, {"h1"}, {"h1", "h2"}} {
		c := sniClient(t, httpsAddr, &tls.Config{ServerName: "pool." + testDomain, RootCAs: bePool}, protos...)
		seen := map[string]int{}
		for range 8 {
			resp, err := c.Get("https://pool." + testDomain + "/x")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			peer := resp.TLS.PeerCertificates[0].Raw
			require.Equal(t, fingerprint(beCert.Certificate[0]), fingerprint(peer), "the backend's certificate, end to end")
			require.NotEqual(t, fingerprint(edgeCert.Certificate[0]), fingerprint(peer))
			wantProto, wantALPN := "HTTP/2.0", "h2"
			if len(protos) == 1 && protos[0] == "h1" {
				wantProto, wantALPN = "HTTP/1.1", "" // Go's HTTP/1.1-only client offers no ALPN
			}
			require.Equal(t, wantProto, resp.Proto)
			require.Equal(t, wantALPN, resp.TLS.NegotiatedProtocol)
			name, rest, _ := strings.Cut(string(body), " ")
			require.Equal(t, fmt.Sprintf("%s alpn=%s client=- sni=pool.%s", wantProto, wantALPN, testDomain), rest)
			seen[name]++
		}
		require.Len(t, seen, 2, "connections are spread over both members: %v", seen)
	}

	// A client that trusts only the edge's certificate for that name gets the backend's
	// and refuses it: the edge never terminates this TLS.
	_, edgePool := selfSigned(t, "other", "pool."+testDomain)
	_, err := sniClient(t, httpsAddr, &tls.Config{ServerName: "pool." + testDomain, RootCAs: edgePool}, "h1").Get("https://pool." + testDomain + "/")
	require.ErrorContains(t, err, "certificate")
}

// TestTLSPassthroughClientCertificates: a backend that requires a client certificate gets
// the client's (mutual TLS end to end); without one the handshake fails at the backend.
func TestTLSPassthroughClientCertificates(t *testing.T) {
	e, httpsAddr, _, _ := passthroughEdge(t, ServerConfig{})
	beCert, bePool := selfSigned(t, "mtls backend", "mtls."+testDomain)
	clientCert, clientPool := selfSigned(t, "the client")
	be := tlsBackend(t, "m", beCert, clientPool)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "mtls"}, be.Listener.Addr().String())
	require.NoError(t, err)

	cfg := &tls.Config{ServerName: "mtls." + testDomain, RootCAs: bePool, Certificates: []tls.Certificate{clientCert}}
	resp, body := fetch(t, sniClient(t, httpsAddr, cfg, "h2"), "https://mtls."+testDomain+"/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "m HTTP/2.0 alpn=h2 client=the client sni=mtls."+testDomain, body)

	cfg = &tls.Config{ServerName: "mtls." + testDomain, RootCAs: bePool}
	_, err = sniClient(t, httpsAddr, cfg, "h1").Get("https://mtls." + testDomain + "/")
	require.Error(t, err, "the backend demands a client certificate")
}

// TestTLSPassthroughNextToTerminatedHTTPS: on the same listener, an https tunnel is served
// with the edge's certificate (and h2), a name that is no tunnel's gets the edge's 404, and
// so does a client sending no server name. An HTTP request for the tls pool's host, on the
// HTTP listener or over the edge's own TLS (a reused HTTP/2 connection), gets 421.
func TestTLSPassthroughNextToTerminatedHTTPS(t *testing.T) {
	e, httpsAddr, edgeCert, edgePool := passthroughEdge(t, ServerConfig{})
	beCert, bePool := selfSigned(t, "pool backend", "pool."+testDomain)
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "pool"}, tlsBackend(t, "tls", beCert, nil).Listener.Addr().String())
	require.NoError(t, err)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoHTTPS, Subdomain: "secure"}, hostPort(protoBackend(t).URL))
	require.NoError(t, err)

	edgeClient := func(name string) *http.Client {
		return sniClient(t, httpsAddr, &tls.Config{ServerName: name, RootCAs: edgePool}, "h1", "h2")
	}
	resp, body := fetch(t, edgeClient("secure."+testDomain), "https://secure."+testDomain+"/s")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "HTTP/1.1 /s", body)
	require.Equal(t, "HTTP/2.0", resp.Proto, "the edge still offers h2")
	require.Equal(t, fingerprint(edgeCert.Certificate[0]), fingerprint(resp.TLS.PeerCertificates[0].Raw), "the edge's certificate")

	resp, body = fetch(t, edgeClient("nothing."+testDomain), "https://nothing."+testDomain+"/")
	require.Equal(t, http.StatusNotFound, resp.StatusCode, body)

	noSNI := sniClient(t, httpsAddr, &tls.Config{ServerName: "edge.test", RootCAs: edgePool}, "h1")
	resp, body = fetch(t, noSNI, "https://secure."+testDomain+"/n")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)

	// An HTTP request for the tls pool over the edge's TLS (SNI secure, Host pool) or over
	// plain HTTP: 421, and nothing reaches the backend.
	req, _ := http.NewRequest(http.MethodGet, "https://secure."+testDomain+"/", nil)
	req.Host = "pool." + testDomain
	resp2, err := edgeClient("secure." + testDomain).Do(req)
	require.NoError(t, err)
	_ = resp2.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, resp2.StatusCode)
	code, body := e.get("pool", "/")
	require.Equal(t, http.StatusMisdirectedRequest, code)
	require.Contains(t, body, "TLS passthrough")

	// The tls pool is still reached by its name.
	resp, body = fetch(t, sniClient(t, httpsAddr, &tls.Config{ServerName: "pool." + testDomain, RootCAs: bePool}, "h1"), "https://pool."+testDomain+"/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, strings.HasPrefix(body, "tls HTTP/1.1"), body)
}

// TestTLSPassthroughClosesSilentAndGarbageClients: a client that sends nothing is closed
// once ReadHeaderTimeout passed, one that sends a record cut short too, and one that sends
// garbage at once (by the edge's TLS server, or, plain HTTP, with its 400); none leaves a
// goroutine behind.
func TestTLSPassthroughClosesSilentAndGarbageClients(t *testing.T) {
	const bound = 400 * time.Millisecond
	e, httpsAddr, _, edgePool := passthroughEdge(t, ServerConfig{Public: PublicHTTP{ReadHeaderTimeout: bound}})
	beCert, _ := selfSigned(t, "pool backend", "pool."+testDomain)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "pool"}, tlsBackend(t, "tls", beCert, nil).Listener.Addr().String())
	require.NoError(t, err)
	// One complete exchange first: every long-lived goroutine has started.
	resp, _ := fetch(t, sniClient(t, httpsAddr, &tls.Config{ServerName: "edge.test", RootCAs: edgePool}, "h1"), "https://x."+testDomain+"/")
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	before := goleak.IgnoreCurrent()

	for _, tc := range []struct {
		name  string
		send  []byte
		fast  bool // closed before the bound
		reply string
	}{
		{"nothing", nil, false, ""},
		{"a record cut short", []byte{22, 3, 1, 0x02, 0x00, 1, 0, 1, 0xfc, 3, 3}, false, ""},
		{"garbage", []byte{0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3, 4, 5, 6, 7}, true, ""},
		{"plain HTTP", []byte("GET / HTTP/1.1\r\nHost: pool.warren.test\r\n\r\n"), true, "400 Bad Request"},
	} {
		c, err := net.Dial("tcp", httpsAddr)
		require.NoError(t, err)
		start := time.Now()
		_ = c.SetDeadline(start.Add(10 * time.Second))
		if tc.send != nil {
			_, err = c.Write(tc.send)
			require.NoError(t, err)
		}
		got, err := io.ReadAll(c)
		took := time.Since(start)
		_ = c.Close()
		if !errors.Is(err, syscall.ECONNRESET) { // the edge closed with our bytes unread
			require.NoError(t, err, "%s: closed by the edge, not by our deadline", tc.name)
		}
		require.Contains(t, string(got), tc.reply, tc.name)
		if tc.fast {
			require.Less(t, took, bound, tc.name)
		} else {
			require.GreaterOrEqual(t, took, bound-50*time.Millisecond, tc.name)
			require.Less(t, took, bound+2*time.Second, tc.name)
		}
	}
	goleak.VerifyNone(t, before)
}

// TestTLSPassthroughValidation: a tls tunnel takes client_ip affinity only, no h2c and no
// http probe; an edge without TLS refuses it; a tls and an http tunnel cannot share a
// subdomain; a reserved endpoint may say tls and its policy gates the connections.
func TestTLSPassthroughValidation(t *testing.T) {
	for _, sp := range []TunnelSpec{
		{Proto: ProtoTLS},
		{Proto: ProtoTLS, Subdomain: "p", Group: "p", GroupKey: "k", Affinity: "cookie"},
		{Proto: ProtoTLS, Subdomain: "p", Group: "p", GroupKey: "k", Affinity: "header:X-User"},
		{Proto: ProtoTLS, Subdomain: "p", BackendProtocol: "h2c"},
		{Proto: ProtoTLS, Subdomain: "p", Health: &health.Spec{Type: health.TypeHTTP, Path: "/"}},
	} {
		_, err := (&Session{}).Forward(context.Background(), sp, "127.0.0.1:1")
		require.ErrorIs(t, err, ErrInvalid, "%+v", sp)
	}
	sp := TunnelSpec{Proto: ProtoTLS, Subdomain: "p", Group: "p", GroupKey: "k", Affinity: "cookie"}
	require.ErrorContains(t, sp.normalize(false), "a TLS passthrough pool (no HTTP is seen) takes client_ip")

	// No TLS at the edge: refused for good.
	plain := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	_, err := plain.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "p"}, "127.0.0.1:1")
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "no TLS configuration")

	// One subdomain, one protocol; client_ip affinity is fine.
	e, httpsAddr, _, _ := passthroughEdge(t, ServerConfig{Endpoints: []Endpoint{
		{Subdomain: "gated", Proto: ProtoTLS, Group: "gated", Policy: Policy{DenyCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}},
	}})
	sess := e.connect()
	beCert, bePool := selfSigned(t, "b", "pool."+testDomain, "gated."+testDomain)
	addr := tlsBackend(t, "b", beCert, nil).Listener.Addr().String()
	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "pool", Group: "pool", GroupKey: "k", Affinity: "client_ip"}, addr)
	require.NoError(t, err)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoHTTP, Subdomain: "pool", Group: "pool", GroupKey: "k"}, addr)
	require.ErrorIs(t, err, ErrProtoMismatch)
	require.ErrorContains(t, err, "serves tls, this tunnel is http")

	// The reserved endpoint's policy refuses 127.0.0.1: the connection is closed before
	// any member is dialled.
	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "gated", Group: "gated", GroupKey: "any"}, addr)
	require.NoError(t, err)
	_, err = sniClient(t, httpsAddr, &tls.Config{ServerName: "gated." + testDomain, RootCAs: bePool}, "h1").Get("https://gated." + testDomain + "/")
	require.Error(t, err, "refused by the endpoint's policy")
	resp, _ := fetch(t, sniClient(t, httpsAddr, &tls.Config{ServerName: "pool." + testDomain, RootCAs: bePool}, "h1"), "https://pool."+testDomain+"/")
	require.Equal(t, http.StatusOK, resp.StatusCode, "the pool next to it is not gated")

	require.ErrorContains(t, (&Endpoint{Subdomain: "x", Proto: ProtoTLS}).validate(group.PortRange{}), "Group: required: the pool's name")
	require.NoError(t, (&Endpoint{Subdomain: "x", Proto: ProtoTLS, Group: "x"}).validate(group.PortRange{}))
}

// passthroughALPN is an ALPN list long enough to spread a ClientHello over several 512-byte
// records; the backend picks http/1.1.
func passthroughALPN(n int) []string {
	var protos []string
	for i := range n {
		protos = append(protos, fmt.Sprintf("x-protocol-number-%03d-with-a-long-name", i))
	}
	return append(protos, "http/1.1")
}

// TestTLSPassthroughSplitClientHelloWithOpenSSL: openssl s_client sending its ClientHello
// in 512-byte records (-max_send_frag 512, a long ALPN list) reaches the pool's backend,
// which does the handshake: the request and its Authorization go to the backend, and the
// edge never terminates the TLS (before, it did, with its own certificate, and answered the
// client's plaintext 421).
func TestTLSPassthroughSplitClientHelloWithOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("no openssl on this machine")
	}
	e, httpsAddr, _, _ := passthroughEdge(t, ServerConfig{})
	beCert, _ := selfSigned(t, "pool backend", "pool."+testDomain)
	auth := make(chan string, 1)
	b := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case auth <- r.Header.Get("Authorization"):
		default:
		}
		fmt.Fprintf(w, "backend %s alpn=%s sni=%s", r.Proto, r.TLS.NegotiatedProtocol, r.TLS.ServerName)
	}))
	b.TLS = &tls.Config{Certificates: []tls.Certificate{beCert}}
	b.StartTLS()
	t.Cleanup(b.Close)
	_, err = e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "pool"}, b.Listener.Addr().String())
	require.NoError(t, err)

	ctx := ctxT(t)
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", httpsAddr, "-servername", "pool."+testDomain,
		"-max_send_frag", "512", "-alpn", strings.Join(passthroughALPN(40), ","), "-quiet")
	cmd.Stdin = strings.NewReader("GET / HTTP/1.1\r\nHost: pool." + testDomain + "\r\nAuthorization: Bearer s3cret\r\nConnection: close\r\n\r\n")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "HTTP/1.1 200 OK", "%s", out)
	require.Contains(t, string(out), "backend HTTP/1.1 alpn=http/1.1 sni=pool."+testDomain, "%s", out)
	require.Equal(t, "Bearer s3cret", <-auth)
}

// thinHello is a connection whose first write, a TLS record holding a ClientHello, goes out
// in records of one byte each: more than the edge's router reads before deciding.
type thinHello struct {
	net.Conn
	sent bool
}

func (c *thinHello) Write(p []byte) (int, error) {
	if c.sent || len(p) < 5 || p[0] != 22 {
		return c.Conn.Write(p)
	}
	c.sent = true
	var out []byte
	for _, b := range p[5:] {
		out = append(out, p[0], p[1], p[2], 0, 1, b)
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// TestTLSPassthroughNameIsNeverTerminatedAtTheEdge: a ClientHello for a passthrough name
// that the router cannot read within its bounds (a long one, in records of one byte) goes
// on to the edge's own TLS server, which refuses the handshake: it never terminates the
// tunnel's TLS with the edge's certificate, which the client here would accept. A name of
// the edge's own is still served.
func TestTLSPassthroughNameIsNeverTerminatedAtTheEdge(t *testing.T) {
	e, httpsAddr, _, edgePool := passthroughEdge(t, ServerConfig{})
	be, conns, _ := tallyingBackend(t)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "pool"}, be.Listener.Addr().String())
	require.NoError(t, err)

	for name, wantErr := range map[string]bool{"pool." + testDomain: true, "web." + testDomain: false} {
		raw, err := net.Dial("tcp", httpsAddr)
		require.NoError(t, err)
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		c := tls.Client(&thinHello{Conn: raw}, &tls.Config{ServerName: name, RootCAs: edgePool, NextProtos: passthroughALPN(100)})
		err = c.Handshake()
		_ = c.Close()
		if wantErr {
			require.Error(t, err, "the edge terminated a passthrough tunnel's TLS")
		} else {
			require.NoError(t, err, name)
		}
	}
	require.Zero(t, conns.Load(), "the router read this hello: the test would not reach the TLS server's refusal")
}
