package proxy

import (
	"context"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	b := <-accepted
	require.NotNil(t, b)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	for _, c := range []net.Conn{a, b} {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

func TestDataConnsCapEvictsTheOldest(t *testing.T) {
	var st DataStats
	p := NewDataConns(&st)
	conns := make([]net.Conn, DataConnsMax+2)
	for i := range conns {
		a, _ := tcpPair(t)
		conns[i] = a
		require.True(t, p.Put(a))
	}
	require.Equal(t, DataConnsMax, p.Idle(), "capped")
	require.EqualValues(t, 2, st.Evicted.Load())
	for _, c := range conns[:2] {
		_, err := c.Write([]byte("x"))
		require.ErrorIs(t, err, net.ErrClosed, "the oldest were closed")
	}
	require.Same(t, conns[len(conns)-1], p.take(), "the newest is taken first")
	p.Close()
	require.Zero(t, p.Idle())
	require.Nil(t, p.take())
	a, _ := tcpPair(t)
	require.False(t, p.Put(a), "a closed pool keeps nothing")
	_, err := a.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// joined runs JoinData between the far ends of two TCP pairs: it returns the public
// client's end and the connector's end, and waits for JoinData at cleanup.
func joined(t *testing.T, ctx context.Context, alive func() bool) (client, connector *net.TCPConn) {
	client, public := tcpPair(t)
	data, connector := tcpPair(t)
	var wg sync.WaitGroup
	wg.Go(func() { JoinData(ctx, public, data, alive) })
	t.Cleanup(wg.Wait)
	return client, connector
}

func TestJoinDataHalfCloseAndCleanEnd(t *testing.T) {
	client, connector := joined(t, context.Background(), func() bool { return true })
	_, err := client.Write([]byte("request"))
	require.NoError(t, err)
	require.NoError(t, client.CloseWrite())
	got, err := io.ReadAll(connector)
	require.NoError(t, err)
	require.Equal(t, "request", string(got), "the client's half-close reaches the connector")
	_, err = connector.Write([]byte("reply"))
	require.NoError(t, err)
	require.NoError(t, connector.CloseWrite())
	got, err = io.ReadAll(client)
	require.NoError(t, err, "a confirmed end is a clean end")
	require.Equal(t, "reply", string(got))
}

func TestJoinDataUnconfirmedEndResets(t *testing.T) {
	client, connector := joined(t, context.Background(), func() bool { return false })
	_, err := connector.Write([]byte("partial"))
	require.NoError(t, err)
	require.NoError(t, connector.Close()) // a FIN, as from a process that died
	_, err = io.ReadAll(client)
	require.ErrorIs(t, err, syscall.ECONNRESET, "a peer whose session is gone did not end cleanly")
}

func TestJoinDataContextEndResetsBothSides(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	client, connector := joined(t, ctx, nil)
	_, err := client.Write([]byte("x"))
	require.NoError(t, err)
	_, err = io.ReadFull(connector, make([]byte, 1))
	require.NoError(t, err)
	cancel()
	_, err = io.ReadAll(client)
	require.ErrorIs(t, err, syscall.ECONNRESET)
	_, err = io.ReadAll(connector)
	require.ErrorIs(t, err, syscall.ECONNRESET)
}

func TestJoinDataResetIsPassedOn(t *testing.T) {
	client, connector := joined(t, context.Background(), func() bool { return true })
	require.NoError(t, connector.SetLinger(0))
	require.NoError(t, connector.Close()) // the connector's backend was reset
	_, err := io.ReadAll(client)
	require.ErrorIs(t, err, syscall.ECONNRESET)
}
