// Package proxy is an edge's data path: the public HTTP ingress (HTTP), which routes each
// request by its Host header to a group and carries it to one member over a keep-alive
// stream, and the public TCP ingress (TCP), one listener per TCP group carrying each
// connection to one member.
//
// A member is reached through the *Tunnel its group.Member holds as its Value: the tunnel's
// yamux session, its id and protocol, its unread-notice key, a context that ends when the
// tunnel is removed, and its pool of idle HTTP streams. Opening a data stream writes the
// wire envelope; the connector answers with a one-byte acknowledgement once its local
// backend accepted the connection, or a refusal when it did not (and then closes the
// stream, discarding whatever the edge sent behind the envelope: no byte reached an
// application). A TCP connection, and an HTTP/2 connection to an h2c member, wait for the
// acknowledgement before their first byte. An HTTP/1.1 request does not (one round trip
// to the connector instead of two): its head goes right behind the envelope, with the
// request whole when it has no body, or with at most 64 KiB of its body, which the edge
// keeps until the acknowledgement arrives (the rest of a longer body waits for it); see
// memberConn.
//
// Dispatch retries at most once per request or connection, to one other member:
//
//   - always when opening the stream failed, or the connector refused it or closed or
//     reset it before acknowledging it: no byte of the request reached an application,
//     and the edge still holds every byte of it that it sent. A stream that failed before
//     its acknowledgement because its session died or OpenTimeout passed is no refusal
//     (the acknowledgement may have been on its way, the request with it): such a request
//     goes elsewhere only under the idempotent retry below;
//   - with Config.RetryUnreadRequests, when the member's backend reset its connection with a
//     bodyless request unread and its connector said so with an unread notice;
//   - for a member whose backend speaks h2c (Tunnel.SetBackendProtocol), when its backend
//     refused the request's HTTP/2 stream unprocessed (RST_STREAM REFUSED_STREAM, a GOAWAY
//     whose last stream is below it, a connection that closed before it was sent), if the
//     request has no body or the edge holds it for a replay (below); opening an HTTP/2
//     connection to a member that fails is a failed open;
//   - with Config.RetryIdempotent (opt-in per group), when a replayable request failed on
//     its member before any byte of a response arrived: the stream or the member's backend
//     connection ended or was reset, the session died, or an unread notice came. A request
//     is replayable when its method is GET, HEAD, OPTIONS, PUT or DELETE, or it carries an
//     Idempotency-Key header, and its body is empty or at most 64 KiB: the edge reads such a
//     body whole (through the public body's limits) before sending it, and sends the same
//     bytes again. A longer body is streamed as usual and never replayed.
//
// No request is sent again once a byte of its response arrived, nor once its client has
// gone. Config.Outcome, when set, hears of each attempt on a member: whether it failed (the
// open was refused, the member's stream ended before a response head, the backend answered
// 502) or not, for passive outlier ejection.
//
// A group's affinity (group.Group.Affinity) steers the first pick: "cookie" sends a request
// carrying a valid warren_affinity cookie to the member it names and hands out that cookie
// when another member served; "client_ip" and "header:<Name>" pick by consistent hashing of
// the client's address or the header's value. TCP groups honour "client_ip" only. A retry
// still goes to another member.
//
// A member's backend speaks HTTP/1.1 by default: each request in flight has a data stream of
// its own, kept alive for the next. With backend protocol h2c the edge speaks HTTP/2 with
// prior knowledge instead, over one data stream per HTTP/2 connection (h2.go), sharing it
// among many requests; gRPC needs it. Either way each public request, HTTP/1.1 or HTTP/2,
// is dispatched on its own. Request trailers are carried with their values, and interim 1xx
// responses (103 Early Hints) are relayed. A client speaking HTTP/2 with prior knowledge to a
// listener that does not serve it gets an HTTP/2 GOAWAY (HTTP_1_1_REQUIRED).
//
// Expect: 100-continue on a request with a body goes to the backend, whatever its protocol
// (net/http's HTTP/2 server hides it from the handler; the edge puts it back). The edge does
// not read the client's body, and so does not send it 100 Continue, until the backend
// answered 100 or a second passed without an answer (then the body goes anyway, as with
// net/http's client); a backend that gives its final answer first (a 413, a 401) gets none
// of the body, its answer is relayed, and the client's connection is closed after it (HTTP/2:
// the stream is reset, NO_ERROR) rather than its body read. A replayable request
// (Config.RetryIdempotent) with Expect is read ahead for a replay only when its length is
// announced, at most 64 KiB.
//
// Every request to a member carries the edge's forwarding headers: X-Forwarded-For,
// X-Forwarded-Proto, X-Forwarded-Host, Forwarded (RFC 7239) and X-Real-IP. The client's own
// are dropped, unless its TCP peer is a trusted proxy (Config.TrustedProxies): then its
// forwarding chain is kept and the peer appended, and X-Real-IP is the chain's right-most
// address that is no trusted proxy. The other headers only a proxy may set (X-Forwarded-Ssl,
// X-Forwarded-Port, CF-Connecting-IP, X-Original-URL…) are kept from a trusted proxy only,
// and every request gets the edge's Via element (forwarded.go).
//
// The package knows nothing of connector sessions, registration or the admin plane: the edge
// passes in its routing table, timeouts, a logger and counters.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/internal/mux"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/dispatch"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/policy"
	"github.com/warren-tunnel/warren/internal/wire"
)

