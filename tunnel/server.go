package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/admin"
	"github.com/warren-tunnel/warren/dispatch"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/webhook"
)

// ServerConfig configures an edge. The zero value is a working in-memory edge: public
// domain "localhost", no authentication, load balancing off, no TCP port range, and
// default timeouts. Every field is optional.
type ServerConfig struct {
	// Domain is the public domain: HTTP tunnels are reached at <subdomain>.<Domain>.
	// Default "localhost".
	Domain string
	// RegionID names this edge in alerts and metrics. Default "local".
	RegionID string
	// Logger receives the edge's logs. Default zap.NewNop().
	Logger *zap.Logger

	// Auth checks connector tokens. Nil accepts every connector, with or without a token.
	Auth Authenticator

	// LoadBalancing is the kill switch for groups: when false (the default) the group
	// fields of a registration are accepted and ignored, and every tunnel is solo.
	LoadBalancing bool
	// Strategy picks a member per request or connection: "least_streams" (default) or
	// "random".
	Strategy string
	// NewStrategy, when set, makes each new pool's dispatch strategy and Strategy is
	// ignored: an embedder's own dispatch.Strategy. It is called once per pool, so a
	// strategy may keep per-pool state (as LeastStreams keeps its tie rotation); Pick is
	// called concurrently and must not block.
	NewStrategy func() dispatch.Strategy

	// TCPPorts is the inclusive range TCP tunnels take their public port from. The zero
	// range refuses TCP tunnels with ErrNoPorts.
	TCPPorts group.PortRange
	// TCPBindHost is the address TCP tunnel listeners bind to. Default "" (all addresses).
	TCPBindHost string
	// ListenTCP, when set, replaces net.Listen for TCP tunnel ports (tests can hand out
	// in-memory listeners). It should return an error wrapping group.ErrPortUnavailable when
	// the port is taken, so the next port is tried.
	ListenTCP func(port int) (net.Listener, error)

	// ControlAddr, HTTPAddr, HTTPSAddr and AdminAddr are the listen addresses used by
	// ListenAndServe. ControlAddr defaults to ":4040"; an empty HTTPAddr, HTTPSAddr or
	// AdminAddr means that listener is off; HTTPSAddr needs TLSConfig.
	ControlAddr, HTTPAddr, HTTPSAddr, AdminAddr string
	// TLSConfig, when set, makes the control listener of ListenAndServe speak TLS and is
	// used for the public HTTPS listener.
	TLSConfig *tls.Config
	// PublicHTTPPort and PublicHTTPSPort are the ports written into tunnel URLs; 0 means
	// the port of the first public listener served (80 and 443 are left out of URLs).
	PublicHTTPPort, PublicHTTPSPort int

	// HelloTimeout bounds how long a new connector may take to open its control stream and
	// say hello. Default 10 s.
	HelloTimeout time.Duration
	// OpenTimeout bounds opening a data stream to a member, including its
	// acknowledgement (the connector dials its backend first). Default 10 s.
	OpenTimeout time.Duration
	// DrainTimeout bounds how long a draining member's open streams may run before it is
	// removed anyway. Default 30 s.
	DrainTimeout time.Duration
	// IdleStreamTimeout is how long an idle keep-alive stream to a member is kept for
	// reuse. It should be shorter than the backends' own keep-alive timeouts (5 s in Node
	// and Apache): a request sent on a stream whose backend connection has just closed
	// fails with 502 (it is never replayed), and a pooled stream older than this is never
	// used. Default 4 s.
	IdleStreamTimeout time.Duration
	// MaxTunnelsPerSession caps the tunnels one connector session may hold. Default 16.
	MaxTunnelsPerSession int
	// RegisterRate and RegisterBurst limit how fast one session may register tunnels
	// (token bucket: RegisterRate per second, bursts of RegisterBurst). Defaults 5/s and
	// MaxTunnelsPerSession; a flood gets ErrLimit rejections and costs the edge little.
	RegisterRate  float64
	RegisterBurst int
	// MaxConcurrentPerMember caps the in-flight requests and TCP connections of each member
	// (0: no cap). When every member of a group is at its cap, HTTP gets a 503 saying so and
	// TCP connections are closed: a flood on one group cannot take all of a connector's
	// capacity, nor the edge's.
	MaxConcurrentPerMember int
	// RetryUnreadRequests lets the edge send a bodyless HTTP request to one other member
	// when the first member's backend reset its TCP connection with the request still
	// unread (its connector says so with an unread notice: internal/wire/spec.md). The
	// kernel resets on close only when the application left received bytes unread, so
	// such a request never reached a handler; this saves the requests queued in a backend
	// that dies. Off by default: by default the edge picks another member only when
	// opening the stream fails, and never once a request byte was written.
	RetryUnreadRequests bool

	// ReadHeaderTimeout, IdleTimeout and MaxHeaderBytes protect the public HTTP listeners
	// from slow or hostile clients. Defaults 10 s, 120 s, 32 KiB.
	ReadHeaderTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                 int
	// RequestBodyMaxBytes caps public request bodies (413 above it); 0 means unlimited.
	RequestBodyMaxBytes int64

	// AlertWebhookURL is the operator's URL: the edge POSTs a group_zero_healthy alert
	// to it whenever any group reaches zero healthy members, in addition to the tenant URLs
	// the group's members registered. It is trusted (it may point at a private address).
	AlertWebhookURL string
	// AllowPrivateAlertWebhooks lets tenant alert URLs resolve to loopback, private and
	// link-local addresses. Off by default: a tenant must not make the edge POST inside its
	// own network.
	AllowPrivateAlertWebhooks bool
	// AlertTimeout bounds one alert POST. Default 5 s.
	AlertTimeout time.Duration

	// OnEvent, when set, receives every group membership and health change (joins,
	// leaves, health transitions, drains) in order per group, with no lock of the edge
	// held: it may read the edge (Registry, the admin API). The event holds copies. It
	// holds up the next event of its group, so it should return quickly.
	OnEvent func(group.Event)

	// AdminToken is the bearer token of the admin API: it sees every tunnel and group and
	// may read /metrics. Tenant tokens (checked by Auth, the same tokens the tenant's
	// connectors present) see only their own members. When AdminToken is empty and Auth is
	// nil, the API and /metrics are open and every caller gets the admin view.
	AdminToken string
	// Metrics is where the edge registers its Prometheus collector; /metrics serves it when
	// it is also a prometheus.Gatherer (a *prometheus.Registry is), and otherwise a private
	// registry holding only the edge's metrics. Nil means a fresh private registry. One
	// Registerer holds the metrics of one Server.
	Metrics prometheus.Registerer
	// EventKeepAlive is the interval of the keep-alive comment on a live group event stream.
	// Default 30 s.
	EventKeepAlive time.Duration
	// EventBuffer is how many events one live event subscriber may have pending; past it, the
	// subscriber misses events and is sent a "lagged" event. Default 64.
	EventBuffer int
}

