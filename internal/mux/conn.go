package mux

import (
	"encoding/binary"
	"net"
	"sync"
)

// yamux frame header layout (its spec.md): version(1) type(1) flags(2) stream id(4) length(4).
const (
	muxHeaderSize = 12
	muxTypeData   = 0
)

// frameConn is the connection yamux runs over. It exists to save system calls, which dominate
// the tunnel's CPU profile: yamux's send loop writes every data frame as two Writes, the
// 12-byte header and then the body. frameConn holds back a data header and sends it together
// with the body that always follows it: one writev on TCP, one record on TLS. Other frames
// (window updates, pings, go-away, FIN-only frames) carry no body and are written at once.
//
// Reads are not buffered here: yamux reads through its own 4 KiB bufio.Reader, and a larger
// buffer underneath measured no faster (BenchmarkTCPStream, BenchmarkHTTPLoopback) while
// costing its size on every idle connector session.
//
// TCP_NODELAY stays on (Go sets it on every TCP connection, and Warren never turns it off):
// the acknowledgement byte of a new stream, window updates and small HTTP exchanges must not
// wait for Nagle's algorithm, and coalescing each data frame into one writev is what keeps
// frames from going out as a tiny header segment followed by the body.
//
// Only yamux's single send loop writes, but Write is locked anyway so that correctness never
// depends on that.
type frameConn struct {
	net.Conn

	mu      sync.Mutex
	hdr     [muxHeaderSize]byte
	pending bool
	vecArr  [2][]byte
	vec     net.Buffers // over vecArr; WriteTo consumes it
	join    []byte      // for conns without writev (TLS): header and body copied into one Write
}

func newConn(c net.Conn) *frameConn { return &frameConn{Conn: c} }

func (c *frameConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending {
		c.pending = false
		return c.writeFrame(p)
	}
	if len(p) == muxHeaderSize && p[1] == muxTypeData && binary.BigEndian.Uint32(p[8:]) > 0 {
		copy(c.hdr[:], p)
		c.pending = true
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// writeFrame writes the held header and body as one unit and reports the body's length.
func (c *frameConn) writeFrame(body []byte) (int, error) {
	if _, ok := c.Conn.(*net.TCPConn); ok {
		c.vecArr = [2][]byte{c.hdr[:], body}
		c.vec = c.vecArr[:]
		n, err := c.vec.WriteTo(c.Conn)
		c.vecArr = [2][]byte{} // do not keep the caller's body alive
		return max(int(n)-muxHeaderSize, 0), err
	}
	c.join = append(append(c.join[:0], c.hdr[:]...), body...)
	n, err := c.Conn.Write(c.join)
	if cap(c.join) > 256<<10 {
		c.join = nil // do not keep a huge buffer for a rare huge frame
	}
	return max(n-muxHeaderSize, 0), err
}