// Config is what the ingresses read of their edge. NewHTTP needs Registry; every other field
// has a default or may be left unset.
type Config struct {
	// Registry is the edge's routing table: HTTP looks groups up in it and sweeps the idle
	// streams of its members.
	Registry *group.Registry
	// Domain is the public domain: HTTP tunnels are reached at <subdomain>.<Domain>.
	// Default "localhost".
	Domain string
	// Logger receives the proxy's logs. Default none.
	Logger *zap.Logger

	// OpenTimeout bounds opening a data stream to a member, its acknowledgement included.
	// Default 10 s.
	OpenTimeout time.Duration
	// IdleStreamTimeout is how long an idle keep-alive stream to a member may be reused.
	// Default 4 s.
	IdleStreamTimeout time.Duration
	// MaxHeaderBytes is the public listeners' header limit: an HTTP/2 request whose header
	// list is over it (RFC 7541 sizes, each field's name and value and 32 bytes, pseudo
	// headers included, with the 320 bytes of slack net/http gives HTTP/2) gets 431. The
	// edge's HTTP/2 servers decode header blocks past it, so that one large header ends
	// one request rather than the connection. 0: not checked (net/http's limit holds).
	MaxHeaderBytes int
	// RequestBodyMaxBytes caps public request bodies (413 above it); 0 means unlimited.
	RequestBodyMaxBytes int64
	// RequestBodyTimeout bounds how long a public request body may take to arrive, from
	// the edge's first read of it; 0 means no limit.
	RequestBodyTimeout time.Duration
	// RequestBodyMinRate is the slowest average, in bytes per second since the edge's first
	// read, at which a public request body may arrive once RequestBodyMinRateGrace has
	// passed: byte n must have arrived by grace + n/rate. 0 means no minimum.
	RequestBodyMinRate int64
	// RequestBodyMinRateGrace is the time a request body gets before RequestBodyMinRate
	// applies.
	RequestBodyMinRateGrace time.Duration
	// ResponseStallTimeout cuts a response whose write to its public client has made no
	// progress for this long: an HTTP/1.x client's connection is closed, an HTTP/2 client's
	// stream reset, and the member's stream closed. It also bounds what the server writes
	// of a response after the handler returned. 0 means no limit. See stall.go.
	ResponseStallTimeout time.Duration
	// StalledBytesPerConn, StalledBytesPerClient and StalledBytes are budgets, in bytes, of
	// what the responses whose public client is not keeping up (a write to it blocked for
	// longer than a short grace) may hold at the edge: per public connection, per client
	// address (an IPv4 address or an IPv6 /64 of the connection's remote address) and in
	// all. Each such response counts what its member may send ahead of the client: its
	// stream's receive window (4 MiB; 1 MiB for an h2c member), or the rest of its body if
	// shorter. A response that would take a budget over is cut at once, as at the stall
	// timeout. 0 means no budget.
	StalledBytesPerConn, StalledBytesPerClient, StalledBytes int64
	// RetryUnreadRequests lets a bodyless HTTP request go to one other member when the
	// first member's backend reset its connection with the request unread.
	RetryUnreadRequests bool
	// RetryIdempotent reports whether the replayable HTTP requests of group g may go to one
	// other member when their first member fails before any byte of a response arrived (see
	// the package documentation for what is replayable). When it returns true, the edge
	// buffers a replayable request's body, up to 64 KiB, before sending it. Nil means never;
	// the edge combines an edge-wide setting with the pool's own.
	RetryIdempotent func(g *group.Group) bool
	// Outcome, when set, is called once for each attempt on a member, so that the edge can
	// eject members that keep failing. failed is true, with a short reason, when opening a
	// stream to the member failed ("open refused: …"), when the member's stream or backend
	// connection ended before a response head arrived ("reset before a response"), when
	// its response head was malformed ("bad response: …"), or when its backend answered 502
	// ("backend answered 502"); failed is false, with reason "", when any other response
	// head arrived or, for TCP, when the stream was opened and acknowledged. An attempt that
	// the client ended (it went away, or its request body failed) is not reported. It is
	// called on the request's goroutine and must not block.
	Outcome func(m *group.Member, failed bool, reason string)
	// HTTPSHost returns the public host (and port, if not 443) of an https tunnel's
	// subdomain, where plain-HTTP requests to it are redirected; "" means no redirect (the
	// edge serves no HTTPS). Nil means never redirect.
	HTTPSHost func(subdomain string) string
	// Reserved reports whether a subdomain is a reserved endpoint: with no group it
	// answers 503 (no healthy backend), not 404. Nil means none is.
	Reserved func(subdomain string) bool
	// HTTPGate returns the admission policy of a subdomain, or nil; TCPGate that of a TCP
	// pool. A refused HTTP request gets the refusal's status (403, 429 or 503, with
	// Retry-After); a refused TCP connection is closed. Nil means no policy anywhere.
	HTTPGate func(subdomain string) *policy.Gate
	TCPGate  func(g *group.Group) *policy.Gate

	// TrustedProxies are the addresses of the proxies in front of the edge (a load
	// balancer, a CDN) whose forwarding headers it believes: a request whose TCP peer is in
	// one of these prefixes keeps its X-Forwarded-For and Forwarded, with the peer appended,
	// and its X-Forwarded-Proto and X-Forwarded-Host, and its X-Real-IP is the right-most
	// address of its chain that is not a trusted proxy; the other headers only a proxy may
	// set are kept from it. Any other request's forwarding headers are replaced by the
	// edge's own, and those other headers dropped (forwarded.go). Nil: no peer is trusted.
	TrustedProxies []netip.Prefix

	// TCPBindHost is the address TCP group listeners bind to; "" means all addresses.
	TCPBindHost string
	// ListenTCP, when set, replaces net.Listen for TCP group ports. It should return an
	// error wrapping group.ErrPortUnavailable when the port is taken, so that the registry
	// tries the next port.
	ListenTCP func(port int) (net.Listener, error)

	// Stats are the counters the proxy adds to; nil fields are replaced by private ones.
	Stats Stats
}

