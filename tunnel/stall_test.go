package tunnel

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/warren-tunnel/warren/internal/mux"
)

// downloads is a backend for the stall tests: /big streams up to 1 GiB of unknown length
// (chunked) until its client goes, /sized?n= answers n bytes with a Content-Length. It is
// closed after the edge (cleanups run last-first), whose end unblocks its writers.
func downloads(t *testing.T) *httptest.Server {
	t.Helper()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int64(1 << 30)
		if r.URL.Path == "/sized" {
			var err error
			if n, err = strconv.ParseInt(r.URL.Query().Get("n"), 10, 64); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		}
		for n > 0 && r.Context().Err() == nil {
			k := min(n, int64(len(chunk)))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	}))
	t.Cleanup(b.Close)
	return b
}

// activeStreams is the number of streams the members of subdomain sub have in flight at the
// edge (what the admin API shows as active_streams).
func activeStreams(e *testEdge, sub string) int64 {
	g := e.registry.LookupHTTP(sub)
	if g == nil {
		return -1
	}
	var n int64
	for _, m := range g.Members() {
		n += m.Active()
	}
	return n
}

// publicConnCount is the number of public connections the edge has open.
func publicConnCount(e *testEdge) int {
	e.publicConns.mu.Lock()
	defer e.publicConns.mu.Unlock()
	return e.publicConns.n
}

// h2Client is an HTTP/2 connection spoken frame by frame, whose reader records what the edge
// sends: the streams it reset, whether it sent GOAWAY, and the data of each stream.
type h2Client struct {
	t    *testing.T
	conn net.Conn
	mu   sync.Mutex // guards the framer's writes and the fields below
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer

	resets map[uint32]http2.ErrCode
	goaway bool
	data   map[uint32]int
	ended  map[uint32]bool
	closed chan struct{} // the reader stopped
}

// dialH2 opens an HTTP/2 connection to addr with prior knowledge, whose streams get a flow
// window of streamWindow: a stream the client then grants nothing never receives a byte.
func dialH2(t *testing.T, addr string, streamWindow uint32) *h2Client {
	t.Helper()
	conn, fr := h2Frames(t, addr)
	_ = conn.SetDeadline(time.Time{})
	c := &h2Client{t: t, conn: conn, fr: fr, resets: map[uint32]http2.ErrCode{}, data: map[uint32]int{},
		ended: map[uint32]bool{}, closed: make(chan struct{})}
	c.enc = hpack.NewEncoder(&c.hbuf)
	require.NoError(t, fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow}))
	go c.read()
	t.Cleanup(func() {
		_ = conn.Close()
		<-c.closed
	})
	return c
}

func (c *h2Client) read() {
	defer close(c.closed)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		c.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = c.fr.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			c.resets[f.StreamID] = f.ErrCode
		case *http2.GoAwayFrame:
			c.goaway = true
		case *http2.DataFrame:
			c.data[f.StreamID] += len(f.Data())
			if f.StreamEnded() {
				c.ended[f.StreamID] = true
			}
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				c.ended[f.StreamID] = true
			}
		}
		c.mu.Unlock()
	}
}

// get opens stream id with a GET of path on sub; grant, when positive, is the flow window
// given to the stream and the connection at once.
func (c *h2Client) get(id uint32, sub, path string, grant uint32) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NoError(c.t, c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndStream: true, EndHeaders: true,
		BlockFragment: h2Head(c.t, c.enc, &c.hbuf, "GET", sub+"."+testDomain, path)}))
	if grant > 0 {
		require.NoError(c.t, c.fr.WriteWindowUpdate(id, grant))
		require.NoError(c.t, c.fr.WriteWindowUpdate(0, grant))
	}
}

// state returns the streams reset so far, whether GOAWAY came, and stream id's data.
func (c *h2Client) state(id uint32) (resets map[uint32]http2.ErrCode, goaway bool, got int, ended bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resets = make(map[uint32]http2.ErrCode, len(c.resets))
	for k, v := range c.resets {
		resets[k] = v
	}
	return resets, c.goaway, c.data[id], c.ended[id]
}

