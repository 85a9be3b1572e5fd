package tunnel

import (
	"context"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// clientConn is one connection generation of a session.
type clientConn struct {
	s       *Session
	ctx     context.Context // cancelled when the connection is lost or the session closes
	cancel  context.CancelFunc
	mux     mux.Session
	ctrl    net.Conn
	started time.Time

	wmu sync.Mutex

	detached chan struct{} // closed once the session stopped using this connection
	routed   chan struct{} // closed and replaced (under mu) whenever a registration is routed

	mu          sync.Mutex
	pending     map[uint32]chan wire.Message
	registering map[uint32]*clientTunnel // the tunnel each pending Register is for
	byID        map[string]*clientTunnel
	fatal       error // an Error frame the edge sent

	// noticeKey tags unread notices on this connection's HTTP streams (nil: the edge gave
	// no resume token, and the connector sends no notices).
	noticeKey *[32]byte

	// resets ends the data streams the edge resets (wire.Reset): their public client went
	// away, and the backend's answer must stop at once instead of filling the edge's window.
	resets mux.Resets
}

// send writes one control frame on c.
func (c *clientConn) send(m wire.Message) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ctrl.SetWriteDeadline(time.Now().Add(controlWriteTimeout))
	return wire.WriteFrame(c.ctrl, m)
}

func (c *clientConn) fatalErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fatal
}

// readControl handles frames from the edge until the connection ends.
func (c *clientConn) readControl() {
	defer c.mux.Close()
	for {
		msg, err := wire.ReadFrame(c.ctrl)
		if err != nil {
			if !c.mux.IsClosed() {
				c.s.log.Info("control stream ended", zap.Error(err))
			}
			return
		}
		switch m := msg.(type) {
		case *wire.Registered:
			if !c.reply(m.Req, m, m.TunnelID) {
				// Nobody waits for it any more (the caller's context ended): do not leave an
				// orphan member on the edge.
				c.drop(m.TunnelID)
			}
		case *wire.Rejected:
			c.reply(m.Req, m, "")
		case *wire.Deregistered:
			c.mu.Lock()
			t := c.byID[m.TunnelID]
			delete(c.byID, m.TunnelID)
			c.mu.Unlock()
			if t != nil {
				t.deregistered(c, m.Reason)
			}
		case *wire.Reset:
			c.resets.Reset(m.Streams)
		case *wire.Error:
			c.mu.Lock()
			c.fatal = &sessionError{code: m.Code, msg: m.Message}
			c.mu.Unlock()
			c.s.log.Warn("edge closed the session", zap.String("code", m.Code), zap.String("message", m.Message))
			return
		default:
			c.s.log.Warn("unexpected frame from the edge", zap.Stringer("type", msg.Type()))
			return
		}
	}
}

// drop forgets a registration nobody owns and asks the edge to remove it.
func (c *clientConn) drop(id string) {
	c.mu.Lock()
	delete(c.byID, id)
	c.mu.Unlock()
	_ = c.send(&wire.Deregister{TunnelID: id})
}

// reply hands the answer to registration req to its waiter and reports whether there was
// one. For a registration (tunnelID set) it first routes the tunnel's streams: the edge may
// dispatch to it before anyone learns the registration succeeded. Taking the waiter and
// routing happen in one critical section, so a waiter that gives up either finds its request
// still pending (and this answer is then dropped here) or receives the answer (and drops it).
func (c *clientConn) reply(req uint32, m wire.Message, tunnelID string) bool {
	c.mu.Lock()
	ch, t := c.pending[req], c.registering[req]
	delete(c.pending, req)
	delete(c.registering, req)
	if ch != nil && t != nil && tunnelID != "" {
		c.byID[tunnelID] = t
		close(c.routed)
		c.routed = make(chan struct{})
	}
	c.mu.Unlock()
	if ch == nil {
		return false
	}
	ch <- m
	return true
}

// acceptStreams serves the data streams the edge opens until the connection ends.
func (c *clientConn) acceptStreams() {
	for {
		st, err := c.mux.AcceptStream(context.Background())
		if err != nil {
			return
		}
		// Tracked here, in the order of the streams' IDs, for a reset that overtakes the
		// stream to find it (mux.Resets).
		ctx, untrack := c.resets.Track(c.ctx, st.StreamID())
		c.s.wg.Go(func() { c.serveStream(ctx, st, untrack) })
	}
}

// serveStream reads a data stream's envelope, connects it to the tunnel's target and
// acknowledges, or refuses. ctx ends when the connection is lost or the edge resets the
// stream; untrack is called once the stream is done with.
func (c *clientConn) serveStream(ctx context.Context, st mux.Stream, untrack func()) {
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(pastTime) })
	_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
	env, err := wire.ReadEnvelope(st)
	switch {
	case !stop():
		// Reset (or the connection lost) before it was served: nobody waits for an answer.
		_ = st.Close()
		untrack()
		return
	case err != nil:
		mux.Refuse(st, byte(wire.AckMalformed))
		untrack()
		return
	}
	mux.ClearReadDeadline(st)
	t := c.route(env.TunnelID)
	if t == nil {
		mux.Refuse(st, byte(wire.AckUnknownTunnel))
		untrack()
		return
	}
	t.serve(ctx, c, st, env, untrack)
}

// routeWait bounds how long a stream for an unknown tunnel waits for a registration in
// flight: the edge may dispatch to a new member before this side has read its Registered.
const routeWait = 2 * time.Second

// route returns the tunnel a stream is for, waiting briefly while registrations are pending.
func (c *clientConn) route(id string) *clientTunnel {
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		t, waiting, routed := c.byID[id], len(c.registering) > 0, c.routed
		c.mu.Unlock()
		if t != nil || !waiting {
			return t
		}
		if timeout == nil {
			timer := time.NewTimer(routeWait)
			defer timer.Stop()
			timeout = timer.C
		}
		select {
		case <-routed:
		case <-timeout:
			return nil
		case <-c.ctx.Done():
			return nil
		}
	}
}