// Stats are the proxy's traffic counters, which the edge reads for its metrics.
type Stats struct {
	// HTTPRequests counts public HTTP(S) requests; TCPConnections public TCP connections.
	HTTPRequests, TCPConnections *atomic.Uint64
	// RetriesOpenFailed counts dispatches sent to one other member because opening the
	// stream to the first failed; RetriesResetUnread those sent on because the first
	// member's backend reset its connection with a bodyless request unread, or (h2c)
	// refused the request's stream unprocessed.
	RetriesOpenFailed, RetriesResetUnread *atomic.Uint64
	// RetriesIdempotent counts replayable requests (Config.RetryIdempotent) sent to one
	// other member because the first failed before any byte of a response arrived, other
	// than those counted in RetriesResetUnread.
	RetriesIdempotent *atomic.Uint64
	// ResponsesCut counts the responses cut because their client did not keep up, by rule.
	ResponsesCut *CutCounts
}

func (c *Config) setDefaults() {
	if c.Domain == "" {
		c.Domain = "localhost"
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = 10 * time.Second
	}
	if c.IdleStreamTimeout <= 0 {
		c.IdleStreamTimeout = 4 * time.Second
	}
	if c.HTTPSHost == nil {
		c.HTTPSHost = func(string) string { return "" }
	}
	for _, p := range []**atomic.Uint64{&c.Stats.HTTPRequests, &c.Stats.TCPConnections,
		&c.Stats.RetriesOpenFailed, &c.Stats.RetriesResetUnread, &c.Stats.RetriesIdempotent} {
		if *p == nil {
			*p = new(atomic.Uint64)
		}
	}
	if c.Stats.ResponsesCut == nil {
		c.Stats.ResponsesCut = new(CutCounts)
	}
}