func (c *ServerConfig) setDefaults() error {
	if c.Domain == "" {
		c.Domain = "localhost"
	}
	if c.RegionID == "" {
		c.RegionID = "local"
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.ControlAddr == "" {
		c.ControlAddr = ":4040"
	}
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = 10 * time.Second
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = 10 * time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.IdleStreamTimeout <= 0 {
		c.IdleStreamTimeout = 4 * time.Second
	}
	if c.MaxTunnelsPerSession <= 0 {
		c.MaxTunnelsPerSession = 16
	}
	if c.RegisterRate <= 0 {
		c.RegisterRate = 5
	}
	if c.RegisterBurst <= 0 {
		c.RegisterBurst = c.MaxTunnelsPerSession
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 32 << 10
	}
	if c.AlertTimeout <= 0 {
		c.AlertTimeout = webhook.DefaultTimeout
	}
	if c.EventKeepAlive <= 0 {
		c.EventKeepAlive = 30 * time.Second
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 64
	}
	if c.AlertWebhookURL != "" {
		if err := webhook.ValidateURL(c.AlertWebhookURL); err != nil {
			return fmt.Errorf("tunnel: alert webhook URL: %w", err)
		}
	}
	if c.NewStrategy == nil {
		if _, err := dispatch.New(c.Strategy); err != nil {
			return err
		}
		name := c.Strategy
		c.NewStrategy = func() dispatch.Strategy {
			st, _ := dispatch.New(name)
			return st
		}
	}
	if r := c.TCPPorts; r != (group.PortRange{}) && (r.Lo < 1 || r.Hi > 65535 || r.Lo > r.Hi) {
		return fmt.Errorf("tunnel: invalid TCP port range %d-%d", r.Lo, r.Hi)
	}
	return nil
}

// Server is an edge: it accepts connector sessions, keeps the routing table of groups, and
// carries public HTTP requests and TCP connections to the members. Create it with NewServer;
// serve with ListenAndServe, or piecewise with Serve (connectors), ServePublic (public HTTP),
// ServeAdmin and ServeConn; stop it with Shutdown or Close.
type Server struct {
	cfg      ServerConfig
	log      *zap.Logger
	ctx      context.Context // cancelled by Close: aborts every stream still open
	cancel   context.CancelFunc
	registry *group.Registry
	ingress  *proxy.HTTP // public HTTP (edge_ingress.go)
	tcp      *proxy.TCP  // public TCP: a listener per TCP group
	alerts   *alerter
	admin    *admin.Plane // admin API, live event streams, metrics (edge_admin.go)

	httpPort, httpsPort atomic.Int32

	mu           sync.Mutex
	closing      bool
	listeners    map[net.Listener]struct{}
	sessions     map[*edgeSession]struct{}
	sessionByID  map[string]*edgeSession // for resuming: a reconnect ends its previous session
	httpSrvs     map[*http.Server]struct{}
	done         chan struct{} // closed when Shutdown or Close starts
	closeOnce    sync.Once
	closeOnceObs sync.Once

	// requests counts public HTTP requests and TCP connections (metrics).
	requests struct{ http, tcp atomic.Uint64 }
	// retries counts dispatches sent to one other member (metrics): after a failed stream
	// open, and after a backend reset a bodyless request unread.
	retries struct{ open, unread atomic.Uint64 }

	wg sync.WaitGroup // every goroutine the server starts
	// publicConns counts the public HTTP connections whose net/http goroutines are still
	// running, so that Close returns only after they are gone.
	publicConns connCount
}

// NewServer returns an edge configured by cfg. It starts two small background workers (the
// idle-stream janitor and the alert sender) and no listener: the Serve methods do that.
// Always Close (or Shutdown) a Server, even one that never served.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:         cfg,
		log:         cfg.Logger,
		listeners:   map[net.Listener]struct{}{},
		sessions:    map[*edgeSession]struct{}{},
		sessionByID: map[string]*edgeSession{},
		httpSrvs:    map[*http.Server]struct{}{},
		done:        make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.httpPort.Store(int32(cfg.PublicHTTPPort))
	s.httpsPort.Store(int32(cfg.PublicHTTPSPort))
	pc := cfg.proxyConfig()
	pc.Stats = proxy.Stats{HTTPRequests: &s.requests.http, TCPConnections: &s.requests.tcp,
		RetriesOpenFailed: &s.retries.open, RetriesResetUnread: &s.retries.unread}
	pc.HTTPSHost = func(sub string) string { // "": no HTTPS listener, no redirect
		if s.httpsPort.Load() == 0 {
			return ""
		}
		return strings.TrimPrefix(s.publicURL(group.ProtoHTTPS, sub), "https://")
	}
	s.tcp = proxy.NewTCP(pc)
	bindTCP := func(g *group.Group) error {
		if err := s.tcp.OnCreate(g); !errors.Is(err, proxy.ErrClosed) {
			return err
		}
		return ErrServerClosed
	}
	s.registry = group.NewRegistry(group.Config{
		LoadBalancing:      cfg.LoadBalancing,
		Ports:              cfg.TCPPorts,
		MaxActivePerMember: int64(cfg.MaxConcurrentPerMember),
		NewStrategy:        cfg.NewStrategy,
		OnCreate:           bindTCP,
		OnRemove:           s.tcp.OnRemove,
		OnEvent:            s.onGroupEvent,
	})
	if err := s.newAdmin(); err != nil {
		return nil, err
	}
	pc.Registry = s.registry
	s.ingress = proxy.NewHTTP(pc)
	s.alerts = newAlerter(s)
	s.wg.Go(func() { s.ingress.Janitor(idleSweepInterval, s.done) })
	return s, nil
}

