package tunnel

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// forwardingBackend answers with the forwarding headers of its request, as JSON.
func forwardingBackend(t *testing.T) *httptest.Server {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := map[string]string{}
		for _, n := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded", "X-Real-Ip"} {
			if v := r.Header.Values(n); len(v) > 0 {
				out[n] = fmt.Sprint(v)
			}
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(b.Close)
	return b
}

// forwardedHeaders sends a GET to url with the headers hdr (name, value pairs) and returns
// the forwarding headers the backend saw.
func forwardedHeaders(t *testing.T, c *http.Client, url string, hdr ...string) map[string]string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var got map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	return got
}

// spoofedForwarding are forwarding headers a client makes up.
var spoofedForwarding = []string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.6;proto=https",
	"X-Real-IP", "6.6.6.6", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "bank.example"}

// TestForwardingHeadersFromAnUntrustedClient: a client's own forwarding headers never reach
// the backend: it sees the edge's, naming the client's real (loopback) address, over HTTP
// and over HTTPS with HTTP/2.
func TestForwardingHeadersFromAnUntrustedClient(t *testing.T) {
	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{})
	be := forwardingBackend(t)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(be.URL))
	require.NoError(t, err)
	host := "web." + testDomain

	got := forwardedHeaders(t, e.client, e.url("web", "/"), spoofedForwarding...)
	require.Equal(t, map[string]string{
		"X-Forwarded-For":   "[127.0.0.1]",
		"X-Forwarded-Proto": "[http]",
		"X-Forwarded-Host":  "[" + host + "]",
		"Forwarded":         "[for=127.0.0.1;proto=http;host=" + host + "]",
		"X-Real-Ip":         "[127.0.0.1]",
	}, got)

	got = forwardedHeaders(t, tlsClient(t, pki, httpsAddr, "h2"), "https://"+host+"/", spoofedForwarding...)
	require.Equal(t, map[string]string{
		"X-Forwarded-For":   "[127.0.0.1]",
		"X-Forwarded-Proto": "[https]",
		"X-Forwarded-Host":  "[" + host + "]",
		"Forwarded":         "[for=127.0.0.1;proto=https;host=" + host + "]",
		"X-Real-Ip":         "[127.0.0.1]",
	}, got)
}

// TestTrustedProxiesKeepTheForwardingChain: with 127.0.0.0/8 trusted (a load balancer in
// front of the edge), the incoming X-Forwarded-For and Forwarded are kept with the peer
// appended, X-Forwarded-Proto and -Host are kept, and X-Real-IP is the client the chain
// names, not the one the request claims.
func TestTrustedProxiesKeepTheForwardingChain(t *testing.T) {
	e := startEdge(t, ServerConfig{Public: PublicHTTP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
	be := forwardingBackend(t)
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "web"}, hostPort(be.URL))
	require.NoError(t, err)

	got := forwardedHeaders(t, e.client, e.url("web", "/"),
		"X-Forwarded-For", "203.0.113.9", "Forwarded", `for="[2001:db8::9]";proto=https`,
		"X-Real-IP", "6.6.6.6", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "www.example.org")
	require.Equal(t, map[string]string{
		"X-Forwarded-For":   "[203.0.113.9, 127.0.0.1]",
		"X-Forwarded-Proto": "[https]",
		"X-Forwarded-Host":  "[www.example.org]",
		"Forwarded":         `[for="[2001:db8::9]";proto=https, for=127.0.0.1;proto=http;host=web.` + testDomain + "]",
		"X-Real-Ip":         "[203.0.113.9]",
	}, got)
}

// TestTrustedProxiesInvalidPrefix: NewServer refuses a prefix that is not one.
func TestTrustedProxiesInvalidPrefix(t *testing.T) {
	_, err := NewServer(ServerConfig{Public: PublicHTTP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), {}}}})
	require.ErrorContains(t, err, "Public.TrustedProxies[1]: is not a valid prefix")
}

// expectUploadSize is the body of the end-to-end Expect test: 10 MiB.
const expectUploadSize = 10 << 20

