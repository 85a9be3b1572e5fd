package tunnel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/warren-tunnel/warren/group"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/wire"
)

// Proto is the protocol a tunnel carries ([group.Proto]).
type Proto = group.Proto

// Protocols a tunnel can carry.
const (
	// ProtoHTTP tunnels are reached at http://<subdomain>.<domain> (and over HTTPS when the
	// edge serves it).
	ProtoHTTP = group.ProtoHTTP
	// ProtoHTTPS tunnels are reached only over the edge's HTTPS listener; plain HTTP
	// requests are redirected.
	ProtoHTTPS = group.ProtoHTTPS
	// ProtoTCP tunnels get a public TCP port from the edge's range.
	ProtoTCP = group.ProtoTCP
)

// TunnelSpec describes one tunnel to register.
type TunnelSpec struct {
	// Proto is ProtoHTTP (the default), ProtoHTTPS or ProtoTCP.
	Proto Proto
	// Subdomain is the HTTP route: the tunnel serves <Subdomain>.<edge domain>. Required
	// for http and https.
	Subdomain string
	// Name is a display label for a solo TCP tunnel (optional).
	Name string
	// Group and GroupKey make the tunnel a member of a pool: connectors presenting the same
	// route, group and key share it. The key is hashed (SHA-256) here; only the hash is sent.
	// For TCP, the group name is the route. Both or neither.
	Group    string
	GroupKey string
	// Health, when set, probes the local target; the member starts unhealthy and receives
	// traffic only while its probe passes. Listen tunnels take a health.TypeFunc check.
	Health *health.Spec
	// AlertWebhook is a URL the edge POSTs to when this tunnel's group has no healthy member
	// left. It stays on the edge; no API returns it.
	AlertWebhook string

	// keyHash is the hex SHA-256 of GroupKey; the session keeps only this, not the key.
	keyHash string
}

func (sp TunnelSpec) describe() string {
	switch {
	case sp.Proto == ProtoTCP && sp.Group != "":
		return "tcp group " + sp.Group
	case sp.Proto == ProtoTCP:
		return "tcp " + sp.Name
	}
	return string(sp.Proto) + " " + sp.Subdomain
}

func (sp *TunnelSpec) normalize(listen bool) error {
	if sp.Proto == "" {
		sp.Proto = ProtoHTTP
	}
	switch sp.Proto {
	case ProtoHTTP, ProtoHTTPS:
		if sp.Subdomain == "" {
			return fmt.Errorf("tunnel: %w: %s tunnels need a subdomain", ErrInvalid, sp.Proto)
		}
	case ProtoTCP:
	default:
		return fmt.Errorf("tunnel: %w: unknown proto %q (want http, https or tcp)", ErrInvalid, sp.Proto)
	}
	if (sp.Group == "") != (sp.GroupKey == "") {
		return fmt.Errorf("tunnel: %w: group and group key go together", ErrInvalid)
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"subdomain", sp.Subdomain, wire.MaxLabelLen}, {"name", sp.Name, wire.MaxLabelLen},
		{"group", sp.Group, wire.MaxGroupLen}, {"alert webhook", sp.AlertWebhook, wire.MaxURLLen},
	} {
		if len(f.value) > f.max {
			return fmt.Errorf("tunnel: %w: %s is %d bytes, the limit is %d", ErrInvalid, f.name, len(f.value), f.max)
		}
	}
	if sp.GroupKey != "" {
		h := sha256.Sum256([]byte(sp.GroupKey))
		sp.keyHash, sp.GroupKey = hex.EncodeToString(h[:]), "" // the raw key is not kept
	}
	if h := sp.Health; h != nil {
		spec := h.WithDefaults()
		if err := spec.Validate(); err != nil {
			return fmt.Errorf("tunnel: %w: health check: %v", ErrInvalid, err)
		}
		if len(spec.Path) > wire.MaxURLLen {
			return fmt.Errorf("tunnel: %w: health check path is longer than %d bytes", ErrInvalid, wire.MaxURLLen)
		}
		if listen && spec.Type != health.TypeFunc {
			return fmt.Errorf("tunnel: %w: a Listen tunnel has no local address to probe; use a health.TypeFunc check", ErrInvalid)
		}
		sp.Health = &spec
	}
	return nil
}

func (sp TunnelSpec) register(req uint32) *wire.Register {
	m := &wire.Register{Req: req, Proto: sp.Proto, Label: sp.Subdomain, Group: sp.Group}
	if sp.Proto == ProtoTCP {
		m.Label = sp.Name
	}
	m.KeyHash = sp.keyHash
	if h := sp.Health; h != nil {
		m.Health = &wire.HealthInfo{Kind: string(h.Type), Path: h.Path, IntervalMS: h.Interval.Milliseconds(),
			TimeoutMS: h.Timeout.Milliseconds(), MaxFailed: h.MaxFailed, AlertWebhook: sp.AlertWebhook}
	} else if sp.AlertWebhook != "" {
		m.Health = &wire.HealthInfo{Kind: "none", AlertWebhook: sp.AlertWebhook}
	}
	return m
}

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
	closing   bool
	err       error
	done      chan struct{}
}

