package proxy

import (
	"crypto/tls"
	"net"
	"syscall"
)

// QuickAck takes c's socket out of delayed-acknowledgement ("ping-pong") mode, which Linux
// enters on a connection whose side answers soon after it received: on a data connection,
// the connector writes its acknowledgement right after the envelope arrives, and the edge its
// first bytes right after the acknowledgement. Left in that mode, the receiving side of a bulk
// transfer acknowledges up to 40 ms late, which holds the sender's congestion window (and,
// with BBR, its bandwidth estimate) down for the first second or so of a long link: over a
// 50 ms round trip a 64 MiB stream ran at about half the rate of a fresh TCP connection. c is
// a TCP connection or TLS over one; anything else is left alone.
func QuickAck(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	})
}