// ErrNoMember means the group has no healthy, non-draining member (below its concurrency
// cap) right now.
var ErrNoMember = errors.New("proxy: no healthy member")

// ErrClosed is returned by TCP.OnCreate once the TCP ingress is closed.
var ErrClosed = errors.New("proxy: closed")

// errUnread is the edge's reading of an unread notice: the member's backend reset its
// connection with the request unread. A bodyless request may then go to one other member.
var errUnread = errors.New("proxy: the backend reset its connection before reading the request")

// pastTime is a deadline that has always passed: setting it unblocks pending I/O at once.
var pastTime = time.Unix(1, 0)

// Tunnel is one registered tunnel as the data path sees it. The edge makes one per
// registration with NewTunnel and stores it as the group.Member's Value; the ingresses open
// streams to it and keep its idle HTTP streams.
type Tunnel struct {
	id        string
	proto     group.Proto
	sess      mux.Session
	noticeKey *[32]byte
	// ctx ends when the tunnel is closed (removed from its group, or its session ended):
	// every stream still open on it is cut then.
	ctx    context.Context
	cancel context.CancelFunc
	pool   connPool
	// h2, when not nil, holds the HTTP/2 connections to a backend that speaks h2c
	// (SetBackendProtocol); HTTP requests then go there instead of to pool.
	h2 *h2Pool
	// data, when not nil, gives TCP connections the session's data connections
	// (SetDataConns, datacon.go).
	data *tunnelData
	// reset, when not nil, tells the connector that the edge abandoned a data stream
	// (SetStreamReset).
	reset func(streamID uint32)
}

// NewTunnel returns the data path of tunnel id, served by the connector at the other end of
// sess. proto is the tunnel's protocol, written into each stream's envelope (tls streams carry tcp: they are raw bytes). noticeKey checks
// the unread notices on its HTTP streams (wire.NoticeKey of the session's resume token); it
// is read when a response arrives, so it may be filled in after NewTunnel returns but before
// the tunnel is dispatched to. The tunnel's streams end when parent ends or Close is called.
func NewTunnel(parent context.Context, id string, proto group.Proto, sess mux.Session, noticeKey *[32]byte) *Tunnel {
	if proto == group.ProtoTLS {
		proto = group.ProtoTCP // a TLS passthrough stream is raw bytes, as a TCP one
	}
	t := &Tunnel{id: id, proto: proto, sess: sess, noticeKey: noticeKey}
	t.ctx, t.cancel = context.WithCancel(parent)
	return t
}

// SetStreamReset gives the tunnel the way to reset its data streams: reset(id) tells the
// connector that the edge abandoned stream id (a wire.Reset), so that it ends the stream and
// its backend connection at once. Without it, an abandoned stream is only half-closed (yamux
// has no reset): its connector goes on writing the backend's answer until the edge's receive
// window for it is full, and that window stays held (up to 4 MiB) until yamux's stream close
// timeout. Call it before the tunnel is dispatched to.
func (t *Tunnel) SetStreamReset(reset func(streamID uint32)) { t.reset = reset }

// abandon ends st, a data stream of the tunnel that the edge gives up on before its exchange
// ended (the public side went away or failed, the tunnel is removed): pending reads and
// writes return at once, and the connector is told to reset it.
func (t *Tunnel) abandon(st mux.Stream) {
	mux.Abort(st)
	if t.reset != nil {
		t.reset(st.StreamID())
	}
}

// resettable is a data stream as mux.Join sees it: when Join aborts, it asks each end for a
// reset (SetLinger(0), as of a TCP connection), and the stream's Close then abandons it
// (Tunnel.abandon) instead of only half-closing it.
type resettable struct {
	mux.Stream
	t     *Tunnel
	reset atomic.Bool
}

