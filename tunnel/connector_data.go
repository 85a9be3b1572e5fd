package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/wire"
)

// The connector's side of data connections (package wire describes them).
//
// While a connection generation has a Forward TCP tunnel registered, the connector keeps
// dataPoolSize idle data connections open to the edge it is connected to, each with a
// goroutine waiting for an envelope. When the edge uses one (the connector acknowledged an
// envelope), a new one is dialled at once, off the public connection's path: a new public
// connection never waits for a dial. When the edge closes idle ones (the session's last TCP
// tunnel is gone), they are not replaced until a TCP tunnel is registered again.
//
// Data connections are opened only when the control connection is a TCP (or TLS over TCP)
// connection, not a WebSocket, and the edge offered them (wire.DataTokenOf of its resume token): not over
// in-memory pipes, not to old edges. They use the session's dialer and proxy (the one the
// control connection went through, if any) and, when the control connection is TLS, TLS with
// the same configuration (and a session cache, so that each new one resumes a TLS session
// instead of a full handshake).

// dataPoolSize is how many idle data connections a connector keeps per connection
// generation while it has a TCP tunnel. A used connection is replaced about one round trip
// (plain) or two (TLS) later, so the pool absorbs a burst of this many new public
// connections arriving within that time; a burst beyond it goes over yamux streams (slower,
// never refused). Each idle connection costs the edge a socket and no goroutine; 4 covers
// the usual bursts (a client's connection pool warming up, a browser's parallel
// connections) at a small fixed cost per connector, below the edge's cap
// (proxy.DataConnsMax).
const dataPoolSize = 4

// dataDialTimeout bounds dialling one data connection, its TLS handshake and the edge's
// answer to its preamble.
const dataDialTimeout = 10 * time.Second

// dataBackoffMin and dataBackoffMax bound the wait after a data connection could not be
// opened (or the edge refused it) before the next attempt.
const (
	dataBackoffMin = 100 * time.Millisecond
	dataBackoffMax = 10 * time.Second
)

// connData keeps one connection generation's data connections.
type connData struct {
	c        *clientConn
	addr     string      // the edge's address, as the control connection dialled it
	proxy    *url.URL    // the proxy the control connection went through (nil: none)
	tls      *tls.Config // nil: plain TCP
	preamble []byte
	kick     chan struct{} // wakes run: a connection was used or lost
	capped   atomic.Bool   // a data connection's receive buffer was capped (logged once)

	// idle holds the connections waiting for an envelope. One whose envelope is being
	// answered is taken out (claim), so that closing the idle ones never cuts an exchange
	// under way; a refusal puts it back (unclaim). stopped is set when the generation ended:
	// nothing goes back then.
	mu      sync.Mutex
	idle    map[net.Conn]struct{}
	stopped bool
}

// startData starts keeping data connections for c, if the edge offers them and c runs over
// TCP. It is called when c becomes the live connection.
func (s *Session) startData(c *clientConn) {
	s.mu.Lock()
	id, resume := s.resumeID, s.resumeToken
	s.mu.Unlock()
	token, ok := wire.DataTokenOf(resume)
	if !ok {
		return
	}
	if _, tcp := c.mux.RemoteAddr().(*net.TCPAddr); !tcp || s.opts.wsSet || s.opts.quic {
		return // over WebSocket, TCP tunnels' connections ride the session's streams
	}
	pre, err := wire.AppendDataPreamble(nil, wire.DataPreamble{SessionID: id, Token: token})
	if err != nil {
		return
	}
	edge := s.currentEdge()
	d := &connData{c: c, addr: edge.addr, proxy: edge.proxy, preamble: pre, kick: make(chan struct{}, 1), idle: map[net.Conn]struct{}{}}
	if cfg := s.opts.tlsConfig; cfg != nil {
		cfg = cfg.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = edge.host
		}
		if cfg.ClientSessionCache == nil {
			cfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		}
		d.tls = cfg
	}
	s.wg.Go(d.run)
}

// wanted reports whether a Forward TCP tunnel that is not closing is registered on the
// generation, and returns the channel closed at the next registration.
func (d *connData) wanted() (bool, <-chan struct{}) {
	c := d.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.byID {
		if t.spec.Proto != ProtoTCP || t.accept != nil {
			continue
		}
		t.mu.Lock()
		closing := t.closing // draining: the edge stops using data connections for it
		t.mu.Unlock()
		if !closing {
			return true, c.routed
		}
	}
	return false, c.routed
}

func (d *connData) idleCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.idle)
}

// claim takes dc out of the idle set to answer an envelope on it, and reports whether it
// was there: false means closeIdle took it (and closed it) first.
func (d *connData) claim(dc net.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.idle[dc]
	delete(d.idle, dc)
	return ok
}

// unclaim puts dc, whose envelope was refused, back in the idle set, and reports whether it
// did: false once the generation ended (the caller closes dc).
func (d *connData) unclaim(dc net.Conn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return false
	}
	d.idle[dc] = struct{}{}
	return true
}

