package tunnel

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/wire"
)

// Session is a connector: one multiplexed connection to an edge that carries any number of
// tunnels. When the connection is lost it reconnects with exponential backoff and jitter, to
// the next of its edge addresses when it has several (see DialServers), and registers every
// tunnel again. Create it with Dial or DialServers; end it with Close.
type Session struct {
	servers []string // the edge addresses, as given to Dial or DialServers
	opts    dialOptions
	log     *zap.Logger

	ctx    context.Context // cancelled by Close or a permanent failure
	cancel context.CancelFunc

	mu      sync.Mutex
	conn    *clientConn   // the live connection; nil while reconnecting
	up      chan struct{} // closed when conn becomes non-nil
	edge    candidate     // the edge of the live (or last) connection
	tunnels map[*clientTunnel]struct{}
	err     error
	done    chan struct{}
	closing bool

	// resume names the last session the edge welcomed us with, for the next Hello.
	resumeID, resumeToken string // guarded by mu
	// shuttingDown is set (under mu) when Shutdown starts: no tunnel may be added after.
	shuttingDown bool

	reqs       atomic.Uint32
	reconnects atomic.Int64 // connections established after the first (see Reconnects)
	wg         sync.WaitGroup
}

// Dial connects a connector to the edge at addr ("host:port"), says hello with the token and
// returns the session. It fails if the edge cannot be reached or refuses the token; once it
// has succeeded, later connection losses are retried in the background. The dialer resolves
// a host name in addr itself each time (net.Dialer tries its addresses, IPv6 and IPv4 in
// parallel); for several edges, or one name standing for several edges that the session
// should move between, use DialServers.
func Dial(ctx context.Context, addr string, opts ...Option) (*Session, error) {
	return dial(ctx, []string{addr}, false, opts)
}

func dial(ctx context.Context, servers []string, retry bool, opts []Option) (*Session, error) {
	o := defaultDialOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if retry && o.lookup == nil && !o.customDialer {
		o.lookup = net.DefaultResolver.LookupHost
	}
	if err := o.checkQUIC(); err != nil {
		return nil, err
	}
	if err := o.setupProxy(os.Getenv); err != nil {
		return nil, err
	}
	if err := o.checkWebSocket(); err != nil {
		return nil, err
	}
	log := o.log.With(zap.String("edge", servers[0]))
	if len(servers) > 1 {
		log = o.log.With(zap.Strings("edges", servers))
	}
	s := &Session{
		servers: servers,
		opts:    o,
		log:     log,
		up:      make(chan struct{}),
		tunnels: map[*clientTunnel]struct{}{},
		done:    make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	c, cand, err := s.connectFirst(ctx, retry)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.setEdge(cand)
	s.attach(c)
	s.wg.Go(func() { s.supervise(c) })
	return s, nil
}

// connect dials the edge cand, runs yamux and the hello exchange.
func (s *Session) connect(ctx context.Context, cand candidate) (*clientConn, error) {
	ym, err := s.openSession(ctx, cand) // TCP, TLS, WebSocket or QUIC
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*clientConn, error) {
		_ = ym.Close()
		return nil, err
	}
	ctrl, err := ym.OpenStream()
	if err != nil {
		return fail(fmt.Errorf("tunnel: opening the control stream: %w", err))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = ctrl.SetDeadline(dl)
	} else {
		_ = ctrl.SetDeadline(time.Now().Add(30 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { _ = ctrl.SetDeadline(pastTime) })
	defer stop()
	// A write error is not the end of the story: the edge may have answered (refusing the
	// token) and closed before yamux confirmed our write, so read its answer regardless.
	s.mu.Lock()
	hello := &wire.Hello{Version: wire.Version, Token: s.opts.token, Client: s.opts.client,
		ResumeSession: s.resumeID, ResumeToken: s.resumeToken, Features: []string{wire.FeatureStreamReset}}
	s.mu.Unlock()
	werr := wire.WriteFrame(ctrl, hello)
	msg, err := wire.ReadFrame(ctrl)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case werr != nil:
			return fail(fmt.Errorf("tunnel: sending hello: %w", werr))
		}
		return fail(fmt.Errorf("tunnel: waiting for welcome: %w", err))
	}
	switch m := msg.(type) {
	case *wire.Welcome:
		_ = ctrl.SetDeadline(time.Time{})
		s.log.Info("connected to edge", zap.String("server", cand.String()), zap.String("session", m.SessionID), zap.String("region", m.RegionID),
			zap.String("proxy", proxyName(cand.proxy)), zap.String("transport", s.Transport()))
		s.mu.Lock()
		s.resumeID, s.resumeToken = m.SessionID, m.ResumeToken
		s.mu.Unlock()
		cctx, ccancel := context.WithCancel(s.ctx)
		var key *[32]byte
		if m.ResumeToken != "" {
			k := wire.NoticeKey(m.ResumeToken)
			key = &k
		}
		return &clientConn{
			ctx: cctx, cancel: ccancel, detached: make(chan struct{}), routed: make(chan struct{}),
			s: s, mux: ym, ctrl: ctrl, started: time.Now(),
			pending: map[uint32]chan wire.Message{}, registering: map[uint32]*clientTunnel{},
			byID: map[string]*clientTunnel{}, noticeKey: key,
		}, nil
	case *wire.Error:
		return fail(&sessionError{code: m.Code, msg: m.Message})
	default:
		return fail(fmt.Errorf("%w: expected welcome, got %s", ErrProtocol, msg.Type()))
	}
}

