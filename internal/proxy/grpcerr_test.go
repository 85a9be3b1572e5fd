package proxy

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/policy"
)

func grpcRequest(timeout string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://api.example/pkg.Svc/Call", nil)
	r.ProtoMajor = 2
	r.Header.Set("Content-Type", "application/grpc+proto")
	if timeout != "" {
		r.Header.Set("Grpc-Timeout", timeout)
	}
	return r
}

func TestGRPCTimeoutParsing(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"300m": 300 * time.Millisecond, "1S": time.Second, "2M": 2 * time.Minute, "1H": time.Hour,
		"99999999u": 99999999 * time.Microsecond, "5n": 5,
	} {
		d, ok := grpcTimeout(grpcRequest(v))
		require.True(t, ok, v)
		require.Equal(t, want, d, v)
	}
	for _, v := range []string{"", "m", "123456789m", "10x", "-1S", "1.5S"} {
		_, ok := grpcTimeout(grpcRequest(v))
		require.False(t, ok, v)
	}
	plain := grpcRequest("1S")
	plain.Header.Set("Content-Type", "application/json")
	_, ok := grpcTimeout(plain)
	require.False(t, ok, "not a gRPC call")
}

func TestEdgeFailuresOfGRPCCallsAreGRPCStatuses(t *testing.T) {
	h := &HTTP{}
	for _, c := range []struct {
		status   int
		deadline time.Duration // from now; 0: none
		want     string
	}{
		{http.StatusBadGateway, 0, "14"},
		{http.StatusServiceUnavailable, 0, "14"},
		{http.StatusRequestEntityTooLarge, 0, "8"},
		{http.StatusBadRequest, 0, "13"},
		{http.StatusBadGateway, -time.Millisecond, "4"}, // the call's deadline passed: the backend gave up on it
		{http.StatusBadGateway, time.Hour, "14"},
		{http.StatusNotFound, 0, "12"},
		{http.StatusMethodNotAllowed, 0, "12"},
		{http.StatusForbidden, 0, "7"},
		{http.StatusTooManyRequests, 0, "14"},
		{http.StatusRequestTimeout, 0, "4"},
		{http.StatusMisdirectedRequest, 0, "14"},
		{http.StatusRequestHeaderFieldsTooLarge, 0, "8"},
		{http.StatusPermanentRedirect, 0, "2"},
	} {
		r := grpcRequest("")
		if c.deadline != 0 {
			r = r.WithContext(context.WithValue(r.Context(), grpcDeadlineKey{}, time.Now().Add(c.deadline)))
		}
		w := httptest.NewRecorder()
		w.Header().Set("Connection", "close")
		h.fail(w, r, "bad gateway: x y", c.status)
		require.Equal(t, http.StatusOK, w.Code, "a trailers-only gRPC answer")
		require.Equal(t, c.want, w.Header().Get("Grpc-Status"), "%d %v", c.status, c.deadline)
		require.Equal(t, "bad%20gateway:%20x%20y", w.Header().Get("Grpc-Message"))
		require.Equal(t, "application/grpc", w.Header().Get("Content-Type"))
		require.Empty(t, w.Header().Get("Connection"))
		require.Zero(t, w.Body.Len())
	}
	w := httptest.NewRecorder()
	h.fail(w, httptest.NewRequest(http.MethodGet, "/", nil), "no healthy backend", http.StatusServiceUnavailable)
	require.Equal(t, http.StatusServiceUnavailable, w.Code, "an HTTP request gets an HTTP error")
	require.Equal(t, "no healthy backend\n", w.Body.String())
}

