package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// clientTunnel is the connector's side of one tunnel, across reconnects.
type clientTunnel struct {
	s      *Session
	spec   TunnelSpec
	target string           // Forward: the local address
	accept chan *streamConn // Listen: hands streams to Accept
	regMu  sync.Mutex       // one registration attempt at a time

	mu        sync.Mutex
	conn      *clientConn // where it is registered now; nil while not
	id, url   string
	port      int
	groupName string
	drained   chan string
	stopProbe context.CancelFunc
	closing   bool               // closed, failed or ended: no registration any more
	stopping  chan struct{}      // closed when Close or Shutdown begins the drain
	cutDrain  context.CancelFunc // ends the drain under way at once; nil until one begins
	err       error
	done      chan struct{}
	// health is what Tunnel.Health returns. healthGen names the prober allowed to change it:
	// it is bumped when a registration begins or is lost and when the tunnel stops, so a
	// report of a prober that was stopped meanwhile changes nothing.
	health    TunnelHealth
	healthGen uint64

	streams atomic.Int64 // streams carried now (Tunnel.ActiveStreams)
}

func (s *Session) newTunnel(spec TunnelSpec) *clientTunnel {
	return &clientTunnel{s: s, spec: spec, stopping: make(chan struct{}), done: make(chan struct{}), stopProbe: func() {},
		health: TunnelHealth{Checked: spec.Health != nil}}
}

// resetHealth forgets the health of the registration that ended or was replaced and
// returns the generation of the next prober; the caller holds mu.
func (t *clientTunnel) resetHealth() uint64 {
	t.healthGen++
	t.health = TunnelHealth{Checked: t.spec.Health != nil}
	return t.healthGen
}

// setHealth records r, a report of the prober of generation gen, unless that prober is no
// longer the tunnel's.
func (t *clientTunnel) setHealth(gen uint64, r health.Report) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if gen != t.healthGen {
		return
	}
	t.health = TunnelHealth{Checked: true, Known: true, Healthy: r.Healthy, Reason: r.Reason, Since: r.At}
}

