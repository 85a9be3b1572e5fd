package proxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Copying a TLS data connection. Between two *net.TCPConn, io.Copy splices and no byte
// goes through user space. With TLS on one side, every byte is read into a buffer and
// encrypted or decrypted, and io.Copy alone does that badly: it goes through
// net.TCPConn's ReadFrom or WriteTo, which copy through a 32 KiB buffer held for the
// connection's whole life, and *tls.Conn's Read returns one record (at most 16 KiB) per
// call, so that each record became one system call on the plain side. copyData instead:
//
//   - waits with a small buffer and switches to a large pooled one while the connection is
//     busy (a read filled the small one), back to the small one once a read finds little:
//     an idle connection holds 2 KiB a direction, as mux.Join's copies do;
//   - after a read from a TLS connection, takes the records that are already complete
//     in its input buffer too, without waiting for more (a read deadline in the past
//     makes it return as soon as it would need the socket; crypto/tls keeps its state on
//     such a timeout), and writes them to the plain side in one system call.
const (
	dataCopyBufSize      = 256 << 10 // the busy buffer, pooled
	dataIdleCopyBufSize  = 2 << 10   // the buffer a quiet connection waits with
	dataBusyReadFraction = 2         // as mux's busyReadFraction
)

var dataCopyBufs = sync.Pool{New: func() any { return new([dataCopyBufSize]byte) }}

// copyData copies src to dst until src ends (nil error) or either side fails. Between two
// connections neither of which is TLS it is io.Copy (splice on Linux).
func copyData(dst, src net.Conn) error {
	srcTLS, _ := src.(*tls.Conn)
	if _, ok := dst.(*tls.Conn); !ok && srcTLS == nil {
		_, err := io.Copy(dst, src)
		return err
	}
	dstTLS, _ := dst.(*tls.Conn)
	wb, rb := baseOf(dstTLS), baseOf(srcTLS) // nil unless made by TLSBase
	small := make([]byte, dataIdleCopyBufSize)
	var big *[dataCopyBufSize]byte
	defer func() {
		if big != nil {
			dataCopyBufs.Put(big)
		}
		if rb != nil {
			rb.readIdle()
		}
	}()
	for {
		buf := small
		if big != nil {
			buf = big[:]
		}
		n, rerr := src.Read(buf)
		if srcTLS != nil && rerr == nil && big != nil && n < len(buf) {
			var more int
			more, rerr = readBuffered(srcTLS, buf[n:])
			n += more
		}
		if n > 0 {
			if err := writeData(dst, wb, buf[:n]); err != nil {
				return err
			}
		}
		if rerr != nil {
			if rerr == io.EOF {
				return nil
			}
			return rerr
		}
		switch {
		case big == nil && n > len(small)/dataBusyReadFraction:
			big = dataCopyBufs.Get().(*[dataCopyBufSize]byte) // more is coming
			if rb != nil {
				rb.readBusy()
			}
		case big != nil && n < dataCopyBufSize/16:
			dataCopyBufs.Put(big) // drained: wait with the small buffer
			big = nil
			if rb != nil {
				rb.readIdle()
			}
		}
	}
}

// writeData writes p to dst; through wb, dst's TLSBase if it has one, the records of p go
// out in one system call.
func writeData(dst net.Conn, wb *tlsBase, p []byte) error {
	if wb == nil || len(p) <= 16<<10 {
		_, err := dst.Write(p)
		return err
	}
	wb.startBatch()
	_, err := dst.Write(p)
	if ferr := wb.endBatch(); err == nil {
		err = ferr
	}
	return err
}

// readBuffered reads into p what tc can give without reading its socket: the rest of the
// records already received. It returns a nil error when it stopped because the socket
// would have been needed (or p is full).
func readBuffered(tc *tls.Conn, p []byte) (int, error) {
	if err := tc.SetReadDeadline(pastTime); err != nil {
		return 0, nil
	}
	defer func() { _ = tc.SetReadDeadline(time.Time{}) }()
	n := 0
	for n < len(p) {
		m, err := tc.Read(p[n:])
		n += m
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}
