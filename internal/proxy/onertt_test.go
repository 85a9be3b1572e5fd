package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/testlink"
	"github.com/warren-tunnel/warren/internal/wire"
)

// heldLink is the connector's end of its connection to the edge (testlink.Held).
type heldLink = testlink.Held

func newHeldLink(c net.Conn) *heldLink { return testlink.NewHeld(c) }

// startHeldConnector is startConnector (AckOK) over a link whose connector-to-edge bytes
// can be held back.
func startHeldConnector(t *testing.T, serve func(c *connector, st mux.Stream, env wire.Envelope)) (*connector, *heldLink) {
	t.Helper()
	var link *heldLink
	c := startConnectorOver(t, wire.AckOK, serve, func(b net.Conn) net.Conn {
		link = newHeldLink(b)
		return link
	})
	t.Cleanup(func() { _ = link.Close() })
	return c, link
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// progressBackend answers each request with 200 and the length of its body; progress counts
// the body bytes of the request being read, and heads receives each request head.
type progressBackend struct {
	progress atomic.Int64
	heads    chan *http.Request
	mu       sync.Mutex
	bodies   [][]byte
}

func (b *progressBackend) serve(_ *connector, st mux.Stream, _ wire.Envelope) {
	br := bufio.NewReader(st)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b.progress.Store(0)
		b.heads <- req
		var body bytes.Buffer
		buf := make([]byte, 4<<10)
		for {
			n, err := req.Body.Read(buf)
			body.Write(buf[:n])
			b.progress.Add(int64(n))
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
		}
		b.mu.Lock()
		b.bodies = append(b.bodies, body.Bytes())
		b.mu.Unlock()
		if _, err := fmt.Fprintf(st, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%d", len(fmt.Sprint(body.Len())), body.Len()); err != nil {
			return
		}
	}
}

// TestPipelinedRequestGoesBeforeTheAck: on a new stream the request follows its envelope at
// once: it reaches the backend while the connector's acknowledgement is still on its way
// back (held here), so a request on a new stream costs one round trip to the connector, not
// two. A body longer than maxHeldBody is sent up to maxHeldBody before the acknowledgement,
// and read from the client no further; the rest follows it.
func TestPipelinedRequestGoesBeforeTheAck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
	}{
		{"GET", -1, false},
		{"POST 1 KiB", 1 << 10, false},
		{"POST 200 KiB", 200 << 10, false},
		{"POST 200 KiB chunked", 200 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &progressBackend{heads: make(chan *http.Request, 1)}
			c, link := startHeldConnector(t, be.serve)
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			stats := newStats()
			join(t, reg, "m1", group.ProtoHTTP, c)
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, OpenTimeout: 5 * time.Second})

			var body []byte
			var src *countingReader
			req := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
			if tc.size >= 0 {
				body = bytes.Repeat([]byte("0123456789abcdef"), tc.size/16)
				src = &countingReader{r: bytes.NewReader(body)}
				req = httptest.NewRequest(http.MethodPost, "http://pool."+testDomain+"/", src)
				req.ContentLength = int64(len(body))
				if tc.chunked {
					req.ContentLength = -1
				}
			}
			link.Hold(true)
			rec := httptest.NewRecorder()
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(rec, req)
			}()
			select {
			case <-be.heads:
			case <-time.After(5 * time.Second):
				t.Fatal("the request did not reach the backend while the acknowledgement was held")
			}
			if tc.size > maxHeldBody {
				// The body goes up to what the edge holds, and no further.
				require.Eventually(t, func() bool { return be.progress.Load() == maxHeldBody }, 5*time.Second, time.Millisecond)
				require.Equal(t, int64(maxHeldBody), src.n.Load(), "the edge read more of the body than it holds before the acknowledgement")
			}
			link.Hold(false)
			<-done
			require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
			require.Equal(t, fmt.Sprint(max(len(body), 0)), rec.Body.String())
			if body != nil {
				be.mu.Lock()
				require.Equal(t, body, be.bodies[0])
				be.mu.Unlock()
			}
			require.Zero(t, stats.RetriesOpenFailed.Load())

			// The stream was kept: the next request goes on it, with nothing held.
			rec = httptest.NewRecorder()
			go func() { <-be.heads }()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil))
			require.Equal(t, http.StatusOK, rec.Code)
			require.Equal(t, int64(1), c.streams.Load(), "the keep-alive stream was reused")
		})
	}
}

