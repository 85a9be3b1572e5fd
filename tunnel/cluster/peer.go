package cluster

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/proxy"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
)

// The edge-to-edge link. The edge that forwards dials the edge that holds the member, over
// TCP (TLS with Config.PeerTLS), and sends
//
//	"WRNPEER1" len(1) <its edge id> sha256(token)(32)
//
// The other edge compares the token's hash in constant time and answers one byte, 0 (in) or
// 1 (refused, then closes). Then both run yamux: the dialling edge opens one stream per
// forwarded request or connection and writes the same envelope a connector gets; the
// holding edge opens a stream to the member's connector with it, passes the connector's
// acknowledgement (or refusal) back, and copies bytes both ways. So the retry rule holds
// across the hop: a refusal still means no byte reached an application. The holding edge
// only ever sends a forwarded stream to the member the envelope names, one of its own: a
// request is forwarded at most once.
// resetWriteTimeout bounds one write of a Reset frame on a link's reset channel, so that an
// edge that stopped reading cannot pin the goroutine writing to it (as the control stream's
// writes to a connector are bounded).
const resetWriteTimeout = 10 * time.Second

const (
	peerMagic            = "WRNPEER1"
	peerHandshakeTimeout = 5 * time.Second
	peerOK               = 0
	peerRefused          = 1
)

var errPeerRefused = errors.New("cluster: the edge refused the cluster token")

// Bounds on the streams one edge-to-edge link may cost the edge that accepted it. The other
// edge holds the token, but a buggy or compromised one must not be able to exhaust this one:
// every stream it opens costs a goroutine here while it is forwarded, and a yamux stream
// until both ends closed it.
const (
	// maxPeerStreams caps the streams of one link being forwarded at once. A link carries
	// every request and connection the other edge forwards to this edge's members (all its
	// public traffic for pools whose members are here, websockets and TCP connections
	// included), so the cap is in the thousands: a stream costs a goroutine and a few KiB
	// while it is idle, so 4096 of them are affordable, and more concurrent forwarded
	// streams than that from one edge to another means either a deployment that should run
	// more edges or a peer gone wrong. A stream over the cap is refused at once (AckRefused:
	// no byte reached an application, so the other edge may retry on another member).
	maxPeerStreams = 4096
	// maxPeerPending caps, within maxPeerStreams, the streams whose envelope has not arrived
	// yet. An edge writes the envelope as it opens the stream, so on a sound link these are
	// the few just accepted; a peer opening streams and sending nothing would otherwise hold
	// a goroutine each until OpenTimeout. Over it, a stream is refused at once, as above.
	maxPeerPending = 256
	// maxPeerHeld caps every stream yamux holds for one link: the forwarded ones, the ones
	// queued for accept (AcceptBacklog), and the refused or finished ones whose peer has not
	// closed its side yet (held up to yamux's StreamCloseTimeout, as yamux cannot reset a
	// stream). A sound peer closes a refused stream when it reads the refusal, so more than
	// this means the peer is broken: the link is closed, which frees them all.
	maxPeerHeld = 2 * maxPeerStreams
)

// peerLink is one edge-to-edge link, from either end.
type peerLink struct {
	sess   *yamux.Session
	conn   net.Conn
	ctx    context.Context // ends with the link: remote members' tunnels over it end too
	cancel context.CancelFunc
	once   sync.Once
	// resets, on the dialling end, tells the other edge of the forwarded streams this edge
	// abandoned (the public client went away), over the link's reset channel, so that it
	// resets its member's stream in turn; nil when the other edge has no reset channel.
	resets *mux.ResetSender
	// forwarded, on the accepting end, routes the other edge's resets to the streams it
	// forwarded here.
	forwarded mux.Resets
	// hasResetChannel, on the accepting end: the link's reset channel is open (one per link).
	hasResetChannel atomic.Bool
}

func (l *peerLink) close() {
	l.once.Do(func() {
		l.cancel()
		_ = l.sess.Close()
		_ = l.conn.Close()
	})
}

// peerSet is the links this edge accepted, closed when it stops.
type peerSet struct {
	mu     sync.Mutex
	closed bool
	links  map[*peerLink]struct{}
}

