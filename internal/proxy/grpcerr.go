package proxy

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// A gRPC client cannot read an HTTP error page: it sees "unexpected HTTP status code 502" or,
// for a 404 in text/plain, UNIMPLEMENTED. For a gRPC request the edge answers every failure
// of its own (HTTP.fail: the 404 of an unknown host, 503, 502, 400, 403, 405, 408, 413, 421,
// 429, 431, and the redirect of an https tunnel) as gRPC does, with a trailers-only response
// (status 200, grpc-status and grpc-message in the headers), as Envoy does.

type grpcDeadlineKey struct{}

// isGRPC reports whether r is a gRPC call: over HTTP/2 with a Content-Type of
// application/grpc…, or a gRPC-Web call (application/grpc-web…) over any HTTP version.
func isGRPC(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if !strings.HasPrefix(ct, "application/grpc") {
		return false
	}
	return r.ProtoMajor == 2 || strings.HasPrefix(ct, "application/grpc-web")
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
	grpcUnknown           = 2
	grpcDeadlineExceeded  = 4
	grpcPermissionDenied  = 7
	grpcResourceExhausted = 8
	grpcUnimplemented     = 12
	grpcInternal          = 13
	grpcUnavailable       = 14
	grpcUnauthenticated   = 16
)

// grpcCode maps the edge's HTTP answer to a gRPC status as gRPC's own HTTP-to-status table
// does (400 INTERNAL, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 UNIMPLEMENTED, 429 and
// 502-504 UNAVAILABLE, anything else UNKNOWN), where it has the status; for the others the
// edge says what happened: a body or header over its limit is RESOURCE_EXHAUSTED, a body
// too slow DEADLINE_EXCEEDED, a CONNECT UNIMPLEMENTED, a connection to reach the tunnel
// another way (421) UNAVAILABLE, as is any other failure of the edge's (5xx). A call whose
// deadline (grpc-timeout, counted from its arrival at the edge) has passed is
// DEADLINE_EXCEEDED whatever failed: the backend gave up on it at its deadline.
func grpcCode(r *http.Request, status int) int {
	if d, ok := r.Context().Value(grpcDeadlineKey{}).(time.Time); ok && !time.Now().Before(d) {
		return grpcDeadlineExceeded
	}
	switch status {
	case http.StatusBadRequest:
		return grpcInternal
	case http.StatusUnauthorized:
		return grpcUnauthenticated
	case http.StatusForbidden:
		return grpcPermissionDenied
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return grpcUnimplemented
	case http.StatusRequestTimeout:
		return grpcDeadlineExceeded
	case http.StatusRequestEntityTooLarge, http.StatusRequestHeaderFieldsTooLarge:
		return grpcResourceExhausted
	case http.StatusMisdirectedRequest, http.StatusTooManyRequests:
		return grpcUnavailable
	}
	if status >= 500 {
		return grpcUnavailable
	}
	return grpcUnknown
}

// fail answers an edge failure: an HTTP error, or for a gRPC call a trailers-only gRPC
// status. Headers already set on w (Retry-After, Allow) go with either.
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
	ct := "application/grpc"
	if r.ProtoMajor == 2 {
		hd.Del("Connection") // not an HTTP/2 header
	} else if v := r.Header.Get("Content-Type"); strings.HasPrefix(v, "application/grpc-web") {
		// gRPC-Web over HTTP/1.x: the answer names the call's own framing (-text is
		// base64), and keeps Connection: close when the edge set it.
		ct, _, _ = strings.Cut(v, ";")
	}
	hd.Set("Content-Type", ct)
	hd.Set("Grpc-Status", strconv.Itoa(grpcCode(r, status)))
	if msg != "" {
		hd.Set("Grpc-Message", url.PathEscape(strings.TrimSpace(msg)))
	}
	w.WriteHeader(http.StatusOK)
}
