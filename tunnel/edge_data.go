package tunnel

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wire"
)

// The edge's side of data connections (package wire describes them; proxy keeps the idle
// ones and carries TCP connections over them).
//
// A data connection arrives on the control listener like a connector's control connection.
// ServeConn looks at its first byte without consuming it (sniff): the data magic sends it to
// serveData, anything else to yamux as before. serveData reads the preamble within the
// Hello timeout, under the same pre-authentication caps as a control connection, finds the
// session it names, compares the data token in constant time and, if all is well, answers
// wire.DataAccepted and puts the connection in the session's pool; its goroutine then ends.
// Anything else closes the connection and counts it (dataStats); no answer tells a prober
// which part was wrong.
//
// A session accepts data connections only while it has a TCP tunnel that is not draining:
// when its last one is removed or begins to drain, its idle data connections are closed, and
// the connector stops opening new ones. Its pool is closed when the session ends.

// edgeData is the edge's data-connection state.
type edgeData struct {
	stats proxy.DataStats
	// capped is set once a data connection got a smaller receive buffer than
	// ServerConfig.TCP.DataReadBuffer asked for (net.core.rmem_max), which is logged once.
	capped atomic.Bool
	// closing ends when the server begins to close (Shutdown or Close): it cuts the
	// connections still being sniffed or read their preamble, which belong to no session
	// yet. Made by the first connection (closingCtx).
	once    sync.Once
	closing context.Context
}

// closingCtx returns a context that ends when the server begins to close. A goroutine of
// the server waits for that, one per server, from the first call on.
func (s *Server) closingCtx() context.Context {
	s.data.once.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		s.data.closing = ctx
		if !s.spawn(func() { <-s.done; cancel() }) {
			cancel()
		}
	})
	return s.data.closing
}

// errDataRefused is ServeConn's error for a data connection it closed.
var errDataRefused = errors.New("tunnel: data connection refused")

// sessionData is a session's data-connection state.
type sessionData struct {
	// token is set when the Welcome is sent; until then no data connection is accepted.
	token atomic.Pointer[wire.DataToken]
	pool  *proxy.DataConns
}

func (s *Server) newSessionData() *sessionData {
	return &sessionData{pool: proxy.NewDataConns(&s.data.stats)}
}

// welcomeToken returns the resume token for the session's Welcome: random, marked as the
// token of an edge that accepts data connections, and the source of the session's data token.
func (e *edgeSession) welcomeToken(random string) string {
	token := wire.NewDataResumeToken(random)
	dt, _ := wire.DataTokenOf(token)
	e.data.token.Store(&dt)
	return token
}

// attachData lets a new tunnel use the session's data connections, if it is a plain TCP
// tunnel (TLS passthrough tunnels stay on yamux streams) of a session over TCP (a session
// over WebSocket or QUIC has none: its TCP connections ride the session's streams).
func (e *edgeSession) attachData(t *edgeTunnel, proto group.Proto) {
	if proto == group.ProtoTCP && e.transport == TransportTCP {
		t.data.SetDataConns(e.data.pool)
	}
}

// wantsData reports whether the session has a TCP tunnel that is not draining.
func (e *edgeSession) wantsData() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, t := range e.tunnels {
		if t.data.UsesDataConns() && !t.draining.Load() {
			return true
		}
	}
	return false
}

// dataCheck closes the session's idle data connections once no TCP tunnel can use them (the
// last one was removed or is draining). Call it after a tunnel left or began to drain.
func (e *edgeSession) dataCheck() {
	if !e.wantsData() {
		e.data.pool.CloseIdle()
	}
}

// sniff returns whether c begins with a data connection's preamble, reading no further than
// its first byte, within deadline. The returned conn is the one to use from then on: c
// itself when the byte could be peeked at, or a wrapper that replays it.
func (s *Server) sniff(c net.Conn, deadline time.Time) (net.Conn, bool, error) {
	_ = c.SetReadDeadline(deadline)
	stop := context.AfterFunc(s.closingCtx(), func() { _ = c.SetReadDeadline(pastTime) })
	defer func() {
		if stop() {
			_ = c.SetReadDeadline(time.Time{})
		}
	}()
	if tc, ok := c.(*net.TCPConn); ok {
		if b, ok, err := peekByte(tc); ok {
			return c, wire.IsDataPreamble(b), err
		}
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return c, false, err
	}
	return &replayConn{Conn: c, first: b[0], pending: true}, wire.IsDataPreamble(b[0]), nil
}

// replayConn gives back the byte sniff read before the rest of the connection.
type replayConn struct {
	net.Conn
	first   byte
	pending bool // only the goroutine that owns the connection reads
}

func (c *replayConn) Read(p []byte) (int, error) {
	if c.pending && len(p) > 0 {
		c.pending = false
		p[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(p)
}

// serveData takes in one data connection (see the top of this file). It closes c unless c
// joined a pool.
func (s *Server) serveData(c net.Conn, slot *throttle.Slot, deadline time.Time) error {
	defer slot.Release()
	refuse := func(n *atomic.Uint64, why string, err error) error {
		n.Add(1)
		s.log.Debug("data connection refused", zap.String("remote", c.RemoteAddr().String()), zap.String("why", why), zap.Error(err))
		_ = c.Close()
		return fmt.Errorf("%w: %s", errDataRefused, why)
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(s.closingCtx(), func() { _ = c.SetDeadline(pastTime) })
	p, err := wire.ReadDataPreamble(c)
	if !stop() { // the server is closing
		_ = c.Close()
		return ErrServerClosed
	}
	if err != nil {
		return refuse(&s.data.stats.Refused, "bad preamble", err)
	}
	if r, ok := c.(*replayConn); ok {
		c = r.Conn // the replayed byte was read: the bare connection (TCP, TLS) from here on
	}
	e := s.sessions.get(p.SessionID)
	var want *wire.DataToken
	if e != nil {
		want = e.data.token.Load()
	}
	if want == nil || subtle.ConstantTimeCompare(want[:], p.Token[:]) != 1 {
		return refuse(&s.data.stats.Refused, "unknown session or wrong token", nil)
	}
	if !e.wantsData() {
		return refuse(&s.data.stats.Unwanted, "the session has no TCP tunnel", nil)
	}
	if _, err := c.Write([]byte{wire.DataAccepted}); err != nil {
		return refuse(&s.data.stats.Unwanted, "answering the preamble", err)
	}
	_ = c.SetDeadline(time.Time{})
	if n := s.cfg.TCP.DataReadBuffer; n > 0 {
		if got := proxy.SetDataReadBuffer(c, n); got < n && !s.data.capped.Swap(true) {
			s.log.Warn("data_read_buffer is capped by the kernel (net.core.rmem_max): data connections get a smaller fixed receive buffer than asked for, possibly smaller than what autotuning would reach; raise net.core.rmem_max or unset data_read_buffer",
				zap.Int("asked", n), zap.Int("granted", got))
		}
	}
	if !e.data.pool.Put(c) {
		s.data.stats.Unwanted.Add(1)
		return fmt.Errorf("%w: the session ended", errDataRefused)
	}
	s.data.stats.Accepted.Add(1)
	return nil
}

// errPeerClosed: the connection ended before its first byte.
var errPeerClosed = fmt.Errorf("tunnel: connection closed before its first byte: %w", io.EOF)