// TestRefusedPipelinedRequestGoesElsewhere: a request sent on a new stream whose connector
// refuses it (its backend refused the connection) goes to the other member, whole: without a
// body, with a body the edge held whole, and with a body longer than it holds (the rest had
// waited for the acknowledgement), chunked or not, and with Expect: 100-continue. The retry
// is counted as a failed open and reported to Outcome as one.
func TestRefusedPipelinedRequestGoesElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		expect  bool
	}{
		{"GET", -1, false, false},
		{"POST 1 KiB", 1 << 10, false, false},
		{"POST 64 KiB", 64 << 10, false, false},
		{"POST 200 KiB", 200 << 10, false, false},
		{"POST 200 KiB chunked", 200 << 10, true, false},
		{"POST 100 KiB Expect", 100 << 10, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			stats := newStats()
			refusing := startConnector(t, wire.AckRefused, nil)
			good := &backend{}
			join(t, reg, "refusing", group.ProtoHTTP, refusing)
			join(t, reg, "good", group.ProtoHTTP, startConnector(t, wire.AckOK, good.answer))
			var mu sync.Mutex
			var outcomes []string
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, Outcome: func(m *group.Member, failed bool, reason string) {
				mu.Lock()
				defer mu.Unlock()
				outcomes = append(outcomes, fmt.Sprintf("%s %v %s", m.ID, failed, reason))
			}})
			body := bytes.Repeat([]byte("0123456789abcdef"), max(tc.size, 0)/16)
			for i := 0; refusing.streams.Load() == 0; i++ {
				require.Less(t, i, 20, "no request went to the refusing member")
				req := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/", nil)
				if tc.size >= 0 {
					req = httptest.NewRequest(http.MethodPost, "http://pool."+testDomain+"/", bytes.NewReader(body))
					if tc.chunked {
						req.ContentLength = -1
					}
					if tc.expect {
						req.Header.Set("Expect", "100-continue")
					}
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
				require.Equal(t, "good", rec.Body.String())
				if tc.size >= 0 {
					require.Equal(t, body, good.lastBody(), "the good member got the whole body")
				}
			}
			require.Equal(t, uint64(1), stats.RetriesOpenFailed.Load())
			mu.Lock()
			defer mu.Unlock()
			require.Contains(t, outcomes, "refusing true open refused: backend refused the connection")
		})
	}

	t.Run("no other member", func(t *testing.T) {
		reg := group.NewRegistry(group.Config{LoadBalancing: true})
		join(t, reg, "refusing", group.ProtoHTTP, startConnector(t, wire.AckRefused, nil))
		h := NewHTTP(Config{Registry: reg, Domain: testDomain})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "http://pool."+testDomain+"/", strings.NewReader("body")))
		require.Equal(t, http.StatusBadGateway, rec.Code)
	})
}

// TestPipelinedStreamLostBeforeTheAck: a new stream whose session dies before its
// acknowledgement arrived is no refusal: the connector may have accepted it and passed the
// request on (here it did). The request is not sent elsewhere, unless it is replayable under
// the opt-in idempotent retry.
func TestPipelinedStreamLostBeforeTheAck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		method  string
		retry   bool
		status  int
		retried bool
	}{
		{"POST", http.MethodPost, false, http.StatusBadGateway, false},
		{"GET", http.MethodGet, false, http.StatusBadGateway, false},
		{"GET with idempotent retry", http.MethodGet, true, http.StatusOK, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := &progressBackend{heads: make(chan *http.Request, 1)}
			lost, link := startHeldConnector(t, be.serve)
			good := &backend{}
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			stats := newStats()
			stats.RetriesIdempotent = new(atomic.Uint64)
			join(t, reg, "lost", group.ProtoHTTP, lost)
			cfg := Config{Registry: reg, Domain: testDomain, Stats: stats}
			if tc.retry {
				cfg.RetryIdempotent = retryAll
			}
			h := NewHTTP(cfg)
			// Only "lost" is a member when the request is picked; "good" joins after.
			var body io.Reader
			if tc.method == http.MethodPost {
				body = strings.NewReader("charge the card")
			}
			req := httptest.NewRequest(tc.method, "http://pool."+testDomain+"/", body)
			link.Hold(true)
			rec := httptest.NewRecorder()
			done := make(chan struct{})
			go func() {
				defer close(done)
				h.ServeHTTP(rec, req)
			}()
			select {
			case <-be.heads: // the backend has it; its acknowledgement is held
			case <-time.After(5 * time.Second):
				t.Fatal("the request did not reach the backend while the acknowledgement was held")
			}
			join(t, reg, "good", group.ProtoHTTP, startConnector(t, wire.AckOK, good.answer))
			lost.kill()
			<-done
			require.Equal(t, tc.status, rec.Code, rec.Body.String())
			require.Zero(t, stats.RetriesOpenFailed.Load())
			if tc.retried {
				require.Equal(t, int64(1), good.hits.Load())
				require.Equal(t, uint64(1), stats.RetriesIdempotent.Load())
			} else {
				require.Zero(t, good.hits.Load(), "a request that may have reached an app was sent again")
			}
		})
	}
}

// TestPipelinedOpenTimeout: a connector that never acknowledges a new stream fails the
// request after OpenTimeout (the request was sent: it is not retried as a failed open).
func TestPipelinedOpenTimeout(t *testing.T) {
	be := &progressBackend{heads: make(chan *http.Request, 1)}
	c, link := startHeldConnector(t, be.serve)
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	stats := newStats()
	join(t, reg, "m1", group.ProtoHTTP, c)
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, Stats: stats, OpenTimeout: 200 * time.Millisecond})
	link.Hold(true)
	defer link.Hold(false)
	rec := httptest.NewRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "http://pool."+testDomain+"/", nil))
	require.Equal(t, http.StatusBadGateway, rec.Code)
	require.NoError(t, ctx.Err(), "OpenTimeout bounds the wait for the acknowledgement")
	require.Zero(t, stats.RetriesOpenFailed.Load())
}

