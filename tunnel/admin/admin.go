// Package admin is an edge's operator plane: the JSON REST API, the live group event streams
// (Server-Sent Events), the Prometheus collector and the live status page (GET /, plain
// HTML, CSS and JavaScript embedded from static/).
//
// New builds one from an edge's read-only Operator view, the way net/http/pprof or promhttp
// are mounted: the edge itself links none of it (nor Prometheus). Serve its Handler with the
// edge's ServeAdmin, which adds the limits of an operator listener, or mount it in a mux of
// your own:
//
//	plane, err := admin.New(srv, admin.Options{Token: adminToken})
//	if err != nil {
//		return err
//	}
//	defer plane.Close()
//	go srv.ServeAdmin(adminListener, plane.Handler())
//
// It reads the edge through narrow inputs only: the routing table's read-only view, the group
// events, each group's public URL, the authenticator for tenant tokens and a few counters. It
// knows nothing of how dispatch, tunnels or the wire work. The JSON types here are what its
// endpoints return.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/tunnel"
)

// ErrInvalidToken is what Config.Authenticate returns (wrapped or not) for a token it does
// not know: the caller gets 401. Any other error is an outage of the authenticator: 503.
var ErrInvalidToken = errors.New("admin: invalid token")

// Stats are the edge's counters that the registry does not hold, read at each scrape.
type Stats = tunnel.Counters

// Options configure a Plane beyond what it reads of its edge.
type Options struct {
	// Token is the bearer token that sees every tunnel and group and may read /metrics; at
	// least tunnel.MinTokenLength characters. Tenant tokens (checked by the edge's
	// ServerConfig.Auth, the tokens the tenant's connectors present) see only their own
	// members. When Token is empty and the edge has no Auth, the API and /metrics are open
	// and every caller gets the operator's view: bind such a listener to loopback.
	Token string
	// Metrics is where the Plane registers its Prometheus collector; /metrics serves it when
	// it is also a prometheus.Gatherer (a *prometheus.Registry is), and otherwise a private
	// registry holding only the edge's metrics. Nil means a fresh private registry. One
	// Registerer holds the metrics of one Plane.
	Metrics prometheus.Registerer
	// EventKeepAlive is the interval of the keep-alive comment on a live group event stream.
	// Default 30 s.
	EventKeepAlive time.Duration
	// EventBuffer is how many events one live event subscriber may have pending; past it, the
	// subscriber misses events and is sent a "lagged" event. Default 64.
	EventBuffer int
	// Logger receives the plane's logs; default none.
	Logger *zap.Logger
	// Hosts are the host names (no port) the admin listener is reached by, besides IP
	// addresses and localhost. They matter only while the API is open (no Token, no tenant
	// Auth): a request naming another host is refused (403), so that a web page that a
	// browser on the admin network loaded from a name its author points at the listener (DNS
	// rebinding) cannot read the open API. /healthz answers any host.
	Hosts []string
}

// New builds the operator plane of srv: it registers the metrics collector (Options.Metrics)
// and follows the edge's group events until Close. Live event streams end when the edge
// shuts down.
func New(srv *tunnel.Server, o Options) (*Plane, error) {
	if o.Token != "" {
		if p := tunnel.TokenProblem(o.Token); p != "" {
			return nil, errors.New("admin: the admin token " + p)
		}
	}
	op := srv.Operator()
	cfg := config{
		View:            op.Registry(),
		URL:             op.URL,
		AdminToken:      o.Token,
		Throttle:        op.AuthThrottle(), // shared with the control listener
		Endpoints:       op.IdleEndpoints,
		Routes:          op.Routes,
		ReleaseRoute:    op.ReleaseRoute,
		MaxEventStreams: op.MaxEventStreams, // read as each stream opens: Reload changes it
		Stats:           op.Counters,
		ShuttingDown:    op.ShuttingDown,
		Done:            op.Done(),
		RegionID:        op.RegionID(),
		Metrics:         o.Metrics,
		EventKeepAlive:  o.EventKeepAlive,
		EventBuffer:     o.EventBuffer,
		Logger:          o.Logger,
		Hosts:           o.Hosts,
	}
	if _, ok := op.Cluster(); ok {
		cfg.EdgeID = op.EdgeID()
		cfg.Cluster = func() ClusterInfo { info, _ := op.Cluster(); return info }
	}
	if auth := op.Authenticator(); auth != nil {
		cfg.Authenticate = func(ctx context.Context, token string) (string, error) {
			tenant, err := auth.Authenticate(ctx, token)
			if errors.Is(err, tunnel.ErrUnauthorized) {
				return "", ErrInvalidToken
			}
			return tenant, err
		}
	}
	p, err := newPlane(cfg)
	if err != nil {
		return nil, err
	}
	p.unsubscribe = op.Subscribe(p.observe)
	return p, nil
}