// rejectingBackend is a raw HTTP/1.1 backend that answers 413 (Connection: close) to each
// request as soon as its head arrived, without reading its body, then counts the body bytes
// that still arrive until its connection ends. It returns its address and a func that waits
// for the count of the next connection.
func rejectingBackend(t *testing.T) (string, func() (expect string, n int64)) {
	t.Helper()
	ln := listenLoopback(t)
	type result struct {
		expect string
		n      int64
	}
	results := make(chan result, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo big\n")
				n, _ := io.Copy(io.Discard, br)
				results <- result{req.Header.Get("Expect"), n}
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String(), func() (string, int64) {
		select {
		case r := <-results:
			return r.expect, r.n
		case <-time.After(15 * time.Second):
			t.Fatal("the backend saw no request")
			return "", 0
		}
	}
}

// expectUpload POSTs expectUploadSize bytes with Expect: 100-continue and returns the status
// and how many body bytes the client was asked for.
func expectUpload(c *http.Client, url string) (int, int64, error) {
	body := &countedZeros{left: expectUploadSize}
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		return 0, 0, err
	}
	req.ContentLength = expectUploadSize
	req.Header.Set("Expect", "100-continue")
	resp, err := c.Do(req)
	if err != nil {
		return 0, body.sent(), err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, body.sent(), err
}

// countedZeros is a body of left zero bytes that counts what was read of it.
type countedZeros struct {
	mu   sync.Mutex
	left int64
	read int64
}

func (b *countedZeros) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), b.left))
	clear(p[:n])
	b.left -= int64(n)
	b.read += int64(n)
	return n, nil
}

func (b *countedZeros) sent() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.read
}

// TestExpectContinueReachesTheBackend: an upload of 10 MiB with Expect: 100-continue to a
// backend that refuses it with 413 before reading it, through a real connector, over the
// public HTTP listener and the HTTPS one (HTTP/1.1 and HTTP/2), ten times each: the client
// gets every 413 (no reset) without being asked for its body, and the backend receives
// (almost) none of it. A backend that reads the body (net/http's, which answers 100 when its
// handler reads) gets it whole.
func TestExpectContinueReachesTheBackend(t *testing.T) {
	pki := newTestPKI(t)
	e, httpsAddr := startTLSEdge(t, pki, ServerConfig{})
	addr, next := rejectingBackend(t)
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "big"}, addr)
	require.NoError(t, err)
	reader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s %s", n, r.Header.Get("Expect"), hex.EncodeToString(h.Sum(nil)))
	}))
	t.Cleanup(reader.Close)
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "ok"}, hostPort(reader.URL))
	require.NoError(t, err)

	clients := map[string]*http.Client{
		"http":     publicClient(e.publicAddr),
		"https-h1": tlsClient(t, pki, httpsAddr, "h1"),
		"https-h2": tlsClient(t, pki, httpsAddr, "h2"),
	}
	for _, name := range []string{"http", "https-h1", "https-h2"} {
		c := clients[name]
		c.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Second
		t.Cleanup(c.CloseIdleConnections)
		scheme := "https"
		if name == "http" {
			scheme = "http"
		}
		var received, asked int64
		var failures []string
		for i := range 10 {
			code, sent, err := expectUpload(c, scheme+"://big."+testDomain+"/upload")
			asked += sent
			switch {
			case err != nil:
				failures = append(failures, fmt.Sprintf("upload %d: %v", i, err))
			case code != http.StatusRequestEntityTooLarge:
				failures = append(failures, fmt.Sprintf("upload %d: status %d", i, code))
			}
			expect, n := next()
			require.Equal(t, "100-continue", expect, "the backend is sent the Expect header")
			received += n
		}
		t.Logf("%s: 10 uploads of %d bytes: the backend received %d body bytes, the client was asked for %d, failures %q",
			name, expectUploadSize, received, asked, failures)
		require.Empty(t, failures, name)
		require.Less(t, received, int64(64<<10), "%s: the 413 backend received (almost) none of the bodies", name)
		require.Zero(t, asked, "%s: the client was not asked for its body", name)

		req, err := http.NewRequest(http.MethodPost, scheme+"://ok."+testDomain+"/", &countedZeros{left: expectUploadSize})
		require.NoError(t, err)
		req.ContentLength = expectUploadSize
		req.Header.Set("Expect", "100-continue")
		start := time.Now()
		resp, err := c.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		zeros := sha256.Sum256(make([]byte, expectUploadSize))
		require.Equal(t, fmt.Sprintf("%d 100-continue %s", expectUploadSize, hex.EncodeToString(zeros[:])), string(b), name)
		t.Logf("%s: 10 MiB with Expect to a backend that reads it: %s", name, time.Since(start))
	}
}
