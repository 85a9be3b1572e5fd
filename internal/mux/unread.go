package mux

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"syscall"

	"github.com/warren-tunnel/warren/internal/wire"
)

// errExchangeEnded ends the backend-to-edge copy once the notice was sent.
var errExchangeEnded = errors.New("mux: exchange ended with an unread notice")

// maxTrackedHead bounds the request head unreadConn gathers to find its end; a longer head
// turns the notice off for the stream.
const maxTrackedHead = 16 << 10

// NoticeStream is the data stream an unread notice is written on (a *yamux.Stream).
type NoticeStream interface {
	Write(p []byte) (int, error)
	StreamID() uint32
}

// runState is where the edge's current run of bytes (those since the backend's last
// output) stands.
type runState uint8

const (
	runNone    runState = iota // no edge bytes since the backend's last output
	runHead                    // a request head is coming in; its end has not been seen
	runPending                 // a whole bodyless request head went to the backend
)

// unreadConn is the connector's TCP connection to an HTTP backend, carrying one data stream.
// It follows the edge's requests just enough to know when one is pending: a run of edge bytes
// after the backend's last output that begins with a request line, whose head has no body
// (no Content-Length other than 0, no Transfer-Encoding) and nothing after it. If the backend
// resets the connection while one is pending, the connector tells the edge with an unread
// notice (wire.AppendUnreadNotice) before it ends the stream.
//
// Anything else turns the notice off for the rest of the stream, so that it can never land
// inside data a client receives: a request with a body (its bytes may go on after the
// backend's answer began, and they are the client's to choose), a run that does not begin
// like a request, a head longer than maxTrackedHead, and any 1xx answer (101 Switching
// Protocols above all: the stream may carry anything after it).
type unreadConn struct {
	net.Conn
	st  NoticeStream // the data stream, where the notice goes
	key *[32]byte    // the session's notice key

	mu       sync.Mutex
	run      runState
	head     []byte // a request head that spans several writes, until its end is seen
	off      bool   // no notice on this stream any more
	notified bool   // the notice was written; nothing else goes to the edge
}

// NewUnreadConn wraps the connector's connection to an HTTP backend that carries the data
// stream st: if the backend resets it while a bodyless request is pending, an unread notice
// keyed with the session's notice key goes to the edge on st (see unreadConn).
func NewUnreadConn(backend net.Conn, st NoticeStream, key *[32]byte) net.Conn {
	return &unreadConn{Conn: backend, st: st, key: key}
}

// Write forwards bytes from the edge to the backend.
func (c *unreadConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.track(p)
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	if err != nil && isReset(err) {
		c.reset()
	}
	return n, err
}

// track follows the edge's bytes p; called with mu held.
func (c *unreadConn) track(p []byte) {
	if c.off || len(p) == 0 {
		return
	}
	switch c.run {
	case runNone:
		if !looksLikeRequest(p) {
			c.turnOff()
			return
		}
		c.run = runHead
	case runPending:
		c.turnOff() // bytes after a bodyless request: the edge does not pipeline
		return
	}
	h := p
	if len(c.head) > 0 {
		if len(c.head)+len(p) > maxTrackedHead {
			c.turnOff()
			return
		}
		c.head = append(c.head, p...)
		h = c.head
	}
	end := bytes.Index(h, []byte("\r\n\r\n"))
	switch {
	case end < 0 && len(c.head) == 0 && len(p) <= maxTrackedHead:
		c.head = append(c.head, p...) // the head goes on in the next write
	case end < 0 && len(c.head) == 0:
		c.turnOff()
	case end < 0:
		// still gathering
	case end+4 != len(h) || headHasBody(h[:end+2]):
		c.turnOff()
	default:
		c.run, c.head = runPending, nil
	}
}

func (c *unreadConn) turnOff() { c.off, c.run, c.head = true, runNone, nil }

// Read takes the backend's output towards the edge.
func (c *unreadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if c.notified {
			c.mu.Unlock()
			return 0, errExchangeEnded
		}
		switch c.run {
		case runHead:
			c.turnOff() // an answer before the request was whole
		case runPending:
			// Where a response head begins: after any 1xx the stream may stop being HTTP.
			if n < len("HTTP/1.1 1") || bytes.HasPrefix(p[:n], []byte("HTTP/1.1 1")) || bytes.HasPrefix(p[:n], []byte("HTTP/1.0 1")) {
				c.turnOff()
			}
		}
		c.run = runNone
		c.mu.Unlock()
	}
	if err != nil && isReset(err) {
		c.reset()
	}
	return n, err
}

// CloseWrite half-closes the backend connection (Join uses it at the edge's end of input).
func (c *unreadConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// reset is called when the backend connection was reset: it writes the notice, once, if a
// request is pending or its head was still going out.
func (c *unreadConn) reset() {
	c.mu.Lock()
	send := !c.off && c.run != runNone && !c.notified
	c.notified = c.notified || send
	c.mu.Unlock()
	if send {
		var buf [wire.UnreadNoticeLen]byte
		_, _ = c.st.Write(wire.AppendUnreadNotice(buf[:0], c.key, c.st.StreamID()))
	}
}

// isReset reports whether err is the peer's TCP reset (read or write) or a write to a
// connection the peer had already reset.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// looksLikeRequest reports whether p begins like an HTTP/1.x request line: an upper-case
// method, a space, and a target ("/…", "*", or an absolute URL).
func looksLikeRequest(p []byte) bool {
	i := 0
	for i < len(p) && i <= 16 && p[i] >= 'A' && p[i] <= 'Z' {
		i++
	}
	if i == 0 || i+1 >= len(p) || p[i] != ' ' {
		return false
	}
	switch p[i+1] {
	case '/', '*', 'h', 'H':
		return true
	}
	return false
}

// headHasBody reports whether a request head (request line and header lines, each ending in
// CRLF) announces a body: a Content-Length other than 0, or any Transfer-Encoding.
func headHasBody(head []byte) bool {
	_, rest, _ := bytes.Cut(head, []byte("\r\n")) // the request line
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return true // not a header line: not a head we understand
		}
		name, value = bytes.TrimSpace(name), bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return true
		case bytes.EqualFold(name, []byte("Content-Length")) && !bytes.Equal(value, []byte("0")):
			return true
		}
	}
	return false
}