// Joinable returns st, a data stream of the tunnel, for mux.Join.
func (t *Tunnel) Joinable(st mux.Stream) net.Conn { return &resettable{Stream: st, t: t} }

// MuxStream is the stream itself (mux.Unwrapper).
func (s *resettable) MuxStream() mux.Stream { return s.Stream }

// SetLinger with 0 makes Close reset the stream.
func (s *resettable) SetLinger(sec int) error {
	if sec == 0 {
		s.reset.Store(true)
	}
	return nil
}

// Close half-closes the stream, or abandons it after SetLinger(0).
func (s *resettable) Close() error {
	if s.reset.Load() {
		s.t.abandon(s.Stream)
		return nil
	}
	return s.Stream.Close()
}

// CloseIdle closes the tunnel's idle HTTP streams (it went unhealthy or is draining: they
// would not be picked again soon); the tunnel stays usable.
func (t *Tunnel) CloseIdle() {
	t.pool.closeIdle()
	if t.h2 != nil {
		t.h2.closeIdle()
	}
}

// Close cuts every stream of the tunnel, idle or in flight, and closes any stream returned
// to its pool later. Call it once the tunnel has left its group.
func (t *Tunnel) Close() {
	t.pool.close()
	if t.h2 != nil {
		t.h2.close()
	}
	t.cancel()
}

// openError is a failure to open a data stream to a member: opening it failed, or its
// connector refused it (or closed or reset it unacknowledged), before any byte of the
// payload could reach an application. It is the one case where another member may be
// tried whatever the request. (A pipelined HTTP request's stream that failed before its
// acknowledgement otherwise, because its session died or the open timed out, is no
// openError: its connector may have accepted it and passed the request on.)
type openError struct {
	tunnel string
	err    error
}

func (e *openError) Error() string {
	return fmt.Sprintf("proxy: opening a stream to tunnel %s: %v", e.tunnel, e.err)
}
func (e *openError) Unwrap() error { return e.err }

