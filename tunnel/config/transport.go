package config

import (
	"fmt"
	"net"
	"net/url"
	"path"
	"strings"

	"github.com/warren-tunnel/warren/tunnel"
)

// The connector's transports (transport in config.yml).
const (
	// TransportTCP (the default) reaches the edge's control port: server is "host:port".
	TransportTCP = tunnel.TransportTCP
	// TransportWebSocket reaches the edge over a WebSocket on its public HTTPS port
	// ([server] websocket_path of the edge): server is a URL,
	// "wss://edge.example.com/_warren/connect" (TLS; the tls mapping is optional and
	// tunes it) or ws:// (plain, for an edge that serves the path on plain HTTP behind a
	// proxy that terminates TLS: websocket_on_http).
	TransportWebSocket = tunnel.TransportWebSocket
	// TransportQUIC reaches the edge over QUIC on its UDP port ([server] quic_port of the
	// edge): server is "host:port" of that port. QUIC is always TLS: the tls mapping is
	// optional and tunes it (ca_path, server_name), and tls is on without it. proxy_url is
	// refused and the proxy environment variables are not read: proxies carry TCP, QUIC
	// is UDP. The program must link package tunnel/quic (the connector of examples/connector
	// does).
	TransportQUIC = tunnel.TransportQUIC
)

// quic reports whether the file's transport is quic.
func (c *Connector) quic() bool { return c.Transport == TransportQUIC }

// webSocket reports whether the file's transport is websocket.
func (c *Connector) webSocket() bool { return c.Transport == TransportWebSocket }

// edgeURL is a websocket server of the file, parsed: the address to dial and the path.
type edgeURL struct {
	addr, host, path string
	secure           bool
}

// parseEdgeURL parses s, a ws:// or wss:// URL of an edge, or says why it is not one.
func parseEdgeURL(s string) (edgeURL, string) {
	const eg = `, e.g. "wss://edge.example.com/_warren/connect"`
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
		return edgeURL{}, fmt.Sprintf("%q is not a ws:// or wss:// URL (transport: websocket)%s", s, eg)
	}
	switch {
	case u.User != nil:
		return edgeURL{}, "must not hold credentials: the connector authenticates with auth_token"
	case u.RawQuery != "" || u.Fragment != "":
		return edgeURL{}, fmt.Sprintf("%q must not have a query or a fragment%s", s, eg)
	case u.Path == "" || u.Path == "/":
		return edgeURL{}, fmt.Sprintf("%q has no path: give the edge's websocket_path%s", s, eg)
	case path.Clean(u.Path) != u.Path || strings.ContainsAny(u.Path, " "):
		return edgeURL{}, fmt.Sprintf("%q: the path is not clean%s", s, eg)
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"ws": "80", "wss": "443"}[u.Scheme]
	}
	e := edgeURL{addr: net.JoinHostPort(u.Hostname(), port), host: u.Hostname(), path: u.Path, secure: u.Scheme == "wss"}
	if p := hostPortProblem(e.addr); p != "" {
		return edgeURL{}, p
	}
	return e, ""
}

// edgeProblem says why s is not an edge of the file's transport, or returns "".
func (c *Connector) edgeProblem(s string) string {
	if c.webSocket() {
		_, p := parseEdgeURL(s)
		return p
	}
	if strings.Contains(s, "://") && c.quic() {
		return fmt.Sprintf("%q is a URL: with transport quic give the edge's QUIC address (its quic_port) as host:port", s)
	}
	if strings.Contains(s, "://") {
		return fmt.Sprintf("%q is a URL: with the default transport (tcp) give the edge's control address as host:port; a ws:// or wss:// URL needs transport: websocket", s)
	}
	return hostPortProblem(s)
}

// validateTransport checks transport and, for websocket, that the edges agree on one path
// and one scheme, and that the tls mapping agrees with it.
func (c *Connector) validateTransport(r *reporter) {
	switch c.Transport {
	case "", TransportTCP, TransportWebSocket:
	case TransportQUIC:
		c.validateQUIC(r)
		return
	default:
		r.add("transport", ErrInvalid, "%q is not a transport: use tcp (the default), websocket or quic", c.Transport)
		return
	}
	if !c.webSocket() {
		return
	}
	var first edgeURL
	for i, s := range c.Edges() {
		e, p := parseEdgeURL(s)
		if p != "" {
			return // reported with server or servers
		}
		if i == 0 {
			first = e
			continue
		}
		if e.path != first.path || e.secure != first.secure {
			r.add(indexKey("servers", i), ErrInvalid, "%q: every edge of the list must have the same scheme and path as the first (%s)", s, c.Edges()[0])
		}
	}
	if _, given := r.lines["tls"]; given && !c.TLS.Enabled && first.secure {
		r.add("tls.enabled", ErrInvalid, "a wss:// server is reached over TLS: leave tls.enabled out, or use a ws:// URL")
	}
	if c.TLS.Enabled && first.addr != "" && !first.secure {
		r.add("tls", ErrInvalid, "a ws:// server is plain HTTP: use a wss:// URL for TLS")
	}
}

// validateQUIC checks what goes with transport quic: TLS (always on), no proxy.
func (c *Connector) validateQUIC(r *reporter) {
	if _, given := r.lines["tls"]; given && !c.TLS.Enabled {
		r.add("tls.enabled", ErrInvalid, "QUIC is always TLS 1.3: leave tls.enabled out")
	}
	if c.ProxyURL != "" {
		r.add("proxy_url", ErrInvalid, "does not apply to transport quic (a proxy carries TCP; QUIC is UDP): remove it, or use transport tcp or websocket")
	}
}

// quicDefaults turns TLS on for transport quic when the file has no tls mapping. Called by
// parsing, before validation.
func (c *Connector) quicDefaults(tlsGiven bool) {
	if c.quic() && !tlsGiven {
		c.TLS.Enabled = true
	}
}

// wsDefaults applies what a websocket file's URLs imply: TLS for wss://, its server name
// the URL's host. Called by parsing, before validation.
func (c *Connector) wsDefaults(tlsGiven bool) {
	if !c.webSocket() || len(c.Edges()) == 0 {
		return
	}
	e, p := parseEdgeURL(c.Edges()[0])
	if p != "" {
		return
	}
	if e.secure && !tlsGiven {
		c.TLS.Enabled = true
	}
	if c.TLS.Enabled && c.TLS.ServerName == "" && c.Servers == nil {
		c.TLS.ServerName = e.host
	}
}

// dialEdges returns the addresses to dial and, for websocket, the option naming the path
// (for quic, tunnel.WithQUIC).
func (c *Connector) dialEdges() ([]string, []tunnel.Option) {
	if c.quic() {
		return c.Edges(), []tunnel.Option{tunnel.WithQUIC()}
	}
	if !c.webSocket() {
		if c.Servers != nil {
			return c.Servers, nil
		}
		return []string{c.Server}, nil
	}
	var addrs []string
	var path string
	for _, s := range c.Edges() {
		e, _ := parseEdgeURL(s)
		addrs = append(addrs, e.addr)
		path = e.path
	}
	return addrs, []tunnel.Option{tunnel.WithWebSocket(path)}
}
