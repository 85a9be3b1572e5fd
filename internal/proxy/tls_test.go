package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// clientHello returns the first record a crypto/tls client with cfg sends: its ClientHello.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(a, cfg).Handshake()
	}()
	rec, _, err := readClientHello(b)
	_ = b.Close()
	_ = a.Close()
	<-done
	require.NoError(t, err)
	return rec
}

// TestServerNameOfClientHellos: the server name of real ClientHellos (TLS 1.3 and 1.2, with
// ALPN), lower-cased and without a trailing dot; none for a hello without SNI; malformed
// and cut-short hellos are refused without a panic.
func TestServerNameOfClientHellos(t *testing.T) {
	for _, tc := range []struct {
		cfg  *tls.Config
		want string
	}{
		{&tls.Config{ServerName: "pool.warren.test"}, "pool.warren.test"},
		{&tls.Config{ServerName: "Pool.Warren.TEST.", NextProtos: []string{"h2", "http/1.1"}}, "pool.warren.test"},
		{&tls.Config{ServerName: "old.warren.test", MaxVersion: tls.VersionTLS12}, "old.warren.test"},
		{&tls.Config{ServerName: "127.0.0.1"}, ""}, // an IP address is never sent as SNI
		{&tls.Config{InsecureSkipVerify: true}, ""},
	} {
		rec := clientHello(t, tc.cfg)
		require.Equal(t, byte(tlsRecordHandshake), rec[0])
		got, err := serverName(rec[tlsRecordHeaderLen:])
		require.NoError(t, err)
		require.Equal(t, tc.want, got, tc.cfg.ServerName)

		// Cut short anywhere: refused (or, cut inside a later extension, still no panic).
		body := rec[tlsRecordHeaderLen:]
		for n := range len(body) {
			_, _ = serverName(body[:n])
		}
		_, err = serverName(body[:len(body)/2])
		require.ErrorIs(t, err, errNotTLS)
	}
	for _, bad := range [][]byte{nil, {2, 0, 0, 0}, {1, 0, 0, 40}, []byte("GET / HTTP/1.1\r\n")} {
		_, err := serverName(bad)
		require.ErrorIs(t, err, errNotTLS, "%q", bad)
	}
}

func FuzzServerName(f *testing.F) {
	f.Add(clientHello(f, &tls.Config{ServerName: "pool.warren.test", NextProtos: []string{"h2"}})[tlsRecordHeaderLen:])
	f.Add(clientHello(f, &tls.Config{ServerName: "a.b", MaxVersion: tls.VersionTLS12})[tlsRecordHeaderLen:])
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := serverName(b)
		if err != nil && name != "" {
			t.Fatalf("a name (%q) with an error", name)
		}
		if len(name) > 255 || name != strings.ToLower(name) {
			t.Fatalf("bad name %q", name)
		}
	})
}

// fillReader reads an fillReader run of one byte, counting what was read.
type fillReader struct {
	b    byte
	read int
}

func (e *fillReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = e.b
	}
	e.read += len(p)
	return len(p), nil
}

