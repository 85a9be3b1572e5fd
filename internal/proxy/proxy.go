// Package proxy is an edge's data path: the public HTTP ingress (HTTP), which routes each
// request by its Host header to a group and carries it to one member over a keep-alive
// stream, and the public TCP ingress (TCP), one listener per TCP group carrying each
// connection to one member.
//
// A member is reached through the *Tunnel its group.Member holds as its Value: the tunnel's
// yamux session, its id and protocol, its unread-notice key, a context that ends when the
// tunnel is removed, and its pool of idle HTTP streams. Opening a data stream writes the
// wire envelope and waits for the connector's acknowledgement; nothing of a request is
// written before it.
//
// Dispatch retries once, to one other member, and only when no byte of the request can have
// reached an application: opening the stream failed, or (Config.RetryUnreadRequests) the
// member's backend reset its connection with a bodyless request unread and its connector said
// so with an unread notice.
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
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"go.uber.org/zap"

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
	// RetryUnreadRequests lets a bodyless HTTP request go to one other member when the
	// first member's backend reset its connection with the request unread.
	RetryUnreadRequests bool
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
	// member's backend reset its connection with a bodyless request unread.
	RetriesOpenFailed, RetriesResetUnread *atomic.Uint64
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
		&c.Stats.RetriesOpenFailed, &c.Stats.RetriesResetUnread} {
		if *p == nil {
			*p = new(atomic.Uint64)
		}
	}
}

// ErrNoMember means the group has no healthy, non-draining member (below its concurrency
// cap) right now.
var ErrNoMember = errors.New("no healthy member")

// ErrClosed is returned by TCP.OnCreate once the TCP ingress is closed.
var ErrClosed = errors.New("proxy: closed")

// errUnread is the edge's reading of an unread notice: the member's backend reset its
// connection with the request unread. A bodyless request may then go to one other member.
var errUnread = errors.New("the backend reset its connection before reading the request")

// pastTime is a deadline that has always passed: setting it unblocks pending I/O at once.
var pastTime = time.Unix(1, 0)

// Tunnel is one registered tunnel as the data path sees it. The edge makes one per
// registration with NewTunnel and stores it as the group.Member's Value; the ingresses open
// streams to it and keep its idle HTTP streams.
type Tunnel struct {
	id        string
	proto     group.Proto
	sess      *yamux.Session
	noticeKey *[32]byte
	// ctx ends when the tunnel is closed (removed from its group, or its session ended):
	// every stream still open on it is cut then.
	ctx    context.Context
	cancel context.CancelFunc
	pool   connPool
}

// NewTunnel returns the data path of tunnel id, served by the connector at the other end of
// sess. proto is the tunnel's protocol, written into each stream's envelope. noticeKey checks
// the unread notices on its HTTP streams (wire.NoticeKey of the session's resume token); it
// is read when a response arrives, so it may be filled in after NewTunnel returns but before
// the tunnel is dispatched to. The tunnel's streams end when parent ends or Close is called.
func NewTunnel(parent context.Context, id string, proto group.Proto, sess *yamux.Session, noticeKey *[32]byte) *Tunnel {
	t := &Tunnel{id: id, proto: proto, sess: sess, noticeKey: noticeKey}
	t.ctx, t.cancel = context.WithCancel(parent)
	return t
}

// CloseIdle closes the tunnel's idle HTTP streams (it went unhealthy or is draining: they
// would not be picked again soon); the tunnel stays usable.
func (t *Tunnel) CloseIdle() { t.pool.closeIdle() }

// Close cuts every stream of the tunnel, idle or in flight, and closes any stream returned
// to its pool later. Call it once the tunnel has left its group.
func (t *Tunnel) Close() {
	t.pool.close()
	t.cancel()
}

// openError is a failure to open a data stream to a member before any payload was written:
// the one case where another member may be tried.
type openError struct {
	tunnel string
	err    error
}

func (e *openError) Error() string {
	return fmt.Sprintf("opening a stream to tunnel %s: %v", e.tunnel, e.err)
}
func (e *openError) Unwrap() error { return e.err }

// open opens a data stream to the tunnel's connector, writes the envelope and waits for
// the connector's acknowledgement, which it sends only once its local backend accepted the
// connection. Nothing else has been written when open fails, so the caller may retry on
// another member.
func (t *Tunnel) open(remoteAddr string, timeout time.Duration) (*yamux.Stream, error) {
	st, err := t.sess.OpenStream()
	if err != nil {
		return nil, &openError{t.id, err}
	}
	var buf [wire.MaxEnvelopeSize + 1]byte
	env, err := wire.AppendEnvelope(buf[:0], wire.Envelope{TunnelID: t.id, RemoteAddr: remoteAddr, Proto: t.proto})
	if err != nil {
		_ = st.Close()
		return nil, &openError{t.id, err}
	}
	_ = st.SetDeadline(time.Now().Add(timeout))
	if _, err := st.Write(env); err != nil {
		_ = st.Close()
		return nil, &openError{t.id, err}
	}
	ack := buf[:1]
	if _, err := io.ReadFull(st, ack); err != nil {
		_ = st.Close()
		return nil, &openError{t.id, fmt.Errorf("waiting for the acknowledgement: %w", err)}
	}
	if a := wire.Ack(ack[0]); a != wire.AckOK {
		_ = st.Close()
		return nil, &openError{t.id, errors.New(a.String())}
	}
	_ = st.SetDeadline(time.Time{})
	return st, nil
}

// picker chooses the members for one request or connection: a first pick and, only when
// no byte of the request can have reached an application, one other member, once.
type picker struct {
	g       *group.Group
	retries *atomic.Uint64 // counts retries after a failed open
	last    *group.Member  // the member picked last
	started bool
	retried bool
}

// next returns the first pick, then one member other than the last, then nil.
func (p *picker) next() *group.Member {
	switch {
	case !p.started:
		p.started = true
		p.last = p.g.Pick()
	case !p.retried && p.last != nil:
		p.retried = true
		p.last = p.g.PickExcept(p.last)
	default:
		return nil
	}
	return p.last
}

// pick picks a member and connects to it; if connecting fails (only opening the stream can
// fail here, before any payload is written) and p's retry is unspent, it tries one other
// member. The returned member holds an acquired stream slot: the caller must Release it when
// done. Called again after a success, it spends the retry on one other member.
func pick[T any](p *picker, connect func(*Tunnel) (T, error)) (T, *group.Member, error) {
	var zero T
	err := ErrNoMember
	for failed := false; ; failed = true {
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
		m.Release()
	}
}
