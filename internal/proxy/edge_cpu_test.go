package proxy

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// TestWriteBodylessHeadTargets: the request target written without RequestURI's string is
// byte for byte what Request.Write writes, for the URL shapes that differ in it (a forced
// empty query, an escaped path, a query without a path, a control byte in the path, which
// is escaped), and a control byte in the query is left to Request.Write (which fails it).
func TestWriteBodylessHeadTargets(t *testing.T) {
	req := func(target string) func() *http.Request {
		return func() *http.Request {
			r := httptest.NewRequest(http.MethodGet, target, nil)
			r.Header.Set("User-Agent", "t")
			r.Header.Set("Accept", "*/*")
			return r
		}
	}
	for name, tc := range map[string]struct {
		req     func() *http.Request
		handled bool
	}{
		"forced empty query": {req("http://app.example/x?"), true},
		"escaped path":       {req("http://app.example/a%2Fb/c%20d?x=%2F"), true},
		"query, no path": {func() *http.Request {
			r := req("http://app.example/?a=b")()
			r.URL.Path, r.URL.RawPath = "", ""
			return r
		}, true},
		"control byte in query": {func() *http.Request {
			r := req("http://app.example/p")()
			r.URL.RawQuery = "a=\x01"
			return r
		}, false},
		"control byte in path, escaped": {func() *http.Request {
			r := req("http://app.example/p")()
			r.URL.Path, r.URL.RawPath = "/a\x7f", ""
			return r
		}, true},
	} {
		t.Run(name, func(t *testing.T) {
			var want bytes.Buffer
			werr := tc.req().Write(&want)
			var got bytes.Buffer
			bw := bufio.NewWriter(&got)
			require.Equal(t, tc.handled, writeBodylessHead(bw, tc.req()))
			require.NoError(t, bw.Flush())
			if tc.handled {
				require.NoError(t, werr)
				require.Equal(t, want.String(), got.String())
			} else {
				require.Error(t, werr, "Request.Write accepts what was declined")
				require.Zero(t, got.Len(), "declined, yet wrote")
			}
		})
	}
}

// TestReqCtx: a request's context with its reqInfo still is its parent in every other way:
// other keys' values, cancellation (AfterFunc, WithCancel) and deadline.
func TestReqCtx(t *testing.T) {
	type otherKey struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), otherKey{}, "v"))
	rc := &reqCtx{Context: parent, ri: reqInfo{g: &group.Group{Name: "g"}}}
	require.Same(t, &rc.ri, infoOf(rc))
	require.Equal(t, "v", rc.Value(otherKey{}))
	require.Nil(t, infoOf(parent))

	fired := make(chan struct{})
	context.AfterFunc(rc, func() { close(fired) })
	child, cancelChild := context.WithCancel(rc)
	defer cancelChild()
	cancel()
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("AfterFunc on the request's context did not run when its parent ended")
	}
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a child of the request's context was not cancelled with its parent")
	}
	require.ErrorIs(t, rc.Err(), context.Canceled)
}

// TestHostParsingAllocs: routing a Host without a port allocates nothing (net.SplitHostPort
// would allocate an error twice a request), and one with a port is still parsed.
func TestHostParsingAllocs(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if !validHostPort("app.warren.test") {
			t.Fatal("refused a host without a port")
		}
		if sub, ok := subdomainOf("app.warren.test", testDomain); !ok || sub != "app" {
			t.Fatal("no subdomain in app.warren.test")
		}
	})
	require.Zero(t, allocs)
	require.True(t, validHostPort("app.warren.test:8080"))
	require.False(t, validHostPort("app.warren.test:99999"))
	sub, ok := subdomainOf("app.warren.test:8080", testDomain)
	require.True(t, ok)
	require.Equal(t, "app", sub)
}

// TestGuardTLSRoutesOrder: the guard's 421 for a tls pool still comes before ServeHTTP's
// checks (a bad port), and an HTTP pool behind it is served as without the guard (404 for
// an unknown host, 400 for a bad port).
func TestGuardTLSRoutesOrder(t *testing.T) {
	reg := group.NewRegistry(group.Config{})
	_, err := reg.Join(group.JoinRequest{ID: "t1", Proto: group.ProtoTLS, Label: "secure"})
	require.NoError(t, err)
	h := NewHTTP(Config{Registry: reg, Domain: testDomain}).GuardTLSRoutes()
	for host, want := range map[string]int{
		"secure." + testDomain + ":99999": http.StatusMisdirectedRequest,
		"secure." + testDomain:            http.StatusMisdirectedRequest,
		"other." + testDomain:             http.StatusNotFound,
		"other." + testDomain + ":99999":  http.StatusBadRequest,
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "http://x/", nil)
		r.Host = host
		h.ServeHTTP(w, r)
		require.Equal(t, want, w.Code, host)
	}
}

// BenchmarkEdgeHTTPGuarded is BenchmarkEdgeHTTP through the handler the edge serves
// (GuardTLSRoutes in front of the ingress), as deployed.
func BenchmarkEdgeHTTPGuarded(b *testing.B) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	c := startConnector(b, wire.AckOK, answerHTTP)
	tun := NewTunnel(b.Context(), "m1", group.ProtoHTTP, c.edge, &c.key)
	b.Cleanup(tun.Close)
	_, err := reg.Join(group.JoinRequest{ID: "m1", Proto: group.ProtoHTTP, Label: "pool", Group: "pool", Value: tun})
	if err != nil {
		b.Fatal(err)
	}
	benchHandler(b, NewHTTP(benchConfig(reg)).GuardTLSRoutes())
}

// TestCopyBufPool: the reverse proxy's buffers are full-sized, come back from the pool
// without an allocation, and a buffer of another size is not taken in.
func TestCopyBufPool(t *testing.T) {
	var p copyBufPool
	b := p.Get()
	require.Len(t, b, proxyCopyBufSize)
	p.Put(b)
	allocs := testing.AllocsPerRun(100, func() { p.Put(p.Get()) })
	require.Zero(t, allocs)
	p.Put(make([]byte, 10)) // not the pool's: dropped, no panic
	require.Len(t, p.Get(), proxyCopyBufSize)
}

// TestAddrString: the peer's address is written as netip.Addr.String writes it, whether or
// not the remote address it came from is written the same way (mapped, zoned, not
// canonical), and a TCP peer's address costs no allocation.
func TestAddrString(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.7:40000":              "192.0.2.7",
		"[2001:db8::1]:80":             "2001:db8::1",
		"[2001:DB8:0::1]:80":           "2001:db8::1",
		"[::ffff:192.0.2.7]:80":        "192.0.2.7",
		"[fe80::1%eth0]:80":            "fe80::1",
		"[2001:db8:0:0:0:0:0:1]:65535": "2001:db8::1",
		"not an address":               "",
		"":                             "",
	} {
		require.Equal(t, want, addrString(peerAddr(remote), remote), remote)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if addrString(peerAddr("192.0.2.7:40000"), "192.0.2.7:40000") != "192.0.2.7" {
			t.Fatal("wrong address")
		}
	})
	require.Zero(t, allocs)
}
