package mux

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/wire"
)

// fakeBackendConn is a backend connection for unreadConn: Read returns the queued outputs,
// then err; Write records the edge's bytes or fails with werr.
type fakeBackendConn struct {
	net.Conn
	outputs [][]byte
	err     error
	werr    error
	written bytes.Buffer
}

func (c *fakeBackendConn) Read(p []byte) (int, error) {
	if len(c.outputs) == 0 {
		return 0, c.err
	}
	n := copy(p, c.outputs[0])
	c.outputs = c.outputs[1:]
	return n, nil
}

func (c *fakeBackendConn) Write(p []byte) (int, error) {
	if c.werr != nil {
		return 0, c.werr
	}
	return c.written.Write(p)
}

var (
	errReadReset = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	errWritePipe = &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
)

// fakeStream is the data stream for unreadConn in unit tests.
type fakeStream struct{ bytes.Buffer }

func (*fakeStream) StreamID() uint32 { return 3 }

// TestUnreadNoticeOnlyWhenARequestIsPending walks the connector's tracker through exchanges:
// the notice goes out only for a reset while a bodyless request is pending (or its head is
// still going out), never after a request with a body, a 1xx, or bytes it cannot place.
func TestUnreadNoticeOnlyWhenARequestIsPending(t *testing.T) {
	const req = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
	const resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	type step struct {
		edge    string // bytes the edge sends, or
		backend bool   // one backend output is read
	}
	long := "GET /" + strings.Repeat("a", maxTrackedHead) // a head that goes on, past the bound
	for _, tc := range []struct {
		name    string
		outputs []string
		steps   []step
		endErr  error // the backend's final read error
		werr    error // every write fails with this
		notice  bool
	}{
		{name: "request, then reset", steps: []step{{edge: req}}, endErr: errReadReset, notice: true},
		{name: "request, then write to a reset connection", steps: []step{{edge: req}}, werr: errWritePipe, notice: true},
		{name: "second request on the stream, then reset", outputs: []string{resp}, steps: []step{{edge: req}, {backend: true}, {edge: req}}, endErr: errReadReset, notice: true},
		{name: "head split over writes, then reset", steps: []step{{edge: req[:9]}, {edge: req[9:20]}, {edge: req[20:]}}, endErr: errReadReset, notice: true},
		{name: "head still going out at the reset", steps: []step{{edge: req[:12]}}, endErr: errReadReset, notice: true},
		{name: "bodyless POST (Content-Length: 0), then reset", steps: []step{{edge: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"}}, endErr: errReadReset, notice: true},
		{name: "request, then orderly close", steps: []step{{edge: req}}, endErr: io.EOF},
		{name: "answered, then reset", outputs: []string{resp}, steps: []step{{edge: req}, {backend: true}}, endErr: errReadReset},
		{name: "reset with nothing asked", endErr: errReadReset},
		{name: "request with a body", steps: []step{{edge: "POST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc"}}, endErr: errReadReset},
		{name: "chunked request", steps: []step{{edge: "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"}}, endErr: errReadReset},
		{name: "body continuing after an early answer", outputs: []string{resp}, steps: []step{{edge: "POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc"}, {backend: true}, {edge: "GET /defghi HTTP/1.1\r\n\r\n"}}, endErr: errReadReset},
		{name: "bytes after the head (pipelined)", steps: []step{{edge: req + req}}, endErr: errReadReset},
		{name: "more bytes after a whole head", steps: []step{{edge: req}, {edge: req}}, endErr: errReadReset},
		{name: "a run that is not a request", steps: []step{{edge: "\x16\x03\x01 hello"}}, endErr: errReadReset},
		{name: "head longer than tracked", steps: []step{{edge: long}, {edge: " HTTP/1.1\r\n\r\n"}}, endErr: errReadReset},
		{name: "head growing past the bound", steps: []step{{edge: "GET /x"}, {edge: strings.Repeat("a", maxTrackedHead)}, {edge: " HTTP/1.1\r\n\r\n"}}, endErr: errReadReset},
		{name: "whole long head in one write", steps: []step{{edge: long + " HTTP/1.1\r\n\r\n"}}, endErr: errReadReset, notice: true},
		{name: "after 101 Switching Protocols", outputs: []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"}, steps: []step{{edge: req}, {backend: true}, {edge: req}}, endErr: errReadReset},
		{name: "after 103 Early Hints", outputs: []string{"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"}, steps: []step{{edge: req}, {backend: true}, {edge: req}}, endErr: errReadReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := wire.NoticeKey("t")
			var edge fakeStream
			fc := &fakeBackendConn{err: tc.endErr, werr: tc.werr}
			for _, o := range tc.outputs {
				fc.outputs = append(fc.outputs, []byte(o))
			}
			c := &unreadConn{Conn: fc, st: &edge, key: &key}
			buf := make([]byte, 1024)
			for _, s := range tc.steps {
				if s.backend {
					n, err := c.Read(buf)
					require.NoError(t, err)
					edge.Write(buf[:n])
					continue
				}
				_, err := c.Write([]byte(s.edge))
				require.ErrorIs(t, err, tc.werr)
			}
			for range 2 { // the end is seen twice: the notice goes out once
				_, err := c.Read(buf)
				require.ErrorIs(t, err, tc.endErr)
			}
			var want []byte
			if tc.notice {
				want = wire.AppendUnreadNotice(nil, &key, 3)
			}
			out := edge.Bytes()
			for _, o := range tc.outputs {
				out = bytes.TrimPrefix(out, []byte(o))
			}
			require.Equal(t, string(want), string(out))
		})
	}
}
