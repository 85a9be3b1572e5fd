package tunnel

import (
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/webhook"
)

// A session's tunnels: registered, health reports, drained, deregistered and removed, as its
// control frames ask (edgeSession.run).

// edgeTunnel is one registered tunnel: a member of a group, owned by a session.
type edgeTunnel struct {
	id     string
	tenant string
	member *group.Member
	url    string
	port   int
	// data is the tunnel's data path, the member's Value. Closed when the tunnel is removed
	// (drained, drain timed out, deregistered, or its session ended): every stream still
	// open on it is cut then.
	data     *proxy.Tunnel
	draining atomic.Bool // a Drain is being waited for (only one waiter per tunnel)
	removed  atomic.Bool // remove ran
}

// take removes and returns the session's tunnel id, or nil if the session does not own it.
func (e *edgeSession) take(id string) *edgeTunnel {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.tunnels[id]
	if t == nil {
		e.log.Debug("ignoring frame for a tunnel this session does not own", zap.String("tunnel", id))
		return nil
	}
	delete(e.tunnels, id)
	return t
}

func (e *edgeSession) lookup(id string) *edgeTunnel {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tunnels[id]
}

func (e *edgeSession) register(m *wire.Register) {
	t, err := e.addTunnel(m)
	if err != nil {
		e.log.Info("registration rejected", zap.String("proto", string(m.Proto)), zap.String("label", m.Label), zap.Error(err))
		_ = e.send(&wire.Rejected{Req: m.Req, Code: codeFor(err), Message: wireText(err)})
		return
	}
	g := t.member.Group()
	_ = e.send(&wire.Registered{Req: m.Req, TunnelID: t.id, URL: t.url, Port: t.port, Group: g.Name})
}

func (e *edgeSession) health(m *wire.Health) {
	t := e.lookup(m.TunnelID)
	if t == nil {
		e.log.Info("ignoring health report for a tunnel this session does not own", zap.String("tunnel", m.TunnelID))
		return
	}
	if e.srv.registry.SetHealth(t.member, m.Healthy, m.Reason) {
		e.log.Info("member health changed", zap.String("tunnel", t.id), zap.Bool("healthy", m.Healthy), zap.String("reason", m.Reason))
		if !m.Healthy {
			t.data.CloseIdle()
		}
	}
}

// cutStreamsEndWithin bounds how long a drain that timed out waits for the streams it cut to
// end before it tells the connector that the tunnel is gone.
const cutStreamsEndWithin = 2 * time.Second

// drain stops selecting the tunnel, waits (in a goroutine the server owns) for its streams to
// finish or the drain timeout, then removes it and tells the connector.
func (e *edgeSession) drain(id string) {
	t := e.lookup(id)
	if t == nil {
		return
	}
	if t.draining.Swap(true) {
		return // already draining: one waiter is enough, however many Drains arrive
	}
	drained := e.srv.registry.Drain(t.member)
	t.data.CloseIdle()
	e.dataCheck()
	e.log.Info("draining member", zap.String("tunnel", id), zap.Int64("active", t.member.Active()))
	e.srv.wg.Go(func() {
		timer := time.NewTimer(e.srv.cfg.Timeouts.Drain)
		defer timer.Stop()
		reason, cut := "drained", false
		select {
		case <-drained:
		case <-timer.C:
			reason, cut = fmt.Sprintf("drain timeout after %s with %d streams open", e.srv.cfg.Timeouts.Drain, t.member.Active()), true
		case <-e.mux.CloseChan():
			return // end() removes it
		}
		if e.take(id) == nil {
			return
		}
		e.remove(t)
		if cut {
			// remove cut the streams still open, whose goroutines close their connections
			// after it returns. Deregistered tells the connector the tunnel has ended
			// (Tunnel.Shutdown returns on it), so it waits for them: a public connection
			// must not outlive it. Closing is local; the bound is against a stuck write.
			wait := time.NewTimer(cutStreamsEndWithin)
			select {
			case <-drained:
			case <-wait.C:
			}
			wait.Stop()
		}
		e.log.Info("member drained", zap.String("tunnel", id), zap.String("reason", reason))
		_ = e.send(&wire.Deregistered{TunnelID: id, Reason: reason})
	})
}

