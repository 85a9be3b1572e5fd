package proxy

import (
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
)

// Forwarding headers. The edge tells a member's backend who its public client is, in
// X-Forwarded-For, X-Forwarded-Proto, X-Forwarded-Host, Forwarded (RFC 7239) and X-Real-IP,
// and it believes what a request says of its earlier hops only when the request comes from a
// trusted proxy (Config.TrustedProxies: a load balancer or CDN in front of the edge):
//
//   - From any other peer, the client's own values of all five are dropped: X-Forwarded-For
//     and X-Real-IP are the peer's address, X-Forwarded-Proto and X-Forwarded-Host the
//     edge's listener ("http" or "https") and the request's Host, and Forwarded one element
//     for=<peer>;proto=<proto>;host=<host>.
//   - From a trusted peer, its X-Forwarded-For and Forwarded are kept and the peer appended
//     (an element for Forwarded), its X-Forwarded-Proto and X-Forwarded-Host are kept (the
//     edge's own values when it sent none), and X-Real-IP is the right-most address of the
//     chain that is not a trusted proxy (nginx's real_ip_recursive): the chain is
//     X-Forwarded-For, or the for= nodes of Forwarded when the request has no
//     X-Forwarded-For; a node that is not an address ("unknown", an obfuscated "_name")
//     ends the walk at the trusted hop to its right; a chain of trusted proxies only gives
//     its left-most address.
//
// In Forwarded an IPv6 address is quoted and bracketed (for="[2001:db8::1]"), a value that is
// not a token is a quoted string, and a peer whose address is unknown (a listener that is not
// TCP) is for=unknown; such a peer is never trusted, and gets no X-Forwarded-For or
// X-Real-IP. Headers whose names differ from these only by underscores (X_Real_IP, which
// some CGI gateways read as X-Real-IP) are dropped.
//
// Other headers that only a proxy may set, and that frameworks believe as such, are dropped
// from any peer but a trusted proxy and kept from one (proxyOwned): the scheme
// (X-Forwarded-Ssl: on makes Rack's request HTTPS), the port, the client's address as CDNs
// name it, the original URL (IIS, Symfony). The edge sets none of them itself, as nginx,
// Caddy and Envoy by default do not: the backend learns the scheme from X-Forwarded-Proto and
// Forwarded, the port from the Host, and the edge's listener port is not the public one
// behind a port mapping or a load balancer. Underscore look-alikes of these go too.
//
// Every request also carries the edge's Via element (RFC 9110 §7.6.3), "<version> warren",
// where version is that of the request the edge received ("1.1"; "2.0" from an HTTP/2
// client), appended to the Via the request came with (a trace of the proxies it passed,
// believed by no one, so kept from any peer). The pseudonym names no host or version of the
// edge. Responses get none (a gateway MAY add one; nothing needs it).

// Names of the forwarding headers, canonical.
const (
	hdrForwarded       = "Forwarded"
	hdrXForwardedFor   = "X-Forwarded-For"
	hdrXForwardedHost  = "X-Forwarded-Host"
	hdrXForwardedProto = "X-Forwarded-Proto"
	hdrXRealIP         = "X-Real-Ip"
	hdrVia             = "Via"
)

// viaPseudonym names the edge in Via: no host name or version that would tell a backend, or
// anyone it echoes headers to, more than that a Warren edge passed the request on.
const viaPseudonym = "warren"

// proxyOwned reports whether name (canonical) is a header only a proxy may set, other than
// those the edge sets itself: it is dropped from a peer that is no trusted proxy. A switch
// on the name: every request's every header goes through it.
func proxyOwned(name string) bool {
	switch name {
	case "X-Forwarded-Port", "X-Forwarded-Scheme", "X-Forwarded-Ssl", "Front-End-Https",
		"X-Forwarded-Protocol", "X-Url-Scheme", "X-Forwarded-Prefix", "X-Forwarded-Server",
		"X-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip",
		"X-Cluster-Client-Ip", "Client-Ip", "X-Original-Forwarded-For",
		"X-Original-Url", "X-Rewrite-Url":
		return true
	}
	return false
}

// trustedProxies are the prefixes of the proxies whose forwarding headers the edge believes.
type trustedProxies []netip.Prefix

