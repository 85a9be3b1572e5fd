package tunnel

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// copyBufSize is the buffer each copy direction uses: large enough that a bulk transfer
// moves in few syscalls and few yamux frames.
const copyBufSize = 64 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

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

// Hide ReadFrom/WriteTo so that io.CopyBuffer uses our pooled buffer: TCPConn's fallbacks
// for non-socket peers allocate a fresh buffer per copy.
type (
	readerOnly struct{ io.Reader }
	writerOnly struct{ io.Writer }
)

// join copies bytes both ways between a and b until both directions end, then closes
// both. A clean end of input on one side half-closes the other side's write direction, so
// a peer that shuts down its sending side still receives the reply. An error in either
// direction, or the end of ctx (the session or the server going away), aborts both at once:
// deadlines in the past unblock every pending Read and Write, and both ends are closed.
func join(ctx context.Context, a, b net.Conn) {
	var aborted atomic.Bool
	abort := func() {
		if aborted.Swap(true) {
			return
		}
		past := time.Unix(1, 0)
		_ = a.SetDeadline(past)
		_ = b.SetDeadline(past)
		_ = a.Close()
		_ = b.Close()
	}
	stop := context.AfterFunc(ctx, abort)
	defer stop()
	copyHalf := func(dst, src net.Conn) {
		bp := copyBufs.Get().(*[]byte)
		_, err := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, *bp)
		copyBufs.Put(bp)
		if err != nil {
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
