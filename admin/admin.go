// Package admin is an edge's operator plane: the JSON REST API, the live group event streams
// (Server-Sent Events), the Prometheus collector and the live status page (GET /, plain
// HTML, CSS and JavaScript embedded from static/).
//
// It reads the edge through narrow inputs only: a read-only group.View of the routing table,
// the group events, a function for each group's public URL, an authenticator for tenant
// tokens, and a few counters. It knows nothing of how dispatch, tunnels or the wire work.
// tunnel.Server builds one Plane and serves it from ServeAdmin and AdminHandler; the JSON
// types here are what those endpoints return.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/webhook"
)

// ErrInvalidToken is what Config.Authenticate returns (wrapped or not) for a token it does
// not know: the caller gets 401. Any other error is an outage of the authenticator: 503.
var ErrInvalidToken = errors.New("invalid token")

// Stats are the edge's counters that the registry does not hold, read at each scrape.
type Stats struct {
	// HTTPRequests and TCPConnections count the public requests and connections received.
	HTTPRequests, TCPConnections uint64
	// RetriesOpenFailed and RetriesResetUnread count the dispatches sent to one other
	// member: after opening the stream to the first failed, and after its backend reset the
	// connection with a bodyless request unread.
	RetriesOpenFailed, RetriesResetUnread uint64
	// RetriesIdempotent counts idempotent requests sent to one other member after their
	// member failed before answering (the opt-in idempotent retry).
	RetriesIdempotent uint64
	// Deliveries counts alert deliveries by result.
	Deliveries map[webhook.Result]uint64
	// ResponsesCut counts the public responses cut because their client did not keep up,
	// by rule: "stall_timeout", "conn_budget", "ip_budget", "edge_budget" (each has a
	// series, zero or not).
	ResponsesCut map[string]uint64
	// StalledResponseBytes is what the responses whose client is not keeping up are
	// charged now (what they may hold at the edge).
	StalledResponseBytes int64
}

// Config is what a Plane reads of its edge. View and URL are required.
type Config struct {
	// View is the edge's routing table.
	View group.View
	// URL returns a group's public URL.
	URL func(g group.Info) string
	// AdminToken is the bearer token that sees everything and may read the metrics.
	AdminToken string
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
	cfg       Config
	log       *zap.Logger
	adminHash [sha256.Size]byte
	hasAdmin  bool
	metrics   *collector
	gatherer  prometheus.Gatherer
	events    *broker
	// registeredOn is where the collector was registered; Close unregisters it so that an
	// embedder can start a new edge on the same registry.
	registeredOn prometheus.Registerer
}

// New registers the metrics collector and returns a Plane. Call Close to unregister it.
func New(cfg Config) (*Plane, error) {
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
		return nil, fmt.Errorf("registering the edge's metrics on ServerConfig.Metrics: %w", err)
	}
	p.registeredOn = reg
	if g, ok := reg.(prometheus.Gatherer); ok {
		p.gatherer = g
	} else {
		private := prometheus.NewRegistry()
		if err := private.Register(p.metrics); err != nil {
			reg.Unregister(p.metrics)
			return nil, fmt.Errorf("registering the edge's metrics: %w", err)
		}
		p.gatherer = private
	}
	return p, nil
}

// Close unregisters the collector. It does not end open event streams: Config.Done does.
func (p *Plane) Close() { p.registeredOn.Unregister(p.metrics) }

// Gatherer is where the metrics are gathered from: Config.Metrics when it is a Gatherer,
// otherwise a private registry holding only the edge's metrics.
func (p *Plane) Gatherer() prometheus.Gatherer { return p.gatherer }

// Observe takes one group event: it feeds the health-failure counters and the live event
// streams. It never blocks.
func (p *Plane) Observe(ev group.Event) {
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
	if !p.hasAdmin && p.cfg.Authenticate == nil {
		return scope{admin: true}, true // open API: the self-hosted default
	}
	token, ok := bearerToken(r)
	if !ok {
		unauthorized(w, "missing bearer token")
		return scope{}, false
	}
	attempt, err := p.cfg.Throttle.Begin(throttle.KeyOfString(r.RemoteAddr))
	if refused := (*throttle.RefusedError)(nil); errors.As(err, &refused) {
		w.Header().Set("Retry-After", strconv.Itoa(int(throttle.RoundUp(refused.RetryAfter).Seconds())))
		writeError(w, http.StatusTooManyRequests, refused.Error())
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
