package tunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
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

// startTLSEdge is startEdge with ServerConfig.TLSConfig from a test CA and a public HTTPS
// listener too; it returns the edge and the HTTPS listener's address.
func startTLSEdge(t *testing.T, pki testPKI, cfg ServerConfig) (*testEdge, string) {
	t.Helper()
	cfg.TLSConfig = &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	e := startEdge(t, cfg)
	l := listenLoopback(t)
	e.served.Go(func() {
		if err := e.ServePublicTLS(l); !errors.Is(err, ErrServerClosed) {
			t.Errorf("ServePublicTLS returned %v, want ErrServerClosed", err)
		}
	})
	return e, l.Addr().String()
}

// tlsClient returns a client that sends every request to addr over TLS, trusting pki, and
// speaks protos.
func tlsClient(t *testing.T, pki testPKI, addr string, protos ...string) *http.Client {
	t.Helper()
	var p http.Protocols
	for _, proto := range protos {
		switch proto {
		case "h1":
			p.SetHTTP1(true)
		case "h2":
			p.SetHTTP2(true)
		}
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		Protocols:       &p,
		TLSClientConfig: &tls.Config{RootCAs: pki.pool, ServerName: "edge.test"},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// h2cClient returns a client speaking HTTP/2 with prior knowledge to addr.
func h2cClient(t *testing.T, addr string) *http.Client {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		Protocols: &p,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// protoBackend answers with the protocol its request came in.
func protoBackend(t *testing.T) *httptest.Server {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Proto, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	return b
}

func fetch(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestHTTP2PublicTLS: the public HTTPS listener offers h2 in ALPN by default: an HTTP/2
// client gets HTTP/2 through an HTTPS tunnel (and an HTTP one), an HTTP/1.1 client still
// gets HTTP/1.1, and the backend (HTTP/1.1) sees no difference. The embedder's TLS
// configuration is not modified. Public.DisableHTTP2 keeps the listener on HTTP/1.1.
func TestHTTP2PublicTLS(t *testing.T) {
	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{})
	be := protoBackend(t)
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoHTTPS, Subdomain: "secure"}, hostPort(be.URL))
	require.NoError(t, err)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "plain"}, hostPort(be.URL))
	require.NoError(t, err)

	h2 := tlsClient(t, pki, httpsAddr, "h2")
	for _, sub := range []string{"secure", "plain"} {
		resp, body := fetch(t, h2, "https://"+sub+"."+testDomain+"/x")
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		require.Equal(t, "HTTP/2.0", resp.Proto, sub)
		require.Equal(t, "HTTP/1.1 /x", body, "the HTTP/1.1 backend is served as before")
	}
	resp, body := fetch(t, tlsClient(t, pki, httpsAddr, "h1"), "https://secure."+testDomain+"/y")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "HTTP/1.1", resp.Proto)
	require.Empty(t, e.cfg.TLSConfig.NextProtos, "ServePublicTLS works on a copy of TLSConfig")

	off, offAddr := startTLSEdge(t, pki, ServerConfig{Public: PublicHTTP{DisableHTTP2: true}})
	_, err = off.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoHTTPS, Subdomain: "secure"}, hostPort(be.URL))
	require.NoError(t, err)
	resp, body = fetch(t, tlsClient(t, pki, offAddr, "h1", "h2"), "https://secure."+testDomain+"/z")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "HTTP/1.1", resp.Proto, "DisablePublicHTTP2 offers no h2")
}

// TestHTTP2PublicH2C: with Public.H2C the public HTTP listener serves HTTP/2 with prior
// knowledge (and HTTP/1.1 still); without it an h2c client is refused at once, not left
// with an answer it cannot read.
func TestHTTP2PublicH2C(t *testing.T) {
	be := protoBackend(t)
	on := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}})
	_, err := on.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)
	resp, body := fetch(t, h2cClient(t, on.publicAddr), on.url("app", "/a"))
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "HTTP/2.0", resp.Proto)
	require.Equal(t, "HTTP/1.1 /a", body)
	code, body := on.get("app", "/b")
	require.Equal(t, http.StatusOK, code, body)

	off := startEdge(t, ServerConfig{})
	_, err = off.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)
	start := time.Now()
	_, err = h2cClient(t, off.publicAddr).Get(off.url("app", "/a"))
	require.Error(t, err, "h2c is off")
	require.Less(t, time.Since(start), 3*time.Second, "refused at once")
	code, body = off.get("app", "/b")
	require.Equal(t, http.StatusOK, code, body)
}

