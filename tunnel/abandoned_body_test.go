package tunnel

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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

// TestDeclaredBodyThatNeverComesIsClosedAfterThe408: a public request that declares a body
// and sends none gets its 408, and the edge then closes the connection instead of waiting
// for the body for good. A declared length under 256 KiB is what net/http reads after the
// handler to reuse the connection; a chunked body keeps the error of its failed read and was
// closed at once already.
func TestDeclaredBodyThatNeverComesIsClosedAfterThe408(t *testing.T) {
	e := startEdge(t, ServerConfig{RequestBody: RequestBodyLimits{Timeout: 300 * time.Millisecond, MinRate: -1}})
	app := tcpBackend(t, func(c net.Conn) { // reads one request's body
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = io.Copy(io.Discard, req.Body)
		}
	})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "up"}, app)
	require.NoError(t, err)
	for _, tc := range []struct{ name, framing string }{
		{"content-length", "Content-Length: 1000"},
		{"chunked", "Transfer-Encoding: chunked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := rawRequest(t, e.publicAddr, "POST / HTTP/1.1\r\nHost: up."+testDomain+"\r\n"+tc.framing+"\r\n\r\n", "")
			resp, _ := readAnswer(t, c, br, closeBound)
			require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
			require.True(t, resp.Close, "the 408 says Connection: close")
			requireClosedByEdge(t, c, br)
		})
	}
}

// TestAnswerLeavingTheBodyUnreadClosesTheConnection: on HTTP/1.1, an answer given before the
// request body was read to its end ends the connection, whether the body came (the edge does
// not read and drop it to reuse the connection) or not: a backend that answered without
// reading the upload, or the edge's own 404. Whatever the client sends next is never taken
// for another request.
func TestAnswerLeavingTheBodyUnreadClosesTheConnection(t *testing.T) {
	e := startEdge(t, ServerConfig{RequestBody: RequestBodyLimits{Timeout: 300 * time.Millisecond}})
	app := tcpBackend(t, func(c net.Conn) { // answers at once, reads no body
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "early"}, app)
	require.NoError(t, err)
	for _, tc := range []struct {
		name, host, body string
		status           int
	}{
		{"backend answers early, body cut short", "early", "abc", http.StatusOK},
		{"unknown host, whole body sent", "nobody", "0123456789", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := rawRequest(t, e.publicAddr, "POST / HTTP/1.1\r\nHost: "+tc.host+"."+testDomain+"\r\nContent-Length: 10\r\n\r\n", tc.body)
			resp, _ := readAnswer(t, c, br, closeBound)
			require.Equal(t, tc.status, resp.StatusCode)
			requireClosedByEdge(t, c, br)
		})
	}
}

// TestH2AnswerLeavingTheBodyUnreadEndsOnlyItsStream: on HTTP/2, an answer that leaves its
// request body unread (the edge's 404 to a stream whose body never comes) ends that stream
// only: no GOAWAY, and the next request on the connection is answered.
func TestH2AnswerLeavingTheBodyUnreadEndsOnlyItsStream(t *testing.T) {
	be := protoBackend(t)
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}, RequestBody: RequestBodyLimits{Timeout: 300 * time.Millisecond}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)
	c, fr := h2Frames(t, e.publicAddr)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	head := func(method, host string, extra ...hpack.HeaderField) []byte {
		h2Head(t, enc, &hbuf, method, host, "/")
		for _, f := range extra {
			require.NoError(t, enc.WriteField(f))
		}
		return bytes.Clone(hbuf.Bytes())
	}
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true,
		BlockFragment: head("POST", "nobody."+testDomain, hpack.HeaderField{Name: "content-length", Value: "200000"})}))

	statuses := map[uint32]string{}
	var decoding uint32
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			statuses[decoding] = f.Value
		}
	})
	var reset *http2.RSTStreamFrame
	require.NoError(t, c.SetReadDeadline(time.Now().Add(closeBound)))
	for reset == nil || statuses[3] == "" {
		f, err := fr.ReadFrame()
		require.NoError(t, err, "statuses %v, reset %v", statuses, reset)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, fr.WriteSettingsAck())
			}
		case *http2.GoAwayFrame:
			t.Fatalf("an abandoned body ended the whole HTTP/2 connection: GOAWAY %v", f.ErrCode)
		case *http2.HeadersFrame:
			decoding = f.StreamID
			_, err := dec.Write(f.HeaderBlockFragment())
			require.NoError(t, err)
		case *http2.RSTStreamFrame:
			require.Equal(t, uint32(1), f.StreamID)
			reset = f
			// The connection goes on: another request on it is answered.
			require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndHeaders: true, EndStream: true,
				BlockFragment: head("GET", "app."+testDomain)}))
		}
	}
	require.Equal(t, "404", statuses[1])
	require.Equal(t, "200", statuses[3])
}
