package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wsconn"
)

// WithWebSocket makes the session reach the edge over a WebSocket at path (e.g.
// "/_warren/connect", the edge's ServerConfig.Public.WebSocketPath) on the edge's public
// HTTPS listener, instead of a TCP connection to its control listener: the address given
// to Dial or DialServers is then that listener's ("edge.example.com:443"). With WithTLS
// it is wss:// (TLS, HTTP/1.1 in ALPN, verified as WithTLS says); without, ws://, for an
// edge serving it on plain HTTP (ServerConfig.Public.WebSocketOnHTTP). The Host of the
// upgrade request is the address as given, so give the edge's own domain. Proxies apply as
// for TCP (WithProxy, HTTPS_PROXY): the WebSocket goes through a CONNECT or SOCKS5 tunnel.
// Over WebSocket the session opens no data connections (WithDataReadBuffer has no effect):
// its TCP tunnels' connections ride the session's streams. A path that does not begin with
// "/" makes Dial fail with ErrInvalid.
func WithWebSocket(path string) Option {
	return func(o *dialOptions) { o.wsPath, o.wsSet = path, true }
}

// Transport says how the session reaches the edge: TransportTCP, TransportWebSocket
// (WithWebSocket) or TransportQUIC (WithQUIC).
func (s *Session) Transport() string {
	switch {
	case s.opts.wsSet:
		return TransportWebSocket
	case s.opts.quic:
		return TransportQUIC
	}
	return TransportTCP
}

// openSession opens the session's multiplexer to the edge cand: yamux over a connection
// (openConn), or a QUIC connection.
func (s *Session) openSession(ctx context.Context, cand candidate) (mux.Session, error) {
	if s.opts.quic {
		return s.dialQUIC(ctx, cand)
	}
	raw, err := s.openConn(ctx, cand)
	if err != nil {
		return nil, err
	}
	m, err := mux.Client(raw, s.log)
	if err != nil {
		_ = raw.Close()
		return nil, err
	}
	return m, nil
}

// checkWebSocket refuses a WithWebSocket path the edge could not serve.
func (o *dialOptions) checkWebSocket() error {
	if o.wsSet && (!strings.HasPrefix(o.wsPath, "/") || strings.ContainsAny(o.wsPath, "?# ")) {
		return fmt.Errorf("tunnel: WithWebSocket(%q): the path must begin with \"/\" and hold no query, fragment or space: %w", o.wsPath, ErrInvalid)
	}
	return nil
}

// openConn opens the connection the session's yamux runs over to the edge cand: a TCP
// connection (TLS with WithTLS), or a WebSocket (WithWebSocket).
func (s *Session) openConn(ctx context.Context, cand candidate) (net.Conn, error) {
	raw, err := s.dialEdge(ctx, cand.addr, cand.proxy)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial %s: %w", cand, err)
	}
	scheme := "ws"
	if cfg := s.opts.tlsConfig; cfg != nil {
		cfg = cfg.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = cand.host // the name as given, also when an address of it is dialled
		}
		if s.opts.wsSet {
			cfg.NextProtos = []string{"http/1.1"} // the upgrade is HTTP/1.1's
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("tunnel: TLS handshake with %s: %w", cand, err)
		}
		raw, scheme = tc, "wss"
	}
	if !s.opts.wsSet {
		return raw, nil
	}
	c, err := upgradeWebSocket(ctx, raw, cand.server, s.opts.wsPath)
	if err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("tunnel: WebSocket %s://%s%s: %w", scheme, cand.server, s.opts.wsPath, err)
	}
	return c, nil
}

// upgradeWebSocket asks for a WebSocket at path on conn, an HTTP/1.1 connection (TLS or
// not) to host, within ctx, and returns it as a net.Conn.
func upgradeWebSocket(ctx context.Context, conn net.Conn, host, path string) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(pastTime) })
	c, err := wsconn.Client(conn, host, path, http.Header{"User-Agent": {"warren"}})
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return c, nil
}
