package tunnel

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// observability is the edge's admin side: who may call the admin API, the metrics
// collector, and the broker of live group events.
type observability struct {
	adminHash [sha256.Size]byte
	hasAdmin  bool
	metrics   *collector
	gatherer  prometheus.Gatherer
	events    *broker
	// registeredOn is where the collector was registered; Close unregisters it so that an
	// embedder can start a new Server on the same registry.
	registeredOn prometheus.Registerer
}

// initObservability registers the metrics collector and creates the event broker; it runs
// in NewServer before any group can exist.
func (s *Server) initObservability() error {
	o := &observability{
		hasAdmin: s.cfg.AdminToken != "",
		metrics:  newCollector(s),
		events:   newBroker(s.cfg.EventBuffer),
	}
	if o.hasAdmin {
		o.adminHash = sha256.Sum256([]byte(s.cfg.AdminToken))
	}
	reg := s.cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if err := reg.Register(o.metrics); err != nil {
		return fmt.Errorf("tunnel: registering the edge's metrics on ServerConfig.Metrics: %w", err)
	}
	o.registeredOn = reg
	if g, ok := reg.(prometheus.Gatherer); ok {
		o.gatherer = g
	} else {
		private := prometheus.NewRegistry()
		if err := private.Register(o.metrics); err != nil {
			return fmt.Errorf("tunnel: registering the edge's metrics: %w", err)
		}
		o.gatherer = private
	}
	s.obs = o
	return nil
}

// AdminHandler returns the whole admin API as an http.Handler, as ServeAdmin serves it:
//
//   - GET /healthz answers 200 "ok" while the edge is serving and 503 once it is shutting
//     down. It needs no token.
//   - GET /metrics is MetricsHandler.
//   - /api/ is APIHandler.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if s.shuttingDown() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.Handle("GET /metrics", s.MetricsHandler())
	mux.Handle("/api/", s.APIHandler())
	return mux
}

// closeObservability unregisters the edge's collector.
func (s *Server) closeObservability() {
	s.obs.registeredOn.Unregister(s.obs.metrics)
}

// MetricsHandler returns the Prometheus exposition of the edge's metrics (and of everything
// else registered on ServerConfig.Metrics when that is a Gatherer), whatever the request's
// path. It is open when the API is (no AdminToken and no Auth); otherwise it needs the admin
// token: no token or an unknown one is 401, a tenant's token 403.
func (s *Server) MetricsHandler() http.Handler {
	h := promhttp.HandlerFor(s.obs.gatherer, promhttp.HandlerOpts{
		ErrorLog:      zap.NewStdLog(s.log.Named("metrics")),
		ErrorHandling: promhttp.ContinueOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, ok := s.authenticate(w, r)
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
func (s *Server) requireAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, sc)))
	})
}

// authenticate finds the caller's scope from its bearer token. When it returns false it has
// already answered: 401 for a missing or invalid token, 503 when the authenticator failed
// for another reason.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (scope, bool) {
	if !s.obs.hasAdmin && s.cfg.Auth == nil {
		return scope{admin: true}, true // open API: the self-hosted default
	}
	token, ok := bearerToken(r)
	if !ok {
		unauthorized(w, "missing bearer token")
		return scope{}, false
	}
	if s.obs.hasAdmin {
		h := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(h[:], s.obs.adminHash[:]) == 1 {
			return scope{admin: true}, true
		}
	}
	if s.cfg.Auth == nil {
		unauthorized(w, "invalid token")
		return scope{}, false
	}
	tenant, err := s.cfg.Auth.Authenticate(r.Context(), token)
	switch {
	case errors.Is(err, ErrUnauthorized):
		unauthorized(w, "invalid token")
		return scope{}, false
	case err != nil:
		s.log.Warn("admin API: authenticator failed", zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "cannot check the token now")
		return scope{}, false
	}
	return scope{tenant: tenant}, true
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

// onGroupEvent receives every membership and health change from the registry, under the
// group's lock, in order. Everything it calls only records and queues: it never blocks and
// never takes a group's lock.
func (s *Server) onGroupEvent(ev group.Event) {
	s.alerts.observe(ev)
	s.obs.metrics.observe(ev)
	s.obs.events.publish(ev)
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
	if ev.Kind == group.EventHealth || ev.GroupRemoved {
		s.log.Debug("group changed", zap.String("event", ev.Kind.String()), zap.String("group", ev.Group.Name),
			zap.String("label", ev.Group.Label), zap.Int("members", ev.MemberCount), zap.Int("healthy", ev.SelectableCount))
	}
}
