package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	xproxy "golang.org/x/net/proxy"
)

// A connector behind a proxy: its connections to the edge, the control connection and each
// data connection, are opened through an HTTP(S) proxy (CONNECT host:port) or a SOCKS5
// proxy, chosen by WithProxy or, by default, by the standard environment variables.

// WithProxy makes the session reach the edge through the proxy u: its control connection
// and each of its data connections, on every reconnect. The schemes are http:// (a CONNECT
// request to the proxy), https:// (the same, over TLS to the proxy itself, verified against
// the system roots), socks5:// and socks5h:// (both let the proxy resolve the edge's host
// name, as Go's net/http does); user:password@ in u is sent as the proxy's Basic
// credentials (HTTP) or its username and password (SOCKS5). Without a port, the scheme's
// default is used (80, 443, 1080). The proxy applies to every edge, NO_PROXY
// notwithstanding, and the session does not resolve the edges' names itself then: the proxy
// does (a network behind a proxy often cannot). WithProxy(nil) connects directly, whatever
// the environment says.
//
// Without WithProxy, the session takes its proxy from the environment the way Go's
// net/http does for an https:// URL of the edge (golang.org/x/net/http/httpproxy):
// HTTPS_PROXY (or https_proxy), else ALL_PROXY (or all_proxy), except for the edges that
// NO_PROXY (or no_proxy) names, and never for localhost or a loopback address. The
// environment is read once, by Dial or DialServers. This is what net/http's DefaultTransport
// and gRPC's client do by default, and what an operator behind a corporate proxy expects of a
// program that only needs the outside world: the connector then works where curl does. It
// changes nothing for an edge on the same machine (loopback) or in memory: a dialer set by
// WithDialer reaches the edge itself, so that session uses no proxy from the environment,
// and combining WithDialer with a non-nil WithProxy is refused (ErrInvalid).
//
// An invalid proxy (an unknown scheme, no host, an environment variable that is not a URL)
// makes Dial fail with an error wrapping ErrInvalid. A proxy that cannot be reached, refuses
// the credentials or refuses the edge's address fails the attempt with an error naming the
// proxy (scheme://host:port, never its credentials) and, for HTTP, its answer's status line;
// like any failed connection it is retried with the backoff delay after the session was up.
func WithProxy(u *url.URL) Option {
	return func(o *dialOptions) { o.proxy, o.proxySet = u, true }
}

// withProxyTLS sets the TLS configuration of the connection to an https:// proxy (tests:
// a proxy with a certificate of their own).
func withProxyTLS(cfg *tls.Config) Option { return func(o *dialOptions) { o.proxyTLS = cfg } }

// proxyHeaderMax bounds the header of a proxy's answer to CONNECT.
const proxyHeaderMax = 16 << 10

// setupProxy decides, once per session, how each edge address is reached: o.proxyFor
// returns the proxy for an edge address, or nil for a direct connection. A bad proxy fails
// here, so that it fails Dial instead of every attempt.
func (o *dialOptions) setupProxy(getenv func(string) string) error {
	switch {
	case o.customDialer:
		if o.proxySet && o.proxy != nil {
			return fmt.Errorf("tunnel: WithProxy cannot be combined with WithDialer (the dialer reaches the edge itself): %w", ErrInvalid)
		}
		o.proxyFor = nil
	case o.proxySet && o.proxy == nil, o.quic:
		o.proxyFor = nil // QUIC is UDP, which proxies do not carry
	case o.proxySet:
		p, err := checkProxyURL(o.proxy, "WithProxy")
		if err != nil {
			return err
		}
		o.proxyFor = func(string) *url.URL { return p }
	default:
		f, err := envProxy(getenv)
		if err != nil {
			return err
		}
		o.proxyFor = f
	}
	return nil
}

