package tunnel

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/proxy"
)

// idleSweepInterval is how often the edge closes pooled streams idle for longer than
// ServerConfig.IdleStreamTimeout and lets the others drop their buffers.
const idleSweepInterval = 30 * time.Second

// proxyConfig is the data path's share of the configuration (package internal/proxy);
// NewServer adds the registry, the counters and the HTTPS redirect.
func (c *ServerConfig) proxyConfig() proxy.Config {
	return proxy.Config{
		Domain:              c.Domain,
		Logger:              c.Logger,
		OpenTimeout:         c.OpenTimeout,
		IdleStreamTimeout:   c.IdleStreamTimeout,
		RequestBodyMaxBytes: c.RequestBodyMaxBytes,
		RetryUnreadRequests: c.RetryUnreadRequests,
		TCPBindHost:         c.TCPBindHost,
		ListenTCP:           c.ListenTCP,

		// Negative (no limit) is zero to the proxy.
		RequestBodyTimeout:      max(c.RequestBodyTimeout, 0),
		RequestBodyMinRate:      max(c.RequestBodyMinRate, 0),
		RequestBodyMinRateGrace: c.RequestBodyMinRateGrace,
	}
}

// Handler returns the public HTTP ingress as an http.Handler: it routes each request by its
// Host header to a group and proxies it to one member. Tests can serve it with httptest.
func (s *Server) Handler() http.Handler { return s.ingress }

// ServePublic serves public HTTP on l until Shutdown or Close, and returns ErrServerClosed
// then. The public server has read-header and idle timeouts and a header size limit, so a
// slow client cannot hold others.
func (s *Server) ServePublic(l net.Listener) error {
	s.httpPort.CompareAndSwap(0, int32(portOf(l.Addr())))
	return s.serveHTTP(l, s.ingress)
}

// ServePublicTLS serves public HTTPS on l with ServerConfig.TLSConfig.
func (s *Server) ServePublicTLS(l net.Listener) error {
	if s.cfg.TLSConfig == nil {
		return errors.New("tunnel: ServePublicTLS needs ServerConfig.TLSConfig")
	}
	s.httpsPort.CompareAndSwap(0, int32(portOf(l.Addr())))
	return s.serveHTTP(tls.NewListener(l, s.cfg.TLSConfig), s.ingress)
}

// serveHTTP serves h on l with the public listeners' limits (read-header and idle timeouts,
// header size) until Shutdown or Close; Close waits for its connections' goroutines.
func (s *Server) serveHTTP(l net.Listener, h http.Handler) error {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          zap.NewStdLog(s.log.Named("http")),
		ConnState:         s.publicConns.track,
	}
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
