package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// h2cBackend is a loopback server speaking HTTP/1.1 and HTTP/2 with prior knowledge.
func h2cBackend(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	s.Config.Protocols = &p
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// pipeTo serves each acknowledged stream as the connector does: it dials addr and copies
// both ways until either side ends.
func pipeTo(addr string) func(*connector, mux.Stream, wire.Envelope) {
	return func(_ *connector, st mux.Stream, _ wire.Envelope) {
		b, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		defer b.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.Copy(b, st)
			_ = b.(*net.TCPConn).CloseWrite()
		}()
		_, _ = io.Copy(st, b)
		_ = st.Close()
		<-done
	}
}

// joinH2C registers an h2c member of group "pool" served by c.
func joinH2C(t *testing.T, reg *group.Registry, id string, c *connector) (*group.Member, *Tunnel) {
	t.Helper()
	tun := NewTunnel(context.Background(), id, group.ProtoHTTP, c.edge, &c.key)
	tun.SetBackendProtocol(wire.BackendH2C)
	t.Cleanup(tun.Close)
	m, err := reg.Join(group.JoinRequest{ID: id, Proto: group.ProtoHTTP, Label: "pool", Group: "pool", Value: tun})
	require.NoError(t, err)
	return m, tun
}

// edgeServer serves h on loopback (HTTP/1.1) and returns a client that sends everything there.
func edgeServer(t *testing.T, h http.Handler) *http.Client {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	c := s.Client()
	d := &net.Dialer{}
	c.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, s.Listener.Addr().String())
	}
	c.Timeout = 10 * time.Second
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestH2CMemberSharesOneConnection: requests to an h2c member reach its backend as HTTP/2,
// many at once on one data stream (one HTTP/2 connection), with bodies both ways and
// trailers back; a member whose backend speaks HTTP/1.1 is unchanged next to it.
func TestH2CMemberSharesOneConnection(t *testing.T) {
	const n = 20
	var inFlight, peak atomic.Int64
	release := make(chan struct{})
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
		}
		if r.URL.Path == "/wait" {
			<-release
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Trailer", "X-Len")
		fmt.Fprintf(w, "%s %s %s", r.Proto, r.Host, body)
		w.Header().Set("X-Len", fmt.Sprint(len(body)))
	}))
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	_, tun := joinH2C(t, reg, "h2", c)
	require.Equal(t, wire.BackendH2C, tun.BackendProtocol())
	client := edgeServer(t, h)

	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := client.Post("http://pool."+testDomain+"/wait", "text/plain", strings.NewReader(fmt.Sprint("req", i)))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			want := fmt.Sprintf("HTTP/2.0 pool.%s req%d", testDomain, i)
			if resp.StatusCode != http.StatusOK || string(b) != want || resp.Trailer.Get("X-Len") != fmt.Sprint(len(fmt.Sprint("req", i))) {
				errs <- fmt.Errorf("got %d %q trailer %q, want %q", resp.StatusCode, b, resp.Trailer, want)
			}
		})
	}
	require.Eventually(t, func() bool { return inFlight.Load() == n }, 5*time.Second, 5*time.Millisecond,
		"all requests reach the backend at once")
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(n), peak.Load())
	require.Equal(t, int64(1), c.streams.Load(), "one HTTP/2 connection carried them all")

	// An HTTP/1.1 member of another pool, next to it, is served as before.
	h1 := startConnector(t, wire.AckOK, answerHTTP)
	tun1 := NewTunnel(context.Background(), "h1", group.ProtoHTTP, h1.edge, &h1.key)
	t.Cleanup(tun1.Close)
	_, err := reg.Join(group.JoinRequest{ID: "h1", Proto: group.ProtoHTTP, Label: "old", Value: tun1})
	require.NoError(t, err)
	resp, err := client.Get("http://old." + testDomain + "/")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "h1", string(b))
	require.Equal(t, wire.BackendHTTP1, tun1.BackendProtocol())

	// Removing the tunnel closes its HTTP/2 connection (goleak checks the rest).
	tun.Close()
	resp, err = client.Get("http://pool." + testDomain + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode, "a closed tunnel takes no request")
}

