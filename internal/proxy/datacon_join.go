package proxy

import (
	"context"
	"net"
	"sync/atomic"
)

// JoinData copies bytes both ways between local (the public connection on the edge, the
// backend connection on the connector) and data, a data connection, until both directions
// end, then closes both. It is used by both ends of a data connection.
//
// Each direction is a plain io.Copy, so that between two *net.TCPConn Linux splices the
// bytes from socket to socket without copying them through user space; a TLS data
// connection is copied through a pooled buffer while it is busy (copyData, datacon_copy.go).
//
// Ends, as mux.Join handles them for yamux streams:
//   - a clean end of local's input half-closes data (FIN; TLS close_notify), so that a peer
//     that shut down its sending side still receives the reply;
//   - a clean end of data's input is passed on to local (CloseWrite) only once peerAlive
//     reports that the other end's session is still up: a process that dies ends its
//     sockets with a FIN too, and that must reach the public client as a reset, never as the
//     end of the data. peerAlive is called at most once, on the goroutine of that direction;
//     nil means a clean end is always believed;
//   - an error in either direction, or the end of ctx (the tunnel or session ended), aborts
//     both at once: deadlines in the past unblock the copies, and both ends are reset (RST)
//     rather than closed with a FIN.
func JoinData(ctx context.Context, local, data net.Conn, peerAlive func() bool) {
	var aborted atomic.Bool
	abort := func() {
		if aborted.Swap(true) {
			return
		}
		_ = local.SetDeadline(pastTime)
		_ = data.SetDeadline(pastTime)
		reset(local)
		reset(data)
		_ = local.Close()
		_ = data.Close()
	}
	stop := context.AfterFunc(ctx, abort)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := copyData(data, local); err != nil {
			abort()
			return
		}
		closeWrite(data)
	}()
	err := copyData(local, data)
	switch {
	case err != nil:
		abort()
	case peerAlive != nil && !peerAlive():
		abort()
	default:
		closeWrite(local)
	}
	<-done
	_ = local.Close()
	_ = data.Close()
}

// reset makes c's Close send a reset (RST) instead of a FIN, for TCP connections and TLS
// connections over TCP.
func reset(c net.Conn) {
	if tc := tcpOf(c); tc != nil {
		_ = tc.SetLinger(0)
	}
}

// closeWrite half-closes c if it can (TCP: FIN; TLS: close_notify), and closes it otherwise.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// SetDataReadBuffer fixes the receive buffer of data connection c at n bytes when n > 0 and
// c is TCP or TLS over TCP, and returns the buffer the kernel granted (what it reports, halved
// for its bookkeeping: n, or less when net.core.rmem_max caps it), or 0 when it did nothing.
// It is for long links: the kernel's autotuning grows the buffer of a data connection that
// sat idle since it was opened slowly, over several round trips of its first transfer, while
// a fixed buffer lets the sender fill the link at once. The connection is already up, so on
// Linux the window limit it set up with (from the default buffer) is raised to n as well
// (TCP_WINDOW_CLAMP); without that, kernels that only grow it by autotuning would keep a
// 64 KiB window. A fixed buffer turns autotuning off for c, and may hold up to n bytes of a
// transfer whose reader is slower than its writer.
func SetDataReadBuffer(c net.Conn, n int) int {
	if n <= 0 {
		return 0
	}
	tc := tcpOf(c)
	if tc == nil || tc.SetReadBuffer(n) != nil {
		return 0
	}
	return clampWindow(tc, n)
}
