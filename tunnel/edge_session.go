package tunnel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/webhook"
)

// controlWriteTimeout bounds one control frame write, so a connector that stopped reading
// cannot pin the goroutine writing to it.
const controlWriteTimeout = 10 * time.Second

// pastTime is a deadline that has always passed: setting it unblocks pending I/O at once.
var pastTime = time.Unix(1, 0)

// edgeSession is one connector's session on the edge.
type edgeSession struct {
	srv    *Server
	ctx    context.Context // cancelled when the session ends or the server closes
	cancel context.CancelFunc
	id     string
	conn   net.Conn
	mux    *yamux.Session
	log    *zap.Logger
	tenant string
	// counted is set while the session counts against its tenant's max_sessions.
	counted atomic.Bool

	// remote is the connection's source address as the throttles key it; helloBy is when
	// the control stream and the Hello must have arrived (HelloTimeout after the accept).
	remote  throttle.Key
	helloBy time.Time
	// preAuth holds the connection's place among those not yet authenticated, until its
	// Hello is accepted; welcomed is set then (by the control goroutine, which alone reads
	// it).
	preAuth  *throttle.Slot
	welcomed bool

	wmu  sync.Mutex // serialises control writes
	ctrl net.Conn

	// noticeKey checks the unread notices on this session's HTTP streams (wire.NoticeKey of
	// the resume token).
	noticeKey [32]byte
	// resumeHash is the SHA-256 of the resume token given in Welcome; endedCh is closed once
	// the session's cleanup is done.
	resumeHash [32]byte
	endedCh    chan struct{}
	// resumed and resumedProof are the connector's claim, in its Hello, to be the one that
	// held session resumed (on this edge or another of its cluster): resumedProof is the
	// SHA-256 of the resume token it presented. These and resumeHash are written under
	// srv.mu before the Welcome, then only read.
	resumed      string
	resumedProof [32]byte

	mu      sync.Mutex
	tunnels map[string]*edgeTunnel
	ended   bool

	registrations *rate.Limiter // used only by the control goroutine

	// resets, when the connector handles them (wire.FeatureStreamReset; set before the
	// Welcome, then only read), tells it of the data streams the edge abandoned.
	resets *mux.ResetSender

	data *sessionData // data connections (edge_data.go)
}

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

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) newSession(c net.Conn, preAuth *throttle.Slot) (*edgeSession, error) {
	helloBy := time.Now().Add(s.cfg.PreAuth.HelloTimeout)
	id := newID()
	log := s.log.With(zap.String("session", id), zap.String("remote", c.RemoteAddr().String()))
	mux, err := mux.Server(c, log, s.cfg.Timeouts.Open)
	if err != nil {
		return nil, err
	}
	e := &edgeSession{srv: s, id: id, conn: c, mux: mux, log: log, tunnels: map[string]*edgeTunnel{}, endedCh: make(chan struct{}),
		registrations: s.limits.Load().registrations(),
		remote:        throttle.KeyOf(c.RemoteAddr()), helloBy: helloBy, preAuth: preAuth, data: s.newSessionData()}
	e.ctx, e.cancel = context.WithCancel(s.ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		_ = mux.Close()
		e.cancel()
		return nil, ErrServerClosed
	}
	s.sessions[e] = struct{}{}
	s.sessionByID[id] = e
	s.wg.Add(1) // the session itself; serve calls Done
	return e, nil
}

// serve runs the session: hello, then control frames until the connector leaves.
func (e *edgeSession) serve() error {
	defer e.srv.wg.Done()
	err := e.run()
	e.end(err)
	close(e.endedCh)
	return err
}

// replaceSession ends the session a reconnecting connector names, if the token proves it is
// the same connector, and waits (briefly) for its tunnels to be removed. The edge may not
// have noticed yet that the old connection died (a NAT dropped it, a laptop changed network):
// without this the connector's tunnels would find their own old registrations in the way.
func (s *Server) replaceSession(id, token string, by *edgeSession) {
	s.mu.Lock()
	old := s.sessionByID[id]
	var oldHash [32]byte
	if old != nil {
		oldHash = old.resumeHash
	}
	s.mu.Unlock()
	if old == nil || old == by {
		return
	}
	h := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(h[:], oldHash[:]) != 1 {
		by.log.Info("ignoring a resume with a wrong token", zap.String("old_session", id))
		return
	}
	by.log.Info("connector reconnected: ending its previous session", zap.String("old_session", id))
	// No goodbye: the other end is this same connector, which has already left that
	// connection (and a write to a dead connection could block).
	_ = old.mux.Close()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-old.endedCh:
	case <-t.C:
	}
}