// refusingH2 serves each stream as an HTTP/2 server that refuses every request with
// RST_STREAM REFUSED_STREAM (written by hand: no HTTP/2 server does this on demand).
func refusingH2(streams *atomic.Int64) func(*connector, mux.Stream, wire.Envelope) {
	return func(_ *connector, st mux.Stream, _ wire.Envelope) {
		preface := make([]byte, len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		if _, err := io.ReadFull(st, preface); err != nil {
			return
		}
		frame := func(typ, flags byte, id uint32, payload []byte) []byte {
			b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags}
			b = binary.BigEndian.AppendUint32(b, id)
			return append(b, payload...)
		}
		if _, err := st.Write(frame(0x4, 0, 0, nil)); err != nil { // SETTINGS
			return
		}
		var hdr [9]byte
		for {
			if _, err := io.ReadFull(st, hdr[:]); err != nil {
				return
			}
			payload := make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
			if _, err := io.ReadFull(st, payload); err != nil {
				return
			}
			id := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
			var out []byte
			switch {
			case hdr[3] == 0x4 && hdr[4]&0x1 == 0: // SETTINGS: acknowledge
				out = frame(0x4, 0x1, 0, nil)
			case hdr[3] == 0x1: // HEADERS: refuse the stream
				streams.Add(1)
				out = frame(0x3, 0, id, binary.BigEndian.AppendUint32(nil, h2RefusedStream))
			}
			if out != nil {
				if _, err := st.Write(out); err != nil {
					return
				}
			}
		}
	}
}

// TestH2CRetry: another member is tried when no byte of a request can have reached an
// application: the stream open failed, or the backend refused the HTTP/2 stream
// unprocessed (a bodyless request, or one whose body the edge holds for a replay). A
// refused request with a body the edge does not hold gets 502.
func TestH2CRetry(t *testing.T) {
	stats := newStats()
	stats.RetriesIdempotent = new(atomic.Uint64)
	var okHits atomic.Int64
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		okHits.Add(1)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "ok %s", b)
	}))
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	var replay atomic.Bool
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, OpenTimeout: 2 * time.Second,
		RetryIdempotent: func(*group.Group) bool { return replay.Load() }})
	var refused atomic.Int64
	refusing := startConnector(t, wire.AckOK, refusingH2(&refused))
	closed := startConnector(t, wire.AckRefused, nil)
	live := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	mRefusing, _ := joinH2C(t, reg, "refusing", refusing)
	client := edgeServer(t, h)
	do := func(method string, body string) (int, string) {
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, "http://pool."+testDomain+"/", r)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// Alone, the refusing member's answer is 502, with or without a body; a request without
	// one is sent again on a new stream h2RefusedRetries times first.
	code, _ := do(http.MethodGet, "")
	require.Equal(t, http.StatusBadGateway, code)
	require.Equal(t, int64(1+h2RefusedRetries), refused.Load())
	code, _ = do(http.MethodPost, "payload")
	require.Equal(t, http.StatusBadGateway, code)
	require.Equal(t, int64(2+h2RefusedRetries), refused.Load())
	base := refused.Load()

	// With a member that serves, every bodyless request is served: a refused stream goes
	// to it.
	mLive, _ := joinH2C(t, reg, "live", live)
	const n = 12
	for range n {
		code, body := do(http.MethodGet, "")
		require.Equal(t, http.StatusOK, code, body)
	}
	require.Positive(t, refused.Load()-base, "the refusing member was picked")
	require.Equal(t, uint64(refused.Load()-base), (1+h2RefusedRetries)*stats.RetriesResetUnread.Load(),
		"each refused request was retried on its member, then once on another")
	require.Equal(t, int64(n), okHits.Load())

	// A body the edge does not hold is not sent again: the refusing member's 502 stands.
	before := refused.Load()
	for refused.Load() == before {
		code, body := do(http.MethodPost, "payload")
		if refused.Load() == before {
			require.Equal(t, http.StatusOK, code, body)
			require.Equal(t, "ok payload", body)
		} else {
			require.Equal(t, http.StatusBadGateway, code)
		}
	}
	// A body held for a replay (RetryIdempotent) is.
	replay.Store(true)
	before = refused.Load()
	for refused.Load() == before {
		req, err := http.NewRequest(http.MethodPut, "http://pool."+testDomain+"/", strings.NewReader("held"))
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "ok held", string(b))
	}

	// A member whose backend refuses the connection: its open fails, and another member
	// serves.
	reg.Leave(mRefusing)
	joinH2C(t, reg, "closed", closed)
	hits := okHits.Load()
	for range n {
		code, body := do(http.MethodGet, "")
		require.Equal(t, http.StatusOK, code, body)
	}
	require.Positive(t, closed.streams.Load(), "the member refusing opens was picked")
	require.Equal(t, uint64(closed.streams.Load()), stats.RetriesOpenFailed.Load(), "each refused open was retried once")
	require.Equal(t, hits+n, okHits.Load())
	reg.Leave(mLive)
}

