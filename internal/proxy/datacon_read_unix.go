//go:build unix

package proxy

import (
	"io"
	"net"
	"os"
	"syscall"
)

// pooledReads: readPooled works here.
const pooledReads = true

// readPooled waits until c has bytes to read, holding no buffer, then reads up to
// dataCopyBufSize of them into a buffer of dataCopyBufs, which the caller puts back (buf is
// nil when n is 0). The end of c is io.EOF; c's deadlines apply.
func readPooled(c *net.TCPConn) (buf *[dataCopyBufSize]byte, n int, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, 0, err
	}
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		if buf == nil {
			buf = dataCopyBufs.Get().(*[dataCopyBufSize]byte)
		}
		for {
			n, rerr = syscall.Read(int(fd), buf[:])
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			dataCopyBufs.Put(buf) // wait with nothing held
			buf = nil
			return false
		}
		return true
	})
	switch {
	case err != nil: // a deadline, or c closed: f returned false last, buf is nil
		return nil, 0, err
	case rerr != nil:
		dataCopyBufs.Put(buf)
		return nil, 0, os.NewSyscallError("read", rerr)
	case n == 0:
		dataCopyBufs.Put(buf)
		return nil, 0, io.EOF
	}
	return buf, n, nil
}
