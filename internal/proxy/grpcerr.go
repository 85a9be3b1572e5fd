package proxy

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// A gRPC client cannot read an HTTP error page: it sees "unexpected HTTP status code 502".
// For a gRPC request the edge answers its own failures as gRPC does, with a trailers-only
// response (status 200, grpc-status and grpc-message in the headers), as Envoy does.

type grpcDeadlineKey struct{}

// isGRPC reports whether r is a gRPC call.
func isGRPC(r *http.Request) bool {
	return r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
}

// grpcTimeout parses a gRPC call's grpc-timeout header: at most 8 digits and a unit.
func grpcTimeout(r *http.Request) (time.Duration, bool) {
	if !isGRPC(r) {
		return 0, false
	}
	v := r.Header.Get("Grpc-Timeout")
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, false
	}
	unit := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second,
		'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}[v[len(v)-1]]
	if unit == 0 {
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// gRPC status codes the edge answers with.
const (
	grpcDeadlineExceeded  = 4
	grpcResourceExhausted = 8
	grpcInternal          = 13
	grpcUnavailable       = 14
)

// grpcCode maps the edge's HTTP answer to a gRPC status, as gRPC's own HTTP-to-status table
// does; a call whose deadline (grpc-timeout, counted from its arrival at the edge) has
// passed is DEADLINE_EXCEEDED whatever failed: the backend gave up on it at its deadline.
func grpcCode(r *http.Request, status int) int {
	if d, ok := r.Context().Value(grpcDeadlineKey{}).(time.Time); ok && !time.Now().Before(d) {
		return grpcDeadlineExceeded
	}
	switch status {
	case http.StatusRequestEntityTooLarge:
		return grpcResourceExhausted
	case http.StatusRequestTimeout:
		return grpcDeadlineExceeded
	case http.StatusBadRequest:
		return grpcInternal
	}
	return grpcUnavailable
}

// fail answers an edge failure: an HTTP error, or for a gRPC call a trailers-only gRPC status.
func (h *HTTP) fail(w http.ResponseWriter, r *http.Request, msg string, status int) {
	if !isGRPC(r) {
		if msg == "" {
			w.WriteHeader(status)
			return
		}
		http.Error(w, msg, status)
		return
	}
	hd := w.Header()
	hd.Del("Connection") // not an HTTP/2 header
	hd.Set("Content-Type", "application/grpc")
	hd.Set("Grpc-Status", strconv.Itoa(grpcCode(r, status)))
	if msg != "" {
		hd.Set("Grpc-Message", url.PathEscape(strings.TrimSpace(msg)))
	}
	w.WriteHeader(http.StatusOK)
}