// attach makes c the live connection and starts its goroutines.
func (s *Session) attach(c *clientConn) {
	s.mu.Lock()
	s.conn = c
	close(s.up)
	s.mu.Unlock()
	s.wg.Go(c.readControl)
	s.wg.Go(c.acceptStreams)
	s.startData(c) // data connections, when the edge offers them (connector_data.go)
}

// supervise waits for the live connection to end and reconnects, until Close or a
// permanent failure. Each reconnect is a series of passes over the edges (connectPass),
// starting with the one after the edge just lost, with a backoff delay between passes. The
// lost edge itself is not dialled again without a delay: the pass after a loss waits before
// it (or before the whole pass, when the lost connection did not last the healthy period, so
// that edges which accept and then drop the connector are not dialled in a tight loop).
func (s *Session) supervise(c *clientConn) {
	attempt := 0
	for {
		select {
		case <-c.mux.CloseChan():
		case <-s.ctx.Done():
		}
		if s.ctx.Err() != nil {
			s.detach(c)
			_ = c.mux.Close()
			return
		}
		s.detach(c)
		lost := s.currentEdge()
		if err := c.fatalErr(); err != nil && permanent(err) {
			s.fail(err) // a *sessionError: "tunnel: the edge ended the session: ..."
			return
		}
		if !s.opts.reconnect {
			s.fail(fmt.Errorf("tunnel: connection to %s lost", lost))
			return
		}
		s.log.Warn("connection to edge lost; reconnecting", zap.String("server", lost.String()), zap.NamedError("reason", c.fatalErr()))
		waited := false
		if time.Since(c.started) >= s.opts.healthyPeriod {
			attempt = 0
		} else {
			if !sleepCtx(s.ctx, s.backoff(attempt)) {
				return
			}
			attempt++
			waited = true
		}
		// beforeLost delays the first retry of the edge just lost, unless the pass was delayed.
		beforeLost := func() bool {
			if waited {
				return true
			}
			waited = true
			d := s.backoff(attempt)
			attempt++
			return sleepCtx(s.ctx, d)
		}
		var cand candidate
		for pass := 0; ; pass++ {
			if pass > 0 {
				if !sleepCtx(s.ctx, s.backoff(attempt)) {
					return
				}
				attempt++
			}
			nc, cd, err, fatal := s.connectPass(s.ctx, &lost, beforeLost, func(cd candidate, err error) {
				s.log.Info("reconnect failed", zap.Int("attempt", attempt), zap.String("server", cd.String()), zap.Error(err))
			})
			if fatal {
				s.fail(err)
				return
			}
			if s.ctx.Err() != nil {
				if nc != nil {
					_ = nc.mux.Close()
				}
				return
			}
			if err == nil {
				c, cand = nc, cd
				break
			}
		}
		if !cand.same(lost) {
			s.log.Warn("moved to another edge", zap.String("from", lost.String()), zap.String("to", cand.String()))
		}
		s.setEdge(cand)
		s.reconnects.Add(1) // before attach: whoever sees Connected sees this count too
		s.attach(c)
		s.reregister(c)
	}
}

// backoff returns the delay before reconnect attempt n (from 0): min·2ⁿ capped at max,
// with ±20% jitter.
func (s *Session) backoff(n int) time.Duration {
	d := s.opts.backoffMin
	for range n {
		d *= 2
		if d >= s.opts.backoffMax {
			d = s.opts.backoffMax
			break
		}
	}
	jitter := 0.8 + 0.4*rand.Float64()
	return time.Duration(float64(d) * jitter)
}

// detach forgets a lost connection: tunnels wait for the next one.
func (s *Session) detach(c *clientConn) {
	c.cancel()
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
		s.up = make(chan struct{})
		close(c.detached)
	}
	s.mu.Unlock()
	c.mu.Lock()
	byID := c.byID
	c.byID = map[string]*clientTunnel{}
	for _, ch := range c.pending {
		close(ch)
	}
	c.pending = map[uint32]chan wire.Message{}
	c.registering = map[uint32]*clientTunnel{}
	c.mu.Unlock()
	for _, t := range byID {
		t.lost(c)
	}
}

