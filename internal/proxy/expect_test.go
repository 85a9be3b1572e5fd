package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// uploadSize is the body of the Expect tests: 10 MiB, well over every buffer and window on
// the way (the public connection, the yamux stream, the proxy's copy buffer).
const uploadSize = 10 << 20

// seen is what an Expect test's backend saw of one request.
type seen struct {
	expect string // its Expect header
	// quiet: no body byte arrived in the 300 ms after the head (backends that send 100).
	quiet bool
	// wait is the time from the head (or from the 100 the backend sent) to the first body
	// byte; zero when none came.
	wait time.Duration
	n    int64  // body bytes received, to the stream's end (413 backend) or the body's
	sum  string // hex SHA-256 of the body (backends that read it)
}

// expectBackend is a member's backend, on the member's stream, for the Expect tests. mode:
//
//   - "413": answers 413 (Connection: close) as soon as the head arrived, then counts every
//     byte that still comes until the edge ends the stream;
//   - "100": waits 300 ms (noting whether any body byte came), sends 100 Continue, reads the
//     body and answers 200 with its checksum;
//   - "read": ignores Expect, reads the body and answers 200 with its checksum.
func expectBackend(mode string, out chan<- seen) func(*connector, mux.Stream, wire.Envelope) {
	return func(_ *connector, st mux.Stream, _ wire.Envelope) {
		br := bufio.NewReader(st)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			s := seen{expect: req.Header.Get("Expect")}
			start := time.Now()
			switch mode {
			case "413":
				_, _ = io.WriteString(st, "HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo big\n")
				_ = st.SetReadDeadline(time.Now().Add(5 * time.Second))
				s.n, _ = io.Copy(io.Discard, br) // the rest of the stream: whatever body came
				out <- s
				return
			case "100":
				_ = st.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				_, err := br.Peek(1)
				s.quiet = err != nil
				_ = st.SetReadDeadline(time.Time{})
				_, _ = io.WriteString(st, "HTTP/1.1 100 Continue\r\n\r\n")
				start = time.Now()
			}
			if req.ContentLength != 0 {
				if _, err := br.Peek(1); err == nil {
					s.wait = time.Since(start)
				}
			}
			h := sha256.New()
			s.n, err = io.Copy(h, req.Body)
			s.sum = hex.EncodeToString(h.Sum(nil))
			out <- s
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(st, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(s.sum), s.sum); err != nil {
				return
			}
		}
	}
}

// expectEdge serves the HTTP ingress, in plain HTTP or over TLS (HTTP/1.1 or HTTP/2), in
// front of one HTTP/1.1 member whose backend is serve; it returns a client that waits up to
// 5 s for a 100 Continue, and the scheme of the public URL.
func expectEdge(t *testing.T, proto string, serve func(*connector, mux.Stream, wire.Envelope)) (*http.Client, string) {
	t.Helper()
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second})
	c := startConnector(t, wire.AckOK, serve)
	join(t, reg, "m", group.ProtoHTTP, c)

	s := httptest.NewUnstartedServer(h)
	scheme := "http"
	switch proto {
	case "h1":
		s.Start()
	case "tls-h1", "tls-h2":
		s.EnableHTTP2 = proto == "tls-h2"
		s.StartTLS()
		scheme = "https"
	}
	t.Cleanup(s.Close)
	client := s.Client()
	tr := client.Transport.(*http.Transport)
	tr.ExpectContinueTimeout = 5 * time.Second
	tr.ForceAttemptHTTP2 = proto == "tls-h2"
	if tr.TLSClientConfig != nil {
		tr.TLSClientConfig.ServerName = "example.com" // httptest's certificate
	}
	d := &net.Dialer{}
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, s.Listener.Addr().String())
	}
	client.Timeout = 20 * time.Second
	t.Cleanup(client.CloseIdleConnections)
	return client, scheme
}

// patternBody is a request body of n bytes of a fixed pattern; it counts what was read of it.
type patternBody struct {
	left int64
	read atomic.Int64
}

func (b *patternBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), b.left)]
	off := uploadSize - b.left
	for i := range p {
		p[i] = byte((off + int64(i)) * 7 % 251)
	}
	b.left -= int64(len(p))
	b.read.Add(int64(len(p)))
	return len(p), nil
}

