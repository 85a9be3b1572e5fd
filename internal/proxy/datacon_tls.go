package proxy

import (
	"crypto/tls"
	"net"
	"sync"
)

// TLSBase wraps c, the TCP connection under a data connection's TLS (give the result to
// tls.Client or tls.Server), so that copyData can move a busy TLS connection in large
// system calls:
//
//   - crypto/tls writes every record (at most 16 KiB of plaintext) with a Write of its
//     own; while copyData writes one buffer of up to 256 KiB, the records are gathered
//     here and go out in one Write;
//   - crypto/tls reads the socket through a buffer about two records large; while copyData
//     reads the connection, the socket is read here in pieces of up to 256 KiB and the
//     records taken from that (on Unix).
//
// Both buffers are pooled and held only while bytes are there to move, never while the
// connection waits; outside copyData (the handshake, the envelope, a yamux session over
// the same kind of connection) every Read and Write goes straight to c. Connections not wrapped (an embedder's own
// tls.Listener given to Server.Serve) are copied correctly, in more system calls.
func TLSBase(c net.Conn) net.Conn { return &tlsBase{Conn: c} }

// tlsBase is TLSBase's wrapper.
type tlsBase struct {
	net.Conn

	// Reads: only the goroutine reading the TLS connection (under crypto/tls's input
	// lock) touches these. While copying (set by copyData, which reads), a read waits for
	// the socket with no buffer, then takes up to 256 KiB into a pooled one, held until
	// TLS took all of it.
	copying bool
	rbuf    *[dataCopyBufSize]byte
	r, w    int // rbuf[r:w] is read from c and not yet given to TLS

	// Writes: crypto/tls writes under its output lock, but a read may answer (an alert, a
	// key update) between a batch's Write and its flush.
	mu    sync.Mutex
	wbuf  *[tlsBatchSize]byte // non-nil: batching
	wn    int
	werr  error
	batch bool
}

// tlsBatchSize holds one copy buffer's worth of records: 16 KiB plaintext each, with
// their header and tag (22 bytes in TLS 1.3; TLS 1.2's explicit nonce adds 8).
const tlsBatchSize = dataCopyBufSize + dataCopyBufSize/(16<<10)*64

var tlsBatchBufs = sync.Pool{New: func() any { return new([tlsBatchSize]byte) }}

// NetConn returns the wrapped connection.
func (b *tlsBase) NetConn() net.Conn { return b.Conn }

func (b *tlsBase) Read(p []byte) (int, error) {
	if b.r < b.w {
		n := copy(p, b.rbuf[b.r:b.w])
		b.r += n
		b.release()
		return n, nil
	}
	tc, ok := b.Conn.(*net.TCPConn)
	if !b.copying || !ok || !pooledReads || len(p) >= dataCopyBufSize/2 {
		return b.Conn.Read(p)
	}
	buf, n, err := readPooled(tc)
	if buf == nil {
		return 0, err
	}
	m := copy(p, buf[:n])
	b.rbuf, b.r, b.w = buf, m, n
	b.release()
	return m, nil
}

// release puts the read buffer back once TLS took all of it.
func (b *tlsBase) release() {
	if b.rbuf != nil && b.r == b.w {
		dataCopyBufs.Put(b.rbuf)
		b.rbuf, b.r, b.w = nil, 0, 0
	}
}

func (b *tlsBase) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.batch {
		return b.Conn.Write(p)
	}
	if b.werr != nil {
		return 0, b.werr
	}
	if b.wn+len(p) > tlsBatchSize {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > tlsBatchSize {
			return b.Conn.Write(p)
		}
	}
	if b.wbuf == nil {
		b.wbuf = tlsBatchBufs.Get().(*[tlsBatchSize]byte)
	}
	b.wn += copy(b.wbuf[b.wn:], p)
	return len(p), nil
}

// startBatch gathers the Writes until endBatch.
func (b *tlsBase) startBatch() {
	b.mu.Lock()
	b.batch = true
	b.mu.Unlock()
}

// endBatch writes what was gathered since startBatch, in one Write, and returns its error
// (or that of an earlier flush of the batch).
func (b *tlsBase) endBatch() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batch = false
	err := b.flushLocked()
	if b.wbuf != nil {
		tlsBatchBufs.Put(b.wbuf)
		b.wbuf = nil
	}
	b.werr = nil
	return err
}

func (b *tlsBase) flushLocked() error {
	if b.werr != nil {
		return b.werr
	}
	if b.wn > 0 {
		_, b.werr = b.Conn.Write(b.wbuf[:b.wn])
		b.wn = 0
	}
	return b.werr
}

// baseOf returns the tlsBase under c, a TLS connection, or nil.
func baseOf(c *tls.Conn) *tlsBase {
	if c == nil {
		return nil
	}
	b, _ := c.NetConn().(*tlsBase)
	return b
}

// tcpOf returns the TCP connection under c (TLS, TLSBase's wrapper, or TCP itself), or nil.
func tcpOf(c net.Conn) *net.TCPConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if b, ok := c.(*tlsBase); ok {
		c = b.Conn
	}
	tc, _ := c.(*net.TCPConn)
	return tc
}
