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

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/policy"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// Server is an edge: it accepts connector sessions, keeps the routing table of groups, and
// carries public HTTP requests and TCP connections to the members. Create it with NewServer;
// serve with ListenAndServe, or piecewise with Serve (connectors), ServeConn (one connector
// connection), ServePublic (public HTTP), ServePublicTLS (public HTTPS) and ServeAdmin (an
// operator handler, package tunnel/admin); in a cluster the other edges' links are served by
// the cluster's ServePeers (ListenAndServe does it). Stop it with Shutdown or Close.
type Server struct {
	cfg ServerConfig
	log *zap.Logger
	// sessions are the connector sessions (edge_session_set.go; each one edge_session.go).
	sessions *sessionSet
	ctx      context.Context // cancelled by Close: aborts every stream still open
	cancel   context.CancelFunc
	registry *group.Registry
	routes   *routeBook  // route ownership, reserved endpoints (edge_routes.go)
	ingress  *proxy.HTTP // public HTTP (edge_ingress.go)
	tcp      *proxy.TCP  // public TCP: a listener per TCP group
	alerts   *alerter
	// events are the subscribers to every group event (Operator.Subscribe).
	events eventSubscribers
	// cluster is the edge's part in a cluster (edge_cluster*.go); nil for a single edge.
	cluster Cluster
	// shared are the route rules of an edge of a cluster (nil on a single edge): what the
	// cluster asks of the routes goes through them (ClusterEdge).
	shared *sharedRules
	// authLimit throttles failed authentications per source address, on the control and
	// admin listeners together; preAuth caps the control connections not yet authenticated.
	authLimit *throttle.Auth
	preAuth   *throttle.Conns

	httpPort, httpsPort atomic.Int32
	// limits are the tenant quotas and per-session limits in force; Reload replaces them
	// (edge_live.go).
	limits atomic.Pointer[liveLimits]

	// reloadMu serialises this edge's Reloads.
	reloadMu sync.Mutex

	// Lock order. No lock below is held across a store, NATS or network call, nor while
	// calling out to a cluster or an embedder (OnEvent runs with no lock held):
	//   - a registry route's shard lock, then its group's lock (package group). The registry
	//     calls OnCreate (the TCP listener's bind, a local system call) and OnRemove under
	//     the shard lock; OnRemove only queues the route's store write (routeWrites).
	//   - a cluster's remote view lock (package tunnel/cluster), then the registry's: it
	//     joins and removes other edges' members, which takes no store call any more.
	//   - routeBook.mu, routeWrites.mu, edgeSession.mu, sessionSet.mu, s.mu and the
	//     throttles' locks are leaves: nothing else is locked, and nothing blocks, while one
	//     is held.
	//   - edgeSession.wmu serialises one session's control frames: it is held across that
	//     session's control-stream write (bounded by controlWriteTimeout), which no other
	//     session or request waits for.
	mu        sync.Mutex
	closing   bool
	listeners map[net.Listener]struct{}
	httpSrvs  map[*http.Server]struct{}
	done      chan struct{} // closed when Shutdown or Close starts
	closeOnce sync.Once
	// closeOnceStore closes the route store once every session is gone.
	closeOnceStore sync.Once

	// requests counts public HTTP requests and TCP connections (metrics).
	requests struct{ http, tcp atomic.Uint64 }
	// retries counts dispatches sent to one other member (metrics): after a failed stream
	// open, and after a backend reset a bodyless request unread.
	retries struct{ open, unread, idempotent atomic.Uint64 }
	// cuts counts the responses cut because their client did not keep up (metrics).
	cuts proxy.CutCounts
	// data holds the data connections' counters (edge_data.go).
	data edgeData
	// sessionsBy counts the authenticated connector sessions by transport (metrics).
	sessionsBy sessionCounts

	wg sync.WaitGroup // every goroutine the server starts
	// publicConns counts the public HTTP connections whose net/http goroutines are still
	// running, so that Close returns only after they are gone.
	publicConns connCount
}

