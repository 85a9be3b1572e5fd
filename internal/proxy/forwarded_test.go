package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// forwardingNames are the headers the forwarding tests look at.
var forwardingNames = append([]string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded", "X-Real-Ip", "X_real_ip", "Via"},
	proxyOwnedNames...)

// proxyOwnedNames are the headers only a proxy may set that the edge does not set itself, as
// a client would send them.
var proxyOwnedNames = []string{"X-Forwarded-Port", "X-Forwarded-Scheme", "X-Forwarded-Ssl", "Front-End-Https",
	"X-Forwarded-Protocol", "X-Url-Scheme", "X-Forwarded-Prefix", "X-Forwarded-Server",
	"X-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Cluster-Client-Ip",
	"Client-Ip", "X-Original-Forwarded-For", "X-Original-Url", "X-Rewrite-Url", "X_forwarded_ssl"}

// headerEcho answers with the forwarding headers of its request, as JSON: name -> values.
var headerEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	out := map[string][]string{}
	for _, n := range forwardingNames {
		if v, ok := r.Header[n]; ok {
			out[n] = v
		}
	}
	_ = json.NewEncoder(w).Encode(out)
})

// forwardingEdge is the HTTP ingress, with trusted, in front of two members of headerEcho
// backends: "one" (HTTP/1.1) and "two" (h2c).
func forwardingEdge(t *testing.T, trusted ...string) *HTTP {
	t.Helper()
	var prefixes []netip.Prefix
	for _, p := range trusted {
		prefixes = append(prefixes, netip.MustParsePrefix(p))
	}
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second, TrustedProxies: prefixes})
	be := h2cBackend(t, headerEcho)
	for _, sub := range []string{"one", "two"} {
		c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
		tun := NewTunnel(context.Background(), sub, group.ProtoHTTP, c.edge, &c.key)
		if sub == "two" {
			tun.SetBackendProtocol(wire.BackendH2C)
		}
		t.Cleanup(tun.Close)
		_, err := reg.Join(group.JoinRequest{ID: sub, Proto: group.ProtoHTTP, Label: sub, Value: tun})
		require.NoError(t, err)
	}
	return h
}

// forwardedAs sends a request from remote with the headers hdr (name, value pairs) to each
// member of a forwardingEdge and returns the forwarding headers each backend saw (the same
// for both, which it checks).
func forwardedAs(t *testing.T, h http.Handler, remote string, tls bool, hdr ...string) map[string][]string {
	t.Helper()
	var got map[string][]string
	for _, sub := range []string{"one", "two"} {
		r := httptest.NewRequest(http.MethodGet, "http://"+sub+"."+testDomain+"/", nil)
		if tls {
			r = httptest.NewRequest(http.MethodGet, "https://"+sub+"."+testDomain+"/", nil)
		}
		r.RemoteAddr = remote
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		var seen map[string][]string
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &seen))
		for k, v := range seen {
			if k == "Forwarded" || k == "X-Forwarded-Host" {
				// The Host names the member's label: put the one of "one" in.
				for i := range v {
					v[i] = strings.ReplaceAll(v[i], sub+"."+testDomain, oneHost)
				}
			}
		}
		if got != nil {
			require.Equal(t, got, seen, "the HTTP/1.1 and h2c members are sent the same headers")
		}
		got = seen
	}
	return got
}

const oneHost = "one." + testDomain

