package tunnel

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"github.com/warren-tunnel/warren/internal/wire"
)

// errUnread is the edge's reading of wire.UnreadNotice: the member's backend reset its
// connection with the request unread. A bodyless request may then go to one other member.
var errUnread = errors.New("the backend reset its connection before reading the request")

// errExchangeEnded ends the backend-to-edge copy once the notice was sent.
var errExchangeEnded = errors.New("exchange ended with an unread notice")

// unreadConn is the connector's TCP connection to an HTTP backend, carrying one data stream.
// It watches the exchange without parsing it: bytes from the edge that begin with a request
// line, after the backend's last output, are a pending request; if the backend then resets
// the connection before writing anything, the connector tells the edge with
// wire.UnreadNotice before it ends the stream (see the notice for why that is safe).
//
// Once the backend answers with any 1xx status (101 Switching Protocols above all) the
// stream may stop being HTTP, and no notice is sent on it any more.
type unreadConn struct {
	net.Conn
	edge io.Writer // the data stream, where the notice goes

	mu       sync.Mutex
	edgeRun  bool // the edge has sent bytes since the backend's last output
	pending  bool // ... and they began with a request line
	raw      bool // a 1xx answer was seen: the stream may carry anything now
	notified bool // the notice was written; nothing else goes to the edge
}

// Write forwards bytes from the edge to the backend.
func (c *unreadConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.edgeRun {
		c.edgeRun = true
		c.pending = !c.raw && looksLikeRequest(p)
	}
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	if err != nil && isReset(err) {
		c.reset()
	}
	return n, err
}

// Read takes the backend's output towards the edge.
func (c *unreadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if c.notified {
			c.mu.Unlock()
			return 0, errExchangeEnded
		}
		if c.edgeRun && !c.raw {
			// The first bytes after a request: where a response head begins.
			c.raw = bytes.HasPrefix(p[:n], []byte("HTTP/1.1 1")) || bytes.HasPrefix(p[:n], []byte("HTTP/1.0 1")) ||
				n < len("HTTP/1.1 1") // too short to tell: assume the worst
		}
		c.edgeRun, c.pending = false, false
		c.mu.Unlock()
	}
	if err != nil && isReset(err) {
		c.reset()
	}
	return n, err
}

// CloseWrite half-closes the backend connection (join uses it at the edge's end of input).
func (c *unreadConn) CloseWrite() error {
	if cw, ok := c.Conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// reset is called when the backend connection was reset: it writes the notice if a request
// is pending, once.
func (c *unreadConn) reset() {
	c.mu.Lock()
	send := c.pending && !c.notified
	c.notified = c.notified || send
	c.mu.Unlock()
	if send {
		_, _ = c.edge.Write(wire.UnreadNotice[:])
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
