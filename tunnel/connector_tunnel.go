package tunnel

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// Tunnel is a registered tunnel that forwards to a local address (see Session.Forward).
type Tunnel struct{ t *clientTunnel }

// ID is the tunnel id the edge assigned; it changes when the session reconnects, and is ""
// while the tunnel is not registered.
func (h *Tunnel) ID() string { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.id }

// URL is the tunnel's public URL: http(s)://<subdomain>.<domain>[:port] or tcp://<domain>:<port>.
func (h *Tunnel) URL() string { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.url }

// Port is the public TCP port of a TCP tunnel (0 for HTTP).
func (h *Tunnel) Port() int { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.port }

// Group is the pool's name as its first member set it ("" for a solo tunnel).
func (h *Tunnel) Group() string { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.groupName }

// TunnelHealth is a tunnel's health as its connector's prober last reported it to the edge
// (see TunnelSpec.Health). The edge selects a member with a health check only while its last
// report is healthy; a member without one is always selectable.
type TunnelHealth struct {
	// Checked: the tunnel has a health check. When false, the other fields are zero.
	Checked bool
	// Known: the prober has reported a first result for the current registration. It is
	// false until the first probe of each registration (the first one, and each one after a
	// reconnect) reports, since the edge starts every member unhealthy, and while the tunnel
	// is not registered (the connection is lost).
	Known bool
	// Healthy is the last reported state; meaningful only when Known.
	Healthy bool
	// Reason explains it: health.ReasonSucceeded when healthy, else the consecutive
	// failures and the last probe's error (the edge gets it cut to the wire's limit).
	Reason string
	// Since is when the probe that made the current state finished; zero when not Known.
	Since time.Time
}

// Health returns the tunnel's health as its prober last reported it. Once the tunnel is
// draining or has ended, it keeps the value it had then.
func (h *Tunnel) Health() TunnelHealth { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.health }

// ActiveStreams is the number of streams the tunnel carries now: the public requests and
// connections the edge opened to it that the connector accepted and has not finished. A
// Forward tunnel counts each stream from the moment its local target answered the dial until
// both directions ended; a Listen tunnel counts each stream from when it is handed to Accept
// (or waits for it, at most the local timeout) until the application closes the net.Conn.
// The edge keeps an HTTP tunnel's streams open between requests, for keep-alive, so idle
// ones count too until they are closed: by the local server, by the edge (one idle for
// longer than ServerConfig.Timeouts.IdleStream, when it next picks a stream or at its
// periodic sweep), or by a drain. It is exact on every system and costs two atomic adds per
// stream.
func (h *Tunnel) ActiveStreams() int { return int(h.t.streams.Load()) }

// Done is closed when the tunnel has ended: closed, rejected after a reconnect, or its
// session stopped.
func (h *Tunnel) Done() <-chan struct{} { return h.t.done }

// Err says why the tunnel ended; nil while it runs and after Close.
func (h *Tunnel) Err() error { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.err }

// Close begins the tunnel's drain and returns at once: the edge stops selecting the tunnel
// for new requests and connections, those in flight finish (bounded by the drain timeout,
// WithDrainTimeout, and the edge's own), then the edge removes it and Done is closed. A
// Listener's Accept returns net.ErrClosed as soon as Close is called, so http.Server.Close
// and Shutdown on it do not wait for the drain. Close is idempotent; Session.Close waits for
// (and bounds) every drain still under way.
func (h *Tunnel) Close() error {
	h.t.beginDrain(context.Background(), h.t.s.opts.drainTimeout)
	return nil
}

// Shutdown is the waiting form of Close: it drains the tunnel and returns once the tunnel
// has ended, the in-flight requests and connections finished. ctx bounds the wait: when it
// ends first, streams still open are cut and the edge removes the tunnel at once. After
// Close it waits for the drain Close began. It returns nil.
func (h *Tunnel) Shutdown(ctx context.Context) error { return h.t.shutdown(ctx) }

// Forward registers a tunnel that carries each public request or connection to localAddr
// ("host:port"), dialled afresh for every stream. It returns once the edge accepted the
// registration; a rejection is a *RejectedError carrying the edge's message.
func (s *Session) Forward(ctx context.Context, spec TunnelSpec, localAddr string) (*Tunnel, error) {
	if err := spec.normalize(false); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(localAddr); err != nil {
		return nil, fmt.Errorf("tunnel: %w: local address %q: %v", ErrInvalid, localAddr, err)
	}
	t := s.newTunnel(spec)
	t.target = localAddr
	if err := s.add(ctx, t); err != nil {
		return nil, err
	}
	return &Tunnel{t}, nil
}