// add registers t on the live connection and keeps it for re-registration.
func (s *Session) add(ctx context.Context, t *clientTunnel) error {
	s.mu.Lock()
	if s.closing || s.shuttingDown {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	s.tunnels[t] = struct{}{}
	s.mu.Unlock()
	for {
		c, err := s.liveConn(ctx)
		if err == nil {
			err = s.registerOn(ctx, c, t)
			if errors.Is(err, errConnLost) && ctx.Err() == nil {
				continue // the connection failed under us: wait for the next one
			}
		}
		if err != nil {
			t.fail(err) // also takes it out of s.tunnels
			return err
		}
		return nil
	}
}

// errConnLost: the connection a registration was sent on went away before the answer.
var errConnLost = errors.New("tunnel: connection lost while registering")

// registerOn registers t on c. Registrations of one tunnel are serialised, and a tunnel
// already registered on c is left alone, so a Forward racing the reconnect logic registers
// it once. Errors: a *RejectedError (wrapping ErrRejected), errConnLost, ErrTunnelClosed
// (closed meanwhile), ErrInvalid (the spec cannot be encoded) or ctx's error.
func (s *Session) registerOn(ctx context.Context, c *clientConn, t *clientTunnel) error {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	t.mu.Lock()
	already, closing := t.conn == c, t.closing
	t.mu.Unlock()
	switch {
	case already:
		return nil
	case closing:
		return ErrTunnelClosed
	}
	req := t.spec.register(s.reqs.Add(1), s.opts.hostname)
	ch := make(chan wire.Message, 1)
	c.mu.Lock()
	c.pending[req.Req] = ch
	c.registering[req.Req] = t
	c.mu.Unlock()
	forget := func() (answered bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, pending := c.pending[req.Req]
		delete(c.pending, req.Req)
		delete(c.registering, req.Req)
		return !pending
	}
	if err := c.send(req); err != nil {
		forget()
		if errors.Is(err, wire.ErrMalformed) {
			return fmt.Errorf("tunnel: %w: %v", ErrInvalid, err) // the connection is fine
		}
		_ = c.mux.Close()
		return fmt.Errorf("%w: %v", errConnLost, err)
	}
	var resp wire.Message
	select {
	case m, ok := <-ch:
		if !ok {
			return errConnLost
		}
		resp = m
	case <-c.mux.CloseChan():
		forget()
		return errConnLost
	case <-ctx.Done():
		if forget() {
			// The answer is on its way already (readControl took it): a registration must
			// not outlive the caller who gave up on it.
			if r, ok := (<-ch).(*wire.Registered); ok {
				c.drop(r.TunnelID)
			}
		}
		return ctx.Err()
	}
	switch r := resp.(type) {
	case *wire.Rejected:
		return &RejectedError{Code: r.Code, Message: r.Message}
	case *wire.Registered:
		t.mu.Lock()
		if t.closing { // closed while the registration was in flight
			t.mu.Unlock()
			c.drop(r.TunnelID)
			return ErrTunnelClosed
		}
		t.conn, t.id, t.url, t.port, t.groupName = c, r.TunnelID, r.URL, r.Port, r.Group
		t.drained = make(chan string, 1)
		gen := t.resetHealth()
		t.mu.Unlock()
		s.log.Info("tunnel registered", zap.String("tunnel", r.TunnelID), zap.String("url", r.URL), zap.String("group", r.Group))
		t.startProbe(c, r.TunnelID, gen)
		return nil
	}
	return fmt.Errorf("%w: unexpected answer to register", ErrProtocol)
}

// startProbe runs the tunnel's health prober for one registration; its reports go to the
// edge and, while gen is the tunnel's health generation, to Tunnel.Health.
func (t *clientTunnel) startProbe(c *clientConn, id string, gen uint64) {
	if t.spec.Health == nil {
		return
	}
	s := t.s
	report := func(r health.Report) {
		t.setHealth(gen, r)
		if err := c.send(&wire.Health{TunnelID: id, Healthy: r.Healthy, Reason: truncateReason(r.Reason)}); err != nil {
			s.log.Debug("health report not sent", zap.Error(err))
		}
	}
	p, err := health.NewProber(*t.spec.Health, t.target, report, health.WithLogger(s.log.With(zap.String("tunnel", id))))
	if err != nil {
		s.log.Error("health prober not started", zap.Error(err))
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	t.mu.Lock()
	t.stopProbe()
	t.stopProbe = cancel
	t.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		cancel()
		return
	}
	s.wg.Go(func() { _ = p.Run(ctx) })
}

// truncateReason fits a probe's reason into the wire limit: valid UTF-8 (so that encoding
// cannot make it longer) cut on a character boundary.
func truncateReason(r string) string {
	r = strings.ToValidUTF8(r, "?")
	if len(r) <= wire.MaxReasonLen {
		return r
	}
	cut := wire.MaxReasonLen
	for cut > 0 && !utf8.RuneStart(r[cut]) {
		cut--
	}
	return r[:cut]
}

// serve carries one data stream of connection c to the tunnel's target. ctx ends when the
// connection is lost or the edge resets the stream: the stream and its backend connection
// (or the application's end of it) are cut then. untrack is called once the stream is done
// with.
func (t *clientTunnel) serve(ctx context.Context, c *clientConn, st mux.Stream, env wire.Envelope, untrack func()) {
	s := t.s
	if t.accept != nil {
		sc := &streamConn{Stream: st, local: t.addr(), remote: remoteAddr(env.RemoteAddr), untrack: untrack}
		// A reset cuts the stream under the application: its reads and writes fail at once
		// instead of waiting on an edge that no longer reads.
		sc.stopReset = context.AfterFunc(ctx, sc.abort)
		timer := time.NewTimer(s.opts.acceptTimeout)
		defer timer.Stop()
		// Counted before the hand-over, so that an application closing it at once cannot
		// take the count below zero; a stream refused instead leaves the count here.
		sc.active = &t.streams
		t.streams.Add(1)
		select {
		case t.accept <- sc:
			_ = sc.ack()
			return
		case <-timer.C:
			mux.Refuse(st, byte(wire.AckRefused))
		case <-t.stopping:
			mux.Refuse(st, byte(wire.AckUnknownTunnel))
		case <-t.done:
			mux.Refuse(st, byte(wire.AckUnknownTunnel))
		case <-ctx.Done():
			mux.Refuse(st, byte(wire.AckUnknownTunnel))
		}
		sc.release()
		return
	}
	defer untrack()
	d := net.Dialer{Timeout: s.opts.localTimeout}
	local, err := d.DialContext(ctx, "tcp", t.target)
	if err != nil {
		s.log.Debug("local target refused a stream", zap.String("target", t.target), zap.Error(err))
		mux.Refuse(st, byte(wire.AckRefused))
		return
	}
	t.streams.Add(1)
	defer t.streams.Add(-1)
	if _, err := st.Write([]byte{byte(wire.AckOK)}); err != nil {
		_ = local.Close()
		_ = st.Close()
		return
	}
	if env.Proto.IsHTTP() && c.noticeKey != nil { // tcp and tls streams are raw bytes
		local = mux.NewUnreadConn(local, st, c.noticeKey)
	}
	mux.Join(ctx, local, st)
}

// lost is called when the connection t was registered on is gone.
func (t *clientTunnel) lost(c *clientConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn != c {
		return
	}
	t.stopProbe()
	if !t.closing { // a tunnel draining or ended keeps its last health
		t.resetHealth()
	}
	t.conn, t.id = nil, ""
	// Nothing is left to drain on the edge: it dropped the member with the connection.
	select {
	case t.drained <- "connection lost":
	default:
	}
}

// deregistered is called when the edge says the tunnel is gone.
func (t *clientTunnel) deregistered(c *clientConn, reason string) {
	t.mu.Lock()
	closing := t.closing
	if t.conn == c {
		t.stopProbe()
		t.conn, t.id = nil, ""
		select {
		case t.drained <- reason:
		default:
		}
	}
	t.mu.Unlock()
	if !closing {
		t.fail(fmt.Errorf("tunnel: removed by the edge: %s", reason))
	}
}

// beginDrain begins the tunnel's drain unless one has begun (or the tunnel ended): Accept
// returns at once, new streams are refused, and a goroutine of the session tells the edge to
// stop selecting the tunnel, waits until its streams are done (the edge's Deregistered) or
// bound ends (then the edge is told to remove it at once), and forgets the tunnel. timeout,
// if positive, bounds the drain further.
func (t *clientTunnel) beginDrain(bound context.Context, timeout time.Duration) {
	s := t.s
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		return
	}
	t.closing = true
	close(t.stopping)
	t.stopProbe()
	t.healthGen++ // Health keeps its last value
	c, id, drained := t.conn, t.id, t.drained
	var ctx context.Context
	var cut context.CancelFunc
	if timeout > 0 {
		ctx, cut = context.WithTimeout(bound, timeout)
	} else {
		ctx, cut = context.WithCancel(bound)
	}
	t.cutDrain = cut
	t.mu.Unlock()

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		// The session is past waiting for drains and ends every tunnel left itself.
		cut()
		return
	}
	s.wg.Go(func() {
		defer cut()
		t.drain(ctx, c, id, drained)
	})
}