// Registry returns a read-only view of the edge's routing table: its groups and members,
// their health and history. Everything it returns is a copy; the edge alone changes the table.
func (s *Server) Registry() group.View { return s.registry.View() }

func (s *Server) shuttingDown() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// track registers l so that Shutdown and Close close it; it fails once the server is closing.
func (s *Server) track(l net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.listeners[l] = struct{}{}
	return true
}

func (s *Server) untrack(l net.Listener) {
	s.mu.Lock()
	delete(s.listeners, l)
	s.mu.Unlock()
}

// Serve accepts connector connections on l until Shutdown or Close, and always returns a
// non-nil error: ErrServerClosed after those. Each connection is served as in ServeConn.
// Wrap l with tls.NewListener for TLS.
func (s *Server) Serve(l net.Listener) error {
	if !s.track(l) {
		_ = l.Close()
		return ErrServerClosed
	}
	defer s.untrack(l)
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if s.shuttingDown() {
				return ErrServerClosed
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept error; retrying", zap.Error(err), zap.Duration("delay", backoff))
				select {
				case <-time.After(backoff):
				case <-s.done:
				}
				continue
			}
			return err
		}
		backoff = 0
		if !s.spawn(func() { _ = s.ServeConn(c) }) {
			_ = c.Close()
			return ErrServerClosed
		}
	}
}

