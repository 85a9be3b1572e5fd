package cluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
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

// abortedClients is how many downloads the test abandons.
const abortedClients = 8

// h2cClient returns a client speaking HTTP/2 with prior knowledge to addr.
func h2cClient(t *testing.T, addr string) *http.Client {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestClusterAbortedDownloadsEndTheirBackendConnections: a download forwarded from one edge
// of a cluster to a member on another, whose public client leaves, ends the member's backend
// connection too: the forwarding edge resets its stream over the edge-to-edge link (the
// link's reset channel), and the member's edge resets the member's stream in turn. Before,
// both edges held the abandoned stream's window for yamux's stream close timeout.
// (tunnel.TestAbortedDownloadsEndTheirBackendConnections is the same on one edge.)
func TestClusterAbortedDownloadsEndTheirBackendConnections(t *testing.T) {
	nodes := startNATSCluster(t, 1)
	a := startClusterEdge(t, nodes, "a", clusterOpts{edit: func(c *tunnel.ServerConfig) { c.Public.H2C = true }})
	b := startClusterEdge(t, nodes, "b", clusterOpts{})
	downloads := &endlessDownloads{}
	web := httptest.NewServer(downloads)
	t.Cleanup(web.Close)
	_, err := b.connect().Forward(ctxT(t), clusterPool("k"), hostPort(web.URL))
	require.NoError(t, err)
	a.waitMembers(t, "pool", map[string]int{"b": 1})

	h2 := h2cClient(t, a.PublicAddr)
	for i := range abortedClients {
		if i%2 == 0 { // an HTTP/1.1 client that closes its connection
			c, err := net.Dial("tcp", a.PublicAddr)
			require.NoError(t, err)
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = fmt.Fprintf(c, "GET /dl HTTP/1.1\r\nHost: pool.%s\r\n\r\n", tunneltest.Domain)
			require.NoError(t, err)
			_, err = io.ReadFull(c, make([]byte, 256<<10))
			require.NoError(t, err)
			require.NoError(t, c.Close())
			continue
		}
		ctx, cancel := context.WithCancel(context.Background()) // an HTTP/2 client that resets
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL("pool", "/dl"), nil)
		require.NoError(t, err)
		resp, err := h2.Do(req)
		require.NoError(t, err)
		_, err = io.ReadFull(resp.Body, make([]byte, 256<<10))
		require.NoError(t, err)
		cancel()
	}
	// Each abandoned download reached its backend as a reset connection: no handler is
	// writing any more.
	require.Eventually(t, func() bool { return downloads.live.Load() == 0 }, 10*time.Second, 20*time.Millisecond,
		"backend handlers still writing to abandoned downloads: %d", downloads.live.Load())
	code, body := a.get("pool", "/x")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body)
}
