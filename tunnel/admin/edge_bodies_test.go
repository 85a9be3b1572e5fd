package admin

// The limits of an operator listener (the edge's ServeAdmin) around a Plane and around any
// handler (moved from package tunnel's abandoned_body_test.go).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
)

// closeBound is how long a test waits for the edge to close a connection whose request body
// was abandoned: the tests' body timeouts (at most 300 ms), as long again for the rest of
// the body, net/http's half a second before the close, and room for a loaded machine.
const closeBound = 5 * time.Second

// rawRequest dials addr, writes head (and body, if any) and returns the connection with a
// reader of its answers. The connection is closed at cleanup.
func rawRequest(t *testing.T, addr, head, body string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, head+body)
	require.NoError(t, err)
	return c, bufio.NewReader(c)
}

// readAnswer reads one answer from br within d, body included.
func readAnswer(t *testing.T, c net.Conn, br *bufio.Reader, d time.Duration) (*http.Response, string) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "no answer within %s", d)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// requireClosedByEdge waits at most closeBound for the edge to close c (an end of stream or
// a reset), reading and discarding anything it still sends.
func requireClosedByEdge(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(start.Add(closeBound)))
	_, err := io.Copy(io.Discard, br)
	if err != nil {
		require.False(t, isTimeout(err), "the edge still holds the connection after %s", closeBound)
		require.ErrorIs(t, err, syscall.ECONNRESET)
	}
	t.Logf("closed by the edge after %s", time.Since(start).Round(time.Millisecond))
}

// TestAdminAnswersARequestWithABodyItDoesNotRead: an admin request declaring a body that
// never comes (GET /healthz with Content-Length: 200000) gets its answer at once, not after
// net/http waited for the body, and the connection is closed after it. A long answer (the
// status page), whose head is written while the handler runs, comes at the latest when the
// admin listener's limit on a whole request (twice ReadHeaderTimeout) ends the wait.
func TestAdminAnswersARequestWithABodyItDoesNotRead(t *testing.T) {
	e := startEdge(t, tunnel.ServerConfig{Public: tunnel.PublicHTTP{ReadHeaderTimeout: 500 * time.Millisecond}, RequestBody: tunnel.RequestBodyLimits{Timeout: 300 * time.Millisecond}}, Options{})
	for _, tc := range []struct {
		name, path string
		within     time.Duration
	}{
		{"short answer", "/healthz", 500 * time.Millisecond},
		{"long answer", "/static/status.js", closeBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := rawRequest(t, e.adminAddr, "GET "+tc.path+" HTTP/1.1\r\nHost: admin\r\nContent-Length: 200000\r\n\r\n", "")
			start := time.Now()
			resp, body := readAnswer(t, c, br, closeBound)
			t.Logf("answered after %s (%d bytes)", time.Since(start).Round(time.Millisecond), len(body))
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Less(t, time.Since(start), tc.within)
			require.True(t, resp.Close, "the answer says Connection: close")
			requireClosedByEdge(t, c, br)
		})
	}
}

// TestEventStreamOutlivesTheAdminReadTimeout: the admin listener's limit on reading a
// request (twice ReadHeaderTimeout) does not end a live event stream that lasts longer
// (net/http lifts the deadline when it starts watching the connection for the client's
// leaving, once the request is read).
func TestEventStreamOutlivesTheAdminReadTimeout(t *testing.T) {
	const readHeader = 100 * time.Millisecond
	e := startEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Public: tunnel.PublicHTTP{ReadHeaderTimeout: readHeader}}, Options{EventKeepAlive: readHeader})
	rawMember(t, e, "", probedRegister("pool", "web", "k"))
	st := openStream(t, e.adminAddr, "", "/api/groups/http/pool/events", nil).read()
	start := time.Now()
	require.Equal(t, "group events of http/pool", st.next().comment)
	for time.Since(start) < 4*adminReadTimeoutFactor*readHeader {
		require.Equal(t, "keep-alive", st.next().comment)
	}
}

// ServeAdmin serves any operator handler, not only a Plane's, with the limits of an operator
// listener: an answer that leaves its request body unread comes at once and closes the
// connection, and the read of a body that never comes ends at the limit on a whole request
// (twice ReadHeaderTimeout), and the connection with it.
func TestServeAdminServesAnyHandlerWithTheOperatorLimits(t *testing.T) {
	const readHeader = 300 * time.Millisecond
	e := tunneltest.NewEdge(t, tunnel.ServerConfig{Public: tunnel.PublicHTTP{ReadHeaderTimeout: readHeader}, RequestBody: tunnel.RequestBodyLimits{Timeout: 300 * time.Millisecond}})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ignore", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ignored") })
	mux.HandleFunc("POST /read", func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		_, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%v after %d ms", err != nil, time.Since(start).Milliseconds())
	})
	addr := e.ServeAdmin(mux)

	t.Run("body left unread", func(t *testing.T) {
		c, br := rawRequest(t, addr, "GET /ignore HTTP/1.1\r\nHost: admin\r\nContent-Length: 200000\r\n\r\n", "")
		start := time.Now()
		resp, body := readAnswer(t, c, br, closeBound)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "ignored", body)
		require.Less(t, time.Since(start), 500*time.Millisecond)
		require.True(t, resp.Close, "the answer says Connection: close")
		requireClosedByEdge(t, c, br)
	})
	t.Run("body that never comes", func(t *testing.T) {
		c, br := rawRequest(t, addr, "POST /read HTTP/1.1\r\nHost: admin\r\nContent-Length: 10\r\n\r\n", "abc")
		resp, body := readAnswer(t, c, br, closeBound)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var failed bool
		var ms int64
		_, err := fmt.Sscanf(body, "%t after %d ms", &failed, &ms)
		require.NoError(t, err, body)
		require.True(t, failed, "the read of the body failed: %s", body)
		t.Logf("the handler's read failed after %d ms", ms)
		require.GreaterOrEqual(t, time.Duration(ms)*time.Millisecond, readHeader, "the body had its time: %s", body)
		require.Less(t, time.Duration(ms)*time.Millisecond, closeBound, "the read ended by the listener's limit: %s", body)
		requireClosedByEdge(t, c, br)
	})
}
