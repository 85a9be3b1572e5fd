package tunnel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// countingListener counts the streams an in-process backend accepted.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// inMemoryEdge starts an edge and one connector joined through Server.DialContext, and
// registers an in-process HTTP tunnel on subdomain "app": no sockets at all.
func inMemoryEdge(t testing.TB) (*Server, *Listener) {
	srv, err := NewServer(ServerConfig{Domain: testDomain, Logger: zaptest.NewLogger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	sess, err := Dial(ctxT(t), "in-memory", WithDialer(srv.DialContext))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	ln, err := sess.Listen(ctxT(t), TunnelSpec{Subdomain: "app"})
	require.NoError(t, err)
	return srv, ln
}

// TestInMemoryEdge runs an edge and a connector with no sockets at all: the connector
// attaches through Server.DialContext, public requests go through Server.Handler.
func TestInMemoryEdge(t *testing.T) {
	srv, ln := inMemoryEdge(t)
	require.Equal(t, "http://app."+testDomain, ln.URL())
	require.Equal(t, "warren", ln.Addr().Network())
	serveListener(t, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s for=%s proto=%s host=%s", r.Method, r.URL.Path,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-Host"))
	}))

	for i := range 20 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "http://APP.Warren.Test:8080/p"+fmt.Sprint(i), nil)
		req.RemoteAddr = "203.0.113.7:4242"
		srv.Handler().ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Equal(t, fmt.Sprintf("GET /p%d for=203.0.113.7 proto=http host=APP.Warren.Test:8080", i), rec.Body.String())
	}
}

func TestKeepAliveReusesStreams(t *testing.T) {
	srv, ln := inMemoryEdge(t)
	cl := &countingListener{Listener: ln}
	serveListener(t, cl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))

	for range 50 {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://app."+testDomain+"/", nil))
		require.Equal(t, http.StatusOK, rec.Code)
	}
	require.Equal(t, int64(1), cl.n.Load(), "sequential requests reuse one stream to the member")
}

func TestHTTPForwardOverLoopback(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	b := backend(t, "b1")
	sess := e.connect()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("http://web.%s:%d", testDomain, portOf(mustAddr(t, e.publicAddr))), tun.URL())
	require.NotEmpty(t, tun.ID())

	code, body := e.get("web", "/hello")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "b1 /hello", body)

	code, body = e.get("nope", "/")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "no tunnel for host")

	resp, err := e.client.Get("http://" + e.publicAddr + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode, "a host outside the domain is unknown")
}

func mustAddr(t testing.TB, s string) net.Addr {
	a, err := net.ResolveTCPAddr("tcp", s)
	require.NoError(t, err)
	return a
}

func TestBadGatewayWhenBackendFails(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	sess := e.connect()

	// The backend accepts and then drops the connection mid-request.
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = c.Close()
		}
	}))
	defer b.Close()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "broken"}, hostPort(b.URL))
	require.NoError(t, err)
	code, _ := e.get("broken", "/")
	require.Equal(t, http.StatusBadGateway, code)

	// The backend is not listening at all.
	dead := listenLoopback(t)
	deadAddr := dead.Addr().String()
	require.NoError(t, dead.Close())
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "dead"}, deadAddr)
	require.NoError(t, err)
	code, body := e.get("dead", "/")
	require.Equal(t, http.StatusBadGateway, code, body)
}

func TestStreamingUploadAndServerSentEvents(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	gotFirst := make(chan struct{})
	sendNext := make(chan struct{})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			br := bufio.NewReader(r.Body)
			line, err := br.ReadString('\n')
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			close(gotFirst) // the first chunk arrived while the client still holds the rest
			rest, _ := io.ReadAll(br)
			fmt.Fprintf(w, "%q+%q", line, rest)
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-sendNext
			fmt.Fprint(w, "data: two\n\n")
		}
	}))
	defer b.Close()
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "s"}, hostPort(b.URL))
	require.NoError(t, err)

	pr, pw := io.Pipe()
	req, err := http.NewRequest("POST", e.url("s", "/upload"), pr)
	require.NoError(t, err)
	go func() {
		_, _ = io.WriteString(pw, "first\n")
		select {
		case <-gotFirst:
			_, _ = io.WriteString(pw, "second")
			_ = pw.Close()
		case <-time.After(10 * time.Second):
			_ = pw.CloseWithError(fmt.Errorf("the backend never saw the first chunk"))
		}
	}()
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, `"first\n"+"second"`, string(body))

	resp, err = e.client.Get(e.url("s", "/events"))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "data: one\n", line, "the first event arrives before the backend sends the second")
	close(sendNext)
	rest, _ := io.ReadAll(br)
	require.Equal(t, "\ndata: two\n\n", string(rest))
}

// echoUpgrade answers "Upgrade: echo" with 101 and then echoes every byte.
func echoUpgrade(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != "echo" {
		http.Error(w, "want upgrade", http.StatusBadRequest)
		return
	}
	c, brw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	_, _ = io.Copy(c, brw)
}

func TestUpgradeCarriedEndToEnd(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	b := httptest.NewServer(http.HandlerFunc(echoUpgrade))
	defer b.Close()
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "ws"}, hostPort(b.URL))
	require.NoError(t, err)

	c, err := net.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = fmt.Fprintf(c, "GET /chat HTTP/1.1\r\nHost: ws.%s\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n", testDomain)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	for _, msg := range []string{"ping", "pong", strings.Repeat("x", 100000)} {
		_, err = io.WriteString(c, msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(br, got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
	}
}

func TestSlowHeaderClientDoesNotHoldOthers(t *testing.T) {
	e := startEdge(t, ServerConfig{Public: PublicHTTP{ReadHeaderTimeout: 300 * time.Millisecond}})
	b := backend(t, "b")
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	slow, err := net.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	defer slow.Close()
	_, err = fmt.Fprintf(slow, "GET / HTTP/1.1\r\nHost: app.%s\r\nX-Slow: ", testDomain)
	require.NoError(t, err)

	for range 10 {
		code, body := e.get("app", "/fast")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "b /fast", body)
	}
	// The slow client is cut off after the read-header timeout.
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(slow)
	require.NoError(t, err, "the edge closes the slow connection (EOF), not our deadline")
}

func TestPublicLimits(t *testing.T) {
	e := startEdge(t, ServerConfig{Public: PublicHTTP{MaxHeaderBytes: 4 << 10}, RequestBody: RequestBodyLimits{MaxBytes: 1000}})
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "read %d", n)
	}))
	defer b.Close()
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	req, _ := http.NewRequest("GET", e.url("app", "/"), nil)
	req.Header.Set("X-Huge", strings.Repeat("h", 64<<10))
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)

	resp, err = e.client.Post(e.url("app", "/"), "text/plain", strings.NewReader(strings.Repeat("b", 1001)))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "declared length over the limit")

	// Chunked: the length is only known while streaming.
	resp, err = e.client.Post(e.url("app", "/"), "text/plain", io.MultiReader(strings.NewReader(strings.Repeat("b", 5000))))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "chunked body over the limit: %s", body)

	resp, err = e.client.Post(e.url("app", "/"), "text/plain", strings.NewReader(strings.Repeat("b", 1000)))
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "read 1000", string(body))
}

var _ = context.Background
