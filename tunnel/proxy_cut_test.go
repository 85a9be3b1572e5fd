package tunnel

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// streamForever writes 16 KiB blocks to w until a write fails, flushing each one when w is an
// http.ResponseWriter.
func streamForever(w io.Writer) {
	buf := make([]byte, 16<<10)
	f, _ := w.(http.Flusher)
	for {
		if _, err := w.Write(buf); err != nil {
			return
		}
		if f != nil {
			f.Flush()
		}
	}
}

// TestConnectorKilledMidDownloadIsVisible: when a connector dies in the middle of downloads
// (its connection to the edge cut without a goodbye), every public client sees the loss: a
// TCP client reads a reset, HTTP clients read an error (a body shorter than its
// Content-Length, a chunked body with no last chunk), never a clean end. A download that
// ends normally still ends cleanly.
func TestConnectorKilledMidDownloadIsVisible(t *testing.T) {
	const total = 1 << 20
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43600), BindHost: "127.0.0.1"}})
	d := newCutDialer(t)
	sess := e.connect(WithDialer(d.dial))

	endless := tcpBackend(t, func(c net.Conn) { streamForever(c) })
	finite := tcpBackend(t, func(c net.Conn) { _, _ = c.Write(make([]byte, total)) })
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/length" {
			w.Header().Set("Content-Length", strconv.Itoa(1<<30))
		}
		streamForever(w)
	}))
	t.Cleanup(web.Close)

	endlessTun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, endless)
	require.NoError(t, err)
	finiteTun, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, finite)
	require.NoError(t, err)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "dl"}, hostPort(web.URL))
	require.NoError(t, err)

	dialTCP := func(port int) net.Conn {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c
	}

	// A normal end is a clean end.
	got, err := io.ReadAll(dialTCP(finiteTun.Port()))
	require.NoError(t, err)
	require.Len(t, got, total)

	// Downloads under way: a TCP one and two HTTP ones.
	tcpConn := dialTCP(endlessTun.Port())
	_, err = io.ReadFull(tcpConn, make([]byte, 256<<10))
	require.NoError(t, err)
	var bodies []io.ReadCloser
	for _, path := range []string{"/length", "/chunked"} {
		resp, err := e.client.Get(e.url("dl", path))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		t.Cleanup(func() { _ = resp.Body.Close() })
		_, err = io.ReadFull(resp.Body, make([]byte, 256<<10))
		require.NoError(t, err, path)
		bodies = append(bodies, resp.Body)
	}

	d.cut() // the connector dies

	n, err := io.Copy(io.Discard, tcpConn)
	require.ErrorIs(t, err, syscall.ECONNRESET, "TCP: %d more bytes, then a clean end instead of a reset", n)
	for i, body := range bodies {
		n, err := io.Copy(io.Discard, body)
		require.Error(t, err, "HTTP download %d: %d more bytes, then a clean end", i, n)
	}
}
