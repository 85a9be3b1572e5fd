package tunnel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
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
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{Public: PublicHTTP{H2C: true}})
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
	require.Error(t, err, "the bytes behind the CONNECT were answered as a request")

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
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}})
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

// h2ServerSettings reads the first frame the server on c sends, its SETTINGS, after the
// client preface.
func h2ServerSettings(t *testing.T, c net.Conn) map[http2.SettingID]uint32 {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err := io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())
	f, err := fr.ReadFrame()
	require.NoError(t, err)
	sf, ok := f.(*http2.SettingsFrame)
	require.True(t, ok, "the server's first frame is %v", f)
	settings := map[http2.SettingID]uint32{}
	require.NoError(t, sf.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil }))
	return settings
}

// TestPublicH2NeverAdvertisesExtendedConnect: with GODEBUG=http2xconnect=1, net/http's
// HTTP/2 server advertises extended CONNECT (RFC 8441), and browsers then send WebSockets
// that way, which the edge does not carry; the edge's public HTTP/2 servers (h2c and h2 by
// ALPN) never advertise it, and still serve. net/http reads GODEBUG from the environment
// once, as it initialises (os.Setenv in a test is too late, and //go:debug does not know
// http2xconnect): the test runs itself again in a process started with it.
func TestPublicH2NeverAdvertisesExtendedConnect(t *testing.T) {
	if os.Getenv("WARREN_TEST_XCONNECT") == "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPublicH2NeverAdvertisesExtendedConnect$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "GODEBUG=http2xconnect=1", "WARREN_TEST_XCONNECT=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestPublicH2NeverAdvertisesExtendedConnect", "%s", out)
		return
	}

	plain := httptest.NewUnstartedServer(http.NotFoundHandler())
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	plain.Config.Protocols = &p
	plain.Start()
	t.Cleanup(plain.Close)
	c, err := net.Dial("tcp", plain.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, uint32(1), h2ServerSettings(t, c)[http2.SettingEnableConnectProtocol],
		"net/http does not advertise extended CONNECT here: GODEBUG did not take")

	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{Public: PublicHTTP{H2C: true}})
	be := protoBackend(t)
	_, err = e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)
	h2c, err := net.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	defer h2c.Close()
	h2, err := tls.Dial("tcp", httpsAddr, &tls.Config{RootCAs: pki.pool, ServerName: "edge.test", NextProtos: []string{"h2"}})
	require.NoError(t, err)
	defer h2.Close()
	require.Equal(t, "h2", h2.ConnectionState().NegotiatedProtocol)
	for name, conn := range map[string]net.Conn{"h2c": h2c, "h2": h2} {
		settings := h2ServerSettings(t, conn)
		require.NotContains(t, settings, http2.SettingEnableConnectProtocol, "%s: the edge advertises extended CONNECT", name)
		require.Equal(t, uint32(publicH2MaxStreams), settings[http2.SettingMaxConcurrentStreams], "%s: the rest of its SETTINGS", name)
		require.Equal(t, uint32(publicH2MaxReadFrameSize), settings[http2.SettingMaxFrameSize], name)
	}
	for url, client := range map[string]*http.Client{
		"http://app." + testDomain + "/x":  h2cClient(t, e.publicAddr),
		"https://app." + testDomain + "/x": tlsClient(t, pki, httpsAddr, "h2"),
	} {
		resp, body := fetch(t, client, url)
		require.Equal(t, http.StatusOK, resp.StatusCode, url)
		require.Equal(t, 2, resp.ProtoMajor, url)
		require.Equal(t, "HTTP/1.1 /x", body, url)
	}
}

// writeH2Block writes the header block of stream id as curl does: a HEADERS frame and
// CONTINUATION frames of at most 16 KiB each.
func writeH2Block(t *testing.T, fr *http2.Framer, id uint32, block []byte, endStream bool) {
	t.Helper()
	const frame = 16 << 10
	first := block[:min(frame, len(block))]
	rest := block[len(first):]
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first,
		EndStream: endStream, EndHeaders: len(rest) == 0}))
	for len(rest) > 0 {
		n := min(frame, len(rest))
		require.NoError(t, fr.WriteContinuation(id, n == len(rest), rest[:n]))
		rest = rest[n:]
	}
}

// TestH2OversizedHeaderGets431: one header field over MaxHeaderBytes (40 KiB, the limit
// being 32 KiB) on an HTTP/2 connection gets its stream a 431, as over HTTP/1.1, and the
// connection goes on: a request in flight on it completes, the next is served. (It used
// to end the connection, GOAWAY COMPRESSION_ERROR, and every stream on it.) The edge still
// bounds what it holds: a field over its HTTP/2 bound (twice the limit) ends the
// connection, since staying in step with the client's HPACK state would mean holding it.
func TestH2OversizedHeaderGets431(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d", len(b))
	}))
	t.Cleanup(be.Close)
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)
	c, fr := h2Frames(t, e.publicAddr)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	block := func(method string, extra ...hpack.HeaderField) []byte {
		b := bytes.Clone(h2Head(t, enc, &hbuf, method, "app."+testDomain, "/"))
		hbuf.Reset()
		for _, hf := range extra {
			require.NoError(t, enc.WriteField(hf))
		}
		return append(b, hbuf.Bytes()...)
	}

	status := map[uint32]string{}
	bodies := map[uint32]string{}
	dec := hpack.NewDecoder(4096, nil)
	// await reads frames until stream id is answered, and returns the GOAWAY if one came.
	await := func(id uint32) *http2.GoAwayFrame {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			f, err := fr.ReadFrame()
			require.NoError(t, err)
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					require.NoError(t, fr.WriteSettingsAck())
				}
			case *http2.GoAwayFrame:
				return f
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
				if f.StreamID == id && f.StreamEnded() {
					return nil
				}
			case *http2.DataFrame:
				bodies[f.StreamID] += string(f.Data())
				if f.StreamID == id && f.StreamEnded() {
					return nil
				}
			}
		}
	}

	writeH2Block(t, fr, 1, block("POST"), false) // its body comes later
	writeH2Block(t, fr, 3, block("GET", hpack.HeaderField{Name: "x-big", Value: strings.Repeat("x", 40<<10)}), true)
	if g := await(3); g != nil {
		t.Fatalf("one large header ended the connection: GOAWAY %v", g.ErrCode)
	}
	require.Equal(t, "431", status[3])
	require.NoError(t, fr.WriteData(1, true, []byte("hello")))
	require.Nil(t, await(1))
	require.Equal(t, "200", status[1])
	require.Equal(t, "got 5", bodies[1], "the request in flight completes")
	writeH2Block(t, fr, 5, block("GET"), true)
	require.Nil(t, await(5))
	require.Equal(t, "200", status[5], "the next request is served")

	writeH2Block(t, fr, 7, block("GET", hpack.HeaderField{Name: "x-huge", Value: strings.Repeat("x", 200<<10)}), true)
	g := await(7)
	require.NotNil(t, g, "a header field over the edge's HTTP/2 bound was decoded")
	require.Equal(t, http2.ErrCodeCompression, g.ErrCode)
}
