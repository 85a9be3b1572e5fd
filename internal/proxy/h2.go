package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-tunnel/warren/internal/mux"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// HTTP/2 to a member (backend protocol "h2c"). The edge keeps, per member, a few HTTP/2
// client connections, each carried on one data stream opened like any other (envelope,
// then the connector's acknowledgement once its backend accepted the TCP connection), and
// sends many requests on each: one HTTP/2 stream per request. They are net/http's own
// client connections (http.Transport.NewClientConn), which the edge pools itself so that it
// decides where a request may go again: opening a connection that fails (the stream open,
// or the HTTP/2 preface) is a failed open, and another member is tried; a new connection
// carries one request until the backend's SETTINGS tell its stream limit, then no more than
// that limit (h2Conn.reserve); a request without a body whose stream the backend refused
// (RST_STREAM REFUSED_STREAM: at its limit, not failing) is sent again on a new stream to the
// same member, h2RefusedRetries times; a request the backend refused unprocessed
// (REFUSED_STREAM, above a GOAWAY's last stream, or on a connection that closed before it
// was sent) then goes to one other member if it has no body or the edge holds it for a
// replay; anything else is the member's answer or failure.

const (
	// h2IdleTimeout closes a member's HTTP/2 connection that carried no request for this
	// long. A backend that closes one first sends GOAWAY, so a request racing it is
	// refused unprocessed rather than lost: the connection can stay longer than an
	// HTTP/1.1 keep-alive stream.
	h2IdleTimeout = 90 * time.Second
	// h2StreamWindow is the receive window of each request to an h2c member: what the edge
	// buffers of one response while its public client reads slowly. The connection window
	// is left at net/http's default (1 GiB) so that slow clients cannot stall the other
	// requests on the member's connection; the total stays bounded by the requests in
	// flight.
	h2StreamWindow = 1 << 20
	// h2MaxReadFrameSize is the largest frame the edge accepts from a member.
	h2MaxReadFrameSize = 256 << 10
)

// h2DialKey carries, in the context given to http.Transport.NewClientConn, the member
// stream the transport's DialContext returns.
type h2DialKey struct{}

// h2Transport makes the client connections to h2c members; it pools nothing itself.
var h2Transport = sync.OnceValue(func() *http.Transport {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if c, ok := ctx.Value(h2DialKey{}).(net.Conn); ok {
				return c, nil
			}
			return nil, errors.New("proxy: no member stream to dial")
		},
		IdleConnTimeout: h2IdleTimeout,
		// A request with Expect: 100-continue waits this long for the backend's 100
		// before its body is sent anyway, as http.Transport's own default client does.
		ExpectContinueTimeout: time.Second,
		// The edge relays bodies as they are: no Accept-Encoding of its own.
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream: h2StreamWindow,
			MaxReadFrameSize:          h2MaxReadFrameSize,
		},
	}
})

// SetBackendProtocol sets the protocol the tunnel's backend speaks: wire.BackendH2C makes
// the edge send its HTTP requests as HTTP/2 over cleartext (prior knowledge); anything else
// (wire.BackendHTTP1, "") is HTTP/1.1. The registration's value was checked by
// wire.Register.Validate. Call it before the tunnel is dispatched to.
func (t *Tunnel) SetBackendProtocol(p string) {
	if p == wire.BackendH2C && t.proto != group.ProtoTCP {
		t.h2 = &h2Pool{t: t}
	} else {
		t.h2 = nil
	}
}

// BackendProtocol returns the protocol of the tunnel's backend: wire.BackendH2C or
// wire.BackendHTTP1.
func (t *Tunnel) BackendProtocol() string {
	if t.h2 != nil {
		return wire.BackendH2C
	}
	return wire.BackendHTTP1
}

// h2Pool holds a member's HTTP/2 client connections.
type h2Pool struct {
	t       *Tunnel
	mu      sync.Mutex
	conns   []*h2Conn
	dialing *h2Dial // the connection being made, or nil
	closed  bool
}

// h2Conn is one HTTP/2 client connection to a member, on one data stream.
type h2Conn struct {
	cc *http.ClientConn
	sc *h2StreamConn
}

// reserve reserves a request slot on c, and reports whether it did; settled is whether the
// backend's first SETTINGS arrived. Until they do, c takes one request: net/http lets a new
// connection carry 100 streams before it knows the backend's limit, and a backend that
// allows fewer refuses the rest (REFUSED_STREAM), while slots reserved past its limit
// deadlock the connection (a request waiting for a stream slot holds the lock the others
// need to give back theirs). After, c takes no more requests than the backend's
// MAX_CONCURRENT_STREAMS, even before net/http applied it. p.mu is held: the pool's
// reservations are made one at a time.
func (c *h2Conn) reserve() (ok, settled bool) {
	limit, settled := c.sc.settings.maxStreams()
	if !settled {
		limit = 1
	}
	if c.cc.InFlight() >= limit {
		return false, settled
	}
	return c.cc.Reserve() == nil, settled
}

