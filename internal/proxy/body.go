package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// maxRateCredit caps the time a request body earns by its bytes under the minimum rate, so
// that the deadline arithmetic cannot overflow.
const maxRateCredit = 24 * time.Hour

// errUploadAborted is what a read of a public request body returns once the edge aborted
// it (the exchange ended before the body did).
var errUploadAborted = errors.New("proxy: reading the request body was aborted: the exchange ended")

// bodyTimeoutError means a public request body did not arrive in time: the client gets
// 408 Request Timeout if no response has started, and the exchange is aborted otherwise.
type bodyTimeoutError struct{ reason string }

func (e *bodyTimeoutError) Error() string { return "proxy: request body too slow: " + e.reason }

// requestBodyError is a failure to read the public request body (a malformed chunked
// encoding, a body over the limit, a client gone or too slow): the client's doing, not the
// backend's. The exchange is abandoned and the member's stream closed.
type requestBodyError struct{ err error }

func (e *requestBodyError) Error() string { return "proxy: reading the request body: " + e.err.Error() }
func (e *requestBodyError) Unwrap() error { return e.err }

// publicBody is a public request body as the edge reads it. It bounds the time the edge
// spends waiting for the client's bytes, with a read deadline on the client's connection
// during each read (time in which the edge is not reading, because the backend has not yet
// taken what it was sent, does not count):
//
//   - in all, the edge waits at most timeout for the body;
//   - once it has waited grace, the body must keep up an average of minRate bytes per
//     second: after waiting w in all, at least (w - grace) * minRate bytes have arrived.
//
// A zero timeout or minRate turns that rule off. A body too slow fails with a
// *bodyTimeoutError. abort ends a read in progress (or the next one) with errUploadAborted.
type publicBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	minRate int64
	grace   time.Duration

	mu      sync.Mutex
	waited  time.Duration // time spent in reads
	n       int64         // bytes read
	set     time.Time     // the read deadline in force on the connection; zero: none
	aborted bool
	eof     bool
}

func newPublicBody(body io.ReadCloser, rc *http.ResponseController, cfg *Config) *publicBody {
	return &publicBody{body: body, rc: rc, timeout: max(cfg.RequestBodyTimeout, 0),
		minRate: max(cfg.RequestBodyMinRate, 0), grace: max(cfg.RequestBodyMinRateGrace, 0)}
}

// budget returns how much longer the edge may wait for the body's next bytes and which rule
// says so; limited is false when no rule applies. b.mu is held.
func (b *publicBody) budget() (d time.Duration, why string, limited bool) {
	if b.timeout > 0 {
		d, why, limited = b.timeout-b.waited, fmt.Sprintf("not received within %s", b.timeout), true
	}
	if b.minRate > 0 {
		credit := maxRateCredit
		if secs := b.n / b.minRate; secs < int64(maxRateCredit/time.Second) {
			credit = time.Duration(secs)*time.Second + time.Duration(b.n%b.minRate)*time.Second/time.Duration(b.minRate)
		}
		if r := b.grace + credit - b.waited; !limited || r < d {
			d, why, limited = r, fmt.Sprintf("slower than %d bytes/s", b.minRate), true
		}
	}
	return d, why, limited
}

// setDeadline puts t in force on the client's connection and reports whether it is. b.mu
// is held.
func (b *publicBody) setDeadline(t time.Time) bool {
	if t.Equal(b.set) {
		return true
	}
	if err := b.rc.SetReadDeadline(t); err != nil {
		return false
	}
	b.set = t
	return true
}

func (b *publicBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.aborted {
		b.mu.Unlock()
		return 0, errUploadAborted
	}
	budget, why, limited := b.budget()
	if limited && budget <= 0 {
		b.mu.Unlock()
		return 0, &bodyTimeoutError{why}
	}
	start := time.Now()
	enforced := limited && b.setDeadline(start.Add(budget))
	b.mu.Unlock()

	n, err := b.body.Read(p)

	b.mu.Lock()
	defer b.mu.Unlock()
	waited := time.Since(start)
	b.waited += waited
	b.n += int64(n)
	if b.aborted {
		if err != nil && err != io.EOF {
			err = errUploadAborted
		}
		return n, err
	}
	// Between reads the connection keeps no deadline: the edge is not waiting for the
	// client then, and the server's own reads (the next request, noticing that the client
	// left) must not inherit it.
	b.setDeadline(time.Time{})
	switch {
	case err == io.EOF:
		b.eof = true
	case limited && waited >= budget && (err != nil || !enforced):
		// Failed at the deadline, or (where the connection takes no deadline) returned
		// after it.
		err = &bodyTimeoutError{why}
	}
	return n, err
}

func (b *publicBody) Close() error { return b.body.Close() }

// cutShort reports whether the body was aborted before its end.
func (b *publicBody) cutShort() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.aborted && !b.eof
}

// abort makes the read in progress, and every later one, fail with errUploadAborted, unless
// the body was read to its end.
func (b *publicBody) abort() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.aborted || b.eof {
		return
	}
	b.aborted = true
	if err := b.rc.SetReadDeadline(pastTime); err == nil {
		b.set = pastTime
	}
}