// config is what a Plane reads of its edge. View and URL are required.
type config struct {
	// View is the edge's routing table.
	View group.View
	// URL returns a group's public URL.
	URL func(g group.Info) string
	// AdminToken is the bearer token that sees everything and may read the metrics.
	AdminToken string
	// Hosts are the host names an open API answers besides IP addresses and localhost.
	Hosts []string
	// Authenticate maps a tenant token to its tenant; nil means the edge has no tenants.
	// When both AdminToken and Authenticate are unset the API is open: every caller sees
	// everything.
	Authenticate func(ctx context.Context, token string) (tenant string, err error)
	// Throttle limits token guessing per caller address (the request's RemoteAddr): a
	// caller with recent failures waits before its token is checked, and a blocked one gets
	// 429 with Retry-After without its token being checked. A wrong token counts as a
	// failure, a missing one does not. tunnel.Server shares one with its control listener;
	// nil means no throttling.
	Throttle *throttle.Auth
	// Endpoints returns the reserved routes that have no live group, listed with zero
	// members; nil means none.
	Endpoints func() []Endpoint
	// Routes lists the routes tenants hold, and ReleaseRoute drops one (tunnel.Operator's);
	// nil: GET /api/routes lists none and DELETE answers 404.
	Routes       func(ctx context.Context) ([]tunnel.RouteClaim, error)
	ReleaseRoute func(kind, label string) (tunnel.RouteClaim, error)
	// MaxEventStreams returns how many live event streams a tenant may have open at once
	// (0: no cap); nil means no cap. The admin token is never capped.
	MaxEventStreams func(tenant string) int
	// Stats returns the edge's counters; nil reports zeros.
	Stats func() Stats
	// ShuttingDown reports whether the edge is shutting down (/healthz answers 503).
	ShuttingDown func() bool
	// Done is closed when the edge shuts down: every live event stream ends.
	Done <-chan struct{}
	// RegionID is the region label of the per-group metrics.
	RegionID string
	// EdgeID is this edge's id in a cluster, shown on its own members; "" outside one.
	EdgeID string
	// Cluster describes the cluster for GET /api/cluster; nil outside one.
	Cluster func() ClusterInfo
	// Metrics is where the collector is registered; nil means a private registry.
	Metrics prometheus.Registerer
	// EventKeepAlive is the interval of the keep-alive comment on an event stream; default 30 s.
	EventKeepAlive time.Duration
	// EventBuffer is how many events one stream subscriber may have pending; default 64.
	EventBuffer int
	// Logger receives the plane's logs; default none.
	Logger *zap.Logger
}

// Plane serves an edge's admin API, event streams and metrics. It is safe for concurrent use.
type Plane struct {
	cfg       config
	log       *zap.Logger
	adminHash [sha256.Size]byte
	hasAdmin  bool
	metrics   *collector
	gatherer  prometheus.Gatherer
	events    *broker
	// registeredOn is where the collector was registered; Close unregisters it so that an
	// embedder can start a new edge on the same registry.
	registeredOn prometheus.Registerer
	// unsubscribe stops the edge's group events (New); nil for a plane on a bare config.
	unsubscribe func()
	closeOnce   sync.Once
}