// patternSum is the hex SHA-256 of a patternBody of uploadSize bytes.
func patternSum(t *testing.T) string {
	t.Helper()
	h := sha256.New()
	_, err := io.Copy(h, &patternBody{left: uploadSize})
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// upload POSTs a patternBody of uploadSize bytes, with Expect: 100-continue if expect; it
// returns the status, the answer, and how much of the body the client was asked for.
func upload(t *testing.T, client *http.Client, url string, expect bool) (int, string, int64, error) {
	t.Helper()
	body := &patternBody{left: uploadSize}
	req, err := http.NewRequest(http.MethodPost, url, body)
	require.NoError(t, err)
	req.ContentLength = uploadSize
	if expect {
		req.Header.Set("Expect", "100-continue")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", body.read.Load(), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), body.read.Load(), err
}

// next waits for what the backend saw of the next request.
func next(t *testing.T, ch <-chan seen) seen {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(15 * time.Second):
		t.Fatal("the backend saw no request")
		return seen{}
	}
}

// longExpectTimeout makes the edge wait 10 s for a backend's 100 Continue during t (its
// servers, closed at cleanup before this runs, are done with it then), so that a body that
// arrives sooner did not wait for the timeout.
func longExpectTimeout(t *testing.T) {
	prev := expectContinueTimeout
	expectContinueTimeout = 10 * time.Second
	t.Cleanup(func() { expectContinueTimeout = prev })
}

// TestExpectContinueRejectedBeforeTheBody: a backend that answers 413 as soon as it has the
// head of an upload with Expect: 100-continue is sent the Expect header and none of the
// body: the edge does not read the client's body, the client is never asked for it, and it
// gets the 413, over plain HTTP and HTTPS (HTTP/1.1 and HTTP/2), ten times in a row with no
// connection reset.
func TestExpectContinueRejectedBeforeTheBody(t *testing.T) {
	for _, proto := range []string{"h1", "tls-h1", "tls-h2"} {
		t.Run(proto, func(t *testing.T) {
			ch := make(chan seen, 16)
			client, scheme := expectEdge(t, proto, expectBackend("413", ch))
			var total int64
			for i := range 10 {
				code, body, asked, err := upload(t, client, scheme+"://pool."+testDomain+"/up", true)
				require.NoError(t, err, "upload %d", i)
				require.Equal(t, http.StatusRequestEntityTooLarge, code, body)
				require.Equal(t, "too big\n", body)
				require.Zero(t, asked, "the client was not asked for its body")
				s := next(t, ch)
				require.Equal(t, "100-continue", s.expect, "the backend is sent the Expect header")
				total += s.n
			}
			t.Logf("%s: the 413 backend received %d body bytes in 10 uploads of %d", proto, total, uploadSize)
			require.Less(t, total, int64(64<<10), "the backend received (almost) none of the bodies")
		})
	}
}

// TestExpectContinueRelaysTheBackends100: the body of an upload with Expect: 100-continue
// reaches the backend only once it answered 100 (nothing in the 300 ms before), then at once
// (no waiting for the edge's timeout), whole: the backend's checksum matches.
func TestExpectContinueRelaysTheBackends100(t *testing.T) {
	want := patternSum(t)
	for _, proto := range []string{"h1", "tls-h2"} {
		t.Run(proto, func(t *testing.T) {
			longExpectTimeout(t)
			ch := make(chan seen, 4)
			client, scheme := expectEdge(t, proto, expectBackend("100", ch))
			code, body, asked, err := upload(t, client, scheme+"://pool."+testDomain+"/up", true)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, body)
			require.Equal(t, want, body, "the body arrived intact")
			require.Equal(t, int64(uploadSize), asked)
			s := next(t, ch)
			require.Equal(t, "100-continue", s.expect)
			require.True(t, s.quiet, "no body byte reached the backend before its 100")
			require.Equal(t, int64(uploadSize), s.n)
			require.Less(t, s.wait, expectContinueTimeout/2, "the body followed the backend's 100, not the edge's timeout")
		})
	}
}

// TestExpectContinueIgnoredByTheBackend: a backend that does not answer Expect and just
// reads the body gets it once the edge's wait for a 100 (expectContinueTimeout) is over,
// whole.
func TestExpectContinueIgnoredByTheBackend(t *testing.T) {
	want := patternSum(t)
	ch := make(chan seen, 4)
	client, scheme := expectEdge(t, "h1", expectBackend("read", ch))
	code, body, _, err := upload(t, client, scheme+"://pool."+testDomain+"/up", true)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, want, body)
	s := next(t, ch)
	require.Equal(t, "100-continue", s.expect)
	require.Equal(t, int64(uploadSize), s.n)
	require.GreaterOrEqual(t, s.wait, expectContinueTimeout-100*time.Millisecond, "the body waited for the timeout")
}

// TestExpectContinueNotAskedIsUnchanged: an upload without Expect is sent at once, as
// before; a bodyless request's Expect is not forwarded (there is nothing to wait for).
func TestExpectContinueNotAskedIsUnchanged(t *testing.T) {
	longExpectTimeout(t)
	want := patternSum(t)
	ch := make(chan seen, 4)
	client, scheme := expectEdge(t, "h1", expectBackend("read", ch))
	code, body, _, err := upload(t, client, scheme+"://pool."+testDomain+"/up", false)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, want, body)
	s := next(t, ch)
	require.Empty(t, s.expect)
	require.Less(t, s.wait, expectContinueTimeout/2, "the body was not held back")

	req, err := http.NewRequest(http.MethodGet, scheme+"://pool."+testDomain+"/", nil)
	require.NoError(t, err)
	req.Header.Set("Expect", "100-continue")
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, next(t, ch).expect, "a bodyless request's Expect is dropped")
}

// TestExpectContinueGate: the gate's first decision stands; the timeout decides to send.
func TestExpectContinueGate(t *testing.T) {
	g := newContinueGate()
	g.decide(false)
	g.decide(true)
	require.True(t, g.withheld())
	require.False(t, g.wait())

	g = newContinueGate()
	g.timeout = 10 * time.Millisecond
	require.False(t, g.withheld())
	require.True(t, g.wait(), "the timeout lets the body go")
	g.decide(false)
	require.False(t, g.withheld())

	var nilGate *continueGate
	nilGate.decide(false)
	require.False(t, nilGate.withheld())

	for v, want := range map[string]bool{"100-continue": true, "100-Continue": true, " 100-continue ": true,
		"foo, 100-continue": true, "": false, "200-ok": false} {
		require.Equal(t, want, expectsContinue(http.Header{"Expect": {v}}), v)
	}
}