func (s *Session) newTunnel(spec TunnelSpec) *clientTunnel {
	return &clientTunnel{s: s, spec: spec, done: make(chan struct{}), stopProbe: func() {}}
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
	req := t.spec.register(s.reqs.Add(1))
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
		t.mu.Unlock()
		s.log.Info("tunnel registered", zap.String("tunnel", r.TunnelID), zap.String("url", r.URL), zap.String("group", r.Group))
		t.startProbe(c, r.TunnelID)
		return nil
	}
	return fmt.Errorf("tunnel: %w: unexpected answer to register", ErrProtocol)
}

// startProbe runs the tunnel's health prober for one registration.
func (t *clientTunnel) startProbe(c *clientConn, id string) {
	if t.spec.Health == nil {
		return
	}
	s := t.s
	report := func(r health.Report) {
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

// serve carries one data stream of connection c to the tunnel's target.
func (t *clientTunnel) serve(c *clientConn, st *yamux.Stream, env wire.Envelope) {
	s := t.s
	if t.accept != nil {
		sc := &streamConn{Stream: st, local: t.addr(), remote: remoteAddr(env.RemoteAddr)}
		timer := time.NewTimer(s.opts.acceptTimeout)
		defer timer.Stop()
		select {
		case t.accept <- sc:
			_ = sc.ack()
		case <-timer.C:
			refuse(st, wire.AckRefused)
		case <-t.done:
			refuse(st, wire.AckUnknownTunnel)
		case <-s.ctx.Done():
			refuse(st, wire.AckUnknownTunnel)
		}
		return
	}
	d := net.Dialer{Timeout: s.opts.localTimeout}
	local, err := d.DialContext(s.ctx, "tcp", t.target)
	if err != nil {
		s.log.Debug("local target refused a stream", zap.String("target", t.target), zap.Error(err))
		refuse(st, wire.AckRefused)
		return
	}
	if _, err := st.Write([]byte{byte(wire.AckOK)}); err != nil {
		_ = local.Close()
		_ = st.Close()
		return
	}
	if env.Proto != group.ProtoTCP && c.noticeKey != nil {
		local = &unreadConn{Conn: local, st: st, key: c.noticeKey}
	}
	join(c.ctx, local, st)
}

// lost is called when the connection t was registered on is gone.
func (t *clientTunnel) lost(c *clientConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn != c {
		return
	}
	t.stopProbe()
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

// shutdown drains the tunnel on the edge (bounded by ctx), then forgets it.
func (t *clientTunnel) shutdown(ctx context.Context) error {
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		<-t.done
		return nil
	}
	t.closing = true
	t.stopProbe()
	c, id, drained := t.conn, t.id, t.drained
	t.mu.Unlock()

	if c != nil && id != "" {
		if err := c.send(&wire.Drain{TunnelID: id}); err == nil {
			select {
			case <-drained:
			case <-ctx.Done():
				_ = c.send(&wire.Deregister{TunnelID: id})
			case <-c.mux.CloseChan():
			}
		}
		c.mu.Lock()
		delete(c.byID, id)
		c.mu.Unlock()
	}
	t.finish(nil)
	return nil
}

// fail ends the tunnel with err (a rejection after reconnect, or the session's end).
func (t *clientTunnel) fail(err error) {
	t.mu.Lock()
	t.closing = true
	t.stopProbe()
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

// Done is closed when the tunnel has ended: closed, rejected after a reconnect, or its
// session stopped.
func (h *Tunnel) Done() <-chan struct{} { return h.t.done }

// Err says why the tunnel ended; nil while it runs and after Close.
func (h *Tunnel) Err() error { h.t.mu.Lock(); defer h.t.mu.Unlock(); return h.t.err }

// Close drains the tunnel: the edge stops selecting it for new requests and connections,
// waits for those in flight (bounded by the drain timeouts), then removes it.
func (h *Tunnel) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), h.t.s.opts.drainTimeout)
	defer cancel()
	return h.t.shutdown(ctx)
}

// Shutdown is Close with the drain bounded by ctx.
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

// Accept waits for the next public request stream or connection. After Close it returns
// an error wrapping net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.t.accept:
		return c, nil
	case <-l.t.done:
		if err := l.Err(); err != nil {
			return nil, fmt.Errorf("%w: %w", net.ErrClosed, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrTunnelClosed, net.ErrClosed)
	}
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
	*yamux.Stream
	local, remote net.Addr
	ackOnce       sync.Once
	ackErr        error
}

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
	_ = c.ack()
	_ = c.Stream.SetReadDeadline(pastTime)
	return c.Stream.Close()
}

// LocalAddr is the tunnel's public URL.
func (c *streamConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr is the public client's address for TCP tunnels; HTTP streams are shared by
// requests from many clients (use X-Forwarded-For).
func (c *streamConn) RemoteAddr() net.Addr { return c.remote }
