package proxy

import (
	"net"
	"syscall"
)

// QuickAck takes c's socket out of delayed-acknowledgement ("ping-pong") mode, which Linux
// enters on a connection whose side answers soon after it received: on a data connection,
// the connector writes its acknowledgement right after the envelope arrives. Linux enters the
// mode again when that side next sends soon after receiving, so it holds for the side that
// receives a one-way transfer (the connector of an upload to a silent backend; the edge sends
// the client's bytes right after the acknowledgement and re-enters it at once). Measured over
// a 50 ms link, one 64 MiB upload went from 0.31–0.77× a fresh TCP connection's rate to
// 0.75–0.93× with it (docs/benchmarks.md, WAN). c is a TCP connection or TLS over one; anything
// else is left alone.
func QuickAck(c net.Conn) {
	tc := tcpOf(c)
	if tc == nil {
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

// clampWindow raises c's window limit to n (TCP_WINDOW_CLAMP) after its buffer was fixed at
// n, and returns the buffer the kernel granted (SO_RCVBUF halved), 0 if it cannot be read.
func clampWindow(c *net.TCPConn, n int) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	granted := 0
	_ = rc.Control(func(fd uintptr) {
		v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		if err != nil {
			return
		}
		granted = v / 2
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP, min(n, granted))
	})
	return granted
}