// Listener is a registered tunnel whose streams are accepted in-process: it is a
// net.Listener, so http.Serve(l, handler) serves an in-process backend through the edge.
type Listener struct{ Tunnel }

// Listen registers a tunnel whose public requests or connections are handed to the
// returned listener's Accept.
func (s *Session) Listen(ctx context.Context, spec TunnelSpec) (*Listener, error) {
	if err := spec.normalize(true); err != nil {
		return nil, err
	}
	t := s.newTunnel(spec)
	t.accept = make(chan *streamConn)
	if err := s.add(ctx, t); err != nil {
		return nil, err
	}
	return &Listener{Tunnel{t}}, nil
}

// Accept waits for the next public request stream or connection. Once Close or Shutdown
// began, or the tunnel ended, it returns an error wrapping net.ErrClosed (and ErrTunnelClosed,
// or why the tunnel ended).
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.t.stopping:
		return nil, l.closedErr()
	default:
	}
	select {
	case c := <-l.t.accept:
		return c, nil
	case <-l.t.stopping:
		return nil, l.closedErr()
	case <-l.t.done:
		return nil, l.closedErr()
	}
}

func (l *Listener) closedErr() error {
	if err := l.Err(); err != nil {
		return fmt.Errorf("tunnel: %w: %w", net.ErrClosed, err)
	}
	return fmt.Errorf("%w: %w", ErrTunnelClosed, net.ErrClosed)
}

// Addr returns the tunnel's public URL as a net.Addr of network "warren".
func (l *Listener) Addr() net.Addr { return l.t.addr() }

// tunnelAddr is a tunnel's public URL as a net.Addr.
type tunnelAddr string

func (tunnelAddr) Network() string  { return "warren" }
func (a tunnelAddr) String() string { return string(a) }

func remoteAddr(s string) net.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return net.TCPAddrFromAddrPort(ap)
	}
	return tunnelAddr("edge")
}

// streamConn is a data stream handed to a Listen tunnel's Accept. Its acknowledgement is
// written before the first byte of the application's, whichever comes first.
type streamConn struct {
	mux.Stream
	local, remote net.Addr
	ackOnce       sync.Once
	ackErr        error
	// active is the tunnel's stream count, decremented once, by the first Close (or by
	// serve, when the stream is refused before Accept took it).
	active *atomic.Int64
	closed atomic.Bool
	// untrack takes the stream out of its connection's reset table; stopReset stops the
	// watch for a reset (see clientTunnel.serve).
	untrack   func()
	stopReset func() bool
}

// release takes the stream out of its tunnel's count and its connection's reset table, once.
func (c *streamConn) release() {
	if c.closed.CompareAndSwap(false, true) {
		c.active.Add(-1)
		c.stopReset()
		c.untrack()
	}
}

// abort cuts the stream at once, on both sides: the edge reset it.
func (c *streamConn) abort() { mux.Abort(c.Stream) }

// MuxStream is the stream itself (mux.Unwrapper).
func (c *streamConn) MuxStream() mux.Stream { return c.Stream }

func (c *streamConn) ack() error {
	c.ackOnce.Do(func() { _, c.ackErr = c.Stream.Write([]byte{byte(wire.AckOK)}) })
	return c.ackErr
}

// Write implements net.Conn.
func (c *streamConn) Write(p []byte) (int, error) {
	if err := c.ack(); err != nil {
		return 0, err
	}
	return c.Stream.Write(p)
}

// CloseWrite half-closes: the peer reads EOF, and this side can still read. The stream was
// accepted, so its acknowledgement goes first.
func (c *streamConn) CloseWrite() error {
	_ = c.ack()
	return c.Stream.Close()
}

// Close closes both directions: pending reads return at once. The stream was accepted, so
// its acknowledgement goes first.
func (c *streamConn) Close() error {
	c.release()
	_ = c.ack()
	_ = c.Stream.SetReadDeadline(pastTime)
	return c.Stream.Close()
}

// LocalAddr is the tunnel's public URL.
func (c *streamConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the public client's address for TCP tunnels; HTTP streams are shared by
// requests from many clients (use X-Forwarded-For).
func (c *streamConn) RemoteAddr() net.Addr { return c.remote }
