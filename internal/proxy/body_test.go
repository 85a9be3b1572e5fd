package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// bodyEdge is a public HTTP server in front of one member, "m" of group "pool".
type bodyEdge struct {
	srv *httptest.Server
	c   *connector
	m   *group.Member
	// ended receives, for each stream the member was sent, how reading the request body
	// on it ended (nil: it was read to its end).
	ended chan error
}

// startBodyEdge serves the HTTP ingress configured by cfg on loopback, in front of a member
// whose backend reads each request's body (all of it, or until the stream fails) and, when
// early is true, answers with a streamed response as soon as the head arrived; otherwise it
// answers once it read the whole body.
func startBodyEdge(t *testing.T, cfg Config, early bool) *bodyEdge {
	t.Helper()
	e := &bodyEdge{ended: make(chan error, 16)}
	cfg.Registry = group.NewRegistry(group.Config{LoadBalancing: true})
	cfg.Domain = testDomain
	e.c = startConnector(t, wire.AckOK, func(_ *connector, st mux.Stream, _ wire.Envelope) {
		br := bufio.NewReader(st)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if early {
				_, _ = io.WriteString(st, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nearly\r\n")
			}
			n, err := io.Copy(io.Discard, req.Body)
			e.ended <- err
			if err != nil {
				return
			}
			if early {
				_, err = io.WriteString(st, "0\r\n\r\n")
			} else {
				_, err = fmt.Fprintf(st, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(fmt.Sprint(n)), n)
			}
			if err != nil {
				return
			}
		}
	})
	e.m, _ = join(t, cfg.Registry, "m", group.ProtoHTTP, e.c)
	e.srv = httptest.NewServer(NewHTTP(cfg))
	t.Cleanup(e.srv.Close)
	return e
}

// dial opens a raw client connection to the edge, closed at cleanup.
func (e *bodyEdge) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// streamEnded waits for the member's stream to report the end of a request body, and
// returns how it ended.
func (e *bodyEdge) streamEnded(t *testing.T) error {
	t.Helper()
	select {
	case err := <-e.ended:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the member's stream was not released")
		return nil
	}
}

// requireReleased waits until the member holds no stream slot.
func (e *bodyEdge) requireReleased(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return e.m.Active() == 0 }, 10*time.Second, 5*time.Millisecond,
		"the member's stream slot was released")
}

const postHead = "POST /upload HTTP/1.1\r\nHost: pool." + testDomain + "\r\n"

// TestRequestBodyTimeout: a client that sends a request head announcing a body and then
// nothing gets 408 once the body timeout passes, and the member's stream is closed and its
// slot released; a body that arrives in time is carried whole.
func TestRequestBodyTimeout(t *testing.T) {
	e := startBodyEdge(t, Config{RequestBodyTimeout: 300 * time.Millisecond}, false)

	c, br := e.dial(t)
	start := time.Now()
	_, err := io.WriteString(c, postHead+"Content-Length: 1000000\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.Less(t, time.Since(start), 5*time.Second)
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(page), "request body too slow")
	require.NotContains(t, string(page), "proxy:", "a sentence for the client, with no package prefix")
	require.Error(t, e.streamEnded(t), "the member's stream was closed mid-body")
	e.requireReleased(t)
	_, err = io.ReadAll(br)
	require.NoError(t, err, "the edge closes the connection after the 408")

	c, br = e.dial(t)
	body := strings.Repeat("x", 100_000)
	_, err = io.WriteString(c, postHead+fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body))
	require.NoError(t, err)
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, fmt.Sprint(len(body)), string(got))
	require.NoError(t, e.streamEnded(t))
}

// TestRequestBodyMinRate: a body trickling in far below the minimum rate gets 408 soon
// after the grace period, long before the body timeout, and its member's stream is released.
func TestRequestBodyMinRate(t *testing.T) {
	e := startBodyEdge(t, Config{RequestBodyTimeout: time.Minute, RequestBodyMinRate: 1000,
		RequestBodyMinRateGrace: 200 * time.Millisecond}, false)

	c, br := e.dial(t)
	start := time.Now()
	_, err := io.WriteString(c, postHead+"Content-Length: 1000000\r\n\r\n")
	require.NoError(t, err)
	stop := make(chan struct{})
	trickled := make(chan struct{})
	go func() { // 1 byte every 20 ms: 50 bytes/s
		defer close(trickled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte{'x'}); err != nil {
					return
				}
			}
		}
	}()
	resp, err := http.ReadResponse(br, nil)
	close(stop)
	<-trickled
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Error(t, e.streamEnded(t))
	e.requireReleased(t)
}

// TestRequestBodyTimeoutAfterTheResponseStartedAborts: when the backend already answered
// and its response is streaming, a body that stops arriving aborts the exchange (the
// response never ends cleanly) and closes the member's stream.
func TestRequestBodyTimeoutAfterTheResponseStartedAborts(t *testing.T) {
	e := startBodyEdge(t, Config{RequestBodyTimeout: 300 * time.Millisecond}, true)

	c, br := e.dial(t)
	_, err := io.WriteString(c, postHead+"Content-Length: 1000000\r\n\r\nsome of the body")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	require.Error(t, err, "the response is cut, not ended")
	require.Error(t, e.streamEnded(t))
	e.requireReleased(t)
}

// TestMalformedChunkedBodyIs400: a request body whose chunked encoding is malformed is the
// client's fault: 400, and the member's stream is closed, never reused.
func TestMalformedChunkedBodyIs400(t *testing.T) {
	e := startBodyEdge(t, Config{}, false)

	c, br := e.dial(t)
	_, err := io.WriteString(c, postHead+"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), "bad request: reading the request body")
	require.NotContains(t, string(body), "proxy:", "a sentence for the client, with no package prefix")
	require.Error(t, e.streamEnded(t), "the member's stream was closed mid-body")
	e.requireReleased(t)

	// The next request gets a new stream: the broken one was not pooled.
	before := e.c.streams.Load()
	c, br = e.dial(t)
	_, err = io.WriteString(c, postHead+"Content-Length: 2\r\n\r\nok")
	require.NoError(t, err)
	resp, err = http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, before+1, e.c.streams.Load())
	require.NoError(t, e.streamEnded(t))
}

// TestHostWithBadPortIs400: a Host header whose port is not a number from 0 to 65535 gets
// 400 and reaches no member.
func TestHostWithBadPortIs400(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain})
	c := startConnector(t, wire.AckOK, answerHTTP)
	join(t, reg, "m", group.ProtoHTTP, c)
	for host, want := range map[string]int{
		"pool." + testDomain + ":abc":   http.StatusBadRequest,
		"pool." + testDomain + ":99999": http.StatusBadRequest,
		"pool." + testDomain + ":-1":    http.StatusBadRequest,
		"pool." + testDomain + ":8080":  http.StatusOK,
		"pool." + testDomain:            http.StatusOK,
	} {
		req := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, want, rec.Code, "%s: %s", host, rec.Body)
	}
	require.Equal(t, int64(1), c.streams.Load(), "only the valid hosts reached the member, over one stream")
}
