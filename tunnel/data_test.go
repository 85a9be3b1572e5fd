package tunnel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/internal/wire"
)

// dataIdle is how many idle data connections the edge's sessions hold.
func dataIdle(s *Server) int {
	s.sessions.mu.Lock()
	defer s.sessions.mu.Unlock()
	n := 0
	for e := range s.sessions.all {
		n += e.data.pool.Idle()
	}
	return n
}

// waitDataIdle waits until the edge holds n idle data connections.
func waitDataIdle(t *testing.T, s *Server, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return dataIdle(s) == n }, 10*time.Second, 2*time.Millisecond,
		"want %d idle data connections, have %d", n, dataIdle(s))
}

// dialPort connects to a public TCP port of the test edge.
func dialPort(t *testing.T, port int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// digestRoundTrip sends n pseudo-random bytes, half-closes, and checks the digest reply.
func digestRoundTrip(t *testing.T, c net.Conn, n int64) {
	t.Helper()
	h := sha256.New()
	_, err := io.Copy(c, io.TeeReader(io.LimitReader(newPRNG(uint64(n)), n), h))
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	reply, err := io.ReadAll(c)
	require.NoError(t, err, "the reply after our half-close, then a clean end")
	require.Equal(t, fmt.Sprintf("%d %x", n, h.Sum(nil)), string(reply))
}

// sockDialer dials real TCP connections for a connector and keeps them, so that a test can
// kill the connector's sockets as a dying process would. With tlsFirst it also records the
// first byte written on each.
type sockDialer struct {
	mu     sync.Mutex
	conns  []net.Conn
	first  []byte
	spy    bool
	refuse bool // fail every dial from now on
	// mute, once set, makes the control connection (the first one dialled) drop what the
	// connector writes: a connector that stopped answering.
	mute atomic.Bool
}

// muteConn drops writes once its dialer is muted.
type muteConn struct {
	net.Conn
	d *sockDialer
}

func (c *muteConn) Write(p []byte) (int, error) {
	if c.d.mute.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (d *sockDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	refuse := d.refuse
	d.mu.Unlock()
	if refuse {
		return nil, syscall.ECONNREFUSED
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conns = append(d.conns, c)
	if len(d.conns) == 1 && !d.spy {
		return &muteConn{Conn: c, d: d}, nil
	}
	if d.spy {
		d.first = append(d.first, 0)
		return &firstByteConn{Conn: c, d: d, i: len(d.first) - 1}, nil
	}
	return c, nil
}

func (d *sockDialer) dials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns)
}

// kill closes every socket dialled so far (from the from-th on), each with a FIN, as the
// kernel ends the sockets of a process that exits.
func (d *sockDialer) kill(from int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns[from:] {
		_ = c.Close()
	}
}

type firstByteConn struct {
	net.Conn
	d    *sockDialer
	i    int
	once sync.Once
}

func (c *firstByteConn) Write(p []byte) (int, error) {
	if len(p) > 0 {
		c.once.Do(func() { c.d.mu.Lock(); c.d.first[c.i] = p[0]; c.d.mu.Unlock() })
	}
	return c.Conn.Write(p)
}

// TestDataConnCarriesTCP: with a TCP tunnel registered, the connector keeps a pool of data
// connections; a public TCP connection goes over one of them (not a yamux stream), byte
// exact both ways with the half-close carried; the active-stream counts are right while it
// is open and after; and the pool refills.
func TestDataConnCarriesTCP(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43700), BindHost: "127.0.0.1"}})
	sess := e.connect()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	hold := make(chan struct{})
	held, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, func(c net.Conn) {
		_, _ = c.Write([]byte("hi"))
		<-hold
	}))
	require.NoError(t, err)
	waitDataIdle(t, e.Server, dataPoolSize)

	digestRoundTrip(t, dialPort(t, tun.Port()), 8<<20)
	require.EqualValues(t, 1, e.data.stats.Used.Load(), "carried over a data connection")
	require.Zero(t, e.data.stats.Fallback.Load())
	waitDataIdle(t, e.Server, dataPoolSize) // replaced

	c := dialPort(t, held.Port())
	_, err = io.ReadFull(c, make([]byte, 2))
	require.NoError(t, err)
	require.Equal(t, 1, held.ActiveStreams(), "the connector counts it")
	require.EqualValues(t, 1, e.activeStreams(), "the edge counts it")
	require.EqualValues(t, 2, e.data.stats.Used.Load())
	close(hold)
	_, err = io.ReadAll(c)
	require.NoError(t, err, "the backend's close is a clean end")
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return held.ActiveStreams() == 0 && e.activeStreams() == 0 }, 5*time.Second, time.Millisecond)
	require.Zero(t, e.data.stats.Refused.Load()+e.data.stats.Dead.Load())
}

