//go:build unix

package tunnel

import (
	"net"
	"syscall"
)

// peekByte reads c's first byte without consuming it (MSG_PEEK), so that a control
// connection reaches yamux as the bare *net.TCPConn it was (yamux's writer batches its
// frames with writev on one). ok is false when the socket cannot be peeked at; err is the
// read's error (a deadline, the peer's end).
func peekByte(c *net.TCPConn) (b byte, ok bool, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false, nil
	}
	var buf [1]byte
	var n int
	var perr error
	rerr := rc.Read(func(fd uintptr) bool {
		for {
			n, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
			if perr != syscall.EINTR {
				break
			}
		}
		return perr != syscall.EAGAIN
	})
	switch {
	case rerr != nil:
		return 0, true, rerr
	case perr != nil:
		return 0, true, perr
	case n == 0:
		return 0, true, errPeerClosed
	}
	return buf[0], true, nil
}
