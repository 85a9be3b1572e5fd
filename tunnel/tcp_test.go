package tunnel

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
)

// tcpRange gives each test its own slice of loopback ports; taken ports are skipped.
func tcpRange(lo int) group.PortRange { return group.PortRange{Lo: lo, Hi: lo + 49} }

// tcpBackend accepts connections until the test ends and runs handle on each.
func tcpBackend(t testing.TB, handle func(net.Conn)) string {
	addr, _ := stoppableTCPBackend(t, handle)
	return addr
}

// stoppableTCPBackend is tcpBackend with a stop func the test may call early (idempotent).
func stoppableTCPBackend(t testing.TB, handle func(net.Conn)) (addr string, stop func()) {
	l := listenLoopback(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { _ = l.Close(); wg.Wait() }) }
	t.Cleanup(stop)
	return l.Addr().String(), stop
}

// echoBackend is a TCP echo server that the test can stop early; stop is idempotent.
func echoBackend(t *testing.T) (addr string, stop func()) {
	return stoppableTCPBackend(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// digestBackend reads until EOF, then answers with the byte count and SHA-256 of what it read.
func digestBackend(c net.Conn) {
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		return
	}
	fmt.Fprintf(c, "%d %x", n, h.Sum(nil))
}

func TestTCPHalfCloseCarriesTheReply(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43000), BindHost: "127.0.0.1"}})
	sess := e.connect()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Name: "digest"}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	require.GreaterOrEqual(t, tun.Port(), 43000)
	require.Equal(t, fmt.Sprintf("tcp://%s:%d", testDomain, tun.Port()), tun.URL())

	for range 3 {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port())))
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		msg := []byte("the quick brown fox")
		_, err = c.Write(msg)
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite(), "shut down our sending side")
		reply, err := io.ReadAll(c)
		require.NoError(t, err, "the reply still arrives after our half-close")
		sum := sha256.Sum256(msg)
		require.Equal(t, fmt.Sprintf("%d %s", len(msg), hex.EncodeToString(sum[:])), string(reply))
		c.Close()
	}
}

// TestTCPLargeTransferIsByteExact sends a large pseudo-random stream through a TCP tunnel
// and checks its digest on the far side. WARREN_BIG_TRANSFER_MIB overrides the size
// (default 1024 MiB, 64 MiB with -short).
func TestTCPLargeTransferIsByteExact(t *testing.T) {
	mib := 1024
	if testing.Short() {
		mib = 64
	}
	if v := os.Getenv("WARREN_BIG_TRANSFER_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		mib = n
	}
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43100), BindHost: "127.0.0.1"}})
	sess := e.connect()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)

	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port())))
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Minute))

	total := int64(mib) << 20
	src := io.LimitReader(newPRNG(42), total)
	h := sha256.New()
	start := time.Now()
	n, err := io.Copy(c, io.TeeReader(src, h))
	require.NoError(t, err)
	require.Equal(t, total, n)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	reply, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%d %x", total, h.Sum(nil)), string(reply))
	t.Logf("%d MiB byte-exact in %s", mib, time.Since(start).Round(time.Millisecond))
}

// prng is a fast deterministic byte source (xorshift), so the test measures the tunnel,
// not the random generator.
type prng struct{ s uint64 }

func newPRNG(seed uint64) *prng { return &prng{s: seed | 1} }

func (p *prng) Read(b []byte) (int, error) {
	for i := 0; i+8 <= len(b); i += 8 {
		p.s ^= p.s << 13
		p.s ^= p.s >> 7
		p.s ^= p.s << 17
		v := p.s
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	return len(b) &^ 7, nil
}

func TestTCPWithoutHealthyMemberClosesAtOnce(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43200), BindHost: "127.0.0.1"}})
	sess := e.connect()
	never := &healthSpecNeverPasses
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Health: never}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port())))
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	require.Zero(t, n)
	require.ErrorIs(t, err, io.EOF, "accepted and closed at once")
}