// TestH2CCancelReachesTheBackend: a client that goes away resets its HTTP/2 stream: the
// backend's request context ends, and the member's slot is released.
func TestH2CCancelReachesTheBackend(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan struct{})
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		select {
		case <-r.Context().Done():
			close(canceled)
		case <-time.After(10 * time.Second):
		}
	}))
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	m, _ := joinH2C(t, reg, "h2", c)
	client := edgeServer(t, h)

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://pool."+testDomain+"/", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	<-started
	cancel()
	_ = resp.Body.Close()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("the backend's request context did not end")
	}
	require.Eventually(t, func() bool { return m.Active() == 0 }, 2*time.Second, 5*time.Millisecond)
}

// TestRequestTrailersAndEarlyHints: request trailers reach the backend with their values,
// over HTTP/1.1 and h2c; a backend's 103 Early Hints reaches the client before the response.
func TestRequestTrailersAndEarlyHints(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hints" {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		}
		fmt.Fprintf(w, "%s sum=%s", r.Proto, r.Trailer.Get("X-Sum"))
	})
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	be := h2cBackend(t, handler)
	c1 := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	tun1 := NewTunnel(context.Background(), "h1", group.ProtoHTTP, c1.edge, &c1.key)
	t.Cleanup(tun1.Close)
	_, err := reg.Join(group.JoinRequest{ID: "h1", Proto: group.ProtoHTTP, Label: "one", Value: tun1})
	require.NoError(t, err)
	c2 := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	tun2 := NewTunnel(context.Background(), "h2", group.ProtoHTTP, c2.edge, &c2.key)
	tun2.SetBackendProtocol(wire.BackendH2C)
	t.Cleanup(tun2.Close)
	_, err = reg.Join(group.JoinRequest{ID: "h2", Proto: group.ProtoHTTP, Label: "two", Value: tun2})
	require.NoError(t, err)
	client := edgeServer(t, h)

	for sub, proto := range map[string]string{"one": "HTTP/1.1", "two": "HTTP/2.0"} {
		// A chunked body with a declared trailer, whose value is known only at its end.
		pr, pw := io.Pipe()
		req, err := http.NewRequest(http.MethodPost, "http://"+sub+"."+testDomain+"/", pr)
		require.NoError(t, err)
		req.Trailer = http.Header{"X-Sum": nil}
		go func() {
			_, _ = pw.Write(bytes.Repeat([]byte("x"), 1000))
			req.Trailer.Set("X-Sum", "42")
			_ = pw.Close()
		}()
		resp, err := client.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, proto+" sum=42", string(b), sub)

		var hints []string
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			hints = append(hints, fmt.Sprint(code, " ", h.Get("Link")))
			return nil
		}}
		req, err = http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodGet, "http://"+sub+"."+testDomain+"/hints", nil)
		require.NoError(t, err)
		resp, err = client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, []string{"103 </style.css>; rel=preload"}, hints, sub)
	}
}