// get returns a connection with a request slot reserved for the caller, which must use it
// (roundTrip): an open one with room, or a new one. Requests that find no room wait for
// the one connection being made, or for a new connection's backend to tell its stream
// limit, rather than each making its own. A failure to make a new connection is an
// *openError: nothing of any request was sent. The end of ctx ends the wait with ctx's
// error (a connection being made is still made, for the others).
func (p *h2Pool) get(ctx context.Context, openTimeout time.Duration) (*h2Conn, error) {
	for dials := 0; ; {
		if dials == 3 {
			// Connections were made, but each closed at once:
			// still nothing of it was sent.
			return nil, &openError{tunnel: p.t.id, err: errors.New("no HTTP/2 connection to the backend took the request")}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, &openError{tunnel: p.t.id, err: ErrClosed}
		}
		dead := p.prune(false)
		var got, unsettled *h2Conn
		for _, c := range p.conns {
			ok, settled := c.reserve()
			if ok {
				got = c
				break
			}
			if !settled && unsettled == nil {
				unsettled = c
			}
		}
		d := p.dialing
		if got == nil && d == nil && unsettled == nil {
			d = &h2Dial{done: make(chan struct{})}
			p.dialing = d
			go p.dial(d, openTimeout)
		}
		p.mu.Unlock()
		closeAll(dead)
		if got != nil {
			return got, nil
		}
		if d != nil {
			select {
			case <-d.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if d.err != nil {
				return nil, d.err
			}
			if d.c.cc.Err() != nil {
				dials++
			}
			continue // take a slot on it like anyone else
		}
		// A new connection whose backend has not told its limit yet: wait for it.
		t := time.NewTimer(openTimeout)
		select {
		case <-unsettled.sc.settings.settled:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
			// No SETTINGS in all that time: the connection is no use.
			_ = unsettled.cc.Close()
			return nil, &openError{tunnel: p.t.id, err: errors.New("the backend sent no HTTP/2 SETTINGS")}
		}
	}
}

// h2Dial is a connection being made; the requests waiting for it share its outcome.
type h2Dial struct {
	done chan struct{}
	c    *h2Conn
	err  error
}

// dial opens a data stream to the member, starts HTTP/2 on it and adds it to the pool.
func (p *h2Pool) dial(d *h2Dial, openTimeout time.Duration) {
	c, err := p.connect(openTimeout)
	p.mu.Lock()
	p.dialing = nil
	switch {
	case err == nil && p.closed:
		err = &openError{tunnel: p.t.id, err: ErrClosed}
		defer closeAll([]*h2Conn{c})
	case err == nil:
		p.conns = append(p.conns, c)
	}
	d.c, d.err = c, err
	close(d.done)
	p.mu.Unlock()
}

func (p *h2Pool) connect(openTimeout time.Duration) (*h2Conn, error) {
	// Not the request's context: the connection is shared by the requests waiting for it.
	st, err := p.t.open(context.Background(), "", openTimeout)
	if err != nil {
		return nil, err
	}
	nc := newH2StreamConn(p.t, st)
	ctx := context.WithValue(context.Background(), h2DialKey{}, net.Conn(nc))
	cc, err := h2Transport().NewClientConn(ctx, "http", "member:80")
	if err != nil {
		_ = nc.Close()
		return nil, &openError{tunnel: p.t.id, err: err}
	}
	return &h2Conn{cc: cc, sc: nc}, nil
}

// prune takes the closed connections out of the pool, and with idle too those that carry
// no request (and any that can take none, having had a GOAWAY), and returns them to be
// closed. p.mu is held.
func (p *h2Pool) prune(idle bool) []*h2Conn {
	var dead []*h2Conn
	keep := p.conns[:0]
	for _, c := range p.conns {
		switch {
		case c.cc.Err() != nil,
			c.cc.InFlight() == 0 && (idle || c.cc.Available() == 0):
			dead = append(dead, c)
		default:
			keep = append(keep, c)
		}
	}
	clear(p.conns[len(keep):])
	p.conns = keep
	return dead
}

// sweep closes the closed and unusable connections (each closes itself once idle for
// h2IdleTimeout).
func (p *h2Pool) sweep() {
	p.mu.Lock()
	dead := p.prune(false)
	p.mu.Unlock()
	closeAll(dead)
}

// closeIdle closes the connections that carry no request.
func (p *h2Pool) closeIdle() {
	p.mu.Lock()
	dead := p.prune(true)
	p.mu.Unlock()
	closeAll(dead)
}

// close closes every connection, in flight or not, and any made later.
func (p *h2Pool) close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	closeAll(conns)
}