// TestDataConnConnectorDeathResets: when the connector dies (its sockets end with a FIN, as
// when its process exits) in the middle of a download over a data connection, the public
// client reads a reset, never a clean end; a download that ends normally ends cleanly. The
// connector stops answering first and its data connection's FIN arrives before its control
// connection ends: the edge must not take that FIN for the end of the download.
//
// A second case kills every socket at once.
func TestDataConnConnectorDeathResets(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43750), BindHost: "127.0.0.1"}})
	d := &sockDialer{}
	sess := e.connect(WithDialer(d.dial))
	endless, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, func(c net.Conn) { streamForever(c) }))
	require.NoError(t, err)
	finite, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, func(c net.Conn) { _, _ = c.Write(make([]byte, 1<<20)) }))
	require.NoError(t, err)
	waitDataIdle(t, e.Server, dataPoolSize)

	got, err := io.ReadAll(dialPort(t, finite.Port()))
	require.NoError(t, err)
	require.Len(t, got, 1<<20)

	c := dialPort(t, endless.Port())
	_, err = io.ReadFull(c, make([]byte, 256<<10))
	require.NoError(t, err)
	require.EqualValues(t, 2, e.data.stats.Used.Load(), "both went over data connections")

	d.mute.Store(true) // the process stops answering,
	d.kill(1)          // its data sockets end,
	first := d
	t.Cleanup(func() { first.kill(0) })
	time.AfterFunc(300*time.Millisecond, func() { first.kill(0) }) // and its control socket a moment later
	n, err := io.Copy(io.Discard, c)
	require.ErrorIs(t, err, syscall.ECONNRESET, "%d more bytes, then a clean end instead of a reset", n)

	// All at once, on a second edge.
	e = startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(44050), BindHost: "127.0.0.1"}})
	d = &sockDialer{}
	sess = e.connect(WithDialer(d.dial))
	endless, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, func(c net.Conn) { streamForever(c) }))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return d.dials() == 1+dataPoolSize }, 10*time.Second, time.Millisecond)
	waitDataIdle(t, e.Server, dataPoolSize)
	c = dialPort(t, endless.Port())
	_, err = io.ReadFull(c, make([]byte, 256<<10))
	require.NoError(t, err)
	require.EqualValues(t, 1, e.data.stats.Used.Load())
	d.kill(0)
	n, err = io.Copy(io.Discard, c)
	require.ErrorIs(t, err, syscall.ECONNRESET, "%d more bytes, then a clean end instead of a reset", n)
}

// TestDataConnDeadInThePoolFallsBackToAStream: idle data connections that died while in the
// edge's pool (the connector's ends were closed, and it cannot open new ones) are found out
// when used, before any acknowledgement: the connection goes to the same member over a
// yamux stream.
func TestDataConnDeadInThePoolFallsBackToAStream(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43780), BindHost: "127.0.0.1"}})
	d := &sockDialer{}
	sess := e.connect(WithDialer(d.dial))
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	waitDataIdle(t, e.Server, dataPoolSize)
	d.mu.Lock()
	d.refuse = true
	for _, c := range d.conns[1:] { // the data connections, not the control connection
		_ = c.Close()
	}
	d.mu.Unlock()

	for range 2 {
		digestRoundTrip(t, dialPort(t, tun.Port()), 100_000)
	}
	require.Zero(t, e.data.stats.Used.Load())
	require.EqualValues(t, 2, e.data.stats.Dead.Load(), "each found a dead data connection first")
	require.Zero(t, e.retries.open.Load(), "no other member was needed")
}

