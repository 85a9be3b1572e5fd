package tunnel

import (
	"net"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wsconn"
)

// Connectors over WebSocket (ServerConfig.Public.WebSocketPath, WithWebSocket).
//
// A connector behind a proxy or a CDN that passes only HTTPS reaches the edge on its public
// HTTPS listener: an HTTP/1.1 GET with "Upgrade: websocket" for the path, on the edge's own
// domain. The WebSocket's binary messages carry the byte stream a TCP control connection
// carries (yamux, the control stream, the data streams), so everything after the upgrade is
// the same code as for TCP: the Hello and its token, the pre-authentication caps and the
// throttles, resume, health, drain and retry. A session over WebSocket opens no data
// connections: its TCP tunnels' connections ride yamux streams inside the session, one
// WebSocket per connector, which is what a proxy or a CDN in between lets through most
// easily.

// The transports a connector session reaches the edge by (Session.Transport, and the
// edge's admin API and metrics).
const (
	// TransportTCP is a TCP connection, with or without TLS (and a net.Conn given to
	// Server.ServeConn, in memory included).
	TransportTCP = "tcp"
	// TransportWebSocket is a WebSocket on the edge's public HTTPS listener
	// (ServerConfig.Public.WebSocketPath).
	TransportWebSocket = "websocket"
)

// sessionCounts counts the connector sessions whose Hello was accepted, by transport.
type sessionCounts struct{ tcp, websocket, quic atomic.Int64 }

func (n *sessionCounts) of(transport string) *atomic.Int64 {
	switch transport {
	case TransportWebSocket:
		return &n.websocket
	case TransportQUIC:
		return &n.quic
	}
	return &n.tcp
}

// withConnectorWebSocket returns h answering the connectors' WebSocket upgrades at
// Public.WebSocketPath, or h itself when no path is set. The path is the edge's only on its
// own domain (the Host is ServerConfig.Domain, any port): a request for any other host, a
// tenant's subdomain above all, goes to h as before, whatever its path.
func withConnectorWebSocket(s *Server, h http.Handler) http.Handler {
	path := s.cfg.Public.WebSocketPath
	if path == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path || !isEdgeHost(r.Host, s.cfg.Domain) {
			h.ServeHTTP(w, r)
			return
		}
		acceptConnectorWebSocket(s, w, r)
	})
}

// isEdgeHost reports whether host (a Host header, with or without a port) is the edge's
// own domain.
func isEdgeHost(host, domain string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.EqualFold(strings.TrimSuffix(host, "."), domain)
}

// acceptConnectorWebSocket upgrades r to a WebSocket and serves a connector session over
// it, as Serve does a TCP connection. The connection takes its place among those not
// authenticated yet before the upgrade: over PreAuth.MaxConns or MaxConnsPerIP it is
// answered 503 and closed. PreAuth.HelloTimeout runs from the upgrade. The caps and the
// auth throttle count it against its client's address: the TCP peer's, or behind a trusted
// proxy (Public.TrustedProxies: a CDN, a load balancer) the client its forwarding headers
// name, so that the connectors behind one CDN do not share one budget.
func acceptConnectorWebSocket(s *Server, w http.ResponseWriter, r *http.Request) {
	client := proxy.ClientOf(r, s.cfg.Public.TrustedProxies)
	slot := s.preAuth.Acquire(throttle.KeyOfIP(client))
	if slot == nil {
		w.Header().Set("Connection", "close")
		http.Error(w, "too many connections are authenticating; try again later", http.StatusServiceUnavailable)
		return
	}
	ws, err := wsconn.Accept(w, r)
	if err != nil { // Accept answered the request (426, 400)
		slot.Release()
		return
	}
	var c net.Conn = ws
	if client.IsValid() {
		c = &peerConn{Conn: ws, remote: net.TCPAddrFromAddrPort(netip.AddrPortFrom(client, 0))}
	}
	by := time.Now().Add(s.cfg.PreAuth.HelloTimeout)
	if !s.spawn(func() { _ = serveSession(s, c, slot, by, TransportWebSocket) }) {
		slot.Release()
		_ = c.Close()
	}
}

// peerConn is a connection whose RemoteAddr is its client's, as the edge believes it.
type peerConn struct {
	net.Conn
	remote net.Addr
}

func (c *peerConn) RemoteAddr() net.Addr { return c.remote }

// validateWebSocket checks WebSocketPath and WebSocketOnHTTP (ServerConfig.Validate).
func (p PublicHTTP) validateWebSocket() []error {
	w := p.WebSocketPath
	switch {
	case w == "" && p.WebSocketOnHTTP:
		return []error{fieldErr("Public.WebSocketOnHTTP", "needs Public.WebSocketPath")}
	case w == "":
		return nil
	case !strings.HasPrefix(w, "/"):
		return []error{fieldErr("Public.WebSocketPath", "%q must begin with \"/\" (e.g. \"/_warren/connect\")", w)}
	case w == "/":
		return []error{fieldErr("Public.WebSocketPath", "\"/\" is not a path of its own: name one, e.g. \"/_warren/connect\"")}
	case strings.ContainsAny(w, "?# ") || strings.ContainsFunc(w, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return []error{fieldErr("Public.WebSocketPath", "%q holds a query, a fragment, a space or a control character", w)}
	case path.Clean(w) != w:
		return []error{fieldErr("Public.WebSocketPath", "%q is not a clean path (want %q)", w, path.Clean(w))}
	}
	return nil
}
