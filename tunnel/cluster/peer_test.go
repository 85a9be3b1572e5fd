package cluster

import (
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/tunnel"
)

// peerHello is the edge-to-edge handshake of edge id presenting token.
func peerHello(id, token string) []byte {
	h := sha256.Sum256([]byte(token))
	out := append([]byte(peerMagic), byte(len(id)))
	out = append(out, id...)
	return append(out, h[:]...)
}

// handshake sends hello on c and returns the edge's one-byte answer, or the read error.
func handshake(c net.Conn, hello []byte) (byte, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(hello); err != nil {
		return 0, err
	}
	var ans [1]byte
	_, err := io.ReadFull(c, ans[:])
	return ans[0], err
}

// The peer port refuses what is not an edge of the cluster, and bad actors there harm no
// link: garbage is closed unanswered; a wrong token is refused, and an address that keeps
// trying is blocked (then even the right token gets no answer from it); connections that
// send nothing are capped per address, the one over the cap closed at once. Meanwhile the
// other edge's link works and requests cross it.
func TestClusterPeerPortRefusesBadActors(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	limits := func(c *tunnel.ServerConfig) {
		c.PreAuth.MaxConnsPerIP = 2
		c.PreAuth.MaxAuthFailuresPerIP = 3
		c.PreAuth.AuthFailureDelay = -1
	}
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: limits})
	b := startClusterEdge(t, nodes, "b", clusterOpts{host: "127.0.0.2", edit: limits})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})

	// Garbage: closed without an answer.
	_, err = handshake(dialFrom(t, "127.0.0.9", a.peerAddr), []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.Error(t, err) // EOF or a reset (the edge left bytes unread)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "garbage was held: %v", err)

	// A wrong token: refused, three times; then the address is blocked, the right token too.
	for range 3 {
		ans, err := handshake(dialFrom(t, "127.0.0.10", a.peerAddr), peerHello("intruder", "not-the-cluster-token"))
		require.NoError(t, err)
		require.Equal(t, byte(peerRefused), ans)
	}
	_, err = handshake(dialFrom(t, "127.0.0.10", a.peerAddr), peerHello("intruder", clusterToken))
	require.Error(t, err, "a blocked address gets no answer")
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "a blocked address was held: %v", err)
	ans, err := handshake(dialFrom(t, "127.0.0.11", a.peerAddr), peerHello("x", clusterToken))
	require.NoError(t, err)
	require.Equal(t, byte(peerOK), ans, "another address is not blocked")

	// Silent connections: two held (until the handshake timeout), the third closed at once.
	for range 2 {
		dialFrom(t, "127.0.0.12", a.peerAddr)
	}
	require.Eventually(t, func() bool {
		_, held := a.c.preAuth.Held(throttle.KeyOfString("127.0.0.12"))
		return held == 2
	}, 5*time.Second, 5*time.Millisecond)
	third := dialFrom(t, "127.0.0.12", a.peerAddr)
	_ = third.SetReadDeadline(time.Now().Add(peerHandshakeTimeout / 2)) // before the two time out
	_, err = third.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the third was held, not closed: %v", err)

	// The real edge's requests still cross to a's member, over a new link too.
	code, body := b.get("pool", "/")
	require.Equal(t, 200, code, body)
	b.c.remote.mu.Lock()
	l := b.c.remote.edges["a"].link
	b.c.remote.mu.Unlock()
	l.close()
	require.Eventually(t, func() bool {
		code, _ := b.get("pool", "/")
		return code == 200 && b.members("pool")["a"] == 1
	}, 10*time.Second, 20*time.Millisecond)
}