// endSession closes connector session id, if it lives on this edge, without a goodbye: its
// connector reconnects and registers its tunnels again.
func (s *Server) endSession(id, why string) {
	s.mu.Lock()
	e := s.sessionByID[id]
	s.mu.Unlock()
	if e == nil {
		return
	}
	e.log.Warn("ending the session", zap.String("why", why))
	_ = e.mux.Close()
}

// sessionResume is what session id's members' records say of it (memberRecord): the
// SHA-256 of the resume token it was welcomed with and, when its Hello resumed a session,
// that session's id and the SHA-256 of the token presented. False when no such session
// lives on this edge.
func (s *Server) sessionResume(id string) (hash [32]byte, resumed string, proof [32]byte, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.sessionByID[id]; e != nil {
		return e.resumeHash, e.resumed, e.resumedProof, true
	}
	return hash, "", proof, false
}

// endMovedSession ends session id when proof is the SHA-256 of its resume token: its
// connector has proved, on another edge of the cluster, that it held this session, and
// registered there (replaceSession's check, made by this edge on that edge's record). The
// connector has left this session's connection, which this edge may not have noticed yet.
func (s *Server) endMovedSession(id, tenant string, proof [32]byte, to string) {
	s.mu.Lock()
	old := s.sessionByID[id]
	var h [32]byte
	if old != nil {
		h = old.resumeHash
	}
	s.mu.Unlock()
	// A zero hash: not welcomed yet (its tenant is read only once the hash shows it was set).
	if old == nil || h == [32]byte{} || old.tenant != tenant || subtle.ConstantTimeCompare(h[:], proof[:]) != 1 {
		return
	}
	old.log.Info("connector moved to another edge: ending its session here", zap.String("edge", to))
	_ = old.mux.Close() // end() removes its tunnels, and their records
}

func (e *edgeSession) run() error {
	defer e.preAuth.Release()
	ctx, cancel := context.WithDeadline(context.Background(), e.helloBy)
	ctrl, err := e.mux.AcceptStreamWithContext(ctx)
	cancel()
	if err != nil {
		return fmt.Errorf("waiting for the control stream: %w", err)
	}
	e.wmu.Lock()
	e.ctrl = ctrl
	e.wmu.Unlock()
	// The connector opens exactly one stream; GoAway makes yamux refuse any other it tries
	// to open, without a goroutine per session to accept and close them. The edge can
	// still open data streams to the connector. Streams opened before the GoAway would sit
	// unaccepted, each able to buffer a window of data: a connector that opened any is
	// broken or hostile.
	_ = e.mux.GoAway()
	if err := e.onlyControlStream(); err != nil {
		return err
	}

	_ = ctrl.SetReadDeadline(e.helloBy)
	msg, err := wire.ReadFrame(ctrl)
	if err != nil {
		return e.fail(wire.CodeProtocol, fmt.Sprintf("reading hello: %v", err))
	}
	// yamux may have let in a stream it was opening as the GoAway went out; one the connector
	// opened before its Hello has been counted by now (yamux handles a connection's frames in
	// order).
	if err := e.onlyControlStream(); err != nil {
		return err
	}
	hello, ok := msg.(*wire.Hello)
	if !ok {
		return e.fail(wire.CodeProtocol, fmt.Sprintf("expected hello, got %s", msg.Type()))
	}
	if hello.Version != wire.Version {
		return e.fail(wire.CodeUnsupportedVersion, fmt.Sprintf("unsupported protocol version %d (this edge speaks %d)", hello.Version, wire.Version))
	}
	if a := e.srv.cfg.Auth; a != nil {
		if err := e.authenticate(a, hello.Token); err != nil {
			return err
		}
	}
	e.preAuth.Release()
	e.welcomed = true
	if hello.HasFeature(wire.FeatureStreamReset) {
		e.resets = &mux.ResetSender{
			Send: func(ids []uint32) error { return e.send(&wire.Reset{Streams: ids}) },
			Go:   e.srv.spawn,
		}
	}
	if hello.ResumeSession != "" {
		e.srv.mu.Lock()
		e.resumed, e.resumedProof = hello.ResumeSession, sha256.Sum256([]byte(hello.ResumeToken))
		e.srv.mu.Unlock()
		e.srv.replaceSession(hello.ResumeSession, hello.ResumeToken, e)
	}
	if lim := e.srv.limits.Load().of(e.tenant); !e.srv.routes.take(e.srv.routes.sessions, e.tenant, lim.MaxSessions) {
		e.log.Warn("connector refused: tenant session quota", zap.String("tenant", e.tenant), zap.Int("max_sessions", lim.MaxSessions))
		return e.fail(wire.CodeLimit, fmt.Sprintf("this tenant already has %d connector sessions (max_sessions)", lim.MaxSessions))
	}
	e.counted.Store(true)
	token := e.welcomeToken(newID() + newID())
	e.srv.mu.Lock()
	e.resumeHash = sha256.Sum256([]byte(token))
	e.srv.mu.Unlock()
	e.noticeKey = wire.NoticeKey(token)
	_ = ctrl.SetReadDeadline(time.Time{})
	if err := e.send(&wire.Welcome{Version: wire.Version, SessionID: e.id, RegionID: e.srv.cfg.RegionID, ResumeToken: token}); err != nil {
		return err
	}
	e.log.Info("connector connected", zap.String("tenant", e.tenant), zap.String("client", hello.Client))

	for {
		msg, err := wire.ReadFrame(ctrl)
		if err != nil {
			if errors.Is(err, io.EOF) || e.mux.IsClosed() {
				return nil
			}
			return e.fail(wire.CodeProtocol, fmt.Sprintf("reading control frame: %v", err))
		}
		switch m := msg.(type) {
		case *wire.Register:
			e.register(m)
		case *wire.Health:
			e.health(m)
		case *wire.Drain:
			e.drain(m.TunnelID)
		case *wire.Deregister:
			if t := e.take(m.TunnelID); t != nil {
				e.remove(t)
				_ = e.send(&wire.Deregistered{TunnelID: t.id, Reason: "deregistered"})
			}
		default:
			return e.fail(wire.CodeProtocol, fmt.Sprintf("unexpected %s frame from a connector", msg.Type()))
		}
	}
}