// newTrustedProxies returns prefixes masked, without invalid ones, IPv4-mapped IPv6 prefixes
// as IPv4 (peer addresses are compared unmapped).
func newTrustedProxies(prefixes []netip.Prefix) trustedProxies {
	var out trustedProxies
	for _, p := range prefixes {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() {
			if p.Bits() < 96 {
				// Covers more than the IPv4-mapped range: keep it as written.
				out = append(out, p.Masked())
				continue
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}

// contains reports whether a (unmapped, without zone) is a trusted proxy's address.
func (t trustedProxies) contains(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerAddr is the address of a request's TCP peer, unmapped and without zone; the zero Addr
// when its RemoteAddr holds none.
func peerAddr(remote string) netip.Addr {
	a := clientAddr(remote)
	if !a.IsValid() {
		return a
	}
	return a.Unmap().WithZone("")
}

// setForwarding sets the forwarding headers of the request to the member (pr.Out) from the
// public request (pr.In) and its peer, as the comment at the top of this file says. The
// reverse proxy has already removed the public request's Forwarded and X-Forwarded-* from
// pr.Out.
func setForwarding(pr *httputil.ProxyRequest, trusted trustedProxies) {
	in, h := pr.In, pr.Out.Header
	peer := peerAddr(in.RemoteAddr)
	viaProxy := trusted.contains(peer)
	dropSpoofable(h, viaProxy)
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}

	// Every request pays for this: the peer's address is written out once, and the six
	// values share one backing array (each a full slice of one, so that appending to one
	// copies it rather than overwrite the next).
	peerStr := addrString(peer, in.RemoteAddr)
	vals := make([]string, 6)
	set := func(i int, name, v string) {
		if v == "" {
			h.Del(name)
			return
		}
		vals[i] = v
		h[name] = vals[i : i+1 : i+1]
	}

	var xff, fwd string
	if viaProxy {
		xff = joinList(in.Header.Values(hdrXForwardedFor))
		fwd = joinList(in.Header.Values(hdrForwarded))
	}
	xff = appendList(xff, peerStr)
	set(0, hdrXForwardedFor, xff)
	set(1, hdrForwarded, appendList(fwd, forwardedElementOf(peer, peerStr, proto, in.Host)))

	for i, kv := range [...]struct{ name, own string }{{hdrXForwardedProto, proto}, {hdrXForwardedHost, in.Host}} {
		if viaProxy && joinList(in.Header.Values(kv.name)) != "" {
			h[kv.name] = append([]string(nil), in.Header.Values(kv.name)...)
			continue
		}
		set(2+i, kv.name, kv.own)
	}

	client := peer
	if viaProxy {
		client = realClient(in.Header, peer, trusted)
	}
	switch {
	case client == peer && peerStr != "":
		set(4, hdrXRealIP, peerStr)
	case client.IsValid():
		set(4, hdrXRealIP, client.String())
	default:
		h.Del(hdrXRealIP)
	}

	via := viaElement(in)
	if prior := joinList(in.Header.Values(hdrVia)); prior != "" {
		via = prior + ", " + via
	}
	set(5, hdrVia, via)
}

// viaElement is the edge's Via element for a request it received as r.
func viaElement(r *http.Request) string {
	switch {
	case r.ProtoMajor == 1 && r.ProtoMinor == 1:
		return "1.1 " + viaPseudonym
	case r.ProtoMajor == 2:
		return "2.0 " + viaPseudonym
	case r.ProtoMajor == 1 && r.ProtoMinor == 0:
		return "1.0 " + viaPseudonym
	}
	return strconv.Itoa(r.ProtoMajor) + "." + strconv.Itoa(r.ProtoMinor) + " " + viaPseudonym
}

// realClient walks the forwarding chain of a request from the trusted proxy peer, right to
// left, past trusted proxies, and returns the first address that is not one (or the last
// address it could read).
func realClient(h http.Header, peer netip.Addr, trusted trustedProxies) netip.Addr {
	var chain []netip.Addr
	if xff := h.Values(hdrXForwardedFor); joinList(xff) != "" {
		for _, v := range xff {
			for n := range strings.SplitSeq(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					chain = append(chain, parseNode(n))
				}
			}
		}
	} else {
		chain = forwardedFor(h.Values(hdrForwarded))
	}
	addr := peer
	for i := len(chain) - 1; i >= 0; i-- {
		a := chain[i]
		if !a.IsValid() {
			break // "unknown", obfuscated, garbage: nothing further left is known
		}
		addr = a
		if !trusted.contains(a) {
			break
		}
	}
	return addr
}

// parseNode reads an address from a forwarding chain: "192.0.2.1", "2001:db8::1", with a
// port ("192.0.2.1:80", "[2001:db8::1]:80") or brackets. Anything else is the zero Addr.
func parseNode(s string) netip.Addr {
	s = strings.TrimSpace(s)
	var a netip.Addr
	if x, err := netip.ParseAddr(s); err == nil {
		a = x
	} else if ap, err := netip.ParseAddrPort(s); err == nil {
		a = ap.Addr()
	} else if inner, ok := strings.CutPrefix(s, "["); ok {
		if inner, ok = strings.CutSuffix(inner, "]"); ok {
			a, _ = netip.ParseAddr(inner)
		}
	}
	if !a.IsValid() {
		return a
	}
	return a.Unmap().WithZone("")
}

// addrString is a.String() ("" for the zero Addr), without allocating when remote, the
// "host:port" a was read from, already holds it written so (as a TCP peer's address does):
// the host part of remote is then returned.
func addrString(a netip.Addr, remote string) string {
	if !a.IsValid() {
		return ""
	}
	host := remote
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	var buf [64]byte
	if b := a.AppendTo(buf[:0]); string(b) == host {
		return host
	}
	return a.String()
}

// forwardedFor returns the for= node of each element of Forwarded header values, in order;
// an element without one, or whose node is not an address, gives the zero Addr.
func forwardedFor(values []string) []netip.Addr {
	var out []netip.Addr
	for _, v := range values {
		for _, elem := range splitQuoted(v, ',') {
			if strings.TrimSpace(elem) == "" {
				continue
			}
			var node netip.Addr
			for _, pair := range splitQuoted(elem, ';') {
				k, val, ok := strings.Cut(pair, "=")
				if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
					node = parseNode(unquote(strings.TrimSpace(val)))
					break
				}
			}
			out = append(out, node)
		}
	}
	return out
}

// splitQuoted splits s at sep outside quoted strings.
func splitQuoted(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// unquote returns the value of a quoted string, or s as it is when it is not one.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// forwardedElement is the edge's Forwarded element for its hop: its peer (for=, "unknown"
// when not known), the protocol of its listener and the Host it received.
func forwardedElement(peer netip.Addr, proto, host string) string {
	var peerStr string
	if peer.IsValid() {
		peerStr = peer.String()
	}
	return forwardedElementOf(peer, peerStr, proto, host)
}

// forwardedElementOf is forwardedElement with peer already written out (peerStr).
func forwardedElementOf(peer netip.Addr, peerStr, proto, host string) string {
	var b strings.Builder
	b.Grow(len("for=\"[]\";proto=;host=") + len(peerStr) + len(proto) + len(host) + 2)
	b.WriteString("for=")
	switch {
	case !peer.IsValid():
		b.WriteString("unknown")
	case peer.Is6():
		b.WriteString(`"[`)
		b.WriteString(peerStr)
		b.WriteString(`]"`)
	default:
		b.WriteString(peerStr)
	}
	b.WriteString(";proto=")
	b.WriteString(proto)
	if host != "" {
		b.WriteString(";host=")
		b.WriteString(forwardedValue(host))
	}
	return b.String()
}

// forwardedValue is v as a Forwarded value: a token as it is, anything else a quoted string.
func forwardedValue(v string) string {
	if isToken(v) {
		return v
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(v[i])
	}
	b.WriteByte('"')
	return b.String()
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// joinList joins the values of a list header, without empty ones.
func joinList(values []string) string {
	var out string
	for _, v := range values {
		if v = strings.TrimSpace(v); strings.Trim(v, ", \t") != "" {
			out = appendList(out, v)
		}
	}
	return out
}

// appendList appends v to the list header value list.
func appendList(list, v string) string {
	if list == "" {
		return v
	}
	return list + ", " + v
}

// dropSpoofable removes, in one pass over h, the proxy-owned headers (proxyOwned) unless the
// peer is a trusted proxy (viaProxy), and the headers whose names are a forwarding or
// proxy-owned header's with underscores for hyphens, from any peer: some gateways (CGI) read
// both as one.
func dropSpoofable(h http.Header, viaProxy bool) {
	for name := range h {
		if strings.IndexByte(name, '_') < 0 {
			if !viaProxy && proxyOwned(name) {
				delete(h, name)
			}
			continue
		}
		switch hyphened := http.CanonicalHeaderKey(strings.ReplaceAll(name, "_", "-")); hyphened {
		case hdrForwarded, hdrXForwardedFor, hdrXForwardedHost, hdrXForwardedProto, hdrXRealIP:
			delete(h, name)
		default:
			if proxyOwned(hyphened) {
				delete(h, name)
			}
		}
	}
}

// ClientOf returns the address of r's client as the edge believes it, as X-Real-IP says it
// to members: the TCP peer's, or, when the peer is one of the trusted proxies
// (ServerConfig.Public.TrustedProxies), the right-most address of its forwarding chain that
// is not a trusted proxy's. The zero Addr when r's RemoteAddr holds none.
func ClientOf(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer := peerAddr(r.RemoteAddr)
	t := newTrustedProxies(trusted)
	if !t.contains(peer) {
		return peer
	}
	return realClient(r.Header, peer, t).Unmap().WithZone("")
}
