package mux

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// joined runs Join between the far end of a loopback TCP connection and a yamux stream, and
// returns the TCP client, the stream's peer, the connection both sessions run over, a
// cancel for Join's context, and a channel closed when Join returns.
func joined(t *testing.T) (client net.Conn, peer Stream, link net.Conn, cancel func(), done chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	_ = client.SetDeadline(time.Now().Add(10 * time.Second))
	server, err := ln.Accept()
	require.NoError(t, err)

	a, b := net.Pipe()
	edge, err := Server(a, zap.NewNop(), 2*time.Second)
	require.NoError(t, err)
	conn, err := Client(b, zap.NewNop())
	require.NoError(t, err)
	t.Cleanup(func() { _ = edge.Close(); _ = conn.Close() })
	accepted := make(chan Stream, 1)
	go func() {
		st, _ := conn.AcceptStream(context.Background())
		accepted <- st
	}()
	st, err := edge.OpenStream()
	require.NoError(t, err)
	_, err = st.Write([]byte("x")) // the SYN goes out with the first bytes
	require.NoError(t, err)
	peer = <-accepted
	require.NotNil(t, peer)
	_, err = io.ReadFull(peer, make([]byte, 1))
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		defer close(done)
		Join(ctx, server, st)
	}()
	t.Cleanup(func() {
		_ = client.Close()
		cancel()
		<-done
	})
	return client, peer, b, cancel, done
}

// TestJoinResetsACutConnection: a stream whose session dies before the peer closed it is a
// cut, not an end: Join resets the TCP side (its client reads ECONNRESET after the bytes
// that made it), as it does when its context ends; a stream the peer closes is a clean end
// (FIN).
func TestJoinResetsACutConnection(t *testing.T) {
	t.Run("session dies", func(t *testing.T) {
		client, peer, link, _, _ := joined(t)
		_, err := peer.Write([]byte("partial"))
		require.NoError(t, err)
		got := make([]byte, len("partial"))
		_, err = io.ReadFull(client, got)
		require.NoError(t, err)
		_ = link.Close() // the connector's side vanishes
		_, err = io.ReadAll(client)
		require.ErrorIs(t, err, syscall.ECONNRESET)
	})
	t.Run("context ends", func(t *testing.T) {
		client, _, _, cancel, _ := joined(t)
		cancel()
		_, err := io.ReadAll(client)
		require.ErrorIs(t, err, syscall.ECONNRESET)
	})
	t.Run("peer closes", func(t *testing.T) {
		client, peer, _, _, done := joined(t)
		_, err := peer.Write([]byte("whole"))
		require.NoError(t, err)
		require.NoError(t, peer.Close())
		got, err := io.ReadAll(client)
		require.NoError(t, err, "a clean end")
		require.Equal(t, "whole", string(got))
		require.NoError(t, client.Close())
		<-done
	})
}
