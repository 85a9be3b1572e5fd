package tunnel

import (
	"bufio"
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

// tallyingBackend is a loopback HTTP/1.1 backend that counts the connections it accepted and
// the requests it served.
func tallyingBackend(t *testing.T) (b *httptest.Server, conns, reqs *atomic.Int64) {
	t.Helper()
	conns, reqs = new(atomic.Int64), new(atomic.Int64)
	b = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs.Add(1)
		_, _ = io.WriteString(w, "backend")
	}))
	b.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	b.Start()
	t.Cleanup(b.Close)
	return b, conns, reqs
}

// TestConnectIsRefusedBeforeAnyMember: a CONNECT to an HTTP tunnel's host is answered 405,
// with Allow, by the edge itself, over HTTP/1.1 and HTTP/2 (h2c, and h2 by ALPN): the member
// and its backend never hear of it, so no member stream is left open however the client
// ends. Over HTTP/1.1 the connection is closed after the 405: the bytes a client sent
// behind its CONNECT without waiting for the answer are never read as a request.
func TestConnectIsRefusedBeforeAnyMember(t *testing.T) {
	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{PublicH2C: true})
	be, conns, reqs := tallyingBackend(t)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(be.URL))
	require.NoError(t, err)
	host := "web." + testDomain

	c, err := net.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = fmt.Fprintf(c, "CONNECT %[1]s:80 HTTP/1.1\r\nHost: %[1]s:80\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: %[1]s\r\n\r\n", host)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	require.Equal(t, allowedMethodsForTest, resp.Header.Get("Allow"))
	require.True(t, resp.Close, "the HTTP/1.1 connection is kept after a refused CONNECT")
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the bytes behind the CONNECT were answered as a request")

	for name, client := range map[string]*http.Client{
		"http":  h2cClient(t, e.publicAddr),
		"https": tlsClient(t, pki, httpsAddr, "h2"),
	} {
		req, err := http.NewRequest(http.MethodConnect, name+"://"+host+":443", nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err, name)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, 2, resp.ProtoMajor, name)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, name)
		require.Equal(t, allowedMethodsForTest, resp.Header.Get("Allow"), name)
	}
	require.Zero(t, conns.Load(), "a CONNECT reached the backend")
	require.Zero(t, reqs.Load(), "a CONNECT reached the backend")

	code, body := e.get("web", "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "backend", body)
}

// allowedMethodsForTest is the Allow header of the edge's 405 to CONNECT.
const allowedMethodsForTest = "GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH, TRACE"
