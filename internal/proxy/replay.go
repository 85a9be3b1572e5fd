package proxy

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// maxReplayBody is the largest request body the edge holds to replay it on another member
// (Config.RetryIdempotent).
const maxReplayBody = 64 << 10

// replayBufs lends the buffers that bodies of unknown length are read into: maxReplayBody
// bytes and one more, which tells a body over the limit from one that fills it exactly.
var replayBufs = sync.Pool{New: func() any { b := make([]byte, maxReplayBody+1); return &b }}

// idempotencyKeyHeader marks a request its client made safe to send twice.
const idempotencyKeyHeader = "Idempotency-Key"

// replayableMethod reports whether req may be sent again as far as its method or its
// Idempotency-Key header go: its body decides the rest.
func replayableMethod(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get(idempotencyKeyHeader) != ""
}

// replay is a request whose body the edge holds whole, so that it can be sent again.
type replay struct {
	body    []byte
	hasBody bool // the request has a body (possibly of zero bytes); false: req.Body is nil
}

// noBody is the replay of a request without a body: there is nothing to rewind.
var noBody = &replay{}

// bufferBody reads req's body, through the public body's limits and timeouts, up to
// maxReplayBody bytes and one more. A body of at most maxReplayBody bytes (or none) makes the
// request replayable: bufferBody returns it, and req.Body reads it from memory. A longer body
// makes it not replayable: bufferBody returns nil, and req.Body reads what was buffered
// followed by the rest of the public body, streaming as if nothing had been read. A failure
// to read the public body is returned as a *requestBodyError (the client's doing); the
// request must not be sent then.
func bufferBody(req *http.Request) (*replay, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return noBody, nil
	}
	if req.ContentLength > maxReplayBody {
		return nil, nil // known to be too long: stream it, as without the rule
	}
	var buf []byte
	var pooled *[]byte
	if req.ContentLength > 0 {
		buf = make([]byte, req.ContentLength+1) // the extra byte sees a body longer than announced
	} else {
		pooled = replayBufs.Get().(*[]byte)
		buf = *pooled
	}
	n, eof, err := readUpTo(req.Body, buf)
	if err != nil {
		if pooled != nil {
			replayBufs.Put(pooled)
		}
		return nil, &requestBodyError{err}
	}
	if !eof {
		// Over the limit: send what was read, then the rest as it comes.
		req.Body = &prefixBody{buf: buf[:n], pooled: pooled, rest: req.Body}
		return nil, nil
	}
	rp := &replay{body: buf[:n:n], hasBody: true}
	if pooled != nil {
		rp.body = bytes.Clone(buf[:n])
		replayBufs.Put(pooled)
	}
	rp.rewind(req)
	return rp, nil
}

// readUpTo reads r into buf until r ends or buf is full. eof reports whether r ended
// (within buf); err is any other failure.
func readUpTo(r io.Reader, buf []byte) (n int, eof bool, err error) {
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		switch {
		case err == io.EOF:
			return n, true, nil
		case err != nil:
			return n, false, err
		}
	}
	return n, false, nil
}

// rewind makes req.Body read the held body from its start, for the next attempt. A nil
// replay, or one of a request without a body, leaves req alone.
func (rp *replay) rewind(req *http.Request) {
	if rp != nil && rp.hasBody {
		req.Body = &heldBody{Reader: bytes.NewReader(rp.body)}
	}
}

// heldBody is a request body read from memory.
type heldBody struct{ *bytes.Reader }

// Close implements io.Closer; the public body it was read from is closed by its owner.
func (heldBody) Close() error { return nil }

// prefixBody is a request body over the replay limit: the bytes already read from the public
// body, then the rest of it. The buffer, if pooled, goes back to the pool once read out.
type prefixBody struct {
	buf    []byte
	pooled *[]byte
	rest   io.ReadCloser
}

func (b *prefixBody) Read(p []byte) (int, error) {
	if len(b.buf) == 0 {
		return b.rest.Read(p)
	}
	n := copy(p, b.buf)
	b.buf = b.buf[n:]
	if len(b.buf) == 0 {
		b.buf = nil
		if b.pooled != nil {
			// Read copied the bytes out: nothing refers to the buffer any more.
			replayBufs.Put(b.pooled)
			b.pooled = nil
		}
	}
	return n, nil
}

// Close closes the public body.
func (b *prefixBody) Close() error { return b.rest.Close() }