// drain runs one drain on c (see beginDrain), then ends the tunnel.
func (t *clientTunnel) drain(ctx context.Context, c *clientConn, id string, drained <-chan string) {
	if c != nil && id != "" {
		if err := c.send(&wire.Drain{TunnelID: id}); err == nil {
			select {
			case <-drained:
			case <-ctx.Done():
				_ = c.send(&wire.Deregister{TunnelID: id})
			case <-c.mux.CloseChan():
			case <-t.s.ctx.Done():
			}
		}
		c.mu.Lock()
		delete(c.byID, id)
		c.mu.Unlock()
	}
	t.finish(nil)
}

// shutdown begins the drain bounded by ctx (or joins the one under way) and waits for the
// tunnel's end. When ctx ends first, the drain is cut: the edge removes the tunnel at once.
func (t *clientTunnel) shutdown(ctx context.Context) error {
	t.beginDrain(ctx, 0)
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
	}
	t.mu.Lock()
	cut := t.cutDrain
	t.mu.Unlock()
	if cut != nil {
		cut()
	}
	<-t.done
	return nil
}

// fail ends the tunnel with err (a rejection after reconnect, or the session's end).
func (t *clientTunnel) fail(err error) {
	t.mu.Lock()
	t.closing = true
	t.stopProbe()
	t.healthGen++ // Health keeps its last value
	c, id := t.conn, t.id
	t.conn, t.id = nil, ""
	t.mu.Unlock()
	if c != nil && id != "" {
		c.mu.Lock()
		delete(c.byID, id)
		c.mu.Unlock()
	}
	t.finish(err)
}

func (t *clientTunnel) finish(err error) {
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		return
	default:
	}
	t.err = err
	close(t.done)
	t.mu.Unlock()
	t.s.mu.Lock()
	delete(t.s.tunnels, t)
	t.s.mu.Unlock()
}

func (t *clientTunnel) addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tunnelAddr(t.url)
}