// TestForwardingHeadersReplaceAnUntrustedClients: a client that is no trusted proxy sends
// its own X-Forwarded-For, Forwarded, X-Real-IP, X-Forwarded-Proto and -Host (and an
// underscore look-alike): the backends, HTTP/1.1 and h2c, see only the edge's values, with
// its real address.
func TestForwardingHeadersReplaceAnUntrustedClients(t *testing.T) {
	h := forwardingEdge(t, "10.0.0.0/8")
	spoof := []string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.6;proto=https", "X-Real-IP", "6.6.6.6",
		"X-Forwarded-Proto", "https", "X-Forwarded-Host", "bank.example", "X_Real_IP", "6.6.6.6"}
	got := forwardedAs(t, h, "192.0.2.10:40000", false, spoof...)
	require.Equal(t, map[string][]string{
		"X-Forwarded-For":   {"192.0.2.10"},
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {oneHost},
		"Forwarded":         {"for=192.0.2.10;proto=http;host=" + oneHost},
		"X-Real-Ip":         {"192.0.2.10"},
		"Via":               {"1.1 warren"},
	}, got)

	// IPv6: quoted and bracketed in Forwarded; HTTPS: proto=https.
	got = forwardedAs(t, h, "[2001:db8::1]:40000", true, spoof...)
	require.Equal(t, map[string][]string{
		"X-Forwarded-For":   {"2001:db8::1"},
		"X-Forwarded-Proto": {"https"},
		"X-Forwarded-Host":  {oneHost},
		"Forwarded":         {`for="[2001:db8::1]";proto=https;host=` + oneHost},
		"X-Real-Ip":         {"2001:db8::1"},
		"Via":               {"1.1 warren"},
	}, got)

	// A peer whose address is unknown (not TCP) is for=unknown, and has no X-Forwarded-For
	// or X-Real-IP.
	got = forwardedAs(t, h, "@", false, spoof...)
	require.Equal(t, map[string][]string{
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {oneHost},
		"Forwarded":         {"for=unknown;proto=http;host=" + oneHost},
		"Via":               {"1.1 warren"},
	}, got)
}

// TestTrustedProxiesKeepTheChain: from a trusted proxy, X-Forwarded-For and Forwarded are
// kept and the proxy appended, X-Forwarded-Proto and -Host kept, and X-Real-IP is the
// right-most address of the chain that is no trusted proxy.
func TestTrustedProxiesKeepTheChain(t *testing.T) {
	h := forwardingEdge(t, "10.0.0.0/8", "192.0.2.0/24")
	got := forwardedAs(t, h, "10.1.1.1:5000", false,
		"X-Forwarded-For", "198.51.100.7, 203.0.113.9", "X-Forwarded-For", "192.0.2.5",
		"Forwarded", `for=198.51.100.7, for=203.0.113.9;proto=https, for="192.0.2.5:8443"`,
		"X-Real-IP", "6.6.6.6", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "www.example.org")
	require.Equal(t, map[string][]string{
		"X-Forwarded-For":   {"198.51.100.7, 203.0.113.9, 192.0.2.5, 10.1.1.1"},
		"X-Forwarded-Proto": {"https"},
		"X-Forwarded-Host":  {"www.example.org"},
		"Forwarded":         {`for=198.51.100.7, for=203.0.113.9;proto=https, for="192.0.2.5:8443", for=10.1.1.1;proto=http;host=` + oneHost},
		"X-Real-Ip":         {"203.0.113.9"},
		"Via":               {"1.1 warren"},
	}, got)

	// A trusted proxy that sends nothing: the edge's own values, the proxy as the client.
	got = forwardedAs(t, h, "10.1.1.1:5000", false)
	require.Equal(t, map[string][]string{
		"X-Forwarded-For":   {"10.1.1.1"},
		"X-Forwarded-Proto": {"http"},
		"X-Forwarded-Host":  {oneHost},
		"Forwarded":         {"for=10.1.1.1;proto=http;host=" + oneHost},
		"X-Real-Ip":         {"10.1.1.1"},
		"Via":               {"1.1 warren"},
	}, got)

	// Forwarded alone makes the chain, IPv6 included.
	got = forwardedAs(t, h, "[::ffff:10.1.1.1]:5000", false, "Forwarded", `for="[2001:db8::7]:4711";proto=https`)
	require.Equal(t, `for="[2001:db8::7]:4711";proto=https, for=10.1.1.1;proto=http;host=`+oneHost, got["Forwarded"][0])
	require.Equal(t, []string{"2001:db8::7"}, got["X-Real-Ip"])
	require.Equal(t, []string{"10.1.1.1"}, got["X-Forwarded-For"])
}