// open opens a data stream to the tunnel's connector, writes the envelope and waits for
// the connector's acknowledgement, which it sends only once its local backend accepted the
// connection. Nothing else has been written when open fails, so the caller may retry on
// another member. The end of ctx (the public request or connection went away) stops the
// wait, closes the stream and returns ctx's error: not the member's failure.
func (t *Tunnel) open(ctx context.Context, remoteAddr string, timeout time.Duration) (mux.Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st, err := t.sess.OpenStream()
	if err != nil {
		return nil, &openError{tunnel: t.id, err: err}
	}
	_ = st.SetDeadline(time.Now().Add(timeout)) // before the abort, which must win
	stop := context.AfterFunc(ctx, func() { _ = st.SetDeadline(pastTime) })
	err = t.handshake(st, remoteAddr)
	if !stop() {
		if err == nil {
			t.abandon(st)
		}
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// handshake writes the envelope on st and waits for the connector's acknowledgement, within
// st's deadline; st is closed when it fails.
func (t *Tunnel) handshake(st mux.Stream, remoteAddr string) error {
	var buf [wire.MaxEnvelopeSize + 1]byte
	env, err := wire.AppendEnvelope(buf[:0], wire.Envelope{TunnelID: t.id, RemoteAddr: remoteAddr, Proto: t.proto})
	if err != nil {
		_ = st.Close()
		return &openError{tunnel: t.id, err: err}
	}
	if _, err := st.Write(env); err != nil {
		_ = st.Close()
		return &openError{tunnel: t.id, err: err}
	}
	ack := buf[:1]
	if _, err := io.ReadFull(st, ack); err != nil {
		// The connector may still be connecting its backend (the open timed out, or the
		// public side left): it is to give up.
		t.abandon(st)
		return &openError{tunnel: t.id, err: fmt.Errorf("waiting for the acknowledgement: %w", err)}
	}
	if a := wire.Ack(ack[0]); a != wire.AckOK {
		// The connector is done with the stream: over QUIC a plain close would hold its
		// receive side (the connector's end, unread) for the close timeout.
		mux.Abort(st)
		return &openError{tunnel: t.id, err: errors.New(a.String())}
	}
	mux.ClearDeadline(st)
	return nil
}

// openPipelined opens a data stream to the tunnel's connector for HTTP/1.1 requests without
// waiting for its acknowledgement: the envelope waits in the returned connection's write
// buffer, to go out with the first request, and the acknowledgement is read ahead of the
// first response (memberConn.readAck). The stream's deadline is timeout from now until the
// acknowledgement arrived. A failure here is an *openError: nothing was sent.
func (t *Tunnel) openPipelined(ctx context.Context, timeout time.Duration) (*memberConn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var buf [wire.MaxEnvelopeSize]byte
	env, err := wire.AppendEnvelope(buf[:0], wire.Envelope{TunnelID: t.id, Proto: t.proto})
	if err != nil {
		return nil, &openError{tunnel: t.id, err: err}
	}
	st, err := t.sess.OpenStream()
	if err != nil {
		return nil, &openError{tunnel: t.id, err: err}
	}
	_ = st.SetDeadline(time.Now().Add(timeout))
	pc := newMemberConn(t, st)
	pc.ackPending = true
	_, _ = pc.bw.Write(env) // into the empty 4 KiB buffer: cannot fail
	return pc, nil
}

// picker chooses the members for one request or connection: a first pick and, only when
// no byte of the request can have reached an application or the request is replayable, one
// other member, once.
type picker struct {
	g       *group.Group
	retries *atomic.Uint64 // counts retries after a failed open
	// outcome, if not nil, hears of each failed open (Config.Outcome).
	outcome func(m *group.Member, failed bool, reason string)
	// aff, if not nil, steers the first pick by the group's affinity.
	aff *affinity
	// ctx, if not nil, is the public request's or connection's: once it ended, no member is
	// picked or opened any more, and a failed open is not the member's failure.
	ctx     context.Context
	last    *group.Member // the member picked last
	started bool
	retried bool
}

// affinity is how a group's affinity (group.Group.Affinity) steers one request's or
// connection's first pick.
type affinity struct {
	// token is the request's affinity cookie: its member, if PickToken accepts it, serves.
	token string
	// cookie: hand out the serving member's token when it is not token.
	cookie bool
	// secure: the request came over TLS, and so does the cookie.
	secure bool
	// key, when keyed, is hashed to a member (PickKey).
	key   uint64
	keyed bool
}

// keyedBy returns the affinity of a key (a hash of the client's address or of a header).
func keyedBy(s string) *affinity { return &affinity{key: dispatch.HashString(s), keyed: true} }

// next returns the first pick, then one member other than the last, then nil.
func (p *picker) next() *group.Member {
	switch {
	case !p.started:
		p.started = true
		p.last = p.first()
	case !p.retried && p.last != nil:
		p.retried = true
		p.last = p.g.PickExcept(p.last)
	default:
		return nil
	}
	return p.last
}

// first is the first pick: by the affinity, if any, else by the group's strategy.
func (p *picker) first() *group.Member {
	switch a := p.aff; {
	case a == nil:
	case a.token != "":
		if m := p.g.PickToken(a.token); m != nil {
			return m
		}
	case a.keyed:
		return p.g.PickKey(a.key)
	}
	return p.g.Pick()
}

// pick picks a member and connects to it; if connecting fails (only opening the stream can
// fail here, before any payload is written) and p's retry is unspent, it tries one other
// member. The returned member holds an acquired stream slot: the caller must Release it when
// done. Called again after a success, it spends the retry on one other member.
func pick[T any](p *picker, connect func(*Tunnel) (T, error)) (T, *group.Member, error) {
	var zero T
	err := ErrNoMember
	for failed := false; ; failed = true {
		if p.ctx != nil && p.ctx.Err() != nil {
			return zero, nil, p.ctx.Err()
		}
		m := p.next()
		if m == nil {
			return zero, nil, err
		}
		if failed {
			p.retries.Add(1)
		}
		var v T
		if v, err = connect(m.Value().(*Tunnel)); err == nil {
			return v, m, nil
		}
		if p.ctx != nil && p.ctx.Err() != nil {
			// The client went away while the member was being opened.
			m.Release()
			return zero, nil, p.ctx.Err()
		}
		if p.outcome != nil {
			p.outcome(m, true, openRefused(err))
		}
		m.Release()
	}
}

// openRefused is the Outcome reason of a failed stream open.
func openRefused(err error) string {
	if oe := (*openError)(nil); errors.As(err, &oe) {
		err = oe.err
	}
	return "open refused: " + err.Error()
}
