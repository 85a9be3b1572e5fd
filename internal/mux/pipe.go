package mux

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Copy buffers. A connection that is busy copies through a large pooled buffer, so a bulk
// transfer moves in few system calls and few yamux frames; one that waits for input holds
// only a small one. Without this, every idle long-lived TCP connection (SSH, a database
// pool, a WebSocket) would pin two large buffers on each side for its whole life.
const (
	copyBufSize      = 64 << 10 // the busy buffer, pooled
	idleCopyBufSize  = 2 << 10  // the buffer a quiet connection waits with
	busyReadFraction = 2        // a read that fills more than 1/busyReadFraction of the small buffer switches to the large one
	idleShrinkAfter  = time.Second
)

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// BufferPool lends copy buffers from the pool Join uses (for httputil.ReverseProxy).
type BufferPool struct{}

// Get returns a buffer of the busy size.
func (BufferPool) Get() []byte { return *copyBufs.Get().(*[]byte) }

// Put returns b to the pool if it came from it (has the busy buffer's capacity).
func (BufferPool) Put(b []byte) {
	if cap(b) == copyBufSize {
		b = b[:copyBufSize]
		copyBufs.Put(&b)
	}
}

// ErrSessionEnded is what Join and StreamEOF report, instead of io.EOF, for a yamux stream
// whose session ended before the peer closed the stream: yamux ends every stream of a dead
// session with a plain io.EOF, which would make a cut stream look like one that ended. It
// wraps io.ErrUnexpectedEOF.
var ErrSessionEnded = fmt.Errorf("mux: the session ended before the stream did: %w", io.ErrUnexpectedEOF)

// StreamEOF returns err as read from st, except that io.EOF read after st's session ended
// becomes ErrSessionEnded. A stream whose close arrived and whose session died before the
// close was read is reported as cut too: yamux keeps no trace of the close then.
func StreamEOF(st Stream, err error) error {
	if err == io.EOF {
		return sessionEOF(st)
	}
	return err
}

// shrinker is a yamux stream: Shrink frees its receive buffer while it is empty.
type shrinker interface{ Shrink() }

// copyConn copies src to dst until src ends (nil error) or either side fails.
func copyConn(dst io.Writer, src io.Reader) error {
	small := make([]byte, idleCopyBufSize)
	var big *[]byte
	defer func() {
		if big != nil {
			copyBufs.Put(big)
		}
	}()
	// A yamux stream keeps a receive buffer as large as the biggest burst it took in;
	// when it has been quiet for a while, let it go.
	var shrink *time.Timer
	if sh, ok := src.(shrinker); ok {
		shrink = time.AfterFunc(time.Hour, sh.Shrink)
		shrink.Stop()
		defer shrink.Stop()
	}
	for {
		buf := small
		if big != nil {
			buf = *big
		} else if shrink != nil {
			shrink.Reset(idleShrinkAfter)
		}
		n, rerr := src.Read(buf)
		if big == nil && shrink != nil {
			shrink.Stop()
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				rerr = sessionEOF(src) // as StreamEOF, for a stream or a wrapper of one
			}
			if rerr == io.EOF {
				return nil
			}
			return rerr
		}
		switch {
		case big == nil && n > len(small)/busyReadFraction:
			big = copyBufs.Get().(*[]byte) // more is coming: take the large buffer
		case big != nil && n < len(*big)/busyReadFraction:
			copyBufs.Put(big) // drained: wait for the next bytes with the small one
			big = nil
		}
	}
}

// closeWriter is implemented by conns that can half-close (TCP, TLS, yamux streams via
// streamConn, Unix sockets).
type closeWriter interface{ CloseWrite() error }

// closeWrite half-closes c if it can, and fully closes it otherwise.
func closeWrite(c net.Conn) {
	if cw, ok := c.(closeWriter); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// resetter is implemented by TCP connections: SetLinger(0) makes Close send a reset (RST).
type resetter interface{ SetLinger(sec int) error }

// Join copies bytes both ways between a and b until both directions end, then closes
// both. A clean end of input on one side half-closes the other side's write direction, so
// a peer that shuts down its sending side still receives the reply. A yamux stream whose
// session ended before the peer closed it has not ended cleanly (see ErrSessionEnded).
//
// An error in either direction, or the end of ctx (the session or the server going away),
// aborts both at once: deadlines in the past unblock every pending Read and Write, and both
// ends are closed; an end that is a TCP connection is reset (RST) instead of closed with a
// FIN, so that its peer sees the cut instead of what looks like the end of the data.
func Join(ctx context.Context, a, b net.Conn) {
	var aborted atomic.Bool
	abort := func() {
		if aborted.Swap(true) {
			return
		}
		past := time.Unix(1, 0)
		_ = a.SetDeadline(past)
		_ = b.SetDeadline(past)
		for _, c := range []net.Conn{a, b} {
			if r, ok := c.(resetter); ok {
				_ = r.SetLinger(0)
			}
		}
		_ = a.Close()
		_ = b.Close()
	}
	stop := context.AfterFunc(ctx, abort)
	defer stop()
	copyHalf := func(dst, src net.Conn) {
		if err := copyConn(dst, src); err != nil {
			abort()
			return
		}
		closeWrite(dst)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(b, a)
	}()
	copyHalf(a, b)
	<-done
	_ = a.Close()
	_ = b.Close()
}

// Refuse answers a data stream's envelope with the one-byte refusal ack (wire.Ack) and closes
// the stream; the write is bounded by a second, so that a peer that stopped reading cannot
// hold the caller. Over QUIC it then drops what the peer still sends until the peer ends its
// side, for up to a second more (see drainer).
func Refuse(st net.Conn, ack byte) {
	_ = st.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = st.Write([]byte{ack})
	if d, ok := st.(drainer); ok {
		d.CloseAndDrain(time.Second)
		return
	}
	_ = st.Close()
}

// drainer is a Stream that holds its receive side until the peer's end has been read (QUIC),
// where yamux lets a closed stream go once the peer's close arrives: CloseAndDrain closes it
// for a caller that reads no more of it, and reads and drops what comes until that end, for
// up to d; the peer of a refusal ends its side once it has read the answer.
type drainer interface{ CloseAndDrain(d time.Duration) }
