package quic

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"testing"
	"time"

	qgo "github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/internal/mux"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCert returns a self-signed certificate for "edge.test" and a pool that trusts it.
func testCert(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "edge.test"}, DNSNames: []string{"edge.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// pair is an edge's and a connector's session over loopback QUIC, through the registered
// transport; both are closed at cleanup, and the listener's socket with them.
type pair struct {
	edge, conn mux.Session
	ln         mux.Listener
	clientPC   net.PacketConn // the connector's socket, when the test dialled with its own
}

func newPair(t *testing.T, ownSocket bool) *pair {
	t.Helper()
	q := mux.RegisteredQUIC()
	require.NotNil(t, q, "the package registers the transport")
	cert, pool := testCert(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	ln, err := q.Listen(pc, &tls.Config{Certificates: []tls.Certificate{cert}}, mux.ListenOptions{OpenTimeout: time.Second, HandshakeTimeout: 5 * time.Second})
	require.NoError(t, err)
	p := &pair{ln: ln}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	clientTLS := &tls.Config{RootCAs: pool, ServerName: "edge.test"}
	if ownSocket {
		// A socket of the test's: closing it makes the connector vanish without a word.
		p.clientPC, err = net.ListenPacket("udp", "127.0.0.1:0")
		require.NoError(t, err)
		conn, err := qgo.Dial(ctx, p.clientPC, pc.LocalAddr(), tlsFor(clientTLS, false), config(false, 0))
		require.NoError(t, err)
		p.conn = newSession(conn, 0)
	} else {
		p.conn, err = q.Dial(ctx, pc.LocalAddr().String(), clientTLS)
		require.NoError(t, err)
	}
	p.edge, _, err = ln.Accept(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = p.conn.Close()
		_ = p.edge.Close()
		_ = ln.Close()
		if p.clientPC != nil {
			_ = p.clientPC.Close()
		}
	})
	return p
}

// open opens a stream from the edge and accepts it at the connector (a stream reaches its
// peer with its first bytes: hello is written first, and read here).
func (p *pair) open(t *testing.T) (edge, conn mux.Stream) {
	t.Helper()
	edge, err := p.edge.OpenStream()
	require.NoError(t, err)
	_, err = edge.Write([]byte("hello"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err = p.conn.AcceptStream(ctx)
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf))
	_ = edge.SetDeadline(time.Now().Add(10 * time.Second))
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	return edge, conn
}

func TestOpenAcceptAndStreamIDs(t *testing.T) {
	p := newPair(t, false)
	require.Equal(t, "udp", p.edge.RemoteAddr().Network())
	for i := range 3 {
		e, c := p.open(t)
		require.Equal(t, uint32(i+1), e.StreamID(), "the edge's streams are numbered from 1 in the order they open")
		require.Equal(t, e.StreamID(), c.StreamID(), "both sides name a stream alike")
		_, err := c.Write([]byte("back"))
		require.NoError(t, err)
		buf := make([]byte, 4)
		_, err = io.ReadFull(e, buf)
		require.NoError(t, err)
		require.Equal(t, "back", string(buf))
	}
	_, err := p.edge.Ping()
	require.NoError(t, err)
	require.False(t, p.edge.IsClosed())
}

// The edge lets the connector open one stream, its control stream: a second waits for ever
// (as a refused one would), and the edge never sees it.
func TestEdgeAcceptsOneStreamFromTheConnector(t *testing.T) {
	p := newPair(t, false)
	ctrl, err := p.conn.OpenStream()
	require.NoError(t, err)
	_, err = ctrl.Write([]byte("x"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = p.edge.AcceptStream(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, p.edge.NumStreams())
	_, err = p.conn.OpenStream()
	require.Error(t, err, "the edge gave no credit for a second stream")
}

// Close half-closes: the peer reads the end after the data, and can still answer.
func TestHalfClose(t *testing.T) {
	p := newPair(t, false)
	e, c := p.open(t)
	_, err := c.Write([]byte("request"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	got, err := io.ReadAll(e)
	require.NoError(t, err, "a clean end is io.EOF")
	require.Equal(t, "request", string(got))
	_, err = e.Write([]byte("reply"))
	require.NoError(t, err)
	require.NoError(t, e.Close())
	got, err = io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "reply", string(got))
}

func TestDeadlines(t *testing.T) {
	p := newPair(t, false)
	e, _ := p.open(t)
	require.NoError(t, e.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err := e.Read(make([]byte, 1))
	require.True(t, mux.IsTimeout(err), "a passed read deadline is a timeout: %v", err)
	require.NoError(t, e.SetReadDeadline(time.Time{}))

	// A pending read returns when the deadline is moved into the past.
	done := make(chan error, 1)
	go func() { _, err := e.Read(make([]byte, 1)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, e.SetDeadline(time.Unix(1, 0)))
	require.True(t, mux.IsTimeout(<-done))
}

// Abort cuts a stream both ways: the peer's reads and writes fail with a reset, never a
// clean end; the session and its other streams go on.
func TestAbortResetsThePeer(t *testing.T) {
	p := newPair(t, false)
	e, c := p.open(t)
	other, otherPeer := p.open(t)
	mux.Abort(e)
	_, err := c.Read(make([]byte, 1))
	require.True(t, mux.IsStreamReset(err), "read after the peer's abort: %v", err)
	require.False(t, errors.Is(err, io.EOF))
	require.Eventually(t, func() bool {
		_, err := c.Write([]byte("x"))
		return mux.IsStreamReset(err)
	}, 5*time.Second, 10*time.Millisecond, "writes fail once the peer's stop-sending arrives")
	_, err = other.Write([]byte("still"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(otherPeer, buf)
	require.NoError(t, err)
}

// Close after giving up reading (a read deadline in the past, as the callers do when they
// cut a stream) tells the peer to stop sending: its writes fail instead of filling a window
// nobody reads.
func TestCloseAfterGivingUpReadingStopsThePeer(t *testing.T) {
	p := newPair(t, false)
	e, c := p.open(t)
	require.NoError(t, c.SetReadDeadline(time.Unix(1, 0)))
	require.NoError(t, c.Close())
	got, err := io.ReadAll(e)
	require.NoError(t, err, "the connector's side ended cleanly")
	require.Empty(t, got)
	require.Eventually(t, func() bool {
		_, err := e.Write(make([]byte, 1024))
		return mux.IsStreamReset(err)
	}, 5*time.Second, 10*time.Millisecond)
}

// A connector that vanishes (its socket gone, no goodbye) ends the edge's session once the
// idle timeout passes: a read in flight fails (never a clean end) and CloseChan is closed.
func TestVanishedPeerEndsTheSession(t *testing.T) {
	defer func(d time.Duration) { idleTimeout = d }(idleTimeout)
	idleTimeout = 300 * time.Millisecond
	p := newPair(t, true)
	e, _ := p.open(t)
	read := make(chan error, 1)
	go func() { _, err := e.Read(make([]byte, 1)); read <- err }()
	require.NoError(t, p.clientPC.Close())
	select {
	case <-p.edge.CloseChan():
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its vanished peer")
	}
	require.True(t, p.edge.IsClosed())
	err := <-read
	require.Error(t, err)
	require.False(t, errors.Is(err, io.EOF), "a cut stream is not a clean end: %v", err)
	_, err = p.edge.Ping()
	require.Error(t, err)
	_, err = p.edge.OpenStream()
	require.Error(t, err)
}

// The listener's socket stays open while a session it accepted lives, and is closed with the
// last one.
func TestListenerSocketOutlivesItsSessions(t *testing.T) {
	p := newPair(t, false)
	require.NoError(t, p.ln.Close())
	e, c := p.open(t)
	_, err := c.Write([]byte("after the listener closed"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	_, err = io.ReadFull(e, buf)
	require.NoError(t, err)
	require.NoError(t, p.edge.Close())
	l := p.ln.(*listener)
	l.mu.Lock()
	released := l.done
	l.mu.Unlock()
	require.True(t, released, "the socket is released once the listener and its last session closed")
}

// A stream this side closed, whose peer never ends its side, is given up after the close
// timeout (its receive side cancelled), not kept for ever; a read deadline that passed on
// the way does not count as the end.
func TestClosedStreamWhosePeerNeverEndsIsGivenUp(t *testing.T) {
	defer func(d time.Duration) { closeTimeout = d }(closeTimeout)
	closeTimeout = 200 * time.Millisecond
	p := newPair(t, false)
	e, c := p.open(t)
	require.NoError(t, e.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, err := e.Read(make([]byte, 1))
	require.True(t, mux.IsTimeout(err))
	require.NoError(t, e.SetReadDeadline(time.Time{}))
	require.NoError(t, e.Close())
	_, err = io.ReadAll(c)
	require.NoError(t, err, "the edge's side ended cleanly")
	require.Eventually(t, func() bool {
		_, err := c.Write([]byte("still talking"))
		return mux.IsStreamReset(err)
	}, 5*time.Second, 20*time.Millisecond, "the peer is told to stop once the close timeout passed")
}

// An edge whose TLS configuration comes from GetConfigForClient still speaks the transport's
// ALPN and TLS 1.3.
func TestEdgeTLSFromGetConfigForClient(t *testing.T) {
	cert, pool := testCert(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	ln, err := mux.RegisteredQUIC().Listen(pc, &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}, nil
	}}, mux.ListenOptions{HandshakeTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := mux.RegisteredQUIC().Dial(ctx, pc.LocalAddr().String(), &tls.Config{RootCAs: pool, ServerName: "edge.test"})
	require.NoError(t, err)
	edge, _, err := ln.Accept(ctx)
	require.NoError(t, err)
	state := edge.(*session).conn.ConnectionState().TLS
	require.Equal(t, ALPN, state.NegotiatedProtocol)
	require.Equal(t, uint16(tls.VersionTLS13), state.Version)
	require.NoError(t, conn.Close())
	require.NoError(t, edge.Close())
}

// A refused stream (mux.Refuse: the answer written, the rest of what came left unread) is
// released as soon as the opener ends its side, as a yamux stream is, not after the close
// timeout: a backend that is down refuses every request.
func TestRefusedStreamIsReleasedWhenTheOpenerEndsItsSide(t *testing.T) {
	p := newPair(t, false)
	opener, err := p.conn.OpenStream()
	require.NoError(t, err)
	_, err = opener.Write([]byte("envelope and request"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	refuser, err := p.edge.AcceptStream(ctx)
	require.NoError(t, err)
	_, err = io.ReadFull(refuser, make([]byte, 8))
	require.NoError(t, err)
	refused := make(chan struct{})
	go func() {
		defer close(refused)
		mux.Refuse(refuser, 1)
	}()
	ack := make([]byte, 1)
	_, err = io.ReadFull(opener, ack)
	require.NoError(t, err)
	require.Equal(t, byte(1), ack[0])
	require.NoError(t, opener.Close())
	<-refused
	// The edge gives the connector one stream: it gets it back once that one is released.
	require.Eventually(t, func() bool {
		st, err := p.conn.OpenStream()
		if err != nil {
			return false
		}
		_ = st.Close()
		return true
	}, 5*time.Second, 20*time.Millisecond, "the refused stream still holds the edge's stream credit")
}
