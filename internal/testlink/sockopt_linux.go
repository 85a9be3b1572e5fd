package testlink

import (
	"net"
	"syscall"
	"testing"
)

// SockoptInt reads an integer socket option of c (getsockopt), failing t if it cannot.
func SockoptInt(t testing.TB, c *net.TCPConn, level, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatalf("raw connection: %v", err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatalf("control: %v", err)
	}
	if gerr != nil {
		t.Fatalf("getsockopt(%d, %d): %v", level, opt, gerr)
	}
	return v
}