// TestReadClientHelloIsBounded: a first record that cannot start a ClientHello (one over
// the largest record, an empty one, plain HTTP, application data) costs its 5-byte header;
// a handshake record whose message is no ClientHello is read whole and no further; a
// ClientHello over maxClientHello, or spread so thin that its records would take more than
// MaxClientHelloRead bytes, is read no further either.
func TestReadClientHelloIsBounded(t *testing.T) {
	for _, tc := range []struct {
		hdr  []byte
		read int
	}{
		{[]byte{22, 3, 1, 0x40, 0x00}, tlsRecordHeaderLen + maxTLSRecord}, // 16384: the largest record, no ClientHello in it
		{[]byte{22, 3, 1, 0x40, 0x01}, 5},                                 // over it
		{[]byte{22, 3, 1, 0x00, 0x00}, 5},                                 // empty
		{[]byte("GET /"), 5},                                              // plain HTTP to the HTTPS port
		{[]byte{23, 3, 3, 0x00, 0x10}, 5},                                 // application data first
		{[]byte{22, 3, 1, 0x00, 0x04, 1, 0, 0x40, 0x01}, 9},               // a ClientHello over 16 KiB
	} {
		src := &fillReader{b: 0xff}
		rec, name, err := readClientHello(io.MultiReader(bytes.NewReader(tc.hdr), src))
		require.NoError(t, err)
		require.Empty(t, name)
		require.Len(t, rec, tc.read, "%x", tc.hdr)
		require.Equal(t, tc.read-len(tc.hdr), src.read, "nothing is read past the record")
		require.Equal(t, tc.hdr, rec[:len(tc.hdr)], "what was read is replayed")
	}

	// A ClientHello of 16 KiB in records of one byte each: six bytes read for each byte of
	// it, so the router stops at MaxClientHelloRead, its name unread.
	hello := append([]byte{1, 0, 0x3f, 0xfc}, bytes.Repeat([]byte{0}, maxClientHello-4)...)
	thin := fragment(append([]byte{22, 3, 1, byte(len(hello) >> 8), byte(len(hello))}, hello...), 1)
	rec, name, err := readClientHello(bytes.NewReader(thin))
	require.NoError(t, err)
	require.Empty(t, name)
	require.LessOrEqual(t, len(rec), MaxClientHelloRead)
	require.Equal(t, thin[:len(rec)], rec)

	_, _, err = readClientHello(bytes.NewReader([]byte{22, 3, 1, 0, 10, 1, 2}))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a record cut short is an error: the connection is closed")
	_, _, err = readClientHello(bytes.NewReader(fragment(clientHello(t, &tls.Config{ServerName: "pool.warren.test"}), 100)[:150]))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a ClientHello whose next record never comes is an error")
}

// fragment re-splits the handshake payload of the single TLS record rec into records of at
// most size bytes, as OpenSSL's max_send_frag does.
func fragment(rec []byte, size int) []byte {
	var out []byte
	for body := rec[tlsRecordHeaderLen:]; len(body) > 0; {
		n := min(size, len(body))
		out = append(out, rec[0], rec[1], rec[2], byte(n>>8), byte(n))
		out = append(out, body[:n]...)
		body = body[n:]
	}
	return out
}

// longALPN is an ALPN list long enough to spread a ClientHello over several 512-byte
// records.
func longALPN() []string {
	var protos []string
	for i := range 40 {
		protos = append(protos, fmt.Sprintf("x-protocol-number-%02d-with-a-long-name", i))
	}
	return append(protos, "h2", "http/1.1")
}

// TestReadClientHelloAcrossRecords: a ClientHello spread over several records (512 bytes
// each, as openssl s_client -max_send_frag 512 sends it; 40, 7, 1 byte) is reassembled: its
// server name is read, and every byte read is the client's, records unchanged.
func TestReadClientHelloAcrossRecords(t *testing.T) {
	for _, cfg := range []*tls.Config{
		{ServerName: "pool.warren.test", NextProtos: longALPN()},
		{ServerName: "pool.warren.test", NextProtos: longALPN(), MaxVersion: tls.VersionTLS12},
	} {
		rec := clientHello(t, cfg)
		require.Greater(t, len(rec), 3*512)
		for _, size := range []int{512, 40, 7, 1} {
			sent := fragment(rec, size)
			got, name, err := readClientHello(io.MultiReader(bytes.NewReader(sent), strings.NewReader("after")))
			require.NoError(t, err, size)
			require.Equal(t, "pool.warren.test", name, size)
			require.Equal(t, sent, got, size)
		}
	}
}

// tlsEdge is a registry with a tls pool "pool", an http pool "web", and a
// PassthroughListener on loopback whose Accept'ed connections are handed to accepted.
type tlsEdge struct {
	reg      *group.Registry
	pl       *PassthroughListener
	accepted chan net.Conn
	stats    Stats
	conns    atomic.Uint64
}