// envProxy returns the proxy choice of the environment getenv reads (see WithProxy), or nil
// when it names no proxy. The proxy's value is checked here, more strictly than net/http
// does (which takes a value it cannot parse for no proxy at all): a typo in it fails Dial
// instead of silently connecting directly.
func envProxy(getenv func(string) string) (func(addr string) *url.URL, error) {
	anyOf := func(names ...string) (string, string) {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return n, v
			}
		}
		return "", ""
	}
	name, value := anyOf("HTTPS_PROXY", "https_proxy")
	if value == "" {
		name, value = anyOf("ALL_PROXY", "all_proxy")
	}
	if value == "" {
		return nil, nil
	}
	raw := value
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw // as net/http reads "proxy.example:3128"
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url's message quotes the value, credentials and all.
		return nil, fmt.Errorf("tunnel: the proxy of %s is not a valid URL (want e.g. http://proxy.example:3128): %w", name, ErrInvalid)
	}
	if u, err = checkProxyURL(u, name); err != nil {
		return nil, err
	}
	_, noProxy := anyOf("NO_PROXY", "no_proxy")
	exempt := parseNoProxy(noProxy)
	return func(addr string) *url.URL {
		if exempt(addr) {
			return nil
		}
		return u
	}, nil
}

// parseNoProxy returns whether NO_PROXY's value v exempts an edge address (host:port), by
// the rules of net/http's ProxyFromEnvironment (golang.org/x/net/http/httpproxy): localhost
// and loopback addresses always; "*" every address; an IP address or a CIDR prefix the
// addresses it names; "example.com" that name and its subdomains, ".example.com" its
// subdomains only... and the name too, as httpproxy does; a port after an entry limits it to
// that port. The rules are written out here rather than taken from httpproxy, which links
// IDNA tables into every connector (a third of a megabyte) for host names that this matching
// compares as written, in lower case.
func parseNoProxy(v string) func(addr string) bool {
	type entry struct {
		prefix netip.Prefix // valid: an IP address or CIDR entry
		name   string       // a host name entry, lower case, without a leading dot
		port   string       // "": any port
	}
	var entries []entry
	all := false
	for _, f := range strings.Split(v, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		switch {
		case f == "":
			continue
		case f == "*":
			all = true
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			entries = append(entries, entry{prefix: p})
			continue
		}
		host, port := f, ""
		if h, p, err := net.SplitHostPort(f); err == nil {
			host, port = h, p
		}
		if a, err := netip.ParseAddr(host); err == nil {
			entries = append(entries, entry{prefix: netip.PrefixFrom(a, a.BitLen()), port: port})
			continue
		}
		entries = append(entries, entry{name: strings.TrimPrefix(host, "."), port: port})
	}
	return func(addr string) bool {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		host = strings.ToLower(host)
		ip, ipErr := netip.ParseAddr(host)
		if host == "localhost" || (ipErr == nil && ip.IsLoopback()) || all {
			return true
		}
		for _, e := range entries {
			if e.port != "" && e.port != port {
				continue
			}
			switch {
			case e.prefix.IsValid():
				if ipErr == nil && e.prefix.Contains(ip.Unmap()) {
					return true
				}
			case host == e.name || strings.HasSuffix(host, "."+e.name):
				return true
			}
		}
		return false
	}
}

// checkProxyURL checks that u is a proxy the session can use, and returns it with the
// scheme's default port when it has none. from names where it came from, for the error.
func checkProxyURL(u *url.URL, from string) (*url.URL, error) {
	var port string
	switch u.Scheme {
	case "http":
		port = "80"
	case "https":
		port = "443"
	case "socks5", "socks5h":
		port = "1080"
	default:
		return nil, fmt.Errorf("tunnel: the proxy of %s has the scheme %q; use http, https, socks5 or socks5h: %w", from, u.Scheme, ErrInvalid)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("tunnel: the proxy of %s has no host: %w", from, ErrInvalid)
	}
	if u.Port() != "" {
		return u, nil
	}
	p := *u
	p.Host = net.JoinHostPort(u.Hostname(), port)
	return &p, nil
}