// spawn starts f in a goroutine the server waits for, unless the server is closing. Callers
// that are not themselves server goroutines must use it instead of wg.Go, so that no goroutine
// is added while Close waits.
func (s *Server) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.wg.Go(f)
	return true
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// ServeConn serves one connector over c, which may be any net.Conn (a TCP or TLS connection,
// or one end of net.Pipe), and returns when the session ends. It closes c.
func (s *Server) ServeConn(c net.Conn) error {
	sess, err := s.newSession(c)
	if err != nil {
		_ = c.Close()
		return err
	}
	return sess.serve()
}

// DialContext connects an in-memory connector to this edge: it returns one end of a
// net.Pipe and serves the other end as ServeConn does, in a goroutine the server owns. Pass
// it to tunnel.WithDialer to run a whole edge and its connectors with no sockets.
func (s *Server) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.shuttingDown() {
		return nil, ErrServerClosed
	}
	client, edge := net.Pipe()
	if !s.spawn(func() { _ = s.ServeConn(edge) }) {
		_ = edge.Close()
		_ = client.Close()
		return nil, ErrServerClosed
	}
	return client, nil
}

// ServeAdmin serves the admin API (AdminHandler: /healthz, /metrics and /api) on l until
// Shutdown or Close.
func (s *Server) ServeAdmin(l net.Listener) error {
	return s.serveHTTP(l, s.AdminHandler())
}

