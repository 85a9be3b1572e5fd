//go:build linux

package tunnel

import (
	"context"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/internal/testlink"
)

// rcvbuf reads SO_RCVBUF of c (what the kernel reports: twice what was asked for).
func rcvbuf(t *testing.T, c *net.TCPConn) int {
	return testlink.SockoptInt(t, c, syscall.SOL_SOCKET, syscall.SO_RCVBUF)
}

// recordingListener hands out the connections it accepts as they are, and keeps them.
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*net.TCPConn
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		l.mu.Lock()
		l.conns = append(l.conns, tc)
		l.mu.Unlock()
	}
	return c, err
}

// withRcvbuf counts the connections whose receive buffer the kernel reports as want.
func withRcvbuf(t *testing.T, conns []*net.TCPConn, want int) int {
	n := 0
	for _, c := range conns {
		if rcvbuf(t, c) == want {
			n++
		}
	}
	return n
}

// TestDataReadBuffer: ServerConfig.TCP.DataReadBuffer and WithDataReadBuffer fix the receive
// buffer of the data connections at their two ends (the kernel reports twice the size asked
// for) and raise their window limit to it, and touch nothing else: the control connection
// keeps the kernel's own. The connector's end of a data connection carrying an upload to a
// silent backend is out of delayed-ack mode (QuickAck after its acknowledgement).
func TestDataReadBuffer(t *testing.T) {
	// Above the 64 KiB window a connection sets up with, below a stock net.core.rmem_max
	// (208 KiB) once doubled.
	const edgeBuf, connBuf = 80000, 96000
	srv, err := NewServer(ServerConfig{Domain: testDomain, Logger: zaptest.NewLogger(t), TCP: TCPTunnels{Ports: tcpRange(44150), BindHost: "127.0.0.1", DataReadBuffer: edgeBuf}})
	require.NoError(t, err)
	l := &recordingListener{Listener: listenLoopback(t)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-served, ErrServerClosed)
	})
	var mu sync.Mutex
	var dialled []*net.TCPConn
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			mu.Lock()
			dialled = append(dialled, tc)
			mu.Unlock()
		}
		return c, err
	}
	sess, err := Dial(ctxT(t), l.Addr().String(), WithDialer(dial), WithDataReadBuffer(connBuf), WithLogger(zaptest.NewLogger(t)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	received := make(chan int64, 1)
	silent, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, func(c net.Conn) {
		n, _ := io.CopyN(io.Discard, c, 64<<10)
		received <- n
		_, _ = io.Copy(io.Discard, c)
	}))
	require.NoError(t, err)
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	waitDataIdle(t, srv, dataPoolSize)

	l.mu.Lock()
	accepted := append([]*net.TCPConn(nil), l.conns...)
	l.mu.Unlock()
	require.GreaterOrEqual(t, len(accepted), 1+dataPoolSize, "the control connection and the idle data connections")
	require.GreaterOrEqual(t, withRcvbuf(t, accepted, 2*edgeBuf), dataPoolSize, "the edge's side of every data connection")
	require.NotEqual(t, 2*edgeBuf, rcvbuf(t, accepted[0]), "the control connection keeps the kernel's buffer")

	connectorData := func() []*net.TCPConn {
		mu.Lock()
		defer mu.Unlock()
		var out []*net.TCPConn
		for _, c := range dialled {
			if rcvbuf(t, c) == 2*connBuf {
				out = append(out, c)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(connectorData()) >= dataPoolSize }, 5*time.Second, time.Millisecond)
	mu.Lock()
	require.NotEqual(t, 2*connBuf, rcvbuf(t, dialled[0]), "the control connection keeps the kernel's buffer")
	mu.Unlock()
	for _, c := range connectorData() {
		require.GreaterOrEqual(t, testlink.SockoptInt(t, c, syscall.IPPROTO_TCP, syscall.TCP_WINDOW_CLAMP), connBuf, "the window may grow to the fixed buffer")
	}

	// An upload to a silent backend: the connector's end only receives.
	up := dialPort(t, silent.Port())
	_, err = up.Write(make([]byte, 64<<10))
	require.NoError(t, err)
	select {
	case n := <-received:
		require.EqualValues(t, 64<<10, n)
	case <-time.After(10 * time.Second):
		t.Fatal("the backend did not receive the upload")
	}
	require.EqualValues(t, 1, srv.data.stats.Used.Load(), "carried over a data connection")
	for _, c := range connectorData() {
		require.NotZero(t, testlink.SockoptInt(t, c, syscall.IPPROTO_TCP, syscall.TCP_QUICKACK), "no data connection of the connector in delayed-ack mode")
	}
	require.NoError(t, up.Close())

	// And they carry a connection both ways as before.
	digestRoundTrip(t, dialPort(t, tun.Port()), 1<<20)
	require.EqualValues(t, 2, srv.data.stats.Used.Load())
}
