package proxy

import (
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/testlink"
)

// quickAckOn reads TCP_QUICKACK back: Linux answers 1 unless the socket is in delayed-ack
// ("ping-pong") mode.
func quickAckOn(t *testing.T, c *net.TCPConn) bool {
	return testlink.SockoptInt(t, c, syscall.IPPROTO_TCP, syscall.TCP_QUICKACK) != 0
}

// TestQuickAckLeavesPingPongMode: a side that answers at once what it received (as the
// connector's acknowledgement of an envelope) is put in delayed-ack mode by the kernel;
// QuickAck takes it out, so that the bulk data that follows is acknowledged promptly.
func TestQuickAckLeavesPingPongMode(t *testing.T) {
	edge, connector := tcpPair(t)
	var err error

	// An envelope arrives and is answered at once, until the kernel takes the answering side
	// for an interactive one (one exchange on current kernels; a stall of the test longer than
	// the delayed-ack timer, 40 ms, can take it out again, hence the retries).
	var b [16]byte
	pingPong := false
	for range 50 {
		_, err = edge.Write(b[:])
		require.NoError(t, err)
		_, err = io.ReadFull(connector, b[:])
		require.NoError(t, err)
		_, err = connector.Write(b[:1])
		require.NoError(t, err)
		_, err = io.ReadFull(edge, b[:1])
		require.NoError(t, err)
		if !quickAckOn(t, connector) {
			pingPong = true
			break
		}
	}
	if !pingPong {
		t.Skip("this kernel never put the answering side in delayed-ack mode: nothing for QuickAck to undo")
	}
	QuickAck(connector)
	require.True(t, quickAckOn(t, connector))
	QuickAck(edge)            // the other side: no harm either way
	QuickAck(&net.UnixConn{}) // not TCP: left alone
}