// NewServer returns an edge configured by cfg. It starts a few small background workers (the
// idle-stream janitor, the alert sender, the route sweeper and the writer of the throttles'
// aggregate log lines) and no listener: the Serve methods do that.
// Always Close (or Shutdown) a Server, even one that never served.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		listeners: map[net.Listener]struct{}{},
		httpSrvs:  map[*http.Server]struct{}{},
		done:      make(chan struct{}),
	}
	s.sessions = newSessionSet(&s.wg)
	s.limits.Store(newLiveLimits(&cfg))
	s.authLimit, s.preAuth = cfg.throttles()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.httpPort.Store(int32(cfg.Public.URLHTTPPort))
	s.httpsPort.Store(int32(cfg.Public.URLHTTPSPort))
	pc := cfg.proxyConfig()
	pc.Stats = proxy.Stats{HTTPRequests: &s.requests.http, TCPConnections: &s.requests.tcp,
		RetriesOpenFailed: &s.retries.open, RetriesResetUnread: &s.retries.unread, RetriesIdempotent: &s.retries.idempotent,
		ResponsesCut: &s.cuts}
	// The idempotent retry applies to a pool's requests when the pool asked for it, or when
	// the edge turns it on for every pool.
	pc.RetryIdempotent = func(g *group.Group) bool { return s.cfg.LoadBalancing.RetryIdempotent || g.RetryIdempotent }
	if cfg.LoadBalancing.OutlierEjection != nil {
		pc.Outcome = func(m *group.Member, failed bool, reason string) { s.registry.ReportOutcome(m, failed, reason) }
	}
	pc.HTTPSHost = func(sub string) string { // "": no HTTPS listener, no redirect
		if s.httpsPort.Load() == 0 {
			return ""
		}
		return strings.TrimPrefix(s.publicURL(group.ProtoHTTPS, sub), "https://")
	}
	// Reserved endpoints and their policies; the route book exists before any traffic.
	pc.Reserved = func(sub string) bool { return s.routes.reserved(sub) }
	// Each request reads the set in force (Reload replaces it).
	pc.HTTPGate = func(sub string) *policy.Gate { return s.routes.httpGate(sub) }
	pc.TCPGate = func(g *group.Group) *policy.Gate { return s.routes.tcpGate(g) }
	s.tcp = proxy.NewTCP(pc)
	bindTCP := func(g *group.Group) error {
		if err := s.tcp.OnCreate(g); !errors.Is(err, proxy.ErrClosed) {
			return err
		}
		return ErrServerClosed
	}
	s.registry = group.NewRegistry(group.Config{
		LoadBalancing:      cfg.LoadBalancing.Enabled,
		Ports:              cfg.TCP.Ports,
		MaxActivePerMember: int64(cfg.LoadBalancing.MaxConcurrentPerMember),
		PreferLocalStreams: cfg.LoadBalancing.PreferLocalStreams,
		NewStrategy:        cfg.LoadBalancing.NewStrategy,
		Ejection:           cfg.LoadBalancing.OutlierEjection,
		OnCreate:           bindTCP,
		OnRemove: func(g *group.Group) {
			s.tcp.OnRemove(g)
			s.routes.emptied(g)
		},
		OnEvent: s.onGroupEvent,
	})
	if cfg.Cluster != nil {
		if s.cfg.Store != nil {
			return nil, errors.New("tunnel: a cluster keeps its routes in its own store: do not set Store with Cluster")
		}
		st, err := cfg.Cluster.Join(ClusterEdge{s})
		if err != nil {
			cfg.Cluster.Leave(false)
			return nil, err
		}
		s.cluster = cfg.Cluster
		// The edge remembers the routes it saw: a NATS that lost writes does not lose them
		// (routes_restore.go).
		s.cfg.Store = store.NewRecall(st)
	}
	routes, err := openRouteBook(&s.cfg, s.registry, s.log)
	if err != nil {
		if s.cluster != nil {
			_ = s.cfg.Store.Close()
		}
		s.stopCluster(false)
		return nil, err
	}
	s.routes = routes
	routes.spawn = s.spawn
	if c := s.cluster; c != nil {
		s.shared = &sharedRules{b: routes, c: c, lease: c.Lease(), edgeID: c.EdgeID(), resumeOf: s.sessions.resumeOf, stop: s.done}
		routes.rules = s.shared
	}
	pc.Registry = s.registry
	s.ingress = proxy.NewHTTP(pc)
	s.alerts = newAlerter(s)
	s.wg.Go(func() { s.ingress.Janitor(idleSweepEvery(cfg.Timeouts.IdleStream), s.done) })
	s.wg.Go(func() { s.routes.sweeper(s.done) })
	s.wg.Go(func() { logThrottled(s.authLimit, s.preAuth, s.done) })
	if s.cluster != nil {
		if err := s.cluster.Start(); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	return s, nil
}

