package tunnel

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/proxy"
)

// idleSweepInterval is at most how often the edge closes pooled streams idle for longer
// than ServerConfig.Timeouts.IdleStream and lets the others drop their buffers; see
// idleSweepEvery.
const idleSweepInterval = 30 * time.Second

// idleSweepEvery is how often the edge sweeps its pooled streams: every IdleStream, so a
// stream is closed at most about twice IdleStream after its last request (it is never
// reused after one). An idle stream is not free: one a cluster edge pools to another edge's
// member is an open stream of that member on its own edge, counted there against
// LoadBalancing.MaxConcurrentPerMember, in its active_streams and by its drain.
func idleSweepEvery(idle time.Duration) time.Duration {
	if idle <= 0 || idle > idleSweepInterval {
		return idleSweepInterval
	}
	return idle
}

// proxyConfig is the data path's share of the configuration (package internal/proxy);
// NewServer adds the registry, the counters and the HTTPS redirect.
func (c *ServerConfig) proxyConfig() proxy.Config {
	return proxy.Config{
		Domain:              c.Domain,
		Logger:              c.Logger,
		OpenTimeout:         c.Timeouts.Open,
		IdleStreamTimeout:   c.Timeouts.IdleStream,
		RequestBodyMaxBytes: c.RequestBody.MaxBytes,
		RetryUnreadRequests: c.LoadBalancing.RetryUnreadRequests,
		TrustedProxies:      c.Public.TrustedProxies,
		TCPBindHost:         c.TCP.BindHost,
		ListenTCP:           c.TCP.Listen,

		// HTTP/2 header blocks are decoded up to h2HeaderBlockBytes (edge_h2.go): the
		// proxy answers those over MaxHeaderBytes.
		MaxHeaderBytes: c.Public.MaxHeaderBytes,

		// Negative (no limit) is zero to the proxy.
		RequestBodyTimeout:      max(c.RequestBody.Timeout, 0),
		RequestBodyMinRate:      max(c.RequestBody.MinRate, 0),
		RequestBodyMinRateGrace: c.RequestBody.MinRateGrace,

		ResponseStallTimeout:  max(c.StalledResponses.Timeout, 0),
		StalledBytesPerConn:   max(c.StalledResponses.MaxBytesPerConn, 0),
		StalledBytesPerClient: max(c.StalledResponses.MaxBytesPerIP, 0),
		StalledBytes:          max(c.StalledResponses.MaxBytes, 0),
	}
}

// Handler returns the public HTTP ingress as an http.Handler: it routes each request by its
// Host header to a group and proxies it to one member. A request for a TLS passthrough
// tunnel's host is answered 421 (Misdirected Request): those are reached only through
// ServePublicTLS with the tunnel's name in the TLS ClientHello. With
// ServerConfig.Public.WebSocketPath set it also accepts connectors over WebSocket at that
// path of the edge's own domain, as ServePublicTLS does: an embedder serving it over TLS on
// a server of its own (which must let the handler hijack HTTP/1.1 connections, as net/http's
// does) gets connectors behind HTTPS-only proxies too. Tests can serve it with httptest. A
// server of the embedder's own lacks what ServePublic adds around it: the listener's limits,
// and the close of an HTTP/1.x connection after an answer that left its request body unread
// (without which net/http waits for that body with no deadline).
func (s *Server) Handler() http.Handler { return withConnectorWebSocket(s, s.ingress.GuardTLSRoutes()) }

// HTTP/2 limits of the public listeners: what one client connection may hold of the edge.
// Header sizes, the idle timeout and the TLS handshake's timeout are those of HTTP/1.1
// (ServerConfig.Public.MaxHeaderBytes, IdleTimeout, ReadHeaderTimeout).
const (
	// publicH2MaxStreams is the requests one HTTP/2 connection may have in flight; a client
	// opening more gets them refused (RST_STREAM REFUSED_STREAM).
	publicH2MaxStreams = 250
	// publicH2ConnWindow and publicH2StreamWindow bound the request body bytes the edge
	// buffers for one connection and for one of its requests, unread by the backend. A
	// stream's window is half the connection's, so that one stalled upload cannot stop the
	// others on the connection.
	publicH2ConnWindow   = 1 << 20
	publicH2StreamWindow = 512 << 10
	// publicH2MaxReadFrameSize is the largest frame the edge reads from a client.
	publicH2MaxReadFrameSize = 256 << 10
	// publicH2WriteByteTimeout closes a connection on which the edge could write nothing
	// for this long (a client that stopped reading).
	publicH2WriteByteTimeout = 30 * time.Second
)

