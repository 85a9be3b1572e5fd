package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The proxy of a connector: which edge goes through which proxy (the environment's choice
// and WithProxy's), and the CONNECT handshake against a fake proxy. The tests against real
// proxies (tinyproxy, a SOCKS5 server) are in examples/e2e.

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestProxyFromEnvironment(t *testing.T) {
	const edge = "edge.example.com:4040"
	for _, tc := range []struct {
		name string
		env  map[string]string
		addr string
		want string // "" for direct
	}{
		{"HTTPS_PROXY", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, edge, "http://proxy.corp:3128"},
		{"lower case https_proxy", map[string]string{"https_proxy": "http://proxy.corp:3128"}, edge, "http://proxy.corp:3128"},
		{"no scheme means http", map[string]string{"HTTPS_PROXY": "proxy.corp:3128"}, edge, "http://proxy.corp:3128"},
		{"default port of http", map[string]string{"HTTPS_PROXY": "http://proxy.corp"}, edge, "http://proxy.corp:80"},
		{"default port of https", map[string]string{"HTTPS_PROXY": "https://proxy.corp"}, edge, "https://proxy.corp:443"},
		{"default port of socks5", map[string]string{"HTTPS_PROXY": "socks5://proxy.corp"}, edge, "socks5://proxy.corp:1080"},
		{"HTTP_PROXY alone is not for the edge", map[string]string{"HTTP_PROXY": "http://proxy.corp:3128"}, edge, ""},
		{"ALL_PROXY when no HTTPS_PROXY", map[string]string{"ALL_PROXY": "socks5h://socks.corp:1080"}, edge, "socks5h://socks.corp:1080"},
		{"lower case all_proxy", map[string]string{"all_proxy": "socks5://socks.corp:1080"}, edge, "socks5://socks.corp:1080"},
		{"HTTPS_PROXY before ALL_PROXY", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "ALL_PROXY": "socks5://socks.corp:1080"}, edge, "http://proxy.corp:3128"},
		{"NO_PROXY domain", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": ".example.com"}, edge, ""},
		{"NO_PROXY other domain", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "other.example.org"}, edge, "http://proxy.corp:3128"},
		{"no_proxy exact host", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "no_proxy": "edge.example.com"}, edge, ""},
		{"NO_PROXY host and port", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "edge.example.com:4040"}, edge, ""},
		{"NO_PROXY other port", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "edge.example.com:443"}, edge, "http://proxy.corp:3128"},
		{"NO_PROXY star", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "*"}, edge, ""},
		{"NO_PROXY CIDR", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "192.0.2.0/24"}, "192.0.2.7:4040", ""},
		{"an IP edge outside NO_PROXY", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "192.0.2.0/24"}, "198.51.100.7:4040", "http://proxy.corp:3128"},
		{"never localhost", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "localhost:4040", ""},
		{"never loopback", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "127.0.0.1:4040", ""},
		{"never IPv6 loopback", map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"}, "[::1]:4040", ""},
		{"empty environment", map[string]string{}, edge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := defaultDialOptions()
			require.NoError(t, o.setupProxy(env(tc.env)))
			if o.proxyFor == nil {
				require.Empty(t, tc.want)
				return
			}
			require.Equal(t, tc.want, proxyName(o.proxyFor(tc.addr)))
		})
	}
}

func TestProxyCredentialsFromEnvironmentAreKept(t *testing.T) {
	o := defaultDialOptions()
	require.NoError(t, o.setupProxy(env(map[string]string{"HTTPS_PROXY": "http://alice:s3cret@proxy.corp:3128"})))
	u := o.proxyFor("edge.example.com:4040")
	pw, _ := u.User.Password()
	require.Equal(t, []string{"alice", "s3cret"}, []string{u.User.Username(), pw})
	require.Equal(t, "http://proxy.corp:3128", proxyName(u), "the name shown never carries the credentials")
}

func TestInvalidProxyIsRefusedWithoutItsCredentials(t *testing.T) {
	for name, getenv := range map[string]func(string) string{
		"scheme":     env(map[string]string{"HTTPS_PROXY": "ftp://alice:s3cret@proxy.corp:21"}),
		"not a URL":  env(map[string]string{"HTTPS_PROXY": "http://alice:s3cret@proxy.corp:3128/%zz"}),
		"bad port":   env(map[string]string{"https_proxy": "http://alice:s3cret@proxy.corp:badport"}),
		"all_proxy":  env(map[string]string{"ALL_PROXY": "gopher://alice:s3cret@proxy.corp"}),
		"empty host": env(map[string]string{"HTTPS_PROXY": "socks5://alice:s3cret@:1080"}),
	} {
		t.Run(name, func(t *testing.T) {
			o := defaultDialOptions()
			err := o.setupProxy(getenv)
			require.ErrorIs(t, err, ErrInvalid)
			require.NotContains(t, err.Error(), "s3cret")
			require.Regexp(t, "(?i)the proxy of (https|all)_proxy", err.Error())
		})
	}
	for _, raw := range []string{"ftp://proxy.corp:21", "http://", "socks4://proxy.corp:1080"} {
		u, err := url.Parse(raw)
		require.NoError(t, err)
		_, err = Dial(ctxT(t), "edge.example.com:4040", WithProxy(u))
		require.ErrorIs(t, err, ErrInvalid, raw)
	}
}