func startTLSEdge(t *testing.T, hello time.Duration) *tlsEdge {
	t.Helper()
	e := &tlsEdge{reg: group.NewRegistry(group.Config{LoadBalancing: true}), accepted: make(chan net.Conn, 16), stats: newStats()}
	h := NewHTTP(Config{Registry: e.reg, Domain: "warren.test", Stats: e.stats, OpenTimeout: 2 * time.Second})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e.pl = h.PassthroughListener(l, PassthroughOptions{HelloTimeout: hello, Connections: &e.conns})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := e.pl.Accept()
			if err != nil {
				close(e.accepted)
				return
			}
			e.accepted <- c
		}
	})
	t.Cleanup(func() {
		_ = e.pl.Close()
		wg.Wait()
		for c := range e.accepted {
			_ = c.Close()
		}
	})
	return e
}

// member joins a member of the pool on sub with proto p, served by c; its streams say tcp.
func (e *tlsEdge) member(t *testing.T, id string, p group.Proto, sub string, c *connector) {
	t.Helper()
	tun := NewTunnel(context.Background(), id, group.ProtoTCP, c.edge, &c.key)
	t.Cleanup(tun.Close)
	_, err := e.reg.Join(group.JoinRequest{ID: id, Proto: p, Label: sub, Group: sub, Value: tun})
	require.NoError(t, err)
}

func (e *tlsEdge) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", e.pl.Addr().String())
	require.NoError(t, err)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestPassthroughListenerRoutesByServerName: a ClientHello naming the tls pool goes to a
// member (a refused open is retried on the other), bytes and all, with the client's address
// in the envelope; one naming anything else, or none, comes out of Accept with every byte
// replayed; plain HTTP too (the TLS server answers it).
func TestPassthroughListenerRoutesByServerName(t *testing.T) {
	e := startTLSEdge(t, 5*time.Second)
	var envs sync.Map
	echoing := startConnector(t, wire.AckOK, func(c *connector, st mux.Stream, env wire.Envelope) {
		envs.Store(env.RemoteAddr, env)
		_, _ = io.Copy(st, st)
	})
	e.member(t, "refusing", group.ProtoTLS, "pool", startConnector(t, wire.AckRefused, nil))
	e.member(t, "echo", group.ProtoTLS, "pool", echoing)
	e.member(t, "web", group.ProtoHTTP, "web", startConnector(t, wire.AckOK, echo))

	for i := range 4 {
		c := e.dial(t)
		hello := clientHello(t, &tls.Config{ServerName: "POOL.warren.test"})
		_, err := c.Write(hello)
		require.NoError(t, err)
		got := make([]byte, len(hello))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, hello, got, "the member gets the ClientHello as the client sent it")
		_, err = c.Write([]byte("then the rest"))
		require.NoError(t, err)
		got = make([]byte, len("then the rest"))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, "then the rest", string(got))
		env, ok := envs.Load(c.LocalAddr().String())
		require.True(t, ok, "the envelope carries the client's address")
		require.Equal(t, group.ProtoTCP, env.(wire.Envelope).Proto)
		require.EqualValues(t, i+1, e.conns.Load())
	}
	require.Positive(t, e.stats.RetriesOpenFailed.Load(), "the refusing member's opens were retried")

	for _, first := range [][]byte{
		clientHello(t, &tls.Config{ServerName: "web.warren.test"}),
		clientHello(t, &tls.Config{ServerName: "other.example"}),
		clientHello(t, &tls.Config{InsecureSkipVerify: true}),
		[]byte("GET / HTTP/1.1\r\nHost: pool.warren.test\r\n\r\n"),
	} {
		c := e.dial(t)
		_, err := c.Write(first)
		require.NoError(t, err)
		var ac net.Conn
		select {
		case ac = <-e.accepted:
		case <-time.After(5 * time.Second):
			t.Fatal("not handed to the TLS server")
		}
		_, err = c.Write([]byte("!"))
		require.NoError(t, err)
		got := make([]byte, len(first)+1)
		_ = ac.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadFull(ac, got)
		require.NoError(t, err)
		require.Equal(t, append(first, '!'), got, "every byte reaches the TLS server, in order")
		_ = ac.Close()
	}
	require.EqualValues(t, 4, e.conns.Load(), "only connections to the pool are counted")
}