// TestDataConnRefusalRetriesAnotherMember: a member whose backend refuses answers the
// envelope on its data connection with a refusal; the connection goes to the other member,
// and the refusing member's data connection stays in its pool for the next one.
func TestDataConnRefusalRetriesAnotherMember(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43800), BindHost: "127.0.0.1"}, LoadBalancing: LoadBalancing{Enabled: true, Strategy: "random"}})
	l := listenLoopback(t)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	spec := TunnelSpec{Proto: ProtoTCP, Group: "pair", GroupKey: "k"}
	good, err := e.connect().Forward(ctxT(t), spec, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	bad, err := e.connect().Forward(ctxT(t), spec, closed)
	require.NoError(t, err)
	require.Equal(t, good.Port(), bad.Port(), "one pool")
	waitDataIdle(t, e.Server, 2*dataPoolSize)

	for range 20 {
		digestRoundTrip(t, dialPort(t, good.Port()), 1000)
	}
	require.Positive(t, e.retries.open.Load(), "the refusing member was picked and another served")
	require.Zero(t, e.data.stats.Dead.Load())
	waitDataIdle(t, e.Server, 2*dataPoolSize) // the refused connections went back to the pool
}

// TestDataConnForgedPreambles: data connections with a wrong token, an unknown session, a
// malformed or cut preamble are closed without an answer and counted; the session they aim
// at and its data connections go on working. A connection that is neither (garbage) is
// refused as a control connection, as before.
func TestDataConnForgedPreambles(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43850), BindHost: "127.0.0.1"}, PreAuth: PreAuthLimits{HelloTimeout: 300 * time.Millisecond}})
	sess := e.connect()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	waitDataIdle(t, e.Server, dataPoolSize)
	e.sessions.mu.Lock()
	var victim string
	for s := range e.sessions.all {
		victim = s.id
	}
	e.sessions.mu.Unlock()

	var random wire.DataToken
	_, _ = rand.Read(random[:])
	preamble := func(id string, tok wire.DataToken) []byte {
		b, err := wire.AppendDataPreamble(nil, wire.DataPreamble{SessionID: id, Token: tok})
		require.NoError(t, err)
		return b
	}
	forged := map[string][]byte{
		"wrong token":     preamble(victim, random),
		"unknown session": preamble("0123456789abcdef", random),
		"bad version":     {wire.DataMagic, 'W', 'D', 9, 1, 'x'},
		"cut, then quiet": {wire.DataMagic, 'W', 'D', 1, 16, 'a', 'b'},
		"magic only":      {wire.DataMagic},
	}
	for name, b := range forged {
		c, err := net.Dial("tcp", e.controlAddr)
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Write(b)
		require.NoError(t, err)
		if name == "magic only" {
			require.NoError(t, c.(*net.TCPConn).CloseWrite())
		}
		n, err := c.Read(make([]byte, 1))
		require.Zero(t, n, name)
		require.Error(t, err, name)
		require.NotErrorIs(t, err, context.DeadlineExceeded, "%s: closed by the edge, not left hanging", name)
		c.Close()
	}
	require.Eventually(t, func() bool { return e.data.stats.Refused.Load() == uint64(len(forged)) }, 5*time.Second, time.Millisecond)

	// Garbage that is no preamble goes to yamux and fails there.
	c, err := net.Dial("tcp", e.controlAddr)
	require.NoError(t, err)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	_, err = io.ReadAll(c)
	require.NoError(t, err, "closed")
	c.Close()
	require.EqualValues(t, len(forged), e.data.stats.Refused.Load())

	require.Equal(t, dataPoolSize, dataIdle(e.Server), "the victim's pool is untouched")
	digestRoundTrip(t, dialPort(t, tun.Port()), 64<<10)
	require.EqualValues(t, 1, e.data.stats.Used.Load())
}