// TestProxyOwnedHeadersOnlyFromATrustedProxy: the headers only a proxy may set (the scheme
// as X-Forwarded-Ssl: on or Front-End-Https, the port, the client's address as CDNs name it,
// the original URL) and their underscore look-alikes reach no backend, HTTP/1.1 or h2c, from
// a client that is no trusted proxy; from a trusted proxy they are kept (the look-alikes
// still go). Every request carries the edge's Via element, after the Via it came with.
func TestProxyOwnedHeadersOnlyFromATrustedProxy(t *testing.T) {
	h := forwardingEdge(t, "10.0.0.0/8")
	var sent []string
	for _, n := range proxyOwnedNames {
		sent = append(sent, n, "on")
	}
	sent = append(sent, "Via", "1.1 corp-proxy")

	got := forwardedAs(t, h, "192.0.2.10:40000", true, sent...)
	for _, n := range proxyOwnedNames {
		require.NotContains(t, got, n, "an untrusted client's %s reached the backend", n)
	}
	require.Equal(t, []string{"1.1 corp-proxy, 1.1 warren"}, got["Via"])
	require.Equal(t, []string{"https"}, got["X-Forwarded-Proto"])

	got = forwardedAs(t, h, "10.1.1.1:5000", true, sent...)
	for _, n := range proxyOwnedNames {
		if strings.Contains(n, "_") {
			require.NotContains(t, got, n)
			continue
		}
		require.Equal(t, []string{"on"}, got[n], "a trusted proxy's %s", n)
	}
	require.Equal(t, []string{"1.1 corp-proxy, 1.1 warren"}, got["Via"])

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	for _, v := range []struct {
		major, minor int
		want         string
	}{{1, 0, "1.0 warren"}, {1, 1, "1.1 warren"}, {2, 0, "2.0 warren"}, {3, 0, "3.0 warren"}} {
		r.ProtoMajor, r.ProtoMinor = v.major, v.minor
		require.Equal(t, v.want, viaElement(r))
	}
}

// TestRealIPChain: how X-Real-IP is read from a trusted proxy's chain.
func TestRealIPChain(t *testing.T) {
	trusted := newTrustedProxies([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("::ffff:192.168.0.0/112"), netip.MustParsePrefix("2001:db8:ffff::/48")})
	peer := netip.MustParseAddr("10.0.0.1")
	for _, c := range []struct {
		name, xff, fwd, want string
	}{
		{"no chain: the peer", "", "", "10.0.0.1"},
		{"right-most untrusted", "1.1.1.1, 2.2.2.2, 10.9.9.9", "", "2.2.2.2"},
		{"all trusted: the left-most", "10.3.3.3, 192.168.1.1", "", "10.3.3.3"},
		{"mapped prefix matches IPv4", "1.1.1.1, 192.168.1.1", "", "1.1.1.1"},
		{"ports and brackets", "[2001:db8::5]:80, 1.2.3.4:99", "", "1.2.3.4"},
		{"trusted IPv6 hop", "2001:db8::5, 2001:db8:ffff::1", "", "2001:db8::5"},
		{"unknown stops at the trusted hop right of it", "unknown, 10.2.2.2", "", "10.2.2.2"},
		{"garbage stops at once", "1.1.1.1, nonsense", "", "10.0.0.1"},
		{"X-Forwarded-For wins over Forwarded", "3.3.3.3", "for=4.4.4.4", "3.3.3.3"},
		{"Forwarded when alone", "", `for=5.5.5.5;by=10.0.0.9, For="[2001:db8::9]";proto=http`, "2001:db8::9"},
		{"obfuscated node", "", `for=_hidden, for=10.4.4.4`, "10.4.4.4"},
		{"element without for", "", `proto=https;by=1.2.3.4`, "10.0.0.1"},
		{"quoted comma", "", `for=7.7.7.7;host="a,b", for=10.5.5.5`, "7.7.7.7"},
	} {
		h := http.Header{}
		if c.xff != "" {
			h.Set("X-Forwarded-For", c.xff)
		}
		if c.fwd != "" {
			h.Set("Forwarded", c.fwd)
		}
		require.Equal(t, c.want, realClient(h, peer, trusted).String(), c.name)
	}
}