// reregister registers every open tunnel on the new connection c. A tunnel the edge now
// refuses for good (its key no longer matches, its subdomain belongs to someone else) ends
// alone; one refused for a passing reason (no free TCP port, the registration rate limit)
// is tried again in the background with backoff.
func (s *Session) reregister(c *clientConn) {
	s.mu.Lock()
	var ts []*clientTunnel
	for t := range s.tunnels {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	var later []*clientTunnel
	for _, t := range ts {
		switch err := s.registerFor(c, t); {
		case err == nil:
		case transientRejection(err):
			s.log.Warn("tunnel refused for now after reconnect; retrying", zap.String("tunnel", t.spec.describe()), zap.Error(err))
			later = append(later, t)
		case errors.Is(err, ErrRejected):
			s.log.Error("tunnel rejected after reconnect", zap.String("tunnel", t.spec.describe()), zap.Error(err))
			t.fail(err)
		case errors.Is(err, ErrTunnelClosed), errors.Is(err, ErrInvalid):
		default:
			return // the connection failed again; supervise will notice and retry everything
		}
	}
	if len(later) > 0 {
		s.wg.Go(func() { s.retryRegistrations(c, later) })
	}
}

// registerFor is one bounded registration attempt of t on c.
func (s *Session) registerFor(c *clientConn, t *clientTunnel) error {
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	return s.registerOn(ctx, c, t)
}

// retryRegistrations keeps trying tunnels refused for a passing reason, until each is
// registered or refused for good, or c is lost (the next reconnect retries them anyway).
func (s *Session) retryRegistrations(c *clientConn, ts []*clientTunnel) {
	for attempt := 0; len(ts) > 0; attempt++ {
		timer := time.NewTimer(s.backoff(attempt))
		select {
		case <-timer.C:
		case <-c.ctx.Done():
			timer.Stop()
			return
		}
		var still []*clientTunnel
		for _, t := range ts {
			switch err := s.registerFor(c, t); {
			case err == nil:
			case transientRejection(err):
				still = append(still, t)
			case errors.Is(err, ErrRejected):
				t.fail(err)
			case errors.Is(err, ErrTunnelClosed), errors.Is(err, ErrInvalid):
			default:
				return
			}
		}
		ts = still
	}
}

// transientRejection reports whether a re-registration refused after a reconnect is tried
// again: every rejection but a malformed registration may go away (the owner of the route
// leaves, its claim lapses, ports free up, the edge's store comes back).
func transientRejection(err error) bool {
	return errors.Is(err, ErrRejected) && !errors.Is(err, ErrInvalid)
}

// fail ends the session for good with err.
func (s *Session) fail(err error) {
	s.log.Error("connector session stopped", zap.Error(err))
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	ts := s.tunnels
	s.tunnels = map[*clientTunnel]struct{}{}
	s.mu.Unlock()
	for t := range ts {
		t.fail(err)
	}
	s.cancel()
	s.closeDone()
}

func (s *Session) closeDone() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
	default:
		close(s.done)
	}
}

// Done is closed when the session has stopped for good: after Close, or after a permanent
// failure: the edge refused the token on reconnect, or the dialer answered an error wrapping
// ErrServerClosed (an in-memory edge that was closed). Err then says why.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns why the session stopped, or nil while it runs (and after a clean Close).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Connected reports whether the session has a live connection to the edge now. It is false
// from the moment the connection is lost until it is re-established (tunnels registered on
// it are then registered again), and after the session stopped.
func (s *Session) Connected() bool {
	s.mu.Lock()
	c, closing := s.conn, s.closing
	s.mu.Unlock()
	if closing || c == nil || c.mux.IsClosed() {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Reconnects is how many times the session has connected to the edge again after losing
// its connection: the connection Dial made is not counted, each successful reconnect is
// (failed attempts are not).
func (s *Session) Reconnects() int { return int(s.reconnects.Load()) }

// liveConn waits for a live connection.
func (s *Session) liveConn(ctx context.Context) (*clientConn, error) {
	for {
		s.mu.Lock()
		c, up, closing := s.conn, s.up, s.closing
		s.mu.Unlock()
		if closing {
			return nil, ErrSessionClosed
		}
		if c != nil && !c.mux.IsClosed() {
			return c, nil
		}
		var next <-chan struct{} = up
		if c != nil {
			next = c.detached // a dead connection the supervisor has not let go of yet
		}
		select {
		case <-next:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			if err := s.Err(); err != nil {
				return nil, err
			}
			return nil, ErrSessionClosed
		}
	}
}

// Close drains every tunnel, including those whose Close began a drain that is still under
// way (all bounded by the drain timeout), closes the connection and waits for every goroutine
// of the session. It is idempotent.
func (s *Session) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.drainTimeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown is Close with the drains bounded by ctx instead of the drain timeout: when ctx
// ends, the streams still open are cut and the edge removes the tunnels at once.
func (s *Session) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.closing || s.shuttingDown {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.shuttingDown = true
	var ts []*clientTunnel
	for t := range s.tunnels {
		ts = append(ts, t)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, t := range ts {
		wg.Go(func() { _ = t.shutdown(ctx) })
	}
	wg.Wait()
	s.mu.Lock()
	s.closing = true
	c := s.conn
	s.mu.Unlock()
	s.cancel() // first, so that supervise sees a close and not a lost connection
	if c != nil {
		_ = c.mux.Close()
	}
	s.wg.Wait()
	s.mu.Lock()
	left := s.tunnels
	s.tunnels = map[*clientTunnel]struct{}{}
	s.mu.Unlock()
	for t := range left {
		t.finish(nil)
	}
	s.closeDone()
	return nil
}