func (p *peerSet) add(l *peerLink) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *peerSet) remove(l *peerLink) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (p *peerSet) closeAll() {
	p.mu.Lock()
	p.closed = true
	links := make([]*peerLink, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

func (c *Cluster) tokenHash() [32]byte { return sha256.Sum256([]byte(c.cfg.Token)) }

// dialPeer links to the edge advertised at addr.
func (c *Cluster) dialPeer(addr, id string) (*peerLink, error) {
	ctx, cancel := context.WithTimeout(c.ctx, peerHandshakeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if c.cfg.PeerClientTLS != nil {
		tc := c.cfg.PeerClientTLS.Clone()
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(addr)
		}
		t := tls.Client(conn, tc)
		if err := t.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, err
		}
		conn = t
	}
	_ = conn.SetDeadline(time.Now().Add(peerHandshakeTimeout))
	h := c.tokenHash()
	hello := make([]byte, 0, len(peerMagic)+1+len(c.cfg.EdgeID)+len(h))
	hello = append(hello, peerMagic...)
	hello = append(hello, byte(len(c.cfg.EdgeID)))
	hello = append(hello, c.cfg.EdgeID...)
	hello = append(hello, h[:]...)
	var ans [1]byte
	if _, err := conn.Write(hello); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if _, err := io.ReadFull(conn, ans[:]); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("cluster: edge %s did not answer the link handshake: %w", id, err)
	}
	if ans[0] != peerOK {
		_ = conn.Close()
		return nil, errPeerRefused
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := mux.YamuxServer(conn, c.log, c.edge.OpenTimeout())
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	l := &peerLink{sess: sess, conn: conn}
	l.ctx, l.cancel = context.WithCancel(c.ctx)
	if !c.peers.add(l) {
		l.close()
		return nil, tunnel.ErrServerClosed
	}
	context.AfterFunc(l.ctx, func() { c.peers.remove(l) })
	if err := c.openResetChannel(l); err != nil {
		c.log.Debug("the other edge takes no stream resets: an abandoned forwarded stream waits for yamux's close timeout there",
			zap.String("edge", id), zap.Error(err))
	}
	return l, nil
}

// openResetChannel opens the stream on which the dialling end of link l sends the other edge
// its stream resets (wire.Reset frames), and sets l.resets. An edge that does not know the
// channel refuses it as a malformed envelope.
func (c *Cluster) openResetChannel(l *peerLink) error {
	st, err := l.sess.OpenStream()
	if err != nil {
		return err
	}
	_ = st.SetDeadline(time.Now().Add(c.edge.OpenTimeout()))
	var ack [1]byte
	if _, err := st.Write(wire.ResetChannel[:]); err != nil {
		_ = st.Close()
		return err
	}
	if _, err := io.ReadFull(st, ack[:]); err != nil {
		_ = st.Close()
		return err
	}
	if a := wire.Ack(ack[0]); a != wire.AckOK {
		_ = st.Close()
		return fmt.Errorf("cluster: the other edge refused the reset channel: %s", a)
	}
	_ = st.SetDeadline(time.Time{})
	l.resets = &mux.ResetSender{
		// One goroutine at a time sends (the sender's flush): no lock around the writes.
		Send: func(ids []uint32) error {
			_ = st.SetWriteDeadline(time.Now().Add(resetWriteTimeout))
			return wire.WriteFrame(st, &wire.Reset{Streams: ids})
		},
		Go: c.spawn,
	}
	return nil
}

// serveResetChannel reads the other edge's stream resets on link l's reset channel st until
// the link ends, and ends the forwarded streams they name.
func (c *Cluster) serveResetChannel(l *peerLink, st *yamux.Stream) {
	if !l.hasResetChannel.CompareAndSwap(false, true) {
		mux.Refuse(st, byte(wire.AckMalformed)) // one per link
		return
	}
	defer st.Close()
	_ = st.SetDeadline(time.Time{})
	if _, err := st.Write([]byte{byte(wire.AckOK)}); err != nil {
		return
	}
	for {
		m, err := wire.ReadFrame(st)
		if err != nil {
			return
		}
		if r, ok := m.(*wire.Reset); ok {
			l.forwarded.Reset(r.Streams)
		}
	}
}

// ServePeers implements tunnel.Cluster: it accepts the links of the other edges of the
// cluster on l until Leave (the edge's ListenAndServe does it on Config.PeerAddr), then
// returns tunnel.ErrServerClosed. Wrap l in TLS yourself or set Config.PeerTLS, not both.
func (c *Cluster) ServePeers(l net.Listener) error {
	if c.cfg.PeerTLS != nil {
		l = tls.NewListener(l, c.cfg.PeerTLS)
	}
	if !c.trackListener(l) {
		_ = l.Close()
		return tunnel.ErrServerClosed
	}
	for {
		conn, err := l.Accept()
		if err != nil {
			if c.ctx.Err() != nil || c.stopping() {
				return tunnel.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			c.untrackListener(l)
			return err
		}
		slot := c.preAuth.Acquire(throttle.KeyOf(conn.RemoteAddr()))
		if slot == nil { // over MaxPreAuthConns or MaxPreAuthConnsPerIP: counted and logged
			_ = conn.Close()
			continue
		}
		if !c.spawn(func() { c.servePeer(conn, slot) }) {
			slot.Release()
			_ = conn.Close()
			return tunnel.ErrServerClosed
		}
	}
}

// trackListener records l for Leave to close, unless the cluster is stopping or was not
// joined.
func (c *Cluster) trackListener(l net.Listener) bool {
	c.spawnMu.Lock()
	defer c.spawnMu.Unlock()
	if c.stopped || !c.joined {
		return false
	}
	if c.listeners == nil {
		c.listeners = map[net.Listener]struct{}{}
	}
	c.listeners[l] = struct{}{}
	return true
}

func (c *Cluster) untrackListener(l net.Listener) {
	c.spawnMu.Lock()
	defer c.spawnMu.Unlock()
	delete(c.listeners, l)
}

// stopping reports whether Leave has begun.
func (c *Cluster) stopping() bool {
	c.spawnMu.Lock()
	defer c.spawnMu.Unlock()
	return c.stopped
}

// servePeer checks an incoming link's handshake and serves its streams. Until the
// handshake is over the connection holds slot (the peer port's pre-authentication cap), and
// a wrong token counts as a failed authentication of its address, as on the control and
// admin listeners: delayed, then the address is refused for a while (ServerConfig's
// MaxAuthFailuresPerIP, AuthBlockDuration).
func (c *Cluster) servePeer(conn net.Conn, slot *throttle.Slot) {
	defer slot.Release() // idempotent: released at the end of the handshake
	from, ok := c.peerHandshake(conn)
	slot.Release()
	if !ok {
		_ = conn.Close()
		return
	}
	sess, err := mux.YamuxClient(conn, c.log)
	if err != nil {
		_ = conn.Close()
		return
	}
	l := &peerLink{sess: sess, conn: conn}
	l.ctx, l.cancel = context.WithCancel(c.ctx)
	if !c.peers.add(l) {
		l.close()
		return
	}
	defer c.peers.remove(l)
	defer l.close()
	c.log.Debug("edge linked", zap.String("edge", from), zap.Stringer("remote", conn.RemoteAddr()))
	var wg sync.WaitGroup
	defer wg.Wait()
	var lim peerLimits
	defer lim.report(c.log, from)
	for {
		st, err := sess.AcceptStreamWithContext(l.ctx)
		if err != nil {
			return
		}
		if n := sess.NumStreams(); n > maxPeerHeld {
			c.log.Warn("edge link closed: the other edge keeps more streams open on it than any real traffic needs",
				zap.String("edge", from), zap.Int("streams", n), zap.Int("max", maxPeerHeld))
			_ = st.Close()
			return // the deferred close frees every stream of the link
		}
		if !lim.admit() {
			lim.refused(c.log, from)
			mux.Refuse(st, byte(wire.AckRefused)) // bounded: the write by a second, the close by connWriteTimeout
			continue
		}
		// Tracked here, in the order of the streams' IDs, for a reset that overtakes the
		// stream to find it (mux.Resets).
		ctx, untrack := l.forwarded.Track(l.ctx, st.StreamID())
		wg.Go(func() {
			defer lim.active.Add(-1)
			defer untrack()
			c.forward(ctx, l, st, &lim.pending)
		})
	}
}

// peerLimits counts one accepted link's streams against maxPeerStreams and maxPeerPending.
type peerLimits struct {
	active   atomic.Int64 // streams in forward
	pending  atomic.Int64 // of those, the ones whose envelope was not read yet
	nRefused int64        // streams refused over a cap (the accept loop's alone)
}

// admit counts a stream in, pending its envelope, unless the link is at one of its caps.
func (p *peerLimits) admit() bool {
	if p.active.Load() >= maxPeerStreams || p.pending.Load() >= maxPeerPending {
		return false
	}
	p.active.Add(1)
	p.pending.Add(1)
	return true
}

// refused counts a refusal and logs the first one of the link.
func (p *peerLimits) refused(log *zap.Logger, from string) {
	p.nRefused++
	if p.nRefused == 1 {
		log.Warn("edge link over its stream caps: refusing streams",
			zap.String("edge", from), zap.Int64("forwarded", p.active.Load()), zap.Int64("awaiting_envelope", p.pending.Load()),
			zap.Int("max_streams", maxPeerStreams), zap.Int("max_awaiting_envelope", maxPeerPending))
	}
}

// report logs, when the link ends, how many streams it had refused.
func (p *peerLimits) report(log *zap.Logger, from string) {
	if p.nRefused > 0 {
		log.Warn("edge link ended; streams refused over its caps", zap.String("edge", from), zap.Int64("refused", p.nRefused))
	}
}

// peerHandshake reads and checks an incoming link's hello within peerHandshakeTimeout and
// answers it; it returns the dialling edge's id and whether the link is in.
func (c *Cluster) peerHandshake(conn net.Conn) (string, bool) {
	_ = conn.SetDeadline(time.Now().Add(peerHandshakeTimeout))
	attempt, err := c.edge.AuthThrottle().Begin(throttle.KeyOf(conn.RemoteAddr()))
	if err != nil { // blocked after failed attempts: no answer, the link is closed
		return "", false
	}
	defer attempt.Done() // no-op after Fail
	var head [len(peerMagic) + 1]byte
	if _, err := io.ReadFull(conn, head[:]); err != nil || string(head[:len(peerMagic)]) != peerMagic || head[len(peerMagic)] == 0 ||
		int(head[len(peerMagic)]) > maxEdgeIDLen {
		c.log.Warn("edge link refused: not a warren edge", zap.Stringer("remote", conn.RemoteAddr()))
		return "", false
	}
	rest := make([]byte, int(head[len(peerMagic)])+sha256.Size)
	if _, err := io.ReadFull(conn, rest); err != nil {
		return "", false
	}
	if err := attempt.Wait(c.ctx); err != nil {
		return "", false
	}
	want := c.tokenHash()
	if subtle.ConstantTimeCompare(rest[len(rest)-sha256.Size:], want[:]) != 1 {
		attempt.Fail()
		c.log.Warn("edge link refused: wrong cluster token", zap.Stringer("remote", conn.RemoteAddr()))
		_, _ = conn.Write([]byte{peerRefused})
		return "", false
	}
	if _, err := conn.Write([]byte{peerOK}); err != nil {
		return "", false
	}
	_ = conn.SetDeadline(time.Time{})
	return string(rest[:len(rest)-sha256.Size]), true
}

// forward carries one stream another edge forwarded over link l to the local member its
// envelope names; pending, counting the link's streams awaiting their envelope, is
// decremented once it is read (or is not, in OpenTimeout). ctx ends with the link, or when
// the other edge resets the stream: the member's stream is reset then too.
func (c *Cluster) forward(ctx context.Context, l *peerLink, st *yamux.Stream, pending *atomic.Int64) {
	_ = st.SetReadDeadline(time.Now().Add(c.edge.OpenTimeout()))
	env, err := wire.ReadEnvelope(st)
	pending.Add(-1)
	if errors.Is(err, wire.ErrResetChannel) {
		c.serveResetChannel(l, st)
		return
	}
	if err != nil {
		mux.Refuse(st, byte(wire.AckMalformed))
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	m := c.edge.Registry().Lookup(env.TunnelID)
	if m == nil || m.Edge != "" {
		mux.Refuse(st, byte(wire.AckUnknownTunnel)) // never forwarded twice
		return
	}
	t, ok := m.Value().(*proxy.Tunnel)
	if !ok || !m.AcquireForwarded() {
		mux.Refuse(st, byte(wire.AckUnknownTunnel))
		return
	}
	defer m.ReleaseForwarded()
	member, err := t.OpenForward(ctx, env.RemoteAddr, c.edge.OpenTimeout())
	if err != nil {
		mux.Refuse(st, byte(wire.AckRefused))
		return
	}
	if _, err := st.Write([]byte{byte(wire.AckOK)}); err != nil {
		t.Abandon(member)
		_ = st.Close()
		return
	}
	mux.Join(ctx, st, t.Joinable(member))
}