func closeAll(cs []*h2Conn) {
	for _, c := range cs {
		_ = c.cc.Close()
	}
}

// h2StreamConn is the net.Conn an HTTP/2 client connection runs on: a member's data stream,
// cut when the tunnel is removed.
type h2StreamConn struct {
	mux.Stream
	t        *Tunnel
	unhook   func() bool
	once     sync.Once
	settings h2Settings // the backend's stream limit, as its frames are read
}

func newH2StreamConn(t *Tunnel, st mux.Stream) *h2StreamConn {
	c := &h2StreamConn{Stream: st, t: t}
	c.settings.settled = make(chan struct{})
	c.settings.limit.Store(-1)
	c.unhook = context.AfterFunc(t.ctx, c.abort)
	return c
}

// Read reads the stream; the end of a stream whose session died first is an error.
func (c *h2StreamConn) Read(p []byte) (int, error) {
	n, err := c.Stream.Read(p)
	c.settings.feed(p[:n])
	if err != nil {
		c.settings.settle()
	}
	return n, mux.StreamEOF(c.Stream, err)
}

// h2Settings follows the frames a backend sends on one connection, as the HTTP/2 transport
// reads them, for the backend's SETTINGS_MAX_CONCURRENT_STREAMS: the pool learns the limit
// as soon as the bytes are read, without waiting for net/http to apply it (which it does not
// report). Only the transport's read loop feeds it.
type h2Settings struct {
	hdr     [9]byte
	nhdr    int    // bytes of hdr read
	skip    int    // bytes left of a frame not looked at
	want    int    // length of the SETTINGS frame being collected, or 0
	payload []byte // what was read of it
	seen    bool   // a SETTINGS frame was read
	off     bool   // the stream of frames made no sense: no more is read of it
	// limit is the backend's stream limit: -1 before its first SETTINGS.
	limit   atomic.Int64
	settled chan struct{} // closed at its first SETTINGS, or once the connection fails
	once    sync.Once
}

const (
	h2FrameSettings     = 0x4
	h2FlagAck           = 0x1
	h2SettingMaxStreams = 0x3
	// h2DefaultMaxStreams is net/http's limit for a backend whose first SETTINGS name none.
	h2DefaultMaxStreams = 1000
)

// maxStreams returns the backend's stream limit and whether it is known: 0 when the
// connection failed before its SETTINGS.
func (s *h2Settings) maxStreams() (int, bool) {
	select {
	case <-s.settled:
		return int(max(s.limit.Load(), 0)), true
	default:
		return 0, false
	}
}

func (s *h2Settings) settle() { s.once.Do(func() { close(s.settled) }) }

// feed reads b, the next bytes the backend sent.
func (s *h2Settings) feed(b []byte) {
	for len(b) > 0 && !s.off {
		switch {
		case s.skip > 0:
			k := min(s.skip, len(b))
			s.skip -= k
			b = b[k:]
		case s.want > 0:
			k := min(s.want-len(s.payload), len(b))
			s.payload = append(s.payload, b[:k]...)
			b = b[k:]
			if len(s.payload) == s.want {
				s.apply(s.payload)
				s.want, s.payload = 0, nil
			}
		default:
			k := copy(s.hdr[s.nhdr:], b)
			s.nhdr += k
			b = b[k:]
			if s.nhdr < len(s.hdr) {
				continue
			}
			s.nhdr = 0
			n := int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
			switch {
			case s.hdr[3] != h2FrameSettings || s.hdr[4]&h2FlagAck != 0:
				if !s.seen {
					// A backend's first frame is its SETTINGS (RFC 9113 §3.4): the
					// transport fails the connection.
					s.off = true
					s.settle()
				}
				s.skip = n
			case n > h2MaxReadFrameSize || n%6 != 0:
				s.off = true // the transport fails the connection
				s.settle()
			case n == 0:
				s.apply(nil)
			default:
				s.want = n
			}
		}
	}
}

// apply takes in the parameters of one SETTINGS frame.
func (s *h2Settings) apply(p []byte) {
	first := !s.seen
	s.seen = true
	found := false
	for ; len(p) >= 6; p = p[6:] {
		if uint16(p[0])<<8|uint16(p[1]) == h2SettingMaxStreams {
			s.limit.Store(int64(uint32(p[2])<<24 | uint32(p[3])<<16 | uint32(p[4])<<8 | uint32(p[5])))
			found = true
		}
	}
	if first {
		if !found {
			s.limit.Store(h2DefaultMaxStreams)
		}
		s.settle()
	}
}

