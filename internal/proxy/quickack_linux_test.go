package proxy

import (
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// quickAckOn reads TCP_QUICKACK back: Linux answers 1 unless the socket is in delayed-ack
// ("ping-pong") mode.
func quickAckOn(t *testing.T, c *net.TCPConn) bool {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK)
	}))
	require.NoError(t, gerr)
	return v != 0
}

// TestQuickAckLeavesPingPongMode: a side that answers at once what it received (as the
// connector's acknowledgement of an envelope) is put in delayed-ack mode by the kernel;
// QuickAck takes it out, so that the bulk data that follows is acknowledged promptly.
func TestQuickAckLeavesPingPongMode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	edge, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer edge.Close()
	conn, ok := <-accepted
	require.True(t, ok)
	defer conn.Close()
	connector := conn.(*net.TCPConn)

	// An envelope arrives and is answered at once, a few times over.
	var b [16]byte
	for range 3 {
		_, err = edge.Write(b[:])
		require.NoError(t, err)
		_, err = io.ReadFull(connector, b[:])
		require.NoError(t, err)
		_, err = connector.Write(b[:1])
		require.NoError(t, err)
		_, err = io.ReadFull(edge, b[:1])
		require.NoError(t, err)
	}
	require.False(t, quickAckOn(t, connector), "the kernel took the answering side for an interactive one")
	QuickAck(connector)
	require.True(t, quickAckOn(t, connector))
	QuickAck(edge)            // the other side: no harm either way
	QuickAck(&net.UnixConn{}) // not TCP: left alone
}
