package tunnel

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// requireRetries checks the edge's retry counters (warren_dispatch_retries_total, rendered by
// tunnel/admin: TestMetricsRenderTheEdgeCounters).
func requireRetries(t *testing.T, e *testEdge, openFailed, resetUnread int64) {
	t.Helper()
	c := e.Operator().Counters()
	require.Equal(t, [3]uint64{0, uint64(openFailed), uint64(resetUnread)},
		[3]uint64{c.RetriesIdempotent, c.RetriesOpenFailed, c.RetriesResetUnread}, "idempotent, open_failed, reset_unread")
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

// poolWithLive registers two members of the pool "pool" on e: one whose backend runs handle
// on each TCP connection, and a live HTTP backend; it returns the live backend's counter.
func poolWithLive(t *testing.T, e *testEdge, handle func(net.Conn)) func(method string) int64 {
	t.Helper()
	liveAddr, got := countingBackend(t)
	_, err := e.connect().Forward(ctxT(t), pool("pool"), tcpBackend(t, handle))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), liveAddr)
	require.NoError(t, err)
	return got
}

// TestRequestResetUnreadGoesToAnotherMember: a member's backend resets its connections with
// the request unread (killed, or dropping its queue). Its connector says so, and with
// RetryUnreadRequests the edge sends the bodyless request to the other member: no request
// fails, none is seen twice. Without it (the default) those requests get 502, and none
// reaches the other member either.
func TestRequestResetUnreadGoesToAnotherMember(t *testing.T) {
	for _, retry := range []bool{true, false} {
		t.Run(fmt.Sprintf("RetryUnreadRequests=%v", retry), func(t *testing.T) {
			e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, RetryUnreadRequests: retry}})
			var resets atomic.Int64
			got := poolWithLive(t, e, resetAfterOneByte(&resets))

			const n = 40
			failed := 0
			for i := range n {
				code, body := e.get("pool", fmt.Sprintf("/%d", i))
				if retry || code == http.StatusOK {
					require.Equal(t, http.StatusOK, code, "request %d: %s", i, body)
					require.Equal(t, "live", body)
					continue
				}
				require.Equal(t, http.StatusBadGateway, code)
				failed++
			}
			require.Positive(t, resets.Load(), "the resetting member was picked")
			if retry {
				require.Equal(t, int64(n), got(http.MethodGet), "each request reached the live handler exactly once")
				requireRetries(t, e, 0, resets.Load())
			} else {
				require.Equal(t, resets.Load(), int64(failed), "each reset request failed")
				require.Equal(t, int64(n-failed), got(http.MethodGet), "no failed request reached the live member")
				requireRetries(t, e, 0, 0)
			}
		})
	}
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
			e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, RetryUnreadRequests: true}})
			var seen atomic.Int64
			got := poolWithLive(t, e, tc.handle(&seen))

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

// TestUnreadNoticeIsNotAResponse: an edge that reads a stream beginning with a zero byte
// that is not the notice reports a malformed response (502), never a retry, and at once:
// the backend here keeps its connection open after its three bytes, so an edge waiting for
// a whole notice would leave the client waiting until its own timeout.
func TestUnreadNoticeIsNotAResponse(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, RetryUnreadRequests: true}})
	got := poolWithLive(t, e, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = c.Write([]byte{0x00, 0x01, 'x'})
		}
		// Until the edge gives up on the stream; the bound only keeps a broken edge from
		// pinning this goroutine past the client's timeout.
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = io.Copy(io.Discard, c)
	})
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

// TestBackendOutputLikeTheUnreadNoticeIsNotReplayed: the notice travels in-band, where a
// backend's own bytes could stand (a non-HTTP or buggy backend, stray bytes after a previous
// response on a reused stream: a body sent for HEAD/204/304, a wrong Content-Length; a
// TrueType font begins with 00 01 00 00). Here the backend read the whole request (its
// handler ran) and then wrote 00 01 and more: the edge must answer 502 and never send the
// request to the other member. The notice's tag, keyed by a secret of the session that the
// backend never sees, is what tells them apart.
func TestBackendOutputLikeTheUnreadNoticeIsNotReplayed(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, RetryUnreadRequests: true}})
	var handled atomic.Int64
	got := poolWithLive(t, e, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		handled.Add(1)                                                                 // the whole request was read: a handler ran for it
		_, _ = c.Write([]byte("\x00\x01\x00\x00\x00\x0c\x00\x80\x00\x03\x00\x40OS/2")) // a TrueType font, as the notice is long
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(io.Discard, c) // until the edge gives up on the stream
	})

	const n = 10
	failed := 0
	for i := range n {
		code, _ := e.get("pool", fmt.Sprintf("/%d", i))
		if code != http.StatusOK {
			require.Equal(t, http.StatusBadGateway, code)
			failed++
		}
	}
	require.Positive(t, handled.Load(), "the member whose backend answers with zero bytes was picked")
	require.Equal(t, int64(n), handled.Load()+got(http.MethodGet),
		"each request reached exactly one handler (replayed: %d)", handled.Load()+got(http.MethodGet)-n)
	require.Equal(t, int64(failed), handled.Load(), "a request the first backend read fails, it is not replayed")
}

// TestUnreadNoticeNeverInsideAResponseBody: a backend answers an upload early with a
// streamed (close-delimited) body, more of the upload arrives (beginning like a request
// line: upload content is the public client's to choose), and the backend closes with it
// unread, which resets the connection. The public client must never receive a notice as
// content: after a request with a body the connector sends none on that stream.
func TestUnreadNoticeNeverInsideAResponseBody(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	_, err := e.connect().Forward(ctxT(t), pool("pool"), tcpBackend(t, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		// Read the request head byte by byte, leaving the body in the socket.
		var head []byte
		var b [1]byte
		for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
			if _, err := c.Read(b[:]); err != nil {
				return
			}
			head = append(head, b[0])
		}
		// An early answer with a streamed body.
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\npartial"); err != nil {
			return
		}
		// Wait for more of the upload, then close with it unread: the kernel resets.
		_, _ = c.Read(b[:])
	}))
	require.NoError(t, err)

	pc, err := net.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	defer pc.Close()
	require.NoError(t, pc.SetDeadline(time.Now().Add(8*time.Second)))
	_, err = io.WriteString(pc, "POST /upload HTTP/1.1\r\nHost: pool."+testDomain+"\r\nContent-Length: 65536\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(pc)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	first := make([]byte, len("partial"))
	_, err = io.ReadFull(resp.Body, first)
	require.NoError(t, err)
	require.Equal(t, "partial", string(first))

	// The next 4 KiB of the upload: each 2 KiB block (the connector's small copy buffer)
	// begins like a request line.
	block := bytes.Repeat([]byte{'x'}, 2048)
	copy(block, "PUT /not-a-request ")
	_, err = pc.Write(bytes.Repeat(block, 2))
	require.NoError(t, err)

	rest, _ := io.ReadAll(resp.Body) // the stream ends cleanly: a close-delimited body looks complete
	require.NotContains(t, string(rest), "\x00\x01",
		"the public client received the connector's notice as response content: %q", rest)
}