// addTunnel validates a registration and joins the registry.
func (e *edgeSession) addTunnel(m *wire.Register) (*edgeTunnel, error) {
	s := e.srv
	e.mu.Lock()
	n, ended := len(e.tunnels), e.ended
	e.mu.Unlock()
	if ended {
		return nil, ErrSessionClosed
	}
	limits := s.limits.Load() // the limits in force when the registration arrived
	if n >= limits.perSession {
		return nil, fmt.Errorf("%w: this session already has %d tunnels (max_tunnels_per_session)", ErrLimit, n)
	}
	if !e.registrations.Allow() {
		return nil, fmt.Errorf("%w: registering faster than %g tunnels per second", ErrLimit, float64(e.registrations.Limit()))
	}
	req := group.JoinRequest{
		ID:      newID(),
		Proto:   m.Proto,
		Label:   strings.ToLower(m.Label),
		Group:   m.Group,
		Tenant:  e.tenant,
		Session: e.id,
		// Shown beside the member's id; bounded and made plain text here, never refused.
		Name:      wire.CleanDisplay(m.Name, wire.MaxNameLen),
		Host:      wire.CleanDisplay(m.Host, wire.MaxHostLen),
		Transport: e.transport,
	}
	if err := checkRoute(m.Proto, req.Label, s.cfg.TLSConfig != nil); err != nil {
		return nil, err
	}
	if m.Group != "" {
		h, err := hex.DecodeString(m.KeyHash)
		if err != nil || len(h) != len(req.KeyHash) {
			return nil, &group.Error{Err: ErrInvalid, Msg: "group key hash is not a SHA-256"}
		}
		copy(req.KeyHash[:], h)
	}
	if h := m.Health; h != nil {
		req.HealthKind = h.Kind
		if h.AlertWebhook != "" {
			if err := webhook.ValidateURL(h.AlertWebhook); err != nil {
				return nil, &group.Error{Err: ErrInvalid, Msg: fmt.Sprintf("alert webhook: %v", err)}
			}
			req.AlertWebhook = h.AlertWebhook
		}
	}
	applyLB(&req, m.LB)
	lim := limits.of(e.tenant)
	if !s.routes.take(s.routes.tunnels, e.tenant, lim.MaxTunnels) {
		return nil, fmt.Errorf("%w: this tenant already has %d tunnels (max_tunnels)", ErrLimit, lim.MaxTunnels)
	}
	grouped := m.Group != "" && s.cfg.LoadBalancing.Enabled
	if s.cluster != nil && e.resumed != "" {
		// A connector that moved here from another edge: its registrations there are not
		// in the way of this one (remoteConflict too lets them be).
		s.cluster.MovedHere(e.resumed, e.tenant, e.resumedProof)
	}
	tk, err := s.routes.claim(e.tenant, &req, grouped, lim)
	if err != nil {
		s.routes.give(s.routes.tunnels, e.tenant)
		return nil, err
	}
	t := &edgeTunnel{id: req.ID, tenant: e.tenant, data: proxy.NewTunnel(e.ctx, req.ID, m.Proto, e.mux, &e.noticeKey)}
	t.data.SetBackendProtocol(m.BackendProtocol)
	if e.resets != nil {
		t.data.SetStreamReset(e.resets.Reset)
	}
	e.attachData(t, m.Proto)
	req.Value = t.data
	member, err := s.registry.Join(req)
	if err != nil {
		s.routes.abandon(tk)
		s.routes.give(s.routes.tunnels, e.tenant)
		t.data.Close()
		return nil, err
	}
	t.member = member
	g := member.Group()
	// Write the route through before the registration is acknowledged.
	if err := s.routes.joined(tk, g); err != nil {
		e.remove(t)
		return nil, err
	}
	if g.Kind == group.KindTCP {
		t.port = g.Port
		t.url = fmt.Sprintf("tcp://%s:%d", s.cfg.Domain, g.Port)
	} else {
		t.url = s.publicURL(m.Proto, req.Label)
	}
	e.mu.Lock()
	if e.ended {
		e.mu.Unlock()
		e.remove(t)
		return nil, ErrSessionClosed
	}
	e.tunnels[t.id] = t
	e.mu.Unlock()
	e.log.Info("tunnel registered", zap.String("tunnel", t.id), zap.String("url", t.url),
		zap.String("group", g.Name), zap.String("key", g.KeyHash().Short()),
		zap.String("name", req.Name), zap.String("host", req.Host))
	return t, nil
}

// remove takes the tunnel out of its group and cuts its streams. It runs once per tunnel.
func (e *edgeSession) remove(t *edgeTunnel) {
	e.srv.registry.Leave(t.member)
	e.srv.leftPool(t.member.Group())
	t.data.Close()
	e.dataCheck()
	if !t.removed.Swap(true) {
		e.srv.routes.give(e.srv.routes.tunnels, t.tenant)
	}
}

func (s *Server) publicURL(proto group.Proto, sub string) string {
	port, def := int(s.httpPort.Load()), 80
	if proto == group.ProtoHTTPS || proto == group.ProtoTLS { // both on the HTTPS listener
		port, def = int(s.httpsPort.Load()), 443
	}
	u := string(proto) + "://" + sub + "." + s.cfg.Domain
	if port != 0 && port != def {
		u += fmt.Sprintf(":%d", port)
	}
	return u
}