// Close aborts the stream: pending reads and writes return at once, and the connector resets
// its backend connection (the HTTP/2 connection is over, whatever was in flight on it).
func (c *h2StreamConn) Close() error {
	c.unhook()
	c.abort()
	return nil
}

func (c *h2StreamConn) abort() {
	c.once.Do(func() { c.t.abandon(c.Stream) })
}

// h2Exchange is one request to an h2c member, on a connection slot reserved for it.
type h2Exchange struct {
	t           *Tunnel
	c           *h2Conn
	openTimeout time.Duration
}

// h2RefusedRetries is how many times a request without a body that the backend refused
// unprocessed (REFUSED_STREAM: over its stream limit, as it may lower it at any time) is
// sent again, on a new stream to the same member, before the refusal stands.
const h2RefusedRetries = 3

func (x *h2Exchange) tunnel() *Tunnel { return x.t }

// failedBeforeResponse reports whether err, which roundTrip returned, is the member's
// failure: roundTrip returns only once the response head arrived, so every error came
// before it; a failure of the public client's request body is not the member's.
func (x *h2Exchange) failedBeforeResponse(err error) bool { return !clientFault(err) }

// roundTrip sends req as one HTTP/2 stream and returns the response, whose body releases
// m's stream slot once read to its end or closed. The request body is sent while the
// response comes back; a client that goes away resets the stream (RST_STREAM CANCEL), and
// the backend sees its request's context end.
func (x *h2Exchange) roundTrip(req *http.Request, m *group.Member) (*http.Response, error) {
	// The request goes out at once on a pooled connection (an HTTP/1.1 member's waits for
	// its stream's open first), and on a busy edge the handler gets here ahead of the
	// public server's goroutine, which may already hold the client's reset of the stream
	// (rapid reset) without having run to end the request's context. The processor is
	// yielded once so that a reset already read is seen before anything is sent.
	runtime.Gosched()
	if err := req.Context().Err(); err != nil {
		// The client went away (a stream it reset at once): the backend hears nothing.
		x.c.cc.Release()
		m.Release()
		return nil, err
	}
	var up *h2Upload
	if req.Body != nil && req.Body != http.NoBody {
		up = newH2Upload(req.Body, bodyAborter(req))
		req.Body = up
	}
	limitInterim(req)
	resp, err := x.c.cc.RoundTrip(req)
	for try := 0; err != nil && up == nil && try < h2RefusedRetries && h2Refused(err) && req.Context().Err() == nil; try++ {
		// Nothing of the request reached the backend's application, and without a body
		// it can go again as it was.
		var c *h2Conn
		if c, err = x.t.h2.get(req.Context(), x.openTimeout); err == nil {
			x.c = c
			resp, err = c.cc.RoundTrip(req)
		}
	}
	if err == nil && up != nil && up.failed.Load() {
		// As for HTTP/1.1: an answer to a truncated upload is not relayed.
		_ = resp.Body.Close()
		resp, err = nil, errors.New("proxy: the request body failed before the response")
	}
	if err != nil {
		if up != nil {
			up.end()
			if up.failed.Load() {
				err = &requestBodyError{up.err}
			}
		}
		m.Release()
		return nil, err
	}
	if len(resp.Trailer) > 0 || mayHaveTrailers(req, resp) {
		// HTTP/2 carries trailers after a body of known length; HTTP/1.1 only after a
		// chunked one, which the public response must then be.
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	resp.Body = &h2Body{ReadCloser: resp.Body, m: m, up: up}
	return resp, nil
}

// limitInterim bounds the 1xx responses (103 Early Hints) an h2c member may send before its
// final one to maxInterimResponses, as memberConn.readResponse does for an HTTP/1.1 member:
// net/http's transport hands each to the request's trace, the reverse proxy's, which relays
// it; the hook is wrapped so that the maxInterimResponses-th fails the request (502) once
// relayed. The trace is the reverse proxy's own, made for this request (a hook added with
// httptrace.WithClientTrace instead could not fail it: composed hooks return the result of
// the one added first).
func limitInterim(req *http.Request) {
	tr := httptrace.ContextClientTrace(req.Context())
	if tr == nil {
		return
	}
	relay, limit := tr.Got1xxResponse, interimLimit()
	tr.Got1xxResponse = func(code int, h textproto.MIMEHeader) error {
		if relay != nil {
			if err := relay(code, h); err != nil {
				return err
			}
		}
		return limit(code, h)
	}
}

// mayHaveTrailers reports whether resp, an h2c member's answer to req, may end with trailers
// it did not announce (HTTP/2 allows it) that the public client can take: the client speaks
// HTTP/1.1 (HTTP/2 carries them after a Content-Length too, HTTP/1.0 not at all), the
// response has a body, and it is gRPC's or the client said it accepts trailers (TE:
// trailers, which the reverse proxy passes on). Such a response is relayed chunked, without
// its Content-Length; any other keeps it, and trailers nobody announced are dropped.
func mayHaveTrailers(req *http.Request, resp *http.Response) bool {
	if req.ProtoMajor != 1 || req.ProtoMinor < 1 || req.Method == http.MethodHead ||
		resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified {
		return false
	}
	return strings.HasPrefix(resp.Header.Get("Content-Type"), "application/grpc") ||
		hasToken(req.Header, "Te", "trailers")
}

// h2Body is a response body from an h2c member; its end releases the member's slot, once
// the transport is done with the request body.
type h2Body struct {
	io.ReadCloser
	m    *group.Member
	up   *h2Upload // the request body, or nil
	once sync.Once
}

func (b *h2Body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *h2Body) Close() error {
	err := b.ReadCloser.Close()
	b.finish()
	return err
}

func (b *h2Body) finish() {
	b.once.Do(func() {
		if b.up != nil {
			b.up.end()
		}
		b.m.Release()
	})
}

// h2Upload is a public request body as the HTTP/2 transport reads it. net/http must not
// read a request body once its handler returned, and the transport may still be reading it
// when RoundTrip or the response ends (it reads and closes it on goroutines of its own): end
// stops the upload and waits until no read is in progress. Closing it does not close the
// public body, which the server closes itself.
type h2Upload struct {
	*bodyReader
	abort   func() // ends a blocked read of the public body
	mu      sync.Mutex
	reading bool
	closed  bool
	idle    chan struct{} // closed once closed and not reading
}

func newH2Upload(body io.ReadCloser, abort func()) *h2Upload {
	return &h2Upload{bodyReader: &bodyReader{ReadCloser: body}, abort: abort, idle: make(chan struct{})}
}

func (u *h2Upload) Read(p []byte) (int, error) {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return 0, errUploadAborted
	}
	u.reading = true
	u.mu.Unlock()
	n, err := u.bodyReader.Read(p)
	u.mu.Lock()
	u.reading = false
	if u.closed {
		close(u.idle)
	}
	u.mu.Unlock()
	return n, err
}