// TestH2CPrefaceRefused: a client speaking HTTP/2 with prior knowledge to the ingress served
// as HTTP/1.1 only is told so at once (SETTINGS, then GOAWAY HTTP_1_1_REQUIRED), not given
// a 404 it cannot read.
func TestH2CPrefaceRefused(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	s := httptest.NewServer(NewHTTP(Config{Registry: reg, Domain: testDomain}))
	t.Cleanup(s.Close)

	c, err := net.Dial("tcp", s.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// The preface, an empty SETTINGS and a HEADERS frame, as an h2c client sends them.
	_, err = io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
	require.NoError(t, err)
	got, err := io.ReadAll(c) // the edge closes the connection after its answer
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(got), 9+17)
	require.Equal(t, []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0}, got[:9], "a SETTINGS frame first")
	require.Equal(t, byte(0x7), got[9+3], "then a GOAWAY")
	require.Equal(t, uint32(0xd), binary.BigEndian.Uint32(got[9+9+4:]), "HTTP_1_1_REQUIRED")

	// Go's HTTP/2 client fails at once.
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	start := time.Now()
	_, err = client.Get(s.URL + "/")
	require.Error(t, err)
	require.Less(t, time.Since(start), 2*time.Second)
}

// trackedBody is a request body that records whether it was read.
type trackedBody struct {
	io.Reader
	read atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.Reader.Read(p)
}

// TestH2CExpectContinueForwarded: an h2c member's backend answers Expect: 100-continue
// itself: a backend that refuses the request before reading its body spares the client the
// upload (the edge closes the connection rather than read it); one that reads it gets it at
// once.
func TestH2CExpectContinueForwarded(t *testing.T) {
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/reject" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %d", len(b))
	}))
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
	joinH2C(t, reg, "h2", c)
	client := edgeServer(t, h)
	client.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Second

	post := func(path string) (*http.Response, *trackedBody, time.Duration) {
		body := &trackedBody{Reader: strings.NewReader(strings.Repeat("z", 5000))}
		req, err := http.NewRequest(http.MethodPost, "http://pool."+testDomain+path, body)
		require.NoError(t, err)
		req.ContentLength = 5000
		req.Header.Set("Expect", "100-continue")
		start := time.Now()
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, body, time.Since(start)
	}
	resp, body, took := post("/reject")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.False(t, body.read.Load(), "the client was not asked for its body")
	require.Less(t, took, 3*time.Second)

	resp, body, took = post("/ok")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.True(t, body.read.Load())
	// The edge's transport waits a second for a 100 before it sends the body anyway (and
	// the client, for the edge's own 100): faster means the backend's 100 came through.
	require.Less(t, took, 900*time.Millisecond, "the backend's 100 Continue reached the client")
}

// BenchmarkMemberProtocol compares a member whose backend speaks HTTP/1.1 (one data stream
// per request in flight) with an h2c one (one data stream for all), for small concurrent
// requests through the ingress.
func BenchmarkMemberProtocol(b *testing.B) {
	for _, proto := range []string{wire.BackendHTTP1, wire.BackendH2C} {
		b.Run(proto, func(b *testing.B) {
			be := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "ok")
			}))
			var p http.Protocols
			p.SetHTTP1(true)
			p.SetUnencryptedHTTP2(true)
			be.Config.Protocols = &p
			be.Start()
			defer be.Close()
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
			c := startConnector(b, wire.AckOK, pipeTo(be.Listener.Addr().String()))
			tun := NewTunnel(context.Background(), "m", group.ProtoHTTP, c.edge, &c.key)
			tun.SetBackendProtocol(proto)
			defer tun.Close()
			_, err := reg.Join(group.JoinRequest{ID: "m", Proto: group.ProtoHTTP, Label: "pool", Value: tun})
			require.NoError(b, err)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil))
					if rec.Code != http.StatusOK {
						b.Errorf("got %d", rec.Code)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(c.streams.Load()), "streams")
		})
	}
}
