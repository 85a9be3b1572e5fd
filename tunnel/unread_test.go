package tunnel

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/wire"
)

// requireRetries checks warren_dispatch_retries_total.
func requireRetries(t *testing.T, e *testEdge, openFailed, resetUnread int64) {
	t.Helper()
	want := fmt.Sprintf(`# HELP warren_dispatch_retries_total Requests and connections sent to one other member, by reason: opening the stream to the first failed (open_failed), or its backend reset the connection with the bodyless request unread (reset_unread).
# TYPE warren_dispatch_retries_total counter
warren_dispatch_retries_total{reason="open_failed"} %d
warren_dispatch_retries_total{reason="reset_unread"} %d
`, openFailed, resetUnread)
	require.NoError(t, testutil.GatherAndCompare(e.obs.gatherer, strings.NewReader(want), "warren_dispatch_retries_total"))
}

// rawBackend accepts TCP connections on loopback and hands each to handle, until the test ends.
func rawBackend(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
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
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
	})
	return l.Addr().String()
}

// resetAfterOneByte reads one byte of a request and closes: the rest is left unread, so the
// kernel answers the close with a TCP reset, as it does for a backend killed with requests in
// its socket buffer.
func resetAfterOneByte(seen *atomic.Int64) func(net.Conn) {
	return func(c net.Conn) {
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err == nil {
			seen.Add(1)
		}
	}
}

// countingBackend is an HTTP backend counting the requests its handler received, per method.
func countingBackend(t *testing.T) (addr string, got func(method string) int64) {
	var mu sync.Mutex
	n := map[string]int64{}
	b := backend(t, "live")
	b.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		n[r.Method]++
		mu.Unlock()
		_, _ = io.WriteString(w, "live")
	})
	return hostPort(b.URL), func(m string) int64 {
		mu.Lock()
		defer mu.Unlock()
		return n[m]
	}
}

// TestRequestResetUnreadGoesToAnotherMember: a member's backend resets its connections with
// the request unread (killed, or dropping its queue). Its connector says so, and the edge
// sends the bodyless request to the other member: no request fails, none is seen twice.
func TestRequestResetUnreadGoesToAnotherMember(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: true})
	var resets atomic.Int64
	liveAddr, got := countingBackend(t)
	_, err := e.connect().Forward(ctxT(t), pool("pool"), rawBackend(t, resetAfterOneByte(&resets)))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), liveAddr)
	require.NoError(t, err)

	const n = 40
	for i := range n {
		code, body := e.get("pool", fmt.Sprintf("/%d", i))
		require.Equal(t, http.StatusOK, code, "request %d: %s", i, body)
		require.Equal(t, "live", body)
	}
	require.Positive(t, resets.Load(), "the resetting member was picked")
	require.Equal(t, int64(n), got(http.MethodGet), "each request reached the live handler exactly once")
	requireRetries(t, e, 0, resets.Load())
}

// TestRequestThatMayHaveReachedAnAppIsNotReplayed: the backend reads the whole request and
// closes without answering (an orderly close: the app had it). And a request with a body is
// never sent twice, even when the backend reset with it unread: the body was consumed. Both
// get 502, and the other member never sees them.
func TestRequestThatMayHaveReachedAnAppIsNotReplayed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		handle func(seen *atomic.Int64) func(net.Conn)
	}{
		{"read whole request then close", http.MethodGet, func(seen *atomic.Int64) func(net.Conn) {
			return func(c net.Conn) {
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err == nil {
					seen.Add(1)
				}
			}
		}},
		{"request with a body reset unread", http.MethodPost, resetAfterOneByte},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEdge(t, ServerConfig{LoadBalancing: true})
			var seen atomic.Int64
			liveAddr, got := countingBackend(t)
			_, err := e.connect().Forward(ctxT(t), pool("pool"), rawBackend(t, tc.handle(&seen)))
			require.NoError(t, err)
			_, err = e.connect().Forward(ctxT(t), pool("pool"), liveAddr)
			require.NoError(t, err)

			const n = 30
			failed := 0
			for i := range n {
				req, err := http.NewRequest(tc.method, e.url("pool", fmt.Sprintf("/%d", i)), nil)
				require.NoError(t, err)
				if tc.method == http.MethodPost {
					req.Body = io.NopCloser(strings.NewReader("a body"))
					req.ContentLength = int64(len("a body"))
				}
				resp, err := e.client.Do(req)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
				case http.StatusBadGateway:
					failed++
				default:
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
			}
			require.Positive(t, failed, "the closing member was picked")
			require.Equal(t, int64(failed), seen.Load(), "every failed request is one the closing backend took")
			require.Equal(t, int64(n-failed), got(tc.method), "no failed request was sent to the live member")
			requireRetries(t, e, 0, 0)
		})
	}
}