// ServePublic serves public HTTP on l until Shutdown or Close, and returns ErrServerClosed
// then. The public server has read-header and idle timeouts and a header size limit, so a
// slow client cannot hold others. With ServerConfig.Public.H2C it also serves HTTP/2 with
// prior knowledge (h2c); without it, such a client is refused with an HTTP/2 GOAWAY
// (HTTP_1_1_REQUIRED). With ServerConfig.Public.WebSocketOnHTTP it accepts connectors over
// WebSocket too (PublicHTTP.WebSocketPath).
func (s *Server) ServePublic(l net.Listener) error {
	s.httpPort.CompareAndSwap(0, int32(portOf(l.Addr())))
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(s.cfg.Public.H2C)
	var h http.Handler = s.ingress.GuardTLSRoutes()
	if s.cfg.Public.WebSocketOnHTTP {
		h = s.Handler()
	}
	return s.serveHTTP(l, h, &p, 0, true)
}

// ServePublicTLS serves public HTTPS on l with ServerConfig.TLSConfig, offering HTTP/2 ("h2"
// in ALPN) unless ServerConfig.Public.DisableHTTP2: each handshake adds "h2" and "http/1.1",
// where missing, to a copy of the configuration it uses (the one TLSConfig.GetConfigForClient
// returns, or TLSConfig itself, as it is then: keys rotated with SetSessionTicketKeys take
// effect at once).
//
// It also carries the TLS passthrough tunnels (ProtoTLS): each connection's ClientHello is
// read first, reassembled from as many TLS records as the client spread it over (a
// ClientHello of at most 16 KiB, at most 20 KiB read, within
// ServerConfig.Public.ReadHeaderTimeout; a client that sends none in time is closed), and a
// connection whose server name is <subdomain>.<Domain> of a tls pool goes, still encrypted
// and its records unchanged, to one of its members, as a TCP connection would. Every other
// connection is served here as if nothing had been read: TLS terminated with TLSConfig,
// routed by Host (an unknown name gets 404, as before); a handshake naming a tls pool that
// reaches this server anyway fails, never terminated with the edge's certificate.
//
// With ServerConfig.Public.WebSocketPath it also accepts connectors over WebSocket at that
// path on the edge's own domain (PublicHTTP.WebSocketPath says which requests).
func (s *Server) ServePublicTLS(l net.Listener) error {
	if s.cfg.TLSConfig == nil {
		return errors.New("tunnel: ServePublicTLS needs ServerConfig.TLSConfig")
	}
	s.httpsPort.CompareAndSwap(0, int32(portOf(l.Addr())))
	var p http.Protocols
	p.SetHTTP1(true)
	cfg := refusePassthroughNames(s.cfg.TLSConfig, s.ingress.PassthroughName)
	if !s.cfg.Public.DisableHTTP2 {
		p.SetHTTP2(true)
		cfg = withALPN(cfg, "h2", "http/1.1")
	}
	pl := s.ingress.PassthroughListener(l, proxy.PassthroughOptions{HelloTimeout: s.cfg.Public.ReadHeaderTimeout, Go: s.spawn})
	return s.serveHTTP(tls.NewListener(pl, cfg), s.Handler(), &p, 0, true)
}

// refusePassthroughNames returns the configuration to serve the embedder's cfg with on the
// public HTTPS listener: the same, but a handshake whose server name is a TLS passthrough
// tunnel's fails. The router in front (PassthroughListener) carries such connections to
// their members; one that reached this server anyway (a ClientHello the router could not
// read within its bounds, a pool registered while it read) must not have its TLS, and the
// client's plaintext after it, terminated at the edge with the edge's certificate. As
// withALPN, it keeps cfg itself for the handshakes: what cfg's GetConfigForClient returns,
// or cfg as it is then.
func refusePassthroughNames(cfg *tls.Config, passthrough func(serverName string) bool) *tls.Config {
	pick := cfg.GetConfigForClient
	w := cfg.Clone()
	w.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if passthrough(hello.ServerName) {
			return nil, fmt.Errorf("tunnel: %s is a TLS passthrough tunnel: its TLS is never terminated at the edge", hello.ServerName)
		}
		if pick != nil {
			if c, err := pick(hello); err != nil || c != nil {
				return c, err
			}
		}
		return cfg, nil
	}
	return w
}