// TestHTTP2StreamsBounded: one HTTP/2 client connection may have at most 250 requests in
// flight at the edge, whatever it sends: the edge announces the limit, the 251st stream is
// reset, and the first 250 are served. Flow control windows are bounded too.
func TestHTTP2StreamsBounded(t *testing.T) {
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
		}
		<-release
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)

	c, err := net.Dial("tcp", e.publicAddr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())

	// The edge's SETTINGS come first.
	f, err := fr.ReadFrame()
	require.NoError(t, err)
	sf, ok := f.(*http2.SettingsFrame)
	require.True(t, ok, "got %v", f)
	settings := map[http2.SettingID]uint32{}
	require.NoError(t, sf.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil }))
	require.Equal(t, uint32(publicH2MaxStreams), settings[http2.SettingMaxConcurrentStreams])
	require.Equal(t, uint32(publicH2StreamWindow), settings[http2.SettingInitialWindowSize])
	require.Equal(t, uint32(publicH2MaxReadFrameSize), settings[http2.SettingMaxFrameSize])
	require.Equal(t, uint32(h2HeaderBlockBytes(32<<10)+320), settings[http2.SettingMaxHeaderListSize],
		"the HTTP/2 header bound: twice MaxHeaderBytes (32 KiB), past which the proxy answers 431")

	// Wait for the edge to acknowledge ours, and acknowledge its own: the limit is then
	// in force for both.
	require.NoError(t, fr.WriteSettingsAck())
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	const n = publicH2MaxStreams + 1
	for i := range n {
		hbuf.Reset()
		for _, hf := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
			{Name: ":authority", Value: "app." + testDomain}, {Name: ":path", Value: fmt.Sprintf("/%d", i)}} {
			require.NoError(t, enc.WriteField(hf))
		}
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1),
			BlockFragment: hbuf.Bytes(), EndStream: true, EndHeaders: true}))
	}
	// Until all that the backend can hold are in, the only reset is the one over the limit.
	var reset []uint32
	done := make(chan struct{})
	var frames []http2.Frame
	go func() {
		defer close(done)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.RSTStreamFrame:
				reset = append(reset, f.StreamID)
			case *http2.HeadersFrame:
				frames = append(frames, f)
			case *http2.DataFrame:
				if f.StreamEnded() {
					frames = append(frames, f)
				}
				if len(frames) == 2*publicH2MaxStreams {
					return
				}
			}
		}
	}()
	require.Eventually(t, func() bool { return inFlight.Load() == publicH2MaxStreams }, 20*time.Second, 10*time.Millisecond,
		"250 requests reach the backend")
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, int64(publicH2MaxStreams), peak.Load(), "never more than 250 at once")
	close(release)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the 250 answers did not come")
	}
	require.Equal(t, []uint32{2*n - 1}, reset, "the stream over the limit was reset")
	require.Len(t, frames, 2*publicH2MaxStreams, "every other request was answered")
}

// TestBackendProtocolChecked: a backend protocol other than http1 or h2c, or h2c on a TCP
// tunnel, is refused before anything is sent; the edge refuses it too (a malformed Register).
func TestBackendProtocolChecked(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "a", BackendProtocol: "h3"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrInvalid)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, BackendProtocol: "h2c"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrInvalid)
	for _, p := range []string{"", "http1", "h2c"} {
		sp := TunnelSpec{Subdomain: "ok" + p, BackendProtocol: p}
		require.NoError(t, sp.normalize(false))
		m := sp.register(1, "")
		require.NoError(t, m.Validate())
		if p == "h2c" {
			require.Equal(t, "h2c", m.BackendProtocol)
		} else {
			require.Empty(t, m.BackendProtocol, "the default is not sent")
		}
	}
	m := (&TunnelSpec{Subdomain: "x"}).register(1, "")
	m.BackendProtocol = "spdy"
	require.Error(t, m.Validate())
	m.Proto, m.BackendProtocol = ProtoTCP, "h2c"
	require.Error(t, m.Validate())
}
