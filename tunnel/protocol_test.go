package tunnel

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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

// TestSpoofableHeadersNeverReachTheBackend: headers only a proxy may set, sent by a client
// that is no trusted proxy (X-Forwarded-Ssl: on, which Rack takes for HTTPS, the port, a
// CDN's client address, an original URL), reach no backend, over HTTP/1.1 or HTTP/2; the
// backend sees the edge's Via element with the protocol the client spoke.
func TestSpoofableHeadersNeverReachTheBackend(t *testing.T) {
	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{})
	spoofed := []string{"X-Forwarded-Ssl", "Front-End-Https", "X-Forwarded-Scheme", "X-Forwarded-Port",
		"X-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "X-Original-Url"}
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, n := range spoofed {
			if v := r.Header.Values(n); len(v) > 0 {
				fmt.Fprintf(w, "%s: %q\n", n, v)
			}
		}
		fmt.Fprintf(w, "Via: %q\n", r.Header.Values("Via"))
	}))
	t.Cleanup(be.Close)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(be.URL))
	require.NoError(t, err)
	host := "web." + testDomain

	for url, c := range map[string]*http.Client{
		"http://" + host + "/":  e.client,
		"https://" + host + "/": tlsClient(t, pki, httpsAddr, "h2"),
	} {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(t, err)
		for _, n := range spoofed {
			req.Header.Set(n, "on")
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("Via: [\"%d.%d warren\"]\n", resp.ProtoMajor, resp.ProtoMinor), string(body), url)
	}
}

// TestH2PathWithASpaceIsRefused: an HTTP/2 request whose :path holds a space ("/x?a=1
// HTTP/1.0", which would end the request line to an HTTP/1.1 member early) is answered 400
// by the edge, as net/http answers such a request line over HTTP/1.1; no member is
// involved, and the connection goes on.
func TestH2PathWithASpaceIsRefused(t *testing.T) {
	e := startEdge(t, ServerConfig{PublicH2C: true})
	be, conns, _ := tallyingBackend(t)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(be.URL))
	require.NoError(t, err)
	c, fr := h2Frames(t, e.publicAddr)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	for i, path := range []string{"/x?a=1 HTTP/1.0", "/x?a=1"} {
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), EndStream: true, EndHeaders: true,
			BlockFragment: h2Head(t, enc, &hbuf, "GET", "web."+testDomain, path)}))
	}
	status := map[uint32]string{}
	dec := hpack.NewDecoder(4096, nil)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(status) < 2 {
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, fr.WriteSettingsAck())
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		case *http2.RSTStreamFrame:
			t.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
		case *http2.HeadersFrame:
			fields, err := dec.DecodeFull(f.HeaderBlockFragment())
			require.NoError(t, err)
			for _, hf := range fields {
				if hf.Name == ":status" {
					status[f.StreamID] = hf.Value
				}
			}
		}
	}
	require.Equal(t, map[uint32]string{1: "400", 3: "200"}, status)
	require.Equal(t, int64(1), conns.Load(), "the request with a space in its :path reached the backend")
}