// TestExplicitProxyAndDialerChoices: WithProxy applies to every edge, loopback included, and
// whatever the environment says; WithProxy(nil) and WithDialer ignore the environment;
// WithDialer with a proxy is refused.
func TestExplicitProxyAndDialerChoices(t *testing.T) {
	corp := env(map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "*"})
	p, _ := url.Parse("socks5h://socks.corp:1080")

	o := defaultDialOptions()
	WithProxy(p)(&o)
	require.NoError(t, o.setupProxy(corp))
	require.Equal(t, "socks5h://socks.corp:1080", proxyName(o.proxyFor("127.0.0.1:4040")))

	o = defaultDialOptions()
	WithProxy(nil)(&o)
	require.NoError(t, o.setupProxy(env(map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"})))
	require.Nil(t, o.proxyFor)

	o = defaultDialOptions()
	WithDialer((&net.Dialer{}).DialContext)(&o)
	require.NoError(t, o.setupProxy(env(map[string]string{"HTTPS_PROXY": "http://proxy.corp:3128"})))
	require.Nil(t, o.proxyFor, "a dialer of one's own reaches the edge itself")

	_, err := Dial(ctxT(t), "edge.example.com:4040", WithDialer((&net.Dialer{}).DialContext), WithProxy(p))
	require.ErrorIs(t, err, ErrInvalid)
}

// fakeProxy is an HTTP CONNECT proxy on loopback whose answer a test chooses; with answer
// nil it answers 200 and relays to the requested address.
type fakeProxy struct {
	t      *testing.T
	ln     net.Listener
	answer func(req *http.Request) string // the raw answer; "" relays
	wg     sync.WaitGroup

	mu    sync.Mutex
	reqs  []*http.Request
	conns []net.Conn
}

func startFakeProxy(t *testing.T, tlsCfg *tls.Config, answer func(*http.Request) string) *fakeProxy {
	p := &fakeProxy{t: t, ln: listenLoopback(t), answer: answer}
	if tlsCfg != nil {
		p.ln = tls.NewListener(p.ln, tlsCfg)
	}
	p.wg.Go(func() {
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = p.ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *fakeProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.reqs = append(p.reqs, req)
	p.mu.Unlock()
	if p.answer != nil {
		if a := p.answer(req); a != "" {
			_, _ = io.WriteString(c, a)
			_, _ = io.Copy(io.Discard, br) // until the client gives up
			return
		}
	}
	up, err := net.DialTimeout("tcp", req.Host, 5*time.Second)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	defer up.Close()
	_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(up, br); _ = up.(*net.TCPConn).CloseWrite() })
	_, _ = io.Copy(c, up)
	_ = c.Close()
	wg.Wait()
}

func (p *fakeProxy) requests() []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.reqs...)
}

func (p *fakeProxy) url(scheme, userinfo string) *url.URL {
	u, err := url.Parse(scheme + "://" + userinfo + p.ln.Addr().String())
	require.NoError(p.t, err)
	return u
}

// TestConnectorThroughHTTPProxy: with WithProxy, the control connection and the data
// connections of a TCP tunnel go through the proxy (one CONNECT each, with the Basic
// credentials of the URL), and both an HTTP and a TCP tunnel serve through the edge.
func TestConnectorThroughHTTPProxy(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(44300), BindHost: "127.0.0.1"}})
	p := startFakeProxy(t, nil, nil)
	sess := e.connect(WithProxy(p.url("http", "alice:s3cret@")))
	require.Equal(t, "http://"+p.ln.Addr().String(), sess.Proxy())

	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)
	code, body := e.get("app", "/hello")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "b /hello", body)

	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, func(c net.Conn) { _, _ = io.Copy(c, c) }))
	require.NoError(t, err)
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port())), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, "ping")
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "ping", string(got))

	require.Eventually(t, func() bool { return len(p.requests()) >= 2 }, 10*time.Second, 10*time.Millisecond,
		"the data connections go through the proxy too")
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	for _, r := range p.requests() {
		require.Equal(t, http.MethodConnect, r.Method)
		require.Equal(t, e.controlAddr, r.Host)
		require.Equal(t, want, r.Header.Get("Proxy-Authorization"))
	}
}