// fakeBackendConn is a backend connection for unreadConn: Read returns the queued outputs,
// then err; Write records the edge's bytes or fails with werr.
type fakeBackendConn struct {
	net.Conn
	outputs [][]byte
	err     error
	werr    error
	written bytes.Buffer
}

func (c *fakeBackendConn) Read(p []byte) (int, error) {
	if len(c.outputs) == 0 {
		return 0, c.err
	}
	n := copy(p, c.outputs[0])
	c.outputs = c.outputs[1:]
	return n, nil
}

func (c *fakeBackendConn) Write(p []byte) (int, error) {
	if c.werr != nil {
		return 0, c.werr
	}
	return c.written.Write(p)
}

var (
	errReadReset = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	errWritePipe = &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}
)

// TestUnreadNoticeOnlyWhenARequestIsPending walks the connector's tracker through exchanges:
// the notice goes out only for a reset that follows a request line with no answer since.
func TestUnreadNoticeOnlyWhenARequestIsPending(t *testing.T) {
	const req = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
	const resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	type step struct {
		edge    string // bytes the edge sends, or
		backend bool   // one backend output is read
	}
	for _, tc := range []struct {
		name    string
		outputs []string
		steps   []step
		endErr  error // the backend's final read error
		werr    error // every write fails with this
		notice  bool
	}{
		{name: "request, then reset", steps: []step{{edge: req}}, endErr: errReadReset, notice: true},
		{name: "request, then write to a reset connection", steps: []step{{edge: req}}, werr: errWritePipe, notice: true},
		{name: "second request on the stream, then reset", outputs: []string{resp}, steps: []step{{edge: req}, {backend: true}, {edge: req}}, endErr: errReadReset, notice: true},
		{name: "request, then orderly close", steps: []step{{edge: req}}, endErr: io.EOF},
		{name: "answered, then reset", outputs: []string{resp}, steps: []step{{edge: req}, {backend: true}}, endErr: errReadReset},
		{name: "reset with nothing asked", endErr: errReadReset},
		{name: "body continuing after an early answer", outputs: []string{resp}, steps: []step{{edge: "POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc"}, {backend: true}, {edge: "defghi"}}, endErr: errReadReset},
		{name: "after 101 Switching Protocols", outputs: []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"}, steps: []step{{edge: req}, {backend: true}, {edge: "GET / this is just data"}}, endErr: errReadReset},
		{name: "after 103 Early Hints", outputs: []string{"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"}, steps: []step{{edge: req}, {backend: true}, {edge: req}}, endErr: errReadReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var edge bytes.Buffer
			fc := &fakeBackendConn{err: tc.endErr, werr: tc.werr}
			for _, o := range tc.outputs {
				fc.outputs = append(fc.outputs, []byte(o))
			}
			c := &unreadConn{Conn: fc, edge: &edge}
			buf := make([]byte, 1024)
			for _, s := range tc.steps {
				if s.backend {
					n, err := c.Read(buf)
					require.NoError(t, err)
					edge.Write(buf[:n])
					continue
				}
				_, err := c.Write([]byte(s.edge))
				require.ErrorIs(t, err, tc.werr)
			}
			for range 2 { // the end is seen twice: the notice goes out once
				_, err := c.Read(buf)
				require.ErrorIs(t, err, tc.endErr)
			}
			wantTail := ""
			if tc.notice {
				wantTail = string(wire.UnreadNotice[:])
			}
			out := edge.String()
			for _, o := range tc.outputs {
				out = strings.TrimPrefix(out, o)
			}
			require.Equal(t, wantTail, out)
		})
	}
}

// TestUnreadNoticeIsNotAResponse: an edge that reads a stream beginning with a zero byte
// that is not the notice reports a malformed response (502), never a retry.
func TestUnreadNoticeIsNotAResponse(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: true})
	var conns atomic.Int64
	liveAddr, got := countingBackend(t)
	_, err := e.connect().Forward(ctxT(t), pool("pool"), rawBackend(t, func(c net.Conn) {
		conns.Add(1)
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = c.Write([]byte{0x00, 0x02, 'x'})
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(io.Discard, c) // until the edge gives up on the stream
	}))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), liveAddr)
	require.NoError(t, err)
	failed := 0
	for i := range 10 {
		code, _ := e.get("pool", fmt.Sprintf("/%d", i))
		if code == http.StatusBadGateway {
			failed++
		} else {
			require.Equal(t, http.StatusOK, code)
		}
	}
	require.Positive(t, failed)
	require.Equal(t, int64(10-failed), got(http.MethodGet), "nothing was sent twice")
}