// onlyControlStream fails the session if the connector opened any stream besides its control
// stream.
func (e *edgeSession) onlyControlStream() error {
	if n := e.mux.NumStreams(); n > 1 {
		return e.fail(wire.CodeProtocol, fmt.Sprintf("opened %d streams; a connector opens only its control stream", n))
	}
	return nil
}

// authenticate checks the Hello's token, throttled per source address: an address with
// recent failures waits before its token is checked, and a blocked one is refused without
// its token being checked. Failures are logged by the throttle, in aggregate.
func (e *edgeSession) authenticate(a Authenticator, token string) error {
	attempt, err := e.srv.authLimit.Begin(e.remote)
	if err != nil {
		// Not a verdict on the token: the connector retries after its backoff.
		return e.fail(wire.CodeUnavailable, err.Error())
	}
	if d := attempt.Delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-e.mux.CloseChan(): // the connector left, or the edge is closing
			t.Stop()
			attempt.Done()
			return ErrSessionClosed
		case <-e.ctx.Done():
			t.Stop()
			attempt.Done()
			return e.ctx.Err()
		}
	}
	actx, cancel := context.WithTimeout(e.ctx, e.srv.cfg.PreAuth.HelloTimeout)
	tenant, err := a.Authenticate(actx, token)
	cancel()
	switch {
	case errors.Is(err, ErrUnauthorized):
		attempt.Fail()
		return e.fail(wire.CodeUnauthorized, ErrUnauthorized.Error())
	case err != nil:
		attempt.Done()
		// Not a verdict on the token: the connector retries later.
		e.log.Warn("authenticator failed", zap.Error(err))
		return e.fail(wire.CodeUnavailable, "authentication unavailable, try again later")
	}
	attempt.Done()
	e.tenant = tenant
	return nil
}

// fail tells the connector why the session ends and returns that as an error. Before the
// Hello is accepted the reason is logged at debug level only: anyone can open connections,
// and the throttles log their refusals and the failed authentications in aggregate.
func (e *edgeSession) fail(code, msg string) error {
	lvl := zap.InfoLevel
	if !e.welcomed {
		lvl = zap.DebugLevel
	}
	e.log.Log(lvl, "closing connector session", zap.String("code", code), zap.String("reason", msg))
	_ = e.send(&wire.Error{Code: code, Message: msg})
	return &sessionError{code: code, msg: msg}
}