// TestPassthroughListenerRoutesASplitClientHello: a ClientHello spread over 512-byte records
// (openssl s_client -max_send_frag 512 with a long ALPN list) goes to the tls pool's member,
// its records as the client sent them, and never to the edge's TLS server.
func TestPassthroughListenerRoutesASplitClientHello(t *testing.T) {
	e := startTLSEdge(t, 5*time.Second)
	e.member(t, "echo", group.ProtoTLS, "pool", startConnector(t, wire.AckOK, func(_ *connector, st mux.Stream, _ wire.Envelope) {
		_, _ = io.Copy(st, st)
	}))
	sent := fragment(clientHello(t, &tls.Config{ServerName: "pool.warren.test", NextProtos: longALPN()}), 512)
	require.Greater(t, len(sent), 3*512)
	c := e.dial(t)
	_, err := c.Write(sent)
	require.NoError(t, err)
	got := make([]byte, len(sent))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err, "the member did not get the ClientHello")
	require.Equal(t, sent, got, "the member gets the client's records unchanged")
	require.Empty(t, e.accepted, "handed to the edge's TLS server")
	require.EqualValues(t, 1, e.conns.Load())
}

// TestPassthroughListenerClosesSilentClients: a client that sends nothing, or a record cut
// short, is closed once HelloTimeout passed; Close closes those still waiting and ends
// Accept; no goroutine is left (goleak in TestMain).
func TestPassthroughListenerClosesSilentClients(t *testing.T) {
	e := startTLSEdge(t, 300*time.Millisecond)
	for _, first := range [][]byte{nil, {22, 3, 1, 0x01, 0x00, 1, 0, 0}} {
		c := e.dial(t)
		if first != nil {
			_, err := c.Write(first)
			require.NoError(t, err)
		}
		start := time.Now()
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err, "closed")
		require.Less(t, time.Since(start), 3*time.Second)
	}

	waiting := e.dial(t)
	require.Eventually(t, func() bool {
		e.pl.mu.Lock()
		defer e.pl.mu.Unlock()
		return len(e.pl.pending) == 1
	}, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, e.pl.Close())
	_ = waiting.SetReadDeadline(time.Now().Add(time.Second))
	_, err := waiting.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded) || isTimeout(err), "closed by Close, not by the hello timeout: %v", err)
	e.pl.Wait()
	_, err = e.pl.Accept()
	require.Error(t, err)
	require.Empty(t, e.accepted, "nothing was handed to the TLS server")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestPassthroughNoMemberOrRefused: a tls pool with no selectable member closes the
// connection (as a TCP pool does), and so does its reserved endpoint's policy.
func TestPassthroughNoMemberOrRefused(t *testing.T) {
	e := startTLSEdge(t, 5*time.Second)
	e.member(t, "refusing", group.ProtoTLS, "pool", startConnector(t, wire.AckRefused, nil))
	c := e.dial(t)
	_, err := c.Write(clientHello(t, &tls.Config{ServerName: "pool.warren.test"}))
	require.NoError(t, err)
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, isTimeout(err), "closed at once")
	require.Empty(t, e.accepted, "not served by the edge's TLS server either")
}

// TestGuardTLSRoutes: an HTTP request for a tls pool's host gets 421 (it is reached only by
// TLS with its name); others go to the ingress as before.
func TestGuardTLSRoutes(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: "warren.test"})
	c := startConnector(t, wire.AckOK, answerHTTP)
	tun := NewTunnel(context.Background(), "tls1", group.ProtoTCP, c.edge, &c.key)
	t.Cleanup(tun.Close)
	_, err := reg.Join(group.JoinRequest{ID: "tls1", Proto: group.ProtoTLS, Label: "pool", Value: tun})
	require.NoError(t, err)

	for host, want := range map[string]int{"pool.warren.test": 421, "POOL.warren.test:443": 421, "other.warren.test": 404} {
		w := httptest.NewRecorder()
		h.GuardTLSRoutes().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://"+host+"/", nil))
		require.Equal(t, want, w.Code, host)
		if want == 421 {
			require.Contains(t, w.Body.String(), "TLS passthrough")
		}
	}
	require.Zero(t, c.streams.Load(), "no HTTP reached the tls member")
}
