package tunnel

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// maxUnreadBodyLinger is the longest the edge goes on reading a request body its answer
// abandoned before it closes the connection (nginx's lingering_timeout is 5 s too). Reading
// what the client already sent lets the close be a FIN, not a reset that could destroy the
// answer before the client read it; a client that sends nothing costs the edge at most this.
const maxUnreadBodyLinger = 5 * time.Second

// adminReadTimeoutFactor sets the admin listener's limit on a whole request, body included,
// from ServerConfig.Public.ReadHeaderTimeout: twice it, as Caddy's admin endpoint (5 s for the head,
// 10 s for the request). No admin endpoint reads a body, so a body there has no business
// being slow; a public upload may take long and is bounded by publicBody's own deadlines
// instead (RequestBody.Timeout, RequestBody.MinRate).
const adminReadTimeoutFactor = 2

// unreadBodyLinger is how long the edge reads the rest of a body an answer abandoned: as
// long as it waits for a body (RequestBody.Timeout), and at most maxUnreadBodyLinger.
func (c *ServerConfig) unreadBodyLinger() time.Duration {
	if c.RequestBody.Timeout > 0 {
		return min(c.RequestBody.Timeout, maxUnreadBodyLinger)
	}
	return maxUnreadBodyLinger
}

// adminReadTimeout bounds a whole admin request, head and body (adminReadTimeoutFactor).
func (c *ServerConfig) adminReadTimeout() time.Duration {
	return adminReadTimeoutFactor * c.Public.ReadHeaderTimeout
}

// closeAfterAbandonedBody serves h, and closes an HTTP/1.x connection after an answer that
// left its request body unread to the end.
//
// After every handler, net/http closes the request body, and closing one with at most 256 KiB
// left reads that rest, to reuse the connection (even when the answer says Connection:
// close); a server without full duplex also reads it before it writes the answer's head. It
// reads with whatever read deadline the connection has: none on the public listeners (an
// upload's deadlines are set per read, in the proxy, and cleared after each), so a client
// that declares a body and sends none would hold the connection and its goroutine for good,
// and an answer behind that read would never come (on the admin listener, it would come
// only at the limit on a whole request). A body the proxy
// gave up on (its deadline set in the past, so that net/http's read fails at once) would
// leave the connection to be reused with the rest of the body still to come, read then as
// the next request.
//
// So the rest gets linger to come, and the connection is closed after the answer. HTTP/2
// needs none of this: its server resets the one stream whose body is left unread, and the
// connection goes on.
func closeAfterAbandonedBody(h http.Handler, linger time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		// The handler gets a copy of the request reading a watched body: net/http judges
		// the connection by the body of the request it made (w.req.Body, a type of its
		// own), which must stay its own.
		g := &watchedRequest{req: *r}
		g.body.ReadCloser = r.Body
		g.req.Body = &g.body
		// Deferred: a handler that panics (httputil.ReverseProxy aborting a response under
		// way) leaves net/http to close the body too.
		defer func() {
			if !g.body.ended.Load() {
				abandonBody(w, linger)
			}
		}()
		h.ServeHTTP(w, &g.req)
	})
}

// watchedRequest is a request and its watched body, in one allocation.
type watchedRequest struct {
	req  http.Request
	body watchedBody
}

// watchedBody is a request body that records whether it was read to its end.
type watchedBody struct {
	io.ReadCloser
	ended atomic.Bool // the proxy reads the body from a goroutine of its own
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.ended.Store(true)
	}
	return n, err
}

// abandonBody bounds what net/http still reads of the request body after the handler, and
// has the connection closed after the answer.
func abandonBody(w http.ResponseWriter, linger time.Duration) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(linger))
	// An http.MaxBytesReader over its limit is the one way net/http offers to close a
	// connection after an answer whose head may be out already: the server then sends
	// Connection: close if the head is not yet written, reads no rest of the body before
	// writing it, and after the answer half-closes and waits a moment before the close, so
	// that the client can read the answer before any reset.
	_, _ = http.MaxBytesReader(w, io.NopCloser(strings.NewReader("x")), 0).Read(make([]byte, 1))
}