// ListenAndServe listens on the configured addresses (control, public HTTP, and HTTPS and
// admin when set) and serves them until Shutdown or Close, then returns ErrServerClosed. If
// one listener fails, the others are closed and its error is returned.
func (s *Server) ListenAndServe() error {
	type svc struct {
		name, addr string
		serve      func(net.Listener) error
		wrap       func(net.Listener) net.Listener
	}
	svcs := []svc{{name: "control", addr: s.cfg.ControlAddr, serve: s.Serve}}
	if s.cfg.TLSConfig != nil {
		svcs[0].wrap = func(l net.Listener) net.Listener { return tls.NewListener(l, s.cfg.TLSConfig) }
		if s.cfg.HTTPSAddr != "" {
			svcs = append(svcs, svc{name: "https", addr: s.cfg.HTTPSAddr, serve: s.ServePublicTLS})
		}
	}
	if s.cfg.HTTPAddr != "" {
		svcs = append(svcs, svc{name: "http", addr: s.cfg.HTTPAddr, serve: s.ServePublic})
	}
	if s.cfg.AdminAddr != "" {
		svcs = append(svcs, svc{name: "admin", addr: s.cfg.AdminAddr, serve: s.ServeAdmin})
	}
	var ls []net.Listener
	for _, sv := range svcs {
		l, err := net.Listen("tcp", sv.addr)
		if err != nil {
			for _, l := range ls {
				_ = l.Close()
			}
			return fmt.Errorf("tunnel: listen %s (%s): %w", sv.addr, sv.name, err)
		}
		s.log.Info("listening", zap.String("listener", sv.name), zap.Stringer("addr", l.Addr()), zap.Bool("tls", sv.wrap != nil || sv.name == "https"))
		if sv.wrap != nil {
			l = sv.wrap(l)
		}
		ls = append(ls, l)
	}
	errc := make(chan error, len(svcs))
	for i, sv := range svcs {
		if !s.spawn(func() { errc <- sv.serve(ls[i]) }) {
			for _, l := range ls[i:] {
				_ = l.Close()
			}
			return ErrServerClosed
		}
	}
	err := <-errc
	if !errors.Is(err, ErrServerClosed) {
		_ = s.Close()
	}
	return err
}

// Shutdown stops the edge gracefully: it stops accepting connectors and public traffic,
// waits for in-flight requests and TCP connections to finish, then ends every connector
// session (the connectors reconnect elsewhere or later). If ctx ends first, Shutdown closes
// what remains as Close does and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	listeners, httpSrvs := s.beginClose()

	var hwg sync.WaitGroup
	for _, hs := range httpSrvs {
		hwg.Go(func() { _ = hs.Shutdown(ctx) })
	}
	for _, l := range listeners {
		_ = l.Close()
	}
	s.tcp.Close()
	hwg.Wait()

	// Wait for in-flight streams (TCP connections, upgraded HTTP) to end.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for s.activeStreams() > 0 {
		select {
		case <-ctx.Done():
			_ = s.Close()
			return ctx.Err()
		case <-tick.C:
		}
	}
	s.alerts.stop()
	s.closeSessions("edge shutting down", true)
	waited := make(chan struct{})
	go func() { s.wg.Wait(); s.tcp.Wait(); close(waited) }()
	select {
	case <-waited:
		s.cancel()
		_ = s.alerts.close()
		s.closeOnceObs.Do(s.admin.Close)
	case <-ctx.Done():
		_ = s.Close()
		return ctx.Err()
	}
	select {
	case <-s.publicConns.idle():
		return nil
	case <-ctx.Done():
		_ = s.Close()
		return ctx.Err()
	}
}

// Close stops the edge at once: listeners, public connections and connector sessions are
// closed, and Close waits for every goroutine the server started. It is idempotent.
func (s *Server) Close() error {
	listeners, httpSrvs := s.beginClose()
	for _, l := range listeners {
		_ = l.Close()
	}
	for _, hs := range httpSrvs {
		_ = hs.Close()
	}
	s.tcp.Close()
	s.alerts.stop() // groups vanishing because the edge stops is not an outage to page about
	s.closeSessions("edge closed", false)
	s.cancel()
	s.wg.Wait()
	s.tcp.Wait()
	<-s.publicConns.idle() // net/http's connection goroutines end within its 500 ms linger
	_ = s.alerts.close()
	s.closeOnceObs.Do(s.admin.Close)
	return nil
}

func (s *Server) beginClose() ([]net.Listener, []*http.Server) {
	s.closeOnce.Do(func() { close(s.done) })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	var ls []net.Listener
	for l := range s.listeners {
		ls = append(ls, l)
	}
	var hs []*http.Server
	for h := range s.httpSrvs {
		hs = append(hs, h)
	}
	return ls, hs
}

func (s *Server) activeStreams() int64 {
	var n int64
	for _, g := range s.registry.Groups() {
		for _, m := range g.Members() {
			n += m.Active()
		}
	}
	return n
}