// TestH2StalledStreamsPastTheConnectionBudgetAreReset: an HTTP/2 client that opens many
// streams to a large download and never grants them a window (each would hold a member
// stream's 4 MiB window at the edge, for ever) gets the streams past its connection's budget
// reset at once, the others at the stall timeout; a well-behaved stream on the same
// connection still gets its whole download, the connection is never ended (no GOAWAY), and
// every member stream is closed (the member's active-stream count returns to zero).
func TestH2StalledStreamsPastTheConnectionBudgetAreReset(t *testing.T) {
	be := downloads(t)
	window := int64(mux.StreamWindow)
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}, StalledResponses: StalledResponseLimits{Timeout: time.Second, MaxBytesPerConn: 2*window + window/2}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "dl"}, hostPort(be.URL))
	require.NoError(t, err)

	c := dialH2(t, e.publicAddr, 0)
	const stalled = 6
	for i := range stalled {
		c.get(uint32(2*i+1), "dl", "/big", 0)
	}
	// Two fit in the connection's budget; the four others are reset as they stall.
	var resets map[uint32]http2.ErrCode
	require.Eventually(t, func() bool {
		resets, _, _, _ = c.state(0)
		return len(resets) == stalled-2
	}, 10*time.Second, 5*time.Millisecond)
	_, goaway, _, _ := c.state(0)
	require.False(t, goaway, "the connection was ended")
	require.Equal(t, uint64(stalled-2), e.cuts.ConnBudget.Load())
	require.Zero(t, e.cuts.StallTimeout.Load(), "cut by the stall timeout before it passed")

	// A stream that reads is served in full on the same connection meanwhile.
	const good, size = 101, 2 << 20 // within the 2 MiB the two stalled ones leave: never cut, even if it waits
	c.get(good, "dl", "/sized?n="+strconv.Itoa(size), 1<<30)
	require.Eventually(t, func() bool { _, _, got, ended := c.state(good); return ended && got == size },
		10*time.Second, 5*time.Millisecond)
	resets, goaway, _, _ = c.state(good)
	require.NotContains(t, resets, uint32(good))
	require.False(t, goaway)

	// The two within the budget go at the stall timeout, and no member stream is left.
	require.Eventually(t, func() bool {
		resets, _, _, _ = c.state(0)
		return len(resets) == stalled
	}, 10*time.Second, 5*time.Millisecond, "resets: %v", resets)
	for id, code := range resets {
		require.Equal(t, http2.ErrCodeInternal, code, "stream %d", id)
	}
	require.Equal(t, uint64(2), e.cuts.StallTimeout.Load())
	require.Equal(t, uint64(stalled-2), e.cuts.ConnBudget.Load())
	require.Eventually(t, func() bool { return activeStreams(e, "dl") == 0 }, 10*time.Second, 5*time.Millisecond)
	_, goaway, _, _ = c.state(0)
	require.False(t, goaway)
}

// stalledGet sends a GET of path on sub over a new HTTP/1.1 connection from local (an
// address of the loopback network, "" for any) and never reads the answer: the edge's
// writes block once the kernel's buffers on both sides are full.
func stalledGet(t *testing.T, e *testEdge, local, sub, path string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+sub+"."+testDomain+"\r\n\r\n")
	require.NoError(t, err)
	return c
}

// TestHTTP1ClientThatStopsReadingIsCut: an HTTP/1.1 client that stops reading a large
// download has its connection cut once the edge's write to it has made no progress for the
// stall timeout (there was no write timeout at all: the response, its member stream and up
// to 4 MiB of it at the edge were held for ever), and the member's stream is closed.
func TestHTTP1ClientThatStopsReadingIsCut(t *testing.T) {
	be := downloads(t)
	const timeout = 500 * time.Millisecond
	e := startEdge(t, ServerConfig{StalledResponses: StalledResponseLimits{Timeout: timeout}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "dl"}, hostPort(be.URL))
	require.NoError(t, err)

	start := time.Now()
	c := stalledGet(t, e, "", "dl", "/big")
	require.Eventually(t, func() bool { return e.cuts.StallTimeout.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(start), timeout)
	require.Eventually(t, func() bool { return activeStreams(e, "dl") == 0 }, 10*time.Second, 5*time.Millisecond)

	// The edge closed the client's connection, and the client finds it ended short of the
	// body once it reads what its side still buffers.
	require.Eventually(t, func() bool { return publicConnCount(e) == 0 }, 10*time.Second, 5*time.Millisecond)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, c)
	require.False(t, isTimeout(err), "the connection is still open after %d bytes", n)
	require.Less(t, n, int64(1<<30))
	require.Zero(t, e.cuts.ConnBudget.Load()+e.cuts.ClientBudget.Load()+e.cuts.EdgeBudget.Load())
}