// withALPN returns the configuration to serve the embedder's cfg with, offering protos in
// ALPN, in that order of preference, before the protocols cfg already names. It does not
// copy cfg once and for all, which would lose what the embedder changes while the server
// runs (SetSessionTicketKeys) and the configuration its GetConfigForClient picks per client:
// each handshake takes the configuration cfg's GetConfigForClient returns, or cfg itself,
// as it is then, and a copy of it with protos added only when it lacks one. The session
// ticket keys set on that configuration (copied with it) encrypt and decrypt the tickets; a
// configuration without keys of its own gets the automatic ones of the returned wrapper, as
// a handshake under cfg's GetConfigForClient would from cfg.
func withALPN(cfg *tls.Config, protos ...string) *tls.Config {
	pick := cfg.GetConfigForClient
	w := cfg.Clone() // what crypto/tls reads before GetConfigForClient (ECH keys)
	w.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		base := cfg
		if pick != nil {
			c, err := pick(hello)
			if err != nil {
				return nil, err
			}
			if c != nil {
				base = c
			}
		}
		var add []string
		for _, p := range protos {
			if !slices.Contains(base.NextProtos, p) {
				add = append(add, p)
			}
		}
		if len(add) == 0 {
			return base, nil
		}
		c := base.Clone()
		c.NextProtos = append(add, c.NextProtos...)
		return c, nil
	}
	return w
}

// serveHTTP serves h on l with the public listeners' limits (read-header and idle timeouts,
// header size, HTTP/2 limits) until Shutdown or Close, speaking protos (nil: net/http's
// default); Close waits for its connections' goroutines. readTimeout, when positive, bounds
// each whole request, body included (the admin listener); a public upload is bounded by
// the proxy's deadlines on each read instead. On every listener, an HTTP/1.x connection is
// closed after an answer that left its request body unread (closeAfterAbandonedBody), and
// HTTP/2 never advertises extended CONNECT (edge_h2.go). A public listener (public) decodes
// HTTP/2 header blocks up to h2HeaderBlockBytes, its handler (the proxy) answering those
// over MaxHeaderBytes 431; any other decodes them up to MaxHeaderBytes, as HTTP/1.1.
func (s *Server) serveHTTP(l net.Listener, h http.Handler, protos *http.Protocols, readTimeout time.Duration, public bool) error {
	hs := &http.Server{
		Handler:           closeAfterAbandonedBody(h, s.cfg.unreadBodyLinger()),
		ReadHeaderTimeout: s.cfg.Public.ReadHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       s.cfg.Public.IdleTimeout,
		MaxHeaderBytes:    s.cfg.Public.MaxHeaderBytes,
		ErrorLog:          zap.NewStdLog(s.log.Named("http")),
		ConnState:         s.publicConns.track,
		Protocols:         protos,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          publicH2MaxStreams,
			MaxReadFrameSize:              publicH2MaxReadFrameSize,
			MaxReceiveBufferPerConnection: publicH2ConnWindow,
			MaxReceiveBufferPerStream:     publicH2StreamWindow,
			WriteByteTimeout:              publicH2WriteByteTimeout,
		},
	}
	h2HeaderBytes := 0
	if public {
		h2HeaderBytes = h2HeaderBlockBytes(s.cfg.Public.MaxHeaderBytes)
	}
	setupHTTP2(hs, h2HeaderBytes)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerClosed
	}
	s.httpSrvs[hs] = struct{}{}
	s.mu.Unlock()
	err := hs.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return ErrServerClosed
	}
	return err
}

func portOf(a net.Addr) int {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.Port
	}
	_, p, err := net.SplitHostPort(a.String())
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// connCount counts live connections and lets Close wait for none.
type connCount struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed while n == 0
}

func (c *connCount) track(_ net.Conn, st http.ConnState) {
	if st == http.StateActive || st == http.StateIdle {
		// Twice per request on a keep-alive connection: nothing to count, and no lock
		// shared by every connection to take.
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.zero == nil {
		c.zero = make(chan struct{})
		close(c.zero)
	}
	switch st {
	case http.StateNew:
		if c.n == 0 {
			c.zero = make(chan struct{})
		}
		c.n++
	case http.StateClosed, http.StateHijacked:
		c.n--
		if c.n == 0 {
			close(c.zero)
		}
	}
}

// idle returns a channel closed once no tracked connection is left.
func (c *connCount) idle() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.zero == nil {
		c.zero = make(chan struct{})
		close(c.zero)
	}
	return c.zero
}