// TestEveryEdgeAnswerToAGRPCCallIsAGRPCStatus: every answer the edge gives by itself, not
// only a member's failure, reaches a gRPC call as a gRPC status with the edge's message:
// an unknown host, a bad port, a reserved endpoint with no member, an endpoint policy's
// refusals, a CONNECT, a :path with a space, a tls pool's host, headers or a declared body
// over the limits, an https tunnel reached over plain HTTP. A gRPC-Web call over HTTP/1.1
// gets one too, in its own content type.
func TestEveryEdgeAnswerToAGRPCCallIsAGRPCStatus(t *testing.T) {
	reg := group.NewRegistry(group.Config{})
	for _, j := range []group.JoinRequest{
		{ID: "t1", Proto: group.ProtoTLS, Label: "secure"},
		{ID: "s1", Proto: group.ProtoHTTPS, Label: "web"},
	} {
		_, err := reg.Join(j)
		require.NoError(t, err)
	}
	gates := map[string]*policy.Gate{
		"walled":  policy.New(policy.Rules{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}),
		"limited": policy.New(policy.Rules{Rate: 0.001, Burst: 1}),
	}
	h := NewHTTP(Config{Registry: reg, Domain: testDomain, MaxHeaderBytes: 1000, RequestBodyMaxBytes: 10,
		Reserved:  func(sub string) bool { return sub == "reserved" },
		HTTPGate:  func(sub string) *policy.Gate { return gates[sub] },
		HTTPSHost: func(sub string) string { return sub + "." + testDomain },
	}).GuardTLSRoutes()
	_, _ = gates["limited"].Admit(netip.MustParseAddr("192.0.2.1")) // spends its burst

	for _, c := range []struct {
		name, host, method, path string
		body                     string
		big, tls                 bool
		code, msg                string
	}{
		{"unknown host", "nope." + testDomain, "POST", "/pkg.Svc/Call", "", false, false, "12", "no tunnel for host"},
		{"no tunnel domain", "example.org", "POST", "/pkg.Svc/Call", "", false, false, "12", "no tunnel for host"},
		{"bad port", "nope." + testDomain + ":99999", "POST", "/pkg.Svc/Call", "", false, false, "13", "invalid port"},
		{"reserved, no member", "reserved." + testDomain, "POST", "/pkg.Svc/Call", "", false, false, "14", "no healthy backend"},
		{"policy: address", "walled." + testDomain, "POST", "/pkg.Svc/Call", "", false, false, "7", "not allowed"},
		{"policy: rate", "limited." + testDomain, "POST", "/pkg.Svc/Call", "", false, false, "14", ""},
		{"CONNECT", "nope." + testDomain + ":443", "CONNECT", "", "", false, false, "12", "CONNECT is not supported"},
		{"space in :path", "nope." + testDomain, "POST", "/pkg.Svc/Call?a HTTP/1.0", "", false, false, "13", "space"},
		{"tls pool", "secure." + testDomain, "POST", "/pkg.Svc/Call", "", false, false, "14", "TLS passthrough"},
		{"headers over the limit", "nope." + testDomain, "POST", "/pkg.Svc/Call", "", true, false, "8", "header"},
		{"body over the limit", "web." + testDomain, "POST", "/pkg.Svc/Call", "0123456789abc", false, true, "8", "body over the limit"},
		{"https tunnel over http", "web." + testDomain, "POST", "/pkg.Svc/Call", "", false, false, "2", "https://web." + testDomain + "/pkg.Svc/Call"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, "http://"+c.host+"/", strings.NewReader(c.body))
			r.Host, r.RequestURI, r.RemoteAddr = c.host, c.path, "192.0.2.1:5000"
			r.URL.Path = strings.SplitN(c.path, "?", 2)[0]
			r.ProtoMajor, r.ProtoMinor = 2, 0
			r.Header.Set("Content-Type", "application/grpc")
			if c.big {
				r.Header.Set("X-Big", strings.Repeat("x", 2000))
			}
			if c.tls {
				r.TLS = &tls.ConnectionState{}
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			require.Equal(t, http.StatusOK, w.Code, "a trailers-only gRPC answer, not an HTTP error: %s", w.Body)
			require.Equal(t, "application/grpc", w.Header().Get("Content-Type"))
			require.Equal(t, c.code, w.Header().Get("Grpc-Status"))
			msg, err := url.PathUnescape(w.Header().Get("Grpc-Message"))
			require.NoError(t, err)
			require.Contains(t, msg, c.msg)
			require.Zero(t, w.Body.Len())
			if c.name == "policy: rate" {
				require.NotEmpty(t, w.Header().Get("Retry-After"), "the refusal's Retry-After goes with it")
			}
		})
	}

	r := httptest.NewRequest(http.MethodPost, "http://nope."+testDomain+"/pkg.Svc/Call", nil)
	r.Header.Set("Content-Type", "application/grpc-web-text")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "application/grpc-web-text", w.Header().Get("Content-Type"))
	require.Equal(t, "12", w.Header().Get("Grpc-Status"))

	r = httptest.NewRequest(http.MethodPost, "http://nope."+testDomain+"/pkg.Svc/Call", nil)
	r.Header.Set("Content-Type", "application/grpc")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusNotFound, w.Code, "application/grpc over HTTP/1.1 is no gRPC call")
}