// TestClientAddressOverItsBudgetIsCut: a client address whose stalled responses hold its
// budget gets the next one cut at once, while another address's stalled response is kept
// and its reading client served in full; every member stream is closed once the clients go.
func TestClientAddressOverItsBudgetIsCut(t *testing.T) {
	be := downloads(t)
	window := int64(mux.StreamWindow)
	e := startEdge(t, ServerConfig{StalledResponses: StalledResponseLimits{Timeout: time.Minute, MaxBytesPerIP: 2*window + window/2}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "dl"}, hostPort(be.URL))
	require.NoError(t, err)

	var conns []net.Conn
	for range 3 {
		conns = append(conns, stalledGet(t, e, "127.0.0.2", "dl", "/big"))
	}
	// Two stalled downloads fill 127.0.0.2's budget: the third is cut.
	require.Eventually(t, func() bool { return e.cuts.ClientBudget.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return activeStreams(e, "dl") == 2 && publicConnCount(e) == 2 },
		10*time.Second, 5*time.Millisecond, "the cut connection or its member stream is still open")

	// Another address has a budget of its own: its stalled download is kept, and a client
	// of it that reads gets all of its download.
	conns = append(conns, stalledGet(t, e, "127.0.0.3", "dl", "/big"))
	require.Eventually(t, func() bool { return activeStreams(e, "dl") == 3 }, 10*time.Second, 5*time.Millisecond)
	local := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 5 * time.Second}
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return local.DialContext(ctx, network, e.publicAddr)
		},
	}}
	defer client.CloseIdleConnections()
	const size = 8 << 20
	resp, err := client.Get(e.url("dl", "/sized?n="+strconv.Itoa(size)))
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, int64(size), n)
	require.Equal(t, uint64(1), e.cuts.ClientBudget.Load())
	require.Zero(t, e.cuts.StallTimeout.Load()+e.cuts.ConnBudget.Load()+e.cuts.EdgeBudget.Load())

	require.Equal(t, map[string]uint64{"conn_budget": 0, "edge_budget": 0, "ip_budget": 1, "stall_timeout": 0},
		e.Operator().Counters().ResponsesCut, "what the admin plane's warren_http_responses_cut_total reports")
	// The three stalled downloads are charged a window each.
	require.Eventually(t, func() bool { return e.ingress.StalledBytes() == 3*window }, 10*time.Second, 5*time.Millisecond)

	for _, c := range conns {
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return activeStreams(e, "dl") == 0 }, 10*time.Second, 5*time.Millisecond)
	require.Zero(t, e.ingress.StalledBytes())
}

// Downloads whose clients stopped reading hold only their own streams: a connector's other
// requests go on. (Over QUIC, the bytes a stalled stream holds at the edge also count against
// the connection's flow-control window, which must not be what runs out first.)
func TestStalledDownloadsLeaveTheConnectorsOtherRequestsAlone(t *testing.T) {
	var sent atomic.Int64
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			_, _ = io.WriteString(w, "small")
			return
		}
		for r.Context().Err() == nil {
			n, err := w.Write(chunk)
			sent.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(be.Close)
	e := startEdge(t, ServerConfig{StalledResponses: StalledResponseLimits{Timeout: time.Minute, MaxBytesPerConn: -1, MaxBytesPerIP: -1, MaxBytes: -1}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "dl"}, hostPort(be.URL))
	require.NoError(t, err)

	const stalled = 6 // 24 MiB of windows, above quic-go's default 15 MiB for a connection
	for range stalled {
		stalledGet(t, e, "", "dl", "/big")
	}
	require.Eventually(t, func() bool { return activeStreams(e, "dl") == stalled }, 10*time.Second, 5*time.Millisecond)
	// Wait for the downloads to fill what they may hold: the backend stops getting writes out.
	last := int64(-1)
	require.Eventually(t, func() bool {
		n := sent.Load()
		settled := n == last
		last = n
		return settled
	}, 20*time.Second, 500*time.Millisecond)

	client := publicClient(e.publicAddr)
	client.Timeout = 5 * time.Second
	resp, err := client.Get(e.url("dl", "/small"))
	require.NoError(t, err, "a request next to the stalled downloads")
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "small", string(body))
}