// proxyName names the proxy u in logs, errors and status: scheme://host:port, without its
// credentials.
func proxyName(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// dialEdge opens a connection to the edge address addr, through proxy when it is not nil.
func (s *Session) dialEdge(ctx context.Context, addr string, proxy *url.URL) (net.Conn, error) {
	if proxy == nil {
		return s.opts.dial(ctx, "tcp", addr)
	}
	c, err := dialProxied(ctx, proxy, s.opts.dial, s.opts.proxyTLS, addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: proxy %s: %w", proxyName(proxy), err)
	}
	return c, nil
}

// dialFunc opens a network connection (net.Dialer.DialContext).
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// dialProxied opens a connection to addr through the proxy u, which dial reaches.
func dialProxied(ctx context.Context, u *url.URL, dial dialFunc, tlsCfg *tls.Config, addr string) (net.Conn, error) {
	conn, err := dial(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	var c net.Conn
	switch u.Scheme {
	case "socks5", "socks5h":
		err = socksConnect(ctx, conn, u, addr)
		c = conn
	case "https":
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if tlsCfg != nil {
			cfg = tlsCfg.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(conn, cfg)
		if err = tc.HandshakeContext(ctx); err != nil {
			err = fmt.Errorf("TLS handshake: %w", err)
			break
		}
		c, err = httpConnect(ctx, tc, u, addr)
	default:
		c, err = httpConnect(ctx, conn, u, addr)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return c, nil
}

// socksConnect asks the SOCKS5 proxy on conn for a connection to addr (golang.org/x/net's
// client: RFC 1928, with RFC 1929 username and password when u has them). The connection
// stays the plain one dialled, so that it can still be tuned as TCP.
func socksConnect(ctx context.Context, conn net.Conn, u *url.URL, addr string) error {
	d, err := xproxy.FromURL(u, xproxy.Direct)
	if err != nil {
		return err
	}
	sd, ok := d.(interface {
		DialWithConn(ctx context.Context, c net.Conn, network, address string) (net.Addr, error)
	})
	if !ok {
		return fmt.Errorf("golang.org/x/net/proxy's SOCKS5 dialer cannot connect over a connection of its caller's")
	}
	_, err = sd.DialWithConn(ctx, conn, "tcp", addr)
	return err
}

// httpConnect asks the HTTP proxy on conn for a tunnel to addr (CONNECT addr), with u's
// credentials as Basic Proxy-Authorization. The exchange is bounded by ctx and by
// proxyHeaderMax; an answer other than 2xx is an error quoting its status line.
func httpConnect(ctx context.Context, conn net.Conn, u *url.URL, addr string) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(pastTime) })
	defer stop()
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: addr}, Host: addr,
		Header: http.Header{"User-Agent": {"warren"}}}
	if u.User != nil {
		pw, _ := u.User.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + pw))
		req.Header.Set("Proxy-Authorization", "Basic "+cred)
	}
	fail := func(err error) (net.Conn, error) {
		dl, ok := ctx.Deadline()
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		case ok && !time.Now().Before(dl): // the connection's deadline, a moment before ctx's
			err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
		}
		return nil, err
	}
	if err := req.Write(conn); err != nil {
		return fail(fmt.Errorf("sending CONNECT: %w", err))
	}
	lr := &io.LimitedReader{R: conn, N: proxyHeaderMax}
	br := bufio.NewReader(lr)
	resp, err := http.ReadResponse(br, req)
	switch {
	case err != nil && lr.N == 0:
		return fail(fmt.Errorf("answered CONNECT %s with a header over %d bytes", addr, proxyHeaderMax))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fail(fmt.Errorf("closed the connection before answering CONNECT %s", addr))
	case err != nil:
		return fail(fmt.Errorf("reading the answer to CONNECT %s: %w", addr, err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, connectRefused(resp, u.User != nil, addr)
	}
	if !stop() {
		return fail(errors.New("CONNECT answered too late"))
	}
	_ = conn.SetDeadline(time.Time{})
	if n := br.Buffered(); n > 0 {
		// Bytes the proxy sent past its answer are the edge's: hand them on first.
		head, _ := br.Peek(n)
		return &prefixedConn{Conn: conn, r: io.MultiReader(bytes.NewReader(bytes.Clone(head)), conn)}, nil
	}
	return conn, nil
}

// connectRefused is the error of a proxy's answer other than 2xx to CONNECT addr: its status
// line, and what to do about a refusal of the credentials (withUser: the URL had some).
func connectRefused(resp *http.Response, withUser bool, addr string) error {
	// 407 is the standard refusal; some proxies (tinyproxy) answer 401 to wrong credentials.
	auth := resp.StatusCode == http.StatusProxyAuthRequired || resp.StatusCode == http.StatusUnauthorized
	hint := ""
	switch {
	case auth && withUser:
		hint = " (wrong user or password in the proxy URL)"
	case auth:
		hint = " (it wants credentials: user:password@ in the proxy URL)"
	}
	return fmt.Errorf("refused CONNECT %s with %q%s", addr, resp.Proto+" "+resp.Status, hint)
}

// prefixedConn reads r (what was read ahead, then the connection) instead of Conn.
type prefixedConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