// TestDataConnOnlyWithTCPTunnels: a session with no TCP tunnel opens no data connection;
// one opens them when a TCP tunnel registers, and they are closed (and not replaced) when
// it goes.
func TestDataConnOnlyWithTCPTunnels(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43900), BindHost: "127.0.0.1"}})
	d := &sockDialer{}
	sess := e.connect(WithDialer(d.dial))
	web := backend(t, "web")
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(web.URL))
	require.NoError(t, err)
	status, _ := e.get("web", "/")
	require.Equal(t, 200, status)
	require.Equal(t, 1, d.dials(), "the control connection only")
	require.Zero(t, e.data.stats.Accepted.Load())

	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	waitDataIdle(t, e.Server, dataPoolSize)
	require.Equal(t, 1+dataPoolSize, d.dials())

	require.NoError(t, tun.Close())
	waitDataIdle(t, e.Server, 0)
	status, _ = e.get("web", "/")
	require.Equal(t, 200, status)
	require.Equal(t, 1+dataPoolSize, d.dials(), "not replaced")
	require.Zero(t, e.data.stats.Unwanted.Load())
}

// TestDataConnListenTunnelUsesStreams: an in-process Listen tunnel has no socket to splice
// to: its connections go over yamux streams, in a session whose Forward TCP tunnel uses
// data connections.
func TestDataConnListenTunnelUsesStreams(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43950), BindHost: "127.0.0.1"}})
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	ln, err := sess.Listen(ctxT(t), TunnelSpec{Proto: ProtoTCP})
	require.NoError(t, err)
	var served sync.WaitGroup
	served.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			digestBackend(c)
			c.Close()
		}
	})
	t.Cleanup(func() { _ = ln.Close(); served.Wait() })
	waitDataIdle(t, e.Server, dataPoolSize)
	for range 3 {
		digestRoundTrip(t, dialPort(t, ln.Port()), 10_000)
	}
	require.Zero(t, e.data.stats.Used.Load())
	require.EqualValues(t, 1, e.data.stats.Fallback.Load(), "asked once, then streams straight away")
	waitDataIdle(t, e.Server, dataPoolSize) // the connection asked stayed in the pool
}

// TestDataConnTLS: a connector whose control connection is TLS opens TLS data connections,
// and TCP connections go over them.
func TestDataConnTLS(t *testing.T) {
	pki := newTestPKI(t)
	srv, err := NewServer(ServerConfig{Domain: testDomain, Logger: zaptest.NewLogger(t), TCP: TCPTunnels{Ports: tcpRange(44000), BindHost: "127.0.0.1"},
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}})
	require.NoError(t, err)
	l := listenLoopback(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(tls.NewListener(l, srv.cfg.TLSConfig)) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-served, ErrServerClosed)
	})
	d := &sockDialer{spy: true}
	sess, err := Dial(ctxT(t), l.Addr().String(), WithTLS(&tls.Config{RootCAs: pki.pool}), WithDialer(d.dial), WithLogger(zaptest.NewLogger(t)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, tcpBackend(t, digestBackend))
	require.NoError(t, err)
	waitDataIdle(t, srv, dataPoolSize)

	digestRoundTrip(t, dialPort(t, tun.Port()), 4<<20)
	require.EqualValues(t, 1, srv.data.stats.Used.Load())
	d.mu.Lock()
	defer d.mu.Unlock()
	require.GreaterOrEqual(t, len(d.first), 1+dataPoolSize)
	for i, b := range d.first {
		require.EqualValues(t, 0x16, b, "connection %d begins with a TLS handshake record", i)
	}
}

// TestDataConnSniffDoesNotHoldClose: a connection to the control listener that has sent
// nothing yet (its first byte decides what it is) does not hold up the server's Close until
// its Hello timeout.
func TestDataConnSniffDoesNotHoldClose(t *testing.T) {
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: time.Minute}})
	silent, err := net.Dial("tcp", e.controlAddr)
	require.NoError(t, err)
	defer silent.Close()
	half, err := net.Dial("tcp", e.controlAddr)
	require.NoError(t, err)
	defer half.Close()
	_, err = half.Write([]byte{wire.DataMagic, 'W'})
	require.NoError(t, err)
	e.connect() // served: both connections above are being read by now
	start := time.Now()
	require.NoError(t, e.Close())
	require.Less(t, time.Since(start), 20*time.Second, "Close waited for the silent connections' Hello timeout")
	_ = silent.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = silent.Read(make([]byte, 1))
	require.Error(t, err, "closed by the edge")
}
