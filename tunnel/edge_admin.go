package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/admin"
	"github.com/warren-tunnel/warren/group"
)

// JSON types of the admin API, defined in package admin.
type (
	// TunnelInfo is one tunnel in GET /api/tunnels.
	TunnelInfo = admin.TunnelInfo
	// GroupInfo is one load-balancing group in GET /api/groups.
	GroupInfo = admin.GroupInfo
	// GroupMember is one member of a GroupInfo.
	GroupMember = admin.GroupMember
	// HealthEvent is one entry of GET /api/tunnels/{id}/health-events.
	HealthEvent = admin.HealthEvent
	// GroupEvent is the data of a "group_event" on a live group event stream.
	GroupEvent = admin.GroupEvent
	// LaggedEvent is the data of a "lagged" event on a live group event stream.
	LaggedEvent = admin.LaggedEvent
)

// newAdmin builds the admin plane over a read-only view of the edge; NewServer calls it
// once the registry exists and before any group can.
func (s *Server) newAdmin() error {
	cfg := admin.Config{
		View: s.registry.View(),
		URL: func(g group.Info) string { // the group's public URL
			if g.Kind == group.KindTCP {
				return fmt.Sprintf("tcp://%s:%d", s.cfg.Domain, g.Port)
			}
			return s.publicURL(g.Proto, g.Label)
		},
		AdminToken: s.cfg.AdminToken,
		Stats: func() admin.Stats { // the counters the admin plane reads at each scrape
			return admin.Stats{
				HTTPRequests:         s.requests.http.Load(),
				TCPConnections:       s.requests.tcp.Load(),
				RetriesOpenFailed:    s.retries.open.Load(),
				RetriesResetUnread:   s.retries.unread.Load(),
				RetriesIdempotent:    s.retries.idempotent.Load(),
				Deliveries:           s.alerts.deliveries(),
				ResponsesCut:         s.cuts.ByReason(),
				StalledResponseBytes: s.ingress.StalledBytes(),
			}
		},
		Endpoints: s.routes.idleEndpoints,
		MaxEventStreams: func(tenant string) int {
			return s.limits.Load().of(tenant).MaxEventStreams // read as each stream opens
		},
		ShuttingDown:   s.shuttingDown,
		Done:           s.done,
		RegionID:       s.cfg.RegionID,
		Metrics:        s.cfg.Metrics,
		EventKeepAlive: s.cfg.EventKeepAlive,
		EventBuffer:    s.cfg.EventBuffer,
		Logger:         s.log.Named("admin"),
	}
	cfg.Throttle = s.authLimit // shared with the control listener
	if c := s.cluster; c != nil {
		cfg.EdgeID = c.cfg.EdgeID
		cfg.Cluster = c.info
	}
	if auth := s.cfg.Auth; auth != nil {
		cfg.Authenticate = func(ctx context.Context, token string) (string, error) {
			tenant, err := auth.Authenticate(ctx, token)
			if errors.Is(err, ErrUnauthorized) {
				return "", admin.ErrInvalidToken
			}
			return tenant, err
		}
	}
	p, err := admin.New(cfg)
	if err != nil {
		return fmt.Errorf("tunnel: %w", err)
	}
	s.admin = p
	return nil
}

// onGroupEvent receives every membership and health change from the registry, in order per
// group, with no registry lock held. Everything it calls only records and queues.
func (s *Server) onGroupEvent(ev group.Event) {
	if s.cluster != nil {
		s.cluster.observe(ev)
	}
	s.alerts.observe(ev)
	s.admin.Observe(ev)
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
	if ev.Kind == group.EventHealth || ev.GroupRemoved {
		s.log.Debug("group changed", zap.String("event", ev.Kind.String()), zap.String("group", ev.Group.Name),
			zap.String("label", ev.Group.Label), zap.Int("members", ev.MemberCount), zap.Int("healthy", ev.SelectableCount))
	}
}

// AdminHandler returns the whole admin API as an http.Handler, as ServeAdmin serves it:
//
//   - GET /healthz answers 200 "ok" while the edge is serving and 503 once it is shutting
//     down. It needs no token.
//   - GET /metrics is MetricsHandler.
//   - /api/ is APIHandler.
//   - GET / is the live status page (its assets under /static/): the groups and members the
//     token typed into it may see, updated from the event streams.
func (s *Server) AdminHandler() http.Handler { return s.admin.Handler() }

// MetricsHandler returns the Prometheus exposition of the edge's metrics (and of everything
// else registered on ServerConfig.Metrics when that is a Gatherer), whatever the request's
// path. It is open when the API is (no AdminToken and no Auth); otherwise it needs the admin
// token: no token or an unknown one is 401, a tenant's token 403.
func (s *Server) MetricsHandler() http.Handler { return s.admin.MetricsHandler() }

// APIHandler returns the JSON admin API as an http.Handler. It serves these paths (mount it
// at the root of a mux, or under "/api/"):
//
//	GET /api/tunnels                              every visible tunnel ([]TunnelInfo)
//	GET /api/tunnels/{id}                         one tunnel (TunnelInfo)
//	GET /api/tunnels/{id}/health-events           its last 50 health transitions ([]HealthEvent)
//	GET /api/groups                               every visible load-balancing group ([]GroupInfo)
//	GET /api/groups/{protocol}/{label}/events     Server-Sent Events: GroupEvent per health transition
//
// Every request needs "Authorization: Bearer <token>" (401 without a valid one) unless the
// API is open: ServerConfig.AdminToken empty and ServerConfig.Auth nil. The admin token sees
// everything. A token Auth accepts as a tenant sees only the tunnels its connectors
// registered and the groups that hold at least one of them, with counts over those members
// alone; a token Auth accepts with no tenant sees nothing. Whatever a caller cannot see is
// 404, exactly as if it did not exist.
func (s *Server) APIHandler() http.Handler { return s.admin.APIHandler() }
