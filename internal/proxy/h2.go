package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// HTTP/2 to a member (backend protocol "h2c"). The edge keeps, per member, a few HTTP/2
// client connections, each carried on one data stream opened like any other (envelope,
// then the connector's acknowledgement once its backend accepted the TCP connection), and
// sends many requests on each: one HTTP/2 stream per request. They are net/http's own
// client connections (http.Transport.NewClientConn), which the edge pools itself so that it
// decides where a request may go again: opening a connection that fails (the stream open,
// or the HTTP/2 preface) is a failed open, and another member is tried; a request the
// backend refused unprocessed (RST_STREAM REFUSED_STREAM, above a GOAWAY's last stream, or
// on a connection that closed before it was sent) goes to one other member if it has no
// body or the edge holds it for a replay; anything else is the member's answer or failure.

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
}

// get returns a connection with a request slot reserved for the caller, which must use it
// (roundTrip): an open one with room, or a new one. Requests that find no room wait for
// the one connection being made, rather than each making its own. A failure to make a new
// connection is an *openError: nothing of any request was sent.
func (p *h2Pool) get(openTimeout time.Duration) (*h2Conn, error) {
	for waits := 0; ; waits++ {
		if waits == 3 {
			// Connections were made, but none would take the request (each closed at once):
			// still nothing of it was sent.
			return nil, &openError{p.t.id, errors.New("no HTTP/2 connection to the backend took the request")}
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, &openError{p.t.id, ErrClosed}
		}
		dead := p.prune(false)
		var got *h2Conn
		for _, c := range p.conns {
			if c.cc.Reserve() == nil {
				got = c
				break
			}
		}
		d := p.dialing
		if got == nil && d == nil {
			d = &h2Dial{done: make(chan struct{})}
			p.dialing = d
			p.mu.Unlock()
			closeAll(dead)
			p.dial(d, openTimeout)
			if d.err != nil {
				return nil, d.err
			}
			continue // take a slot on it like anyone else
		}
		p.mu.Unlock()
		closeAll(dead)
		if got != nil {
			return got, nil
		}
		<-d.done
		if d.err != nil {
			return nil, d.err
		}
	}
}

// h2Dial is a connection being made; the requests waiting for it share its outcome.
type h2Dial struct {
	done chan struct{}
	err  error
}

// dial opens a data stream to the member, starts HTTP/2 on it and adds it to the pool.
func (p *h2Pool) dial(d *h2Dial, openTimeout time.Duration) {
	c, err := p.connect(openTimeout)
	p.mu.Lock()
	p.dialing = nil
	switch {
	case err == nil && p.closed:
		err = &openError{p.t.id, ErrClosed}
		defer closeAll([]*h2Conn{c})
	case err == nil:
		p.conns = append(p.conns, c)
	}
	d.err = err
	close(d.done)
	p.mu.Unlock()
}

func (p *h2Pool) connect(openTimeout time.Duration) (*h2Conn, error) {
	st, err := p.t.open("", openTimeout)
	if err != nil {
		return nil, err
	}
	nc := newH2StreamConn(p.t, st)
	ctx := context.WithValue(context.Background(), h2DialKey{}, net.Conn(nc))
	cc, err := h2Transport().NewClientConn(ctx, "http", "member:80")
	if err != nil {
		_ = nc.Close()
		return nil, &openError{p.t.id, err}
	}
	return &h2Conn{cc: cc}, nil
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
	*yamux.Stream
	unhook func() bool
	once   sync.Once
}

func newH2StreamConn(t *Tunnel, st *yamux.Stream) *h2StreamConn {
	c := &h2StreamConn{Stream: st}
	c.unhook = context.AfterFunc(t.ctx, c.abort)
	return c
}

// Read reads the stream; the end of a stream whose session died first is an error.
func (c *h2StreamConn) Read(p []byte) (int, error) {
	n, err := c.Stream.Read(p)
	return n, mux.StreamEOF(c.Stream, err)
}

// Close aborts the stream: pending reads and writes return at once.
func (c *h2StreamConn) Close() error {
	c.unhook()
	c.abort()
	return nil
}

func (c *h2StreamConn) abort() {
	c.once.Do(func() {
		_ = c.Stream.SetDeadline(pastTime)
		_ = c.Stream.Close()
	})
}

// h2Exchange is one request to an h2c member, on a connection slot reserved for it.
type h2Exchange struct {
	t *Tunnel
	c *h2Conn
}

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
	var up *h2Upload
	if req.Body != nil && req.Body != http.NoBody {
		up = newH2Upload(req.Body, bodyAborter(req))
		req.Body = up
	}
	resp, err := x.c.cc.RoundTrip(req)
	if err == nil && up != nil && up.failed.Load() {
		// As for HTTP/1.1: an answer to a truncated upload is not relayed.
		_ = resp.Body.Close()
		resp, err = nil, errors.New("the request body failed before the response")
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
	if len(resp.Trailer) > 0 {
		// HTTP/2 carries trailers after a body of known length; HTTP/1.1 only after a
		// chunked one, which the public response must then be.
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	resp.Body = &h2Body{ReadCloser: resp.Body, m: m, up: up}
	return resp, nil
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

func (e h2StreamError) Error() string { return "http2 stream error" }

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
