//go:build !unix

package proxy

import (
	"errors"
	"net"
)

// pooledReads: readPooled does not work here; copies go through a 32 KiB buffer.
const pooledReads = false

func readPooled(*net.TCPConn) (*[dataCopyBufSize]byte, int, error) {
	return nil, 0, errors.New("proxy: pooled reads are not supported here")
}