// TestConnectorThroughHTTPSProxy: an https:// proxy is spoken to over TLS, then CONNECT.
func TestConnectorThroughHTTPSProxy(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	ts := httptest.NewUnstartedServer(nil) // only for its certificate
	ts.StartTLS()
	cert := ts.TLS.Certificates[0]
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	ts.Close()
	p := startFakeProxy(t, &tls.Config{Certificates: []tls.Certificate{cert}}, nil)
	sess := e.connect(WithProxy(p.url("https", "")), withProxyTLS(&tls.Config{RootCAs: roots, ServerName: "example.com"}))
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(backend(t, "b").URL))
	require.NoError(t, err)
	code, body := e.get("app", "/x")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "b /x", body)
	require.Len(t, p.requests(), 1)
}

// dialThroughFake runs the CONNECT handshake to edge.example:4040 through p, bounded by d.
func dialThroughFake(t *testing.T, u *url.URL, d time.Duration) (net.Conn, time.Duration, error) {
	s := &Session{opts: defaultDialOptions()}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	c, err := s.dialEdge(ctx, "edge.example:4040", u)
	return c, time.Since(start), err
}

func TestConnectHandshake(t *testing.T) {
	t.Run("refusal names the proxy and its status line, not the credentials", func(t *testing.T) {
		p := startFakeProxy(t, nil, func(*http.Request) string {
			return "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"corp\"\r\nContent-Length: 0\r\n\r\n"
		})
		_, _, err := dialThroughFake(t, p.url("http", "alice:s3cret@"), 5*time.Second)
		require.Error(t, err)
		msg := err.Error()
		require.Contains(t, msg, "proxy http://"+p.ln.Addr().String())
		require.Contains(t, msg, `"HTTP/1.1 407 Proxy Authentication Required"`)
		require.Contains(t, msg, "wrong user or password")
		require.NotContains(t, msg, "s3cret")
		require.NotContains(t, msg, "alice")

		_, _, err = dialThroughFake(t, p.url("http", ""), 5*time.Second)
		require.ErrorContains(t, err, "it wants credentials")
	})
	t.Run("other refusals", func(t *testing.T) {
		p := startFakeProxy(t, nil, func(*http.Request) string { return "HTTP/1.0 403 Forbidden\r\n\r\n" })
		_, _, err := dialThroughFake(t, p.url("http", ""), 5*time.Second)
		require.ErrorContains(t, err, `refused CONNECT edge.example:4040 with "HTTP/1.0 403 Forbidden"`)
	})
	t.Run("bytes after the answer are the edge's", func(t *testing.T) {
		p := startFakeProxy(t, nil, func(*http.Request) string {
			return "HTTP/1.1 200 OK\r\nX-Note: early\r\n\r\nhello from the edge"
		})
		c, _, err := dialThroughFake(t, p.url("http", ""), 5*time.Second)
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, len("hello from the edge"))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, "hello from the edge", string(got))
		r := p.requests()[0]
		require.Equal(t, "edge.example:4040", r.Host)
		require.Equal(t, "edge.example:4040", r.RequestURI)
		require.Empty(t, r.Header.Get("Proxy-Authorization"))
	})
	t.Run("a header over the bound", func(t *testing.T) {
		p := startFakeProxy(t, nil, func(*http.Request) string {
			return "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 2*proxyHeaderMax) + "\r\n\r\n"
		})
		_, _, err := dialThroughFake(t, p.url("http", ""), 5*time.Second)
		require.ErrorContains(t, err, "header over 16384 bytes")
	})
	t.Run("a proxy that never answers is bounded by the dial's context", func(t *testing.T) {
		p := startFakeProxy(t, nil, func(*http.Request) string { return "HTTP/1.1 200 OK\r\n" }) // no end
		_, took, err := dialThroughFake(t, p.url("http", ""), 300*time.Millisecond)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, took, 3*time.Second)
	})
	t.Run("a proxy that hangs up", func(t *testing.T) {
		ln := listenLoopback(t)
		var wg sync.WaitGroup
		wg.Go(func() {
			c, err := ln.Accept()
			if err == nil {
				_, _ = http.ReadRequest(bufio.NewReader(c))
				_ = c.Close()
			}
		})
		defer wg.Wait()
		defer ln.Close()
		u, _ := url.Parse("http://" + ln.Addr().String())
		_, _, err := dialThroughFake(t, u, 5*time.Second)
		require.ErrorContains(t, err, "closed the connection before answering CONNECT edge.example:4040")
	})
	t.Run("an unreachable proxy", func(t *testing.T) {
		ln := listenLoopback(t)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		u, _ := url.Parse("http://" + addr)
		_, _, err := dialThroughFake(t, u, 5*time.Second)
		require.ErrorContains(t, err, "proxy http://"+addr)
		require.ErrorContains(t, err, "connection refused")
	})
}
