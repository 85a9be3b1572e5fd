package tunnel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wire"
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
	mux    mux.Session
	log    *zap.Logger
	tenant string
	// transport is how the connector reached the edge: TransportTCP, TransportWebSocket or
	// TransportQUIC
	// (set before the session runs, then only read).
	transport string
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
	// the session set's lock (sessionSet.mu) before the Welcome, then only read.
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

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newEdgeSession starts the session of connector connection c on s, which has preAuth's
// place among the connections not yet authenticated. It fails once s is closing.
func newEdgeSession(s *Server, c net.Conn, preAuth *throttle.Slot) (*edgeSession, error) {
	log := s.log.With(zap.String("remote", c.RemoteAddr().String()))
	m, err := mux.Server(c, log, s.cfg.Timeouts.Open)
	if err != nil {
		return nil, err
	}
	return newEdgeSessionOver(s, m, log, preAuth)
}

// newEdgeSessionOver is newEdgeSession for a session whose multiplexer runs already (a QUIC
// connection); it closes m when it fails.
func newEdgeSessionOver(s *Server, m mux.Session, log *zap.Logger, preAuth *throttle.Slot) (*edgeSession, error) {
	helloBy := time.Now().Add(s.cfg.PreAuth.HelloTimeout)
	id := newID()
	log = log.With(zap.String("session", id))
	e := &edgeSession{srv: s, id: id, mux: m, log: log, tunnels: map[string]*edgeTunnel{}, endedCh: make(chan struct{}),
		registrations: s.limits.Load().registrations(),
		remote:        throttle.KeyOf(m.RemoteAddr()), helloBy: helloBy, preAuth: preAuth, data: s.newSessionData()}
	e.ctx, e.cancel = context.WithCancel(s.ctx)
	if s.shuttingDown() || !s.sessions.add(e) {
		_ = m.Close()
		e.cancel()
		return nil, ErrServerClosed
	}
	return e, nil
}

// serve runs the session: hello, then control frames until the connector leaves.
func (e *edgeSession) serve() error {
	defer e.srv.wg.Done() // counted by sessionSet.add
	err := e.run()
	e.end(err)
	close(e.endedCh)
	return err
}

func (e *edgeSession) run() error {
	defer e.preAuth.Release()
	ctx, cancel := context.WithDeadline(context.Background(), e.helloBy)
	ctrl, err := e.mux.AcceptStream(ctx)
	cancel()
	if err != nil {
		return fmt.Errorf("tunnel: waiting for the control stream: %w", err)
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
	e.srv.sessionsBy.of(e.transport).Add(1)
	if hello.HasFeature(wire.FeatureStreamReset) {
		e.resets = &mux.ResetSender{
			Send: func(ids []uint32) error { return e.send(&wire.Reset{Streams: ids}) },
			Go:   e.srv.spawn,
		}
	}
	if hello.ResumeSession != "" {
		e.srv.sessions.setResumed(e, hello.ResumeSession, sha256.Sum256([]byte(hello.ResumeToken)))
		e.srv.sessions.replace(hello.ResumeSession, hello.ResumeToken, e)
	}
	if lim := e.srv.limits.Load().of(e.tenant); !e.srv.routes.take(e.srv.routes.sessions, e.tenant, lim.MaxSessions) {
		e.log.Warn("connector refused: tenant session quota", zap.String("tenant", e.tenant), zap.Int("max_sessions", lim.MaxSessions))
		return e.fail(wire.CodeLimit, fmt.Sprintf("this tenant already has %d connector sessions (max_sessions)", lim.MaxSessions))
	}
	e.counted.Store(true)
	token := e.welcomeToken(newID() + newID())
	e.srv.sessions.setResumeHash(e, sha256.Sum256([]byte(token)))
	e.noticeKey = wire.NoticeKey(token)
	_ = ctrl.SetReadDeadline(time.Time{})
	if err := e.send(&wire.Welcome{Version: wire.Version, SessionID: e.id, RegionID: e.srv.cfg.RegionID, ResumeToken: token}); err != nil {
		return err
	}
	e.log.Info("connector connected", zap.String("tenant", e.tenant), zap.String("client", hello.Client), zap.String("transport", e.transport))

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
		return e.fail(wire.CodeUnavailable, wireText(err))
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
		return e.fail(wire.CodeUnauthorized, wireText(ErrUnauthorized))
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
	if e.send(&wire.Error{Code: code, Message: msg}) == nil {
		mux.Linger(e.mux, goodbyeTimeout)
	}
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
// session after goodbyeTimeout (see sessionSet.closeAll).
func (e *edgeSession) goodbye(err *sessionError) {
	if !e.wmu.TryLock() {
		return
	}
	var werr error = ErrSessionClosed
	if e.ctrl != nil {
		_ = e.ctrl.SetWriteDeadline(time.Now().Add(goodbyeTimeout))
		werr = wire.WriteFrame(e.ctrl, &wire.Error{Code: err.code, Message: err.msg})
	}
	e.wmu.Unlock()
	if werr == nil {
		mux.Linger(e.mux, goodbyeTimeout)
	}
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
	if e.welcomed {
		e.srv.sessionsBy.of(e.transport).Add(-1)
	}
	e.data.pool.Close()
	_ = e.mux.Close()
	e.cancel()
	e.srv.sessions.remove(e)
	lvl := zap.InfoLevel
	if !e.welcomed {
		lvl = zap.DebugLevel // see fail
	}
	e.log.Log(lvl, "connector disconnected", zap.Int("tunnels", len(tunnels)), zap.NamedError("reason", err))
}