// stopCluster leaves the cluster, if the edge is in one: graceful deletes this edge's
// lease and member records at once, so that the other edges need not wait for the lease.
func (s *Server) stopCluster(graceful bool) {
	if s.cluster != nil {
		s.cluster.Leave(graceful)
	}
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
// Wrap l with tls.NewListener for TLS (ListenAndServe's own TLS listener also batches the
// writes of busy TCP tunnels' data connections into fewer system calls).
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
//
// A connection that begins with a data connection's preamble (package wire) joins its
// session's pool of data connections instead (edge_data.go).
//
// Until its Hello is accepted the connection counts toward PreAuth.MaxConns and
// PreAuth.MaxConnsPerIP; over either cap it is closed at once and ServeConn returns an error.
func (s *Server) ServeConn(c net.Conn) error {
	slot := s.preAuth.Acquire(throttle.KeyOf(c.RemoteAddr()))
	if slot == nil {
		_ = c.Close()
		return errPreAuthFull
	}
	// A data connection (edge_data.go) or a control connection: its first byte tells.
	by := time.Now().Add(s.cfg.PreAuth.HelloTimeout)
	c, data, err := s.sniff(c, by)
	if err != nil || data {
		if err == nil {
			return s.serveData(c, slot, by)
		}
		slot.Release()
		_ = c.Close()
		return err
	}
	return serveSession(s, c, slot, by, TransportTCP)
}

// serveSession serves a connector session over c, which holds slot among the connections
// not yet authenticated and must have sent its Hello by helloBy, and returns when the session
// ends. It closes c.
func serveSession(s *Server, c net.Conn, slot *throttle.Slot, helloBy time.Time, transport string) error {
	sess, err := newEdgeSession(s, c, slot)
	if err != nil {
		slot.Release()
		_ = c.Close()
		return err
	}
	sess.helloBy = helloBy // from the accept, not from the sniff
	sess.transport = transport
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

// ServeAdmin serves h, an operator plane (the admin API of package tunnel/admin, say), on l
// until Shutdown or Close, with the limits of an operator listener: a request there has
// twice ServerConfig.Public.ReadHeaderTimeout to arrive, body included (an event stream is not cut
// by it), and an HTTP/1.x connection is closed after an answer that left its request body
// unread.
func (s *Server) ServeAdmin(l net.Listener, h http.Handler) error {
	return s.serveHTTP(l, h, nil, s.cfg.adminReadTimeout(), false)
}

// ListenAndServe listens on the configured addresses (control, public HTTP, and HTTPS and
// QUIC when set) and serves them until Shutdown or Close, then returns ErrServerClosed. If
// one listener fails, the others are closed and its error is returned.
func (s *Server) ListenAndServe() error {
	type svc struct {
		name, addr string
		serve      func(net.Listener) error
		wrap       func(net.Listener) net.Listener
	}
	svcs := []svc{{name: "control", addr: s.cfg.ControlAddr, serve: s.Serve}}
	if s.cfg.TLSConfig != nil {
		svcs[0].wrap = func(l net.Listener) net.Listener { return tlsListener{l, s.cfg.TLSConfig} }
		if s.cfg.Public.HTTPSAddr != "" {
			svcs = append(svcs, svc{name: "https", addr: s.cfg.Public.HTTPSAddr, serve: s.ServePublicTLS})
		}
	}
	if s.cfg.Public.HTTPAddr != "" {
		svcs = append(svcs, svc{name: "http", addr: s.cfg.Public.HTTPAddr, serve: s.ServePublic})
	}
	if s.cluster != nil {
		svcs = append(svcs, svc{name: "peers", addr: s.cluster.PeerAddr(), serve: s.cluster.ServePeers})
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
	quic, qerr := listenQUIC(s)
	if qerr != nil {
		for _, l := range ls {
			_ = l.Close()
		}
		return qerr
	}
	errc := make(chan error, len(svcs)+1)
	if quic != nil && !s.spawn(func() { errc <- ServeQUIC(s, quic) }) {
		_ = quic.Close()
	}
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

	if s.cluster != nil {
		s.cluster.AnnounceDraining()
	}
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
	s.sessions.closeAll("edge shutting down", true)
	s.stopCluster(true)
	waited := make(chan struct{})
	go func() { s.wg.Wait(); s.tcp.Wait(); close(waited) }()
	select {
	case <-waited:
		s.cancel()
		_ = s.alerts.close()
		s.closeOnceStore.Do(func() { _ = s.routes.close() })
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
	s.sessions.closeAll("edge closed", false)
	s.stopCluster(true)
	s.cancel()
	s.wg.Wait()
	s.tcp.Wait()
	<-s.publicConns.idle() // net/http's connection goroutines end within its 500 ms linger
	_ = s.alerts.close()
	s.closeOnceStore.Do(func() { _ = s.routes.close() })
	return nil
}

func (s *Server) beginClose() ([]net.Listener, []*http.Server) {
	s.closeOnce.Do(func() { close(s.done) })
	s.routes.stop()
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

// tlsListener is tls.NewListener's listener with proxy.TLSBase under each connection, so
// that busy TLS data connections are copied in large system calls.
type tlsListener struct {
	net.Listener
	cfg *tls.Config
}

func (l tlsListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tls.Server(proxy.TLSBase(c), l.cfg), nil
}