func (e *edgeSession) send(m wire.Message) error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	if e.ctrl == nil {
		return ErrSessionClosed
	}
	_ = e.ctrl.SetWriteDeadline(time.Now().Add(controlWriteTimeout))
	return wire.WriteFrame(e.ctrl, m)
}

// goodbyeTimeout bounds the final error frame sent to a connector the edge closes.
const goodbyeTimeout = time.Second

// goodbye tells the connector why its session ends. If another write is under way (it may
// be stuck on a connector that stopped reading), it is skipped. yamux does not bound a write
// on a stuck connection by the stream's deadline, so callers also bound it by closing the
// session after goodbyeTimeout (see closeSessions).
func (e *edgeSession) goodbye(err *sessionError) {
	if !e.wmu.TryLock() {
		return
	}
	defer e.wmu.Unlock()
	if e.ctrl != nil {
		_ = e.ctrl.SetWriteDeadline(time.Now().Add(goodbyeTimeout))
		_ = wire.WriteFrame(e.ctrl, &wire.Error{Code: err.code, Message: err.msg})
	}
}

// closeSessions ends every connector session. With goodbye, each connector is first told
// why, in parallel, for at most goodbyeTimeout in all (a stalled connector cannot hold the
// others or the caller); then every session is closed.
func (s *Server) closeSessions(reason string, goodbye bool) {
	s.mu.Lock()
	var sess []*edgeSession
	for e := range s.sessions {
		sess = append(sess, e)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	if goodbye {
		bye := &sessionError{code: wire.CodeShuttingDown, msg: reason}
		said := make(chan struct{}, len(sess))
		for _, e := range sess {
			wg.Go(func() { e.goodbye(bye); said <- struct{}{} })
		}
		t := time.NewTimer(goodbyeTimeout)
	wait:
		for range sess {
			select {
			case <-said:
			case <-t.C:
				break wait
			}
		}
		t.Stop()
	}
	for _, e := range sess {
		_ = e.mux.Close() // also ends any goodbye still stuck in a write
	}
	wg.Wait()
}

// end removes every tunnel of the session and closes it.
func (e *edgeSession) end(err error) {
	e.mu.Lock()
	e.ended = true
	tunnels := e.tunnels
	e.tunnels = nil
	e.mu.Unlock()
	for _, t := range tunnels {
		e.remove(t)
	}
	if e.counted.Swap(false) {
		e.srv.routes.give(e.srv.routes.sessions, e.tenant)
	}
	e.data.pool.Close()
	_ = e.mux.Close()
	e.cancel()
	e.srv.mu.Lock()
	delete(e.srv.sessions, e)
	delete(e.srv.sessionByID, e.id)
	e.srv.mu.Unlock()
	lvl := zap.InfoLevel
	if !e.welcomed {
		lvl = zap.DebugLevel // see fail
	}
	e.log.Log(lvl, "connector disconnected", zap.Int("tunnels", len(tunnels)), zap.NamedError("reason", err))
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
	t, err := e.srv.addTunnel(e, m)
	if err != nil {
		e.log.Info("registration rejected", zap.String("proto", string(m.Proto)), zap.String("label", m.Label), zap.Error(err))
		_ = e.send(&wire.Rejected{Req: m.Req, Code: codeFor(err), Message: err.Error()})
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
		reason := "drained"
		select {
		case <-drained:
		case <-timer.C:
			reason = fmt.Sprintf("drain timeout after %s with %d streams open", e.srv.cfg.Timeouts.Drain, t.member.Active())
		case <-e.mux.CloseChan():
			return // end() removes it
		}
		if e.take(id) == nil {
			return
		}
		e.remove(t)
		e.log.Info("member drained", zap.String("tunnel", id), zap.String("reason", reason))
		_ = e.send(&wire.Deregistered{TunnelID: id, Reason: reason})
	})
}

// addTunnel validates a registration and joins the registry.
func (s *Server) addTunnel(e *edgeSession, m *wire.Register) (*edgeTunnel, error) {
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
	}
	if err := s.checkRoute(m.Proto, req.Label); err != nil {
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
		zap.String("group", g.Name), zap.String("key", g.KeyHash().Short()))
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
