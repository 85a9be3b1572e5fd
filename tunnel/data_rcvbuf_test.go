//go:build linux

package tunnel

import (
	"context"
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

// TestDataReadBuffer: ServerConfig.DataReadBuffer and WithDataReadBuffer fix the receive
// buffer of the data connections at their two ends (the kernel reports twice the size asked
// for), and of nothing else: the control connection keeps the kernel's own.
func TestDataReadBuffer(t *testing.T) {
	const edgeBuf, connBuf = 40000, 48000
	srv, err := NewServer(ServerConfig{Domain: testDomain, Logger: zaptest.NewLogger(t), TCPPorts: tcpRange(44150), TCPBindHost: "127.0.0.1",
		DataReadBuffer: edgeBuf})
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
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	waitDataIdle(t, srv, dataPoolSize)

	l.mu.Lock()
	accepted := append([]*net.TCPConn(nil), l.conns...)
	l.mu.Unlock()
	require.Len(t, accepted, 1+dataPoolSize, "the control connection and the idle data connections")
	require.Equal(t, dataPoolSize, withRcvbuf(t, accepted, 2*edgeBuf), "the edge's side of every data connection")
	require.NotEqual(t, 2*edgeBuf, rcvbuf(t, accepted[0]), "the control connection keeps the kernel's buffer")

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(dialled) == 1+dataPoolSize
	}, 5*time.Second, time.Millisecond)
	mu.Lock()
	conns := append([]*net.TCPConn(nil), dialled...)
	mu.Unlock()
	require.Equal(t, dataPoolSize, withRcvbuf(t, conns, 2*connBuf), "the connector's side of every data connection")
	require.NotEqual(t, 2*connBuf, rcvbuf(t, conns[0]), "the control connection keeps the kernel's buffer")

	// And they carry a connection as before.
	digestRoundTrip(t, dialPort(t, tun.Port()), 1<<20)
	require.EqualValues(t, 1, srv.data.stats.Used.Load())
}