// TestForwardedValues: the edge's own Forwarded element, quoted as RFC 7239 wants.
func TestForwardedValues(t *testing.T) {
	require.Equal(t, "for=192.0.2.1;proto=http;host=example.com",
		forwardedElement(netip.MustParseAddr("192.0.2.1"), "http", "example.com"))
	require.Equal(t, `for="[2001:db8::1]";proto=https;host="example.com:8443"`,
		forwardedElement(netip.MustParseAddr("2001:db8::1"), "https", "example.com:8443"))
	require.Equal(t, `for=unknown;proto=http`, forwardedElement(netip.Addr{}, "http", ""))
	require.Equal(t, `"a\"b\\c"`, forwardedValue(`a"b\c`))
	require.Equal(t, `a"b\c`, unquote(forwardedValue(`a"b\c`)))
	require.Equal(t, netip.MustParseAddr("192.0.2.1"), peerAddr("[::ffff:192.0.2.1]:80"))
	require.Equal(t, netip.MustParseAddr("fe80::1"), peerAddr("[fe80::1%eth0]:80"))
}

// FuzzForwardedChain: reading any forwarding chain names an address; the edge's own element
// reads back as one element naming its peer, whatever Host it quotes.
func FuzzForwardedChain(f *testing.F) {
	f.Add("1.1.1.1, 10.0.0.2", `for="[2001:db8::1]:80";proto=https, for=_x`, "a.example:80")
	f.Add("", `for=7.7.7.7;host="a,b\"", for=10.5.5.5`, `x"y\z, for=6.6.6.6`)
	trusted := newTrustedProxies([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	peer := netip.MustParseAddr("10.0.0.1")
	f.Fuzz(func(t *testing.T, xff, fwd, host string) {
		h := http.Header{"X-Forwarded-For": {xff}, "Forwarded": {fwd}}
		require.True(t, realClient(h, peer, trusted).IsValid())
		elem := forwardedElement(netip.MustParseAddr("2001:db8::1"), "https", host)
		require.Equal(t, []netip.Addr{netip.MustParseAddr("2001:db8::1")}, forwardedFor([]string{elem}), elem)
		require.Equal(t, host, unquote(forwardedValue(host)))
	})
}

// TestH2HeaderLimit: an HTTP/2 request whose header list (RFC 7541 sizes, pseudo-headers
// included) is over MaxHeaderBytes and net/http's 320 bytes of slack gets 431 before
// anything else; one at the limit goes on (here to a 404: no such tunnel); HTTP/1.1 is
// left to net/http's own limit.
func TestH2HeaderLimit(t *testing.T) {
	h := NewHTTP(Config{Registry: group.NewRegistry(group.Config{}), Domain: testDomain, MaxHeaderBytes: 1000})
	for _, tc := range []struct {
		major int
		extra int
		want  int
	}{{2, 0, http.StatusNotFound}, {2, 1, http.StatusRequestHeaderFieldsTooLarge}, {1, 1, http.StatusNotFound}} {
		r := httptest.NewRequest(http.MethodGet, "http://app."+testDomain+"/", nil)
		r.ProtoMajor, r.ProtoMinor = tc.major, 0
		base := h2HeaderListSize(r) + len("X-Big") + 32
		r.Header.Set("X-Big", strings.Repeat("x", 1000+h2HeaderSlack-base+tc.extra))
		require.Equal(t, 1000+h2HeaderSlack+tc.extra, h2HeaderListSize(r))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, tc.want, w.Code, "HTTP/%d, %d over", tc.major, tc.extra)
	}
}
