package wsconn

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs handle on the server's end of each WebSocket accepted by a loopback server.
func serve(t *testing.T, handle func(c net.Conn)) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Accept(w, r)
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func dial(t *testing.T, addr string) net.Conn {
	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := Client(raw, "edge.test", "/ws", http.Header{"User-Agent": {"test"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Bytes written on one end arrive exactly on the other, in writes of any size (frames with
// 7-, 16- and 64-bit lengths, several frames per write), both ways.
func TestStreamRoundTrip(t *testing.T) {
	addr := serve(t, func(c net.Conn) { _, _ = io.Copy(c, c) })
	c := dial(t, addr)
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	go func() {
		for off, n := 0, 1; off < len(src); n = n*3 + 1 {
			end := min(off+n, len(src))
			if _, err := c.Write(src[off:end]); err != nil {
				return
			}
			off = end
		}
	}()
	got := make([]byte, len(src))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(src), sha256.Sum256(got))
}

// A ping is answered with a pong carrying its payload; a close frame ends the stream.
func TestPingIsAnsweredAndCloseEndsTheStream(t *testing.T) {
	pong := make(chan []byte, 1)
	addr := serve(t, func(c net.Conn) {
		raw := c.(*Conn).Conn
		_, _ = raw.Write([]byte{0x80 | opPing, 3, 'a', 'b', 'c'})
		_, _ = raw.Write([]byte{0x80 | opBinary, 2, 'h', 'i'})
		hdr := make([]byte, 2+4+3) // masked pong from the client
		if _, err := io.ReadFull(raw, hdr); err != nil {
			pong <- nil
			return
		}
		p := hdr[6:]
		for i := range p {
			p[i] ^= hdr[2+i%4]
		}
		pong <- append([]byte{hdr[0]}, p...)
		_, _ = raw.Write([]byte{0x80 | opClose, 0})
	})
	c := dial(t, addr)
	b := make([]byte, 2)
	_, err := io.ReadFull(c, b)
	require.NoError(t, err)
	require.Equal(t, "hi", string(b))
	require.Equal(t, []byte{0x80 | opPong, 'a', 'b', 'c'}, <-pong)
	_, err = c.Read(b)
	require.ErrorIs(t, err, io.EOF)
}

// The server refuses what is not a version 13 upgrade, and frames a client did not mask.
func TestServerRefusals(t *testing.T) {
	errs := make(chan error, 1)
	addr := serve(t, func(c net.Conn) {
		_, err := c.Read(make([]byte, 1))
		errs <- err
	})
	resp, err := http.Get("http://" + addr + "/ws")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusUpgradeRequired, resp.StatusCode)

	raw, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := Client(raw, "edge.test", "/ws", nil)
	require.NoError(t, err)
	_, err = c.(*Conn).Conn.Write([]byte{0x80 | opBinary, 1, 'x'}) // no mask
	require.NoError(t, err)
	require.ErrorIs(t, <-errs, ErrProtocol)
}

func TestClientChecksTheAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Upgrade", "websocket")
		w.Header().Set("Connection", "Upgrade")
		w.WriteHeader(http.StatusNotFound)
	}))
	defer srv.Close()
	raw, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer raw.Close()
	_, err = Client(raw, "edge.test", "/ws", nil)
	require.ErrorContains(t, err, "404")
}

func TestMaskBytesMatchesTheDefinition(t *testing.T) {
	m := [4]byte{1, 2, 3, 4}
	for n := range 40 {
		for pos := range 4 {
			b := bytes.Repeat([]byte{0xaa}, n)
			want := bytes.Clone(b)
			for i := range want {
				want[i] ^= m[(pos+i)&3]
			}
			require.Equal(t, pos+n, maskBytes(m, pos, b))
			require.Equal(t, want, b)
		}
	}
}

// discardConn is a net.Conn whose writes go nowhere (the pongs of FuzzRead).
type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error) { return len(p), nil }

// FuzzRead: whatever a peer sends, reading it ends in data or an error, never a panic or an
// allocation the input's lengths ask for.
func FuzzRead(f *testing.F) {
	f.Add([]byte{0x82, 0x82, 1, 2, 3, 4, 'h' ^ 1, 'i' ^ 2}, false)
	f.Add([]byte{0x82, 2, 'h', 'i', 0x89, 1, 'p', 0x88, 0}, true)
	f.Add([]byte{0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}, false)
	f.Fuzz(func(t *testing.T, in []byte, client bool) {
		c := &Conn{Conn: discardConn{}, br: bufio.NewReader(bytes.NewReader(in)), client: client}
		buf := make([]byte, 64)
		for range len(in) + 2 {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
}
