package tunnel

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
)

// AdminHandler returns the admin API as an http.Handler: GET /healthz answers 200 "ok"
// while the edge is serving and 503 once it is shutting down.
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
	return mux
}

// onGroupEvent receives every membership and health change from the registry, under the
// group's lock, in order.
func (s *Server) onGroupEvent(ev group.Event) {
	s.alerts.observe(ev)
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
	if ev.Kind == group.EventHealth || ev.GroupRemoved {
		s.log.Debug("group changed", zap.String("event", ev.Kind.String()), zap.String("group", ev.Group.Name),
			zap.String("label", ev.Group.Label), zap.Int("members", ev.MemberCount), zap.Int("healthy", ev.SelectableCount))
	}
}