// newPlane registers the metrics collector and returns a Plane. Call Close to unregister it.
func newPlane(cfg config) (*Plane, error) {
	if cfg.URL == nil {
		return nil, errors.New("admin: Config.URL is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Stats == nil {
		cfg.Stats = func() Stats { return Stats{} }
	}
	if cfg.ShuttingDown == nil {
		cfg.ShuttingDown = func() bool { return false }
	}
	if cfg.EventKeepAlive <= 0 {
		cfg.EventKeepAlive = 30 * time.Second
	}
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 64
	}
	p := &Plane{
		cfg:      cfg,
		log:      cfg.Logger,
		hasAdmin: cfg.AdminToken != "",
		events:   newBroker(cfg.EventBuffer),
	}
	p.metrics = newCollector(cfg)
	if p.hasAdmin {
		p.adminHash = sha256.Sum256([]byte(cfg.AdminToken))
	}
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if err := reg.Register(p.metrics); err != nil {
		return nil, fmt.Errorf("admin: registering the edge's metrics on Options.Metrics: %w", err)
	}
	p.registeredOn = reg
	if g, ok := reg.(prometheus.Gatherer); ok {
		p.gatherer = g
	} else {
		private := prometheus.NewRegistry()
		if err := private.Register(p.metrics); err != nil {
			reg.Unregister(p.metrics)
			return nil, fmt.Errorf("admin: registering the edge's metrics: %w", err)
		}
		p.gatherer = private
	}
	return p, nil
}

// Close stops following the edge's events and unregisters the collector, so that another
// Plane may register on the same Options.Metrics. It does not end open event streams: the
// edge's shutdown does. It is idempotent.
func (p *Plane) Close() {
	p.closeOnce.Do(func() {
		if p.unsubscribe != nil {
			p.unsubscribe()
		}
		p.registeredOn.Unregister(p.metrics)
	})
}

// Gatherer is where the metrics are gathered from: Config.Metrics when it is a Gatherer,
// otherwise a private registry holding only the edge's metrics.
func (p *Plane) Gatherer() prometheus.Gatherer { return p.gatherer }

// observe takes one group event: it feeds the health-failure counters and the live event
// streams. It never blocks.
func (p *Plane) observe(ev group.Event) {
	p.metrics.observe(ev)
	p.events.publish(ev)
}

// EventStreams is the number of live event streams open now.
func (p *Plane) EventStreams() int { return p.events.subscribers() }

// Handler returns the whole admin API as an http.Handler:
//
//   - GET / is the live status page (HTML; its script and style sheet are under
//     /static/): every group the token entered on the page may see, with its members.
//     Without JavaScript it lists the groups only when the API is open. Any other path
//     that is not listed here is 404.
//   - GET /healthz answers 200 "ok" while the edge is serving and 503 once it is shutting
//     down. It needs no token.
//   - GET /metrics is MetricsHandler.
//   - /api/ is APIHandler.
func (p *Plane) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", p.serveStatusPage)
	mux.HandleFunc("GET /static/", serveStatic)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if p.cfg.ShuttingDown() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", p.MetricsHandler())
	mux.Handle("/api/", p.APIHandler())
	return mux
}

// MetricsHandler returns the Prometheus exposition of the edge's metrics (and of everything
// else registered on Config.Metrics when that is a Gatherer), whatever the request's path.
// It is open when the API is; otherwise it needs the admin token: no token or an unknown one
// is 401, a tenant's token 403.
func (p *Plane) MetricsHandler() http.Handler {
	h := promhttp.HandlerFor(p.gatherer, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(p.log.Named("metrics")),
		ErrorHandling: promhttp.ContinueOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, ok := p.authenticate(w, r)
		if !ok {
			return
		}
		if !sc.admin {
			writeError(w, http.StatusForbidden, "metrics need the admin token")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// scope is what one API caller may see: everything (admin), or the members registered by
// connectors that authenticated as tenant. A caller whose token is valid but belongs to no
// tenant has the zero scope and sees nothing.
type scope struct {
	admin  bool
	tenant string
}

// sees reports whether the caller may see m (and, through it, m's group).
func (sc scope) sees(m group.MemberInfo) bool {
	return sc.admin || sc.tenant != "" && m.Tenant == sc.tenant
}

type scopeKey struct{}

// scopeOf returns the scope the auth middleware put on r; the zero scope if none.
func scopeOf(r *http.Request) scope {
	sc, _ := r.Context().Value(scopeKey{}).(scope)
	return sc
}

// requireAuth runs next with the caller's scope in the request context, or answers 401.
func (p *Plane) requireAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, ok := p.authenticate(w, r)
		if !ok {
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, sc)))
	})
}

