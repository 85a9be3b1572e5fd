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
// call, so that each record became one system call on the plain side. copyData instead
// copies through a large pooled buffer that it holds only while bytes are there to move,
// never while it waits for them:
//
//   - from a TCP connection (to TLS), the buffer is taken once the socket is readable
//     (readPooled; Unix), so that one read takes up to 256 KiB;
//   - from a TLS connection, it waits in a read of a small buffer; when that one comes back
//     full, the records already complete in crypto/tls's input are taken too, without
//     waiting for more (a read deadline in the past makes it return as soon as it would
//     need the socket; crypto/tls keeps its state on such a timeout), into the large
//     buffer, and written to the plain side in one system call.
//
// Under TLSBase's wrapper (datacon_tls.go), the TLS side's system calls are large too.
const (
	dataCopyBufSize     = 256 << 10 // the busy buffer, pooled
	dataIdleCopyBufSize = 2 << 10   // the buffer a TLS connection is waited on with
)

var dataCopyBufs = sync.Pool{New: func() any { return new([dataCopyBufSize]byte) }}

// copyData copies src to dst until src ends (nil error) or either side fails. Between two
// connections neither of which is TLS it is io.Copy (splice on Linux).
func copyData(dst, src net.Conn) error {
	srcTLS, _ := src.(*tls.Conn)
	dstTLS, _ := dst.(*tls.Conn)
	var err error
	switch {
	case srcTLS == nil && dstTLS == nil:
		_, err = io.Copy(dst, src)
	case srcTLS != nil:
		err = copyFromTLS(dst, srcTLS)
	default:
		err = copyToTLS(dstTLS, src)
	}
	if err == io.EOF {
		err = nil
	}
	return err
}

// copyToTLS copies src, a plain connection, to dst until src ends.
func copyToTLS(dst *tls.Conn, src net.Conn) error {
	wb := baseOf(dst)
	if tc, ok := src.(*net.TCPConn); ok && pooledReads {
		for {
			buf, n, err := readPooled(tc)
			if n > 0 {
				werr := writeData(dst, wb, buf[:n])
				dataCopyBufs.Put(buf)
				if werr != nil {
					return werr
				}
			}
			if err != nil {
				return err
			}
		}
	}
	buf := make([]byte, 32<<10) // what io.Copy used
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if werr := writeData(dst, wb, buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err
		}
	}
}

// copyFromTLS copies src, a TLS connection, to dst until src ends.
func copyFromTLS(dst net.Conn, src *tls.Conn) error {
	if rb := baseOf(src); rb != nil {
		rb.copying = true // read by this goroutine only, as every Read of rb
	}
	small := make([]byte, dataIdleCopyBufSize)
	for {
		n, err := src.Read(small)
		if n == len(small) && err == nil {
			// More may be there already: take it in the large buffer.
			big := dataCopyBufs.Get().(*[dataCopyBufSize]byte)
			copy(big[:], small)
			var more int
			more, err = readBuffered(src, big[n:])
			_, werr := dst.Write(big[:n+more])
			dataCopyBufs.Put(big)
			if werr != nil {
				return werr
			}
		} else if n > 0 {
			if _, werr := dst.Write(small[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			return err
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

// readBuffered reads into p what tc can give without waiting for its socket: the rest of
// the records already received. It returns a nil error when it stopped because the socket
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