// gone takes dc out of the idle set (it carries a connection now, or it is lost) and wakes
// run to replace it.
func (d *connData) gone(dc net.Conn) {
	d.mu.Lock()
	delete(d.idle, dc)
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run keeps the pool filled while the generation wants it, until the generation ends.
func (d *connData) run() {
	defer d.closeIdle(true)
	ctx := d.c.ctx
	failures := 0
	for {
		want, routed := d.wanted()
		if !want {
			d.closeIdle(false)
		}
		if want && d.idleCount() < dataPoolSize {
			if err := d.open(); err != nil {
				if ctx.Err() != nil {
					return
				}
				failures++
				wait := min(dataBackoffMin<<min(failures-1, 10), dataBackoffMax)
				d.c.s.log.Debug("data connection not opened", zap.Error(err), zap.Duration("retry_in", wait))
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
				continue
			}
			failures = 0
			continue
		}
		select {
		case <-routed:
		case <-d.kick:
		case <-ctx.Done():
			return
		}
	}
}

// open dials one data connection, says its preamble and waits for the edge's answer; then
// a goroutine of the session waits on it for envelopes.
func (d *connData) open() error {
	s := d.c.s
	ctx, cancel := context.WithTimeout(d.c.ctx, dataDialTimeout)
	defer cancel()
	dc, err := s.dialEdge(ctx, d.addr, d.proxy)
	if err != nil {
		return fmt.Errorf("tunnel: data connection: dialling: %w", err)
	}
	if n := s.opts.dataReadBuffer; n > 0 {
		if got := proxy.SetDataReadBuffer(dc, n); got < n && !d.capped.Swap(true) {
			s.log.Warn("data_read_buffer is capped by the kernel (net.core.rmem_max), or the connection is not TCP: data connections get a smaller fixed receive buffer than asked for, possibly smaller than what autotuning would reach; raise net.core.rmem_max or unset data_read_buffer",
				zap.Int("asked", n), zap.Int("granted", got))
		}
	}
	if d.tls != nil {
		tc := tls.Client(proxy.TLSBase(dc), d.tls) // large system calls while busy (copyData)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = dc.Close()
			return fmt.Errorf("tunnel: data connection: TLS handshake: %w", err)
		}
		dc = tc
	}
	dl, _ := ctx.Deadline()
	_ = dc.SetDeadline(dl)
	var answer [1]byte
	if _, err = dc.Write(d.preamble); err == nil {
		_, err = io.ReadFull(dc, answer[:])
	}
	if err == nil && answer[0] != wire.DataAccepted {
		_ = dc.Close()
		return fmt.Errorf("tunnel: data connection: the edge refused it: unexpected answer %#x", answer[0])
	}
	if err != nil {
		_ = dc.Close()
		return fmt.Errorf("tunnel: data connection: the edge refused it: %w", err)
	}
	_ = dc.SetDeadline(time.Time{})
	d.mu.Lock()
	d.idle[dc] = struct{}{}
	d.mu.Unlock()
	s.wg.Go(func() { d.serve(dc) })
	return nil
}

// closeIdle closes the idle data connections; their goroutines end. Those answering an
// envelope are left alone. final: the generation ended, no connection goes back to idle.
func (d *connData) closeIdle(final bool) {
	d.mu.Lock()
	idle := d.idle
	d.idle = map[net.Conn]struct{}{}
	d.stopped = d.stopped || final
	d.mu.Unlock()
	for dc := range idle {
		_ = dc.Close()
	}
}

// serve waits for envelopes on dc, idle. A refusal leaves it idle for the next one; an
// accepted one is carried to the tunnel's target until it ends, and dc with it.
func (d *connData) serve(dc net.Conn) {
	c, s := d.c, d.c.s
	for {
		env, err := wire.ReadEnvelope(dc)
		if err != nil {
			if errors.Is(err, wire.ErrMalformed) {
				_ = d.answer(dc, wire.AckMalformed)
			}
			d.gone(dc)
			_ = dc.Close()
			return
		}
		if !d.claim(dc) {
			_ = dc.Close() // closed as idle meanwhile: the edge finds it dead and uses a stream
			return
		}
		t := c.route(env.TunnelID)
		var refusal wire.Ack
		switch {
		case t == nil:
			refusal = wire.AckUnknownTunnel
		case t.accept != nil || env.Proto != ProtoTCP:
			refusal = wire.AckUseStream
		default:
			dl := net.Dialer{Timeout: s.opts.localTimeout}
			local, err := dl.DialContext(s.ctx, "tcp", t.target)
			if err != nil {
				s.log.Debug("local target refused a connection", zap.String("target", t.target), zap.Error(err))
				refusal = wire.AckRefused
				break
			}
			d.gone(dc) // in use: replace it
			t.streams.Add(1)
			defer t.streams.Add(-1)
			if err := d.answer(dc, wire.AckOK); err != nil {
				_ = local.Close()
				_ = dc.Close()
				return
			}
			proxy.QuickAck(dc)
			proxy.JoinData(c.ctx, local, dc, func() bool { _, err := c.mux.Ping(); return err == nil })
			return
		}
		if d.answer(dc, refusal) != nil || !d.unclaim(dc) {
			d.gone(dc)
			_ = dc.Close()
			return
		}
	}
}

// answer writes one acknowledgement on dc, bounded in time.
func (d *connData) answer(dc net.Conn, a wire.Ack) error {
	_ = dc.SetWriteDeadline(time.Now().Add(time.Second))
	_, err := dc.Write([]byte{byte(a)})
	_ = dc.SetWriteDeadline(time.Time{})
	return err
}
