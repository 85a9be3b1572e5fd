package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
