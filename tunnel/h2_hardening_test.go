package tunnel

import (
	"bytes"
	"crypto/tls"
	"errors"
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

// TestHTTP2WithGetConfigForClient: an embedder whose TLSConfig picks its configuration per
// client (GetConfigForClient, e.g. per-SNI certificates) gets HTTP/2 by ALPN too, and an
// HTTP/1.1 client still HTTP/1.1; neither configuration is modified.
func TestHTTP2WithGetConfigForClient(t *testing.T) {
	pki := newTestPKI(t)
	inner := &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	cfg := ServerConfig{TLSConfig: &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return inner, nil },
	}}
	e := startEdge(t, cfg)
	l := listenLoopback(t)
	e.served.Go(func() {
		if err := e.ServePublicTLS(l); !errors.Is(err, ErrServerClosed) {
			t.Errorf("ServePublicTLS returned %v", err)
		}
	})
	be := protoBackend(t)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoHTTPS, Subdomain: "secure"}, hostPort(be.URL))
	require.NoError(t, err)
	resp, body := fetch(t, tlsClient(t, pki, l.Addr().String(), "h1", "h2"), "https://secure."+testDomain+"/x")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "HTTP/2.0", resp.Proto)
	resp, body = fetch(t, tlsClient(t, pki, l.Addr().String(), "h1"), "https://secure."+testDomain+"/y")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Equal(t, "HTTP/1.1", resp.Proto)
	require.Empty(t, inner.NextProtos)
	require.Empty(t, e.cfg.TLSConfig.NextProtos)
}

// TestTicketKeyRotationReachesTheListener: session ticket keys the embedder rotates on its
// TLSConfig (SetSessionTicketKeys, safe while serving) take effect on the public HTTPS
// listener at once, with HTTP/2 offered or not, and on the configuration its
// GetConfigForClient returns: a ticket the edge issues after the rotation is one that a
// server holding only the new key resumes, and a session from before it is not resumed.
func TestTicketKeyRotationReachesTheListener(t *testing.T) {
	for _, tc := range []struct {
		name      string
		off, pick bool
	}{{"h2", false, false}, {"DisablePublicHTTP2", true, false}, {"GetConfigForClient", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			pki := newTestPKI(t)
			k1, k2 := [32]byte{1}, [32]byte{2}
			keyed := &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
			cfg := ServerConfig{Public: PublicHTTP{DisableHTTP2: tc.off}, TLSConfig: keyed}
			if tc.pick {
				cfg.TLSConfig = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return keyed, nil }}
			}
			e := startEdge(t, cfg)
			l := listenLoopback(t)
			e.served.Go(func() {
				if err := e.ServePublicTLS(l); !errors.Is(err, ErrServerClosed) {
					t.Errorf("ServePublicTLS returned %v", err)
				}
			})
			addr := l.Addr().String()
			dial := func(cache tls.ClientSessionCache) bool {
				c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pki.pool, ServerName: "edge.test",
					ClientSessionCache: cache, MaxVersion: tls.VersionTLS12})
				require.NoError(t, err)
				defer c.Close()
				return c.ConnectionState().DidResume
			}
			keyed.SetSessionTicketKeys([][32]byte{k1})
			old := tls.NewLRUClientSessionCache(4)
			dial(old)
			require.True(t, dial(old), "a session resumes under the same key")

			keyed.SetSessionTicketKeys([][32]byte{k2}) // rotate, k1 dropped
			require.False(t, dial(old), "a session of the dropped key resumed")

			// A server holding only k2 resumes a session the edge started after the rotation.
			cache := tls.NewLRUClientSessionCache(4)
			dial(cache)
			ref := &tls.Config{Certificates: []tls.Certificate{pki.server}}
			ref.SetSessionTicketKeys([][32]byte{k2})
			rl, err := tls.Listen("tcp", "127.0.0.1:0", ref)
			require.NoError(t, err)
			defer rl.Close()
			go func() {
				s, err := rl.Accept()
				if err == nil {
					_ = s.(*tls.Conn).Handshake()
					s.Close()
				}
			}()
			c2, err := tls.Dial("tcp", rl.Addr().String(), &tls.Config{RootCAs: pki.pool, ServerName: "edge.test",
				ClientSessionCache: cache, MaxVersion: tls.VersionTLS12})
			require.NoError(t, err)
			defer c2.Close()
			require.True(t, c2.ConnectionState().DidResume, "the edge did not use the rotated ticket key")
		})
	}
}