func (u *h2Upload) Close() error {
	u.bodyReader.closed.Store(true) // a read failing from now on is not the client's doing
	u.mu.Lock()
	if !u.closed {
		u.closed = true
		if !u.reading {
			close(u.idle)
		}
	}
	u.mu.Unlock()
	return nil
}

// end stops the upload, once the exchange is over: no read of the public body starts any
// more, one in progress is cut short (unless the body was read to its end), and end returns
// once it did.
func (u *h2Upload) end() {
	_ = u.Close()
	if !u.done.Load() {
		u.abort()
	}
	<-u.idle
}

// h2StreamError matches net/http's HTTP/2 stream errors (their As method fills any struct of
// the same shape, as golang.org/x/net/http2.StreamError).
type h2StreamError struct {
	StreamID uint32
	Code     uint32
	Cause    error
}

func (e h2StreamError) Error() string { return "proxy: http2 stream error" }

// h2RefusedStream is the RST_STREAM code of a stream refused before any processing.
const h2RefusedStream = 0x7

// h2NotSent are net/http's errors (not exported) for a request that never reached the
// backend's application: the connection was unusable before it was sent, closed before its
// first request, or the backend's GOAWAY named an earlier last stream.
var h2NotSent = []string{
	"http2: client conn not usable",
	"http2: client conn could not be established",
	"http2: Transport received Server's graceful shutdown GOAWAY",
	"connection is unavailable",
}

// h2Refused reports whether err is the h2c member's backend refusing a request's stream
// unprocessed (RST_STREAM REFUSED_STREAM): it is busy, not failing.
func h2Refused(err error) bool {
	var se h2StreamError
	return errors.As(err, &se) && se.Code == h2RefusedStream
}

// h2Unprocessed reports whether err means that the h2c member's backend did not process the
// request at all, so that it may go to another member.
func h2Unprocessed(err error) bool {
	var se h2StreamError
	if errors.As(err, &se) {
		return se.Code == h2RefusedStream
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		for _, s := range h2NotSent {
			if e.Error() == s {
				return true
			}
		}
	}
	return false
}
