package proxy

import (
	"encoding/binary"
	"io"
	"net/http"
	"time"
)

// isH2CPreface reports whether r is the start of the HTTP/2 connection preface ("PRI *
// HTTP/2.0"), which net/http hands to the handler of a listener that does not serve h2c.
func isH2CPreface(r *http.Request) bool {
	return r.Method == "PRI" && r.ProtoMajor == 2 && r.RequestURI == "*"
}

// h2cRefusal is what a client that spoke HTTP/2 with prior knowledge to a listener without
// h2c gets: an empty SETTINGS frame (a server's first frame) and a GOAWAY with the error
// HTTP_1_1_REQUIRED, so that its HTTP/2 stack reports the refusal at once.
var h2cRefusal = func() []byte {
	const debug = "h2c is not enabled on this listener"
	b := []byte{0, 0, 0, 0x4, 0, 0, 0, 0, 0} // SETTINGS, no parameters
	b = append(b, byte((8+len(debug))>>16), byte((8+len(debug))>>8), byte(8+len(debug)), 0x7, 0, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, 0)   // last stream id
	b = binary.BigEndian.AppendUint32(b, 0xd) // HTTP_1_1_REQUIRED
	return append(b, debug...)
}()

// refuseH2C answers an HTTP/2 preface on a listener without h2c, and closes the connection.
func refuseH2C(w http.ResponseWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not an HTTP/1.x connection: an HTTP answer is the best there is.
		http.Error(w, "HTTP/2 with prior knowledge (h2c) is not enabled on this listener", http.StatusHTTPVersionNotSupported)
		return
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = buf.Write(h2cRefusal)
	_ = buf.Flush()
}

// keepTrailers makes the request to the member carry the trailers of the public request
// with their values: the reverse proxy's copy of the request has the trailer names only
// (the values arrive after the body). The values are copied once the public body has been
// read to its end, on the goroutine that reads it, which is the one that then writes the
// trailers (net/http fills the public request's map before that read returns EOF).
func keepTrailers(in, out *http.Request) {
	if len(in.Trailer) == 0 || out.Body == nil || out.Body == http.NoBody {
		return
	}
	if out.Trailer == nil {
		out.Trailer = http.Header{}
	}
	out.Body = &trailerBody{ReadCloser: out.Body, in: in.Trailer, out: out.Trailer}
}

// trailerBody copies the public request's trailers into the member's request at the end of
// the body.
type trailerBody struct {
	io.ReadCloser
	in, out http.Header
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		for k, vv := range b.in {
			if len(vv) > 0 {
				b.out[k] = vv
			}
		}
	}
	return n, err
}