// h2Frames opens an HTTP/2 connection with prior knowledge to addr and returns its framer.
func h2Frames(t *testing.T, addr string) (net.Conn, *http2.Framer) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	_, _ = io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())
	return c, fr
}

// h2Head is the HPACK block of a request's pseudo-headers.
func h2Head(t *testing.T, enc *hpack.Encoder, buf *bytes.Buffer, method, authority, path string) []byte {
	t.Helper()
	buf.Reset()
	for _, hf := range []hpack.HeaderField{{Name: ":method", Value: method}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: authority}, {Name: ":path", Value: path}} {
		require.NoError(t, enc.WriteField(hf))
	}
	return buf.Bytes()
}

// TestH2SlowUploadKeepsTheConnection: one HTTP/2 stream whose upload is too slow
// (RequestBody.Timeout) gets its 408 without ending the connection: no GOAWAY, which would
// make every other request multiplexed on it start over.
func TestH2SlowUploadKeepsTheConnection(t *testing.T) {
	be := protoBackend(t)
	e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}, RequestBody: RequestBodyLimits{Timeout: 300 * time.Millisecond}})
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(t, err)
	c, fr := h2Frames(t, e.publicAddr)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1,
		BlockFragment: h2Head(t, enc, &hbuf, "POST", "app."+testDomain, "/up"), EndHeaders: true}))
	require.NoError(t, fr.WriteData(1, false, []byte("partial")))
	status := ""
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":status" {
			status = f.Value
		}
	})
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break // the read deadline, once the answer came and nothing else
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.GoAwayFrame:
			t.Fatalf("one slow stream ended the whole HTTP/2 connection: GOAWAY %v", f.ErrCode)
		case *http2.HeadersFrame:
			_, _ = dec.Write(f.HeaderBlockFragment())
		}
	}
	require.Equal(t, "408", status)
}

// TestRapidResetReachesNoBackend: HTTP/2 streams the client resets as soon as it opened them
// (rapid reset) do not reach the backend application, of an HTTP/1.1 member or an h2c one:
// a request already gone is not dispatched, one that goes while its member stream is being
// opened stops there, and one for an h2c member, sent at once on a pooled connection, first
// lets the public server act on a reset it already read. (The backend connections the
// connector dialed for opens already under way are logged, not bounded: how many there are
// depends on scheduling, and the race detector. A few requests may still go before their
// reset arrives.)
func TestRapidResetReachesNoBackend(t *testing.T) {
	for _, proto := range []string{"http1", "h2c"} {
		t.Run(proto, func(t *testing.T) {
			var conns, reqs atomic.Int64
			b := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reqs.Add(1)
			}))
			var p http.Protocols
			p.SetHTTP1(true)
			p.SetUnencryptedHTTP2(true)
			b.Config.Protocols = &p
			b.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			b.Start()
			t.Cleanup(b.Close)
			e := startEdge(t, ServerConfig{Public: PublicHTTP{H2C: true}})
			_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app", BackendProtocol: proto}, hostPort(b.URL))
			require.NoError(t, err)
			_, fr := h2Frames(t, e.publicAddr)
			go func() {
				for {
					if _, err := fr.ReadFrame(); err != nil {
						return
					}
				}
			}()
			var hbuf bytes.Buffer
			enc := hpack.NewEncoder(&hbuf)
			const n = 500
			for i := range n {
				id := uint32(2*i + 1)
				if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id,
					BlockFragment: h2Head(t, enc, &hbuf, "GET", "app."+testDomain, "/"), EndStream: true, EndHeaders: true}); err != nil {
					break
				}
				if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
					break
				}
			}
			time.Sleep(time.Second)
			t.Logf("%d reset streams: backend connections %d, backend requests %d", n, conns.Load(), reqs.Load())
			require.Less(t, reqs.Load(), int64(50), "requests the client had already reset reached the backend")
		})
	}
}