// authenticate finds the caller's scope from its bearer token. When it returns false it has
// answered (unless the client left while the throttle held it): 401 for a missing or invalid
// token, 429 when Config.Throttle refuses the caller's address (its token is not checked),
// 503 when the authenticator failed for another reason or the edge shut down meanwhile.
func (p *Plane) authenticate(w http.ResponseWriter, r *http.Request) (scope, bool) {
	if p.apiOpen() {
		// The self-hosted default: anyone who reaches the listener, by its own name.
		if !p.hostAllowed(r.Host) {
			refuseHost(w, r.Host)
			return scope{}, false
		}
		return scope{admin: true}, true
	}
	token, ok := bearerToken(r)
	if !ok {
		unauthorized(w, "missing bearer token")
		return scope{}, false
	}
	attempt, err := p.cfg.Throttle.Begin(throttle.KeyOfString(r.RemoteAddr))
	if refused := (*throttle.RefusedError)(nil); errors.As(err, &refused) {
		w.Header().Set("Retry-After", strconv.Itoa(int(throttle.RoundUp(refused.RetryAfter).Seconds())))
		// The API's answers are sentences for its client, with no package prefix.
		writeError(w, http.StatusTooManyRequests, strings.TrimPrefix(refused.Error(), "throttle: "))
		return scope{}, false
	}
	if attempt.Delay() > 0 && !p.wait(w, r, attempt) {
		return scope{}, false
	}
	if p.hasAdmin {
		h := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(h[:], p.adminHash[:]) == 1 {
			attempt.Done()
			return scope{admin: true}, true
		}
	}
	if p.cfg.Authenticate == nil {
		attempt.Fail()
		unauthorized(w, "invalid token")
		return scope{}, false
	}
	tenant, err := p.cfg.Authenticate(r.Context(), token)
	switch {
	case errors.Is(err, ErrInvalidToken):
		attempt.Fail()
		unauthorized(w, "invalid token")
		return scope{}, false
	case err != nil:
		attempt.Done()
		p.log.Warn("admin API: authenticator failed", zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "cannot check the token now")
		return scope{}, false
	}
	attempt.Done()
	return scope{tenant: tenant}, true
}

// wait waits for the throttle's delay before a token is checked. It reports false, having
// answered 503 if the client is still there, when the request ends or the edge shuts down
// first.
func (p *Plane) wait(w http.ResponseWriter, r *http.Request, attempt *throttle.Attempt) bool {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	waited := make(chan struct{})
	defer close(waited)
	go func() {
		select {
		case <-p.cfg.Done:
			cancel()
		case <-waited:
		}
	}()
	if attempt.Wait(ctx) == nil {
		return true
	}
	if r.Context().Err() == nil {
		writeError(w, http.StatusServiceUnavailable, "shutting down")
	}
	return false
}

// bearerToken returns the token of an "Authorization: Bearer <token>" header.
func bearerToken(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="warren"`)
	writeError(w, http.StatusUnauthorized, msg)
}

// refuseHost answers a request to an open API for a host it does not answer to.
func refuseHost(w http.ResponseWriter, host string) {
	writeError(w, http.StatusForbidden, fmt.Sprintf("admin: this open admin listener does not answer to host %q (list it in the admin hosts)", host))
}

// hostAllowed reports whether an open API answers a request for host (a Host header): an IP
// address, localhost or a name under it, one of the configured Hosts, or no host at all
// (browsers always send one). A name is what DNS rebinding needs; an address is not.
func (p *Plane) hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	for _, h := range p.cfg.Hosts {
		if strings.TrimSuffix(strings.ToLower(h), ".") == host {
			return true
		}
	}
	return false
}
