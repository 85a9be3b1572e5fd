package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// endlessDownloads is an HTTP handler streaming an endless body at /dl (and answering "ok"
// elsewhere); live counts the handlers still writing one (a handler ends when a write fails:
// its connection was closed or reset).
type endlessDownloads struct{ live atomic.Int64 }

func (d *endlessDownloads) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/dl" {
		_, _ = io.WriteString(w, "ok")
		return
	}
	d.live.Add(1)
	defer d.live.Add(-1)
	streamForever(w)
}

// abortedClients is how many downloads each case abandons. Before streams were reset, each
// held its backend connection and up to a 4 MiB window at the edge for yamux's 5-minute
// stream close timeout.
const abortedClients = 8

// requireBackendsFreed waits until no backend handler is writing any more: each abandoned
// download reached its backend as a reset connection.
func requireBackendsFreed(t *testing.T, live *atomic.Int64) {
	t.Helper()
	require.Eventually(t, func() bool { return live.Load() == 0 }, 10*time.Second, 20*time.Millisecond,
		"backend handlers still writing to abandoned downloads: %d", live.Load())
}

// TestAbortedDownloadsEndTheirBackendConnections: a public client that leaves in the middle
// of a download (an HTTP/1.1 client closing its connection, an HTTP/2 client resetting its
// stream, an application's Listen tunnel behind it) ends the member's stream at once: the
// connector resets its backend connection (the backend's write fails), and the member's
// stream slot is free. Before, the edge only half-closed the stream; the connector kept
// writing into it until the edge's window for it was full and then waited, with the
// backend connection open, for yamux's stream close timeout (5 minutes); 200 aborted
// downloads pinned 1.17 GB at the edge.
func TestAbortedDownloadsEndTheirBackendConnections(t *testing.T) {
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}})
	sess := e.connect()
	forwarded := &endlessDownloads{}
	web := httptest.NewServer(forwarded)
	t.Cleanup(web.Close)
	dl, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "dl"}, hostPort(web.URL))
	require.NoError(t, err)
	listened := &endlessDownloads{}
	ln, err := sess.Listen(ctxT(t), TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	serveListener(t, ln, listened)

	abortHTTP1 := func(sub string) {
		c, err := net.Dial("tcp", e.publicAddr)
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = fmt.Fprintf(c, "GET /dl HTTP/1.1\r\nHost: %s.%s\r\n\r\n", sub, testDomain)
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 256<<10))
		require.NoError(t, err)
	}
	h2 := h2cClient(t, e.publicAddr)
	abortHTTP2 := func(sub string) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // RST_STREAM: the connection stays
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url(sub, "/dl"), nil)
		require.NoError(t, err)
		resp, err := h2.Do(req)
		require.NoError(t, err)
		require.Equal(t, "HTTP/2.0", resp.Proto)
		_, err = io.ReadFull(resp.Body, make([]byte, 256<<10))
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name  string
		sub   string
		live  *atomic.Int64
		abort func(string)
	}{
		{"HTTP/1.1 client closes", "dl", &forwarded.live, abortHTTP1},
		{"HTTP/2 client resets its stream", "dl", &forwarded.live, abortHTTP2},
		{"HTTP/1.1 client closes, Listen tunnel", "app", &listened.live, abortHTTP1},
		{"HTTP/2 client resets its stream, Listen tunnel", "app", &listened.live, abortHTTP2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range abortedClients {
				tc.abort(tc.sub)
			}
			requireBackendsFreed(t, tc.live)
		})
	}
	m := e.registry.Lookup(dl.ID())
	require.NotNil(t, m)
	require.Eventually(t, func() bool { return m.Active() == 0 }, 5*time.Second, 10*time.Millisecond)
	// The pool still serves: the resets ended only the abandoned streams.
	code, body := e.get("dl", "/x")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body)
}

// TestAbortedPassthroughEndsItsBackendConnection: a client of a TLS passthrough tunnel that
// closes its connection in the middle of a download ends the backend's connection at once,
// as a TCP tunnel's data connection does.
func TestAbortedPassthroughEndsItsBackendConnection(t *testing.T) {
	e, addr, cert, pool := passthroughEdge(t, ServerConfig{})
	downloads := &endlessDownloads{}
	b := httptest.NewUnstartedServer(downloads)
	b.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	b.StartTLS()
	t.Cleanup(b.Close)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTLS, Subdomain: "pt"}, b.Listener.Addr().String())
	require.NoError(t, err)
	for range abortedClients {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "pt." + testDomain})
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = fmt.Fprintf(c, "GET /dl HTTP/1.1\r\nHost: pt.%s\r\n\r\n", testDomain)
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 256<<10))
		require.NoError(t, err)
		require.NoError(t, c.Close())
	}
	requireBackendsFreed(t, &downloads.live)
}