// TestKeepAliveReusesMemberStreams: sequential keep-alive requests, with and without a
// body, go over one member stream; concurrent ones open no more streams than there are
// requests in flight.
func TestKeepAliveReusesMemberStreams(t *testing.T) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	c := startConnector(t, wire.AckOK, answerHTTP)
	join(t, reg, "m1", group.ProtoHTTP, c)
	h := NewHTTP(Config{Registry: reg, Domain: testDomain})
	for i := range 50 {
		var body io.Reader
		method := http.MethodGet
		if i%2 == 1 {
			method, body = http.MethodPost, strings.NewReader("some body")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "http://pool."+testDomain+"/", body))
		require.Equal(t, http.StatusOK, rec.Code)
	}
	require.Equal(t, int64(1), c.streams.Load())

	const clients = 8
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for j := range 40 {
				var body io.Reader
				method := http.MethodGet
				if (i+j)%2 == 1 {
					method, body = http.MethodPost, strings.NewReader("some body")
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(method, "http://pool."+testDomain+"/", body))
				if rec.Code != http.StatusOK {
					t.Errorf("status %d", rec.Code)
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, c.streams.Load(), int64(clients), "streams were dropped instead of reused")
}

// TestBodylessHeadMatchesRequestWrite: the head the edge writes itself for a request without
// a body is byte for byte Request.Write's, and whatever it does not handle is left to
// Request.Write.
func TestBodylessHeadMatchesRequestWrite(t *testing.T) {
	base := func(method, target string) *http.Request {
		r := httptest.NewRequest(method, target, nil)
		r.Body, r.ContentLength = nil, 0
		r.RequestURI = ""
		r.Header.Set("User-Agent", "curl/8.0")
		r.Header.Set("Accept", "*/*")
		r.Header["X-Forwarded-For"] = []string{"192.0.2.1"}
		r.Header.Add("Cookie", "a=1")
		r.Header.Add("Cookie", "b=2")
		return r
	}
	for name, tc := range map[string]struct {
		req     func() *http.Request
		handled bool
	}{
		"GET":                {func() *http.Request { return base("GET", "http://app.example/p/a?q=1&r=%20") }, true},
		"HEAD":               {func() *http.Request { return base("HEAD", "http://app.example/") }, true},
		"DELETE":             {func() *http.Request { return base("DELETE", "http://app.example/x") }, true},
		"POST without body":  {func() *http.Request { return base("POST", "http://app.example/x") }, true},
		"PATCH without body": {func() *http.Request { return base("PATCH", "http://app.example/x") }, true},
		"OPTIONS *": {func() *http.Request {
			r := base("OPTIONS", "http://app.example/")
			r.URL.Path = "*"
			return r
		}, true},
		"host with port": {func() *http.Request {
			r := base("GET", "http://app.example:8080/")
			r.Host = "app.example:8080"
			return r
		}, true},
		"empty User-Agent": {func() *http.Request {
			r := base("GET", "http://app.example/")
			r.Header.Set("User-Agent", "")
			return r
		}, true},
		"folded values and odd names": {func() *http.Request {
			r := base("GET", "http://app.example/")
			r.Header["X-Odd"] = []string{"  a\r\nb  ", "\tc\t"}
			r.Header["Bad Name"] = []string{"dropped"}
			r.Header.Set("User-Agent", " agent\n2 ")
			return r
		}, true},
		"no User-Agent": {func() *http.Request {
			r := base("GET", "http://app.example/")
			r.Header.Del("User-Agent")
			return r
		}, false},
		"Close": {func() *http.Request { r := base("GET", "http://app.example/"); r.Close = true; return r }, false},
		"IPv6 host": {func() *http.Request {
			r := base("GET", "http://app.example/")
			r.Host = "[fe80::1%25eth0]:80"
			return r
		}, false},
		"with a body": {func() *http.Request {
			r := base("PUT", "http://app.example/")
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader("x")), 1
			return r
		}, false},
		"trailers": {func() *http.Request {
			r := base("GET", "http://app.example/")
			r.Trailer = http.Header{"X-T": nil}
			return r
		}, false},
	} {
		t.Run(name, func(t *testing.T) {
			var want, got bytes.Buffer
			require.NoError(t, tc.req().Write(&want))
			bw := bufio.NewWriter(&got)
			require.Equal(t, tc.handled, writeBodylessHead(bw, tc.req()))
			require.NoError(t, bw.Flush())
			if tc.handled {
				require.Equal(t, want.String(), got.String())
			} else {
				require.Zero(t, got.Len(), "declined, yet wrote")
			}
		})
	}
}
