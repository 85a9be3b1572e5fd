package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/warren-tunnel/warren/internal/mux"
	"golang.org/x/net/http/httpguts"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

const (
	// maxResponseHeaderBytes bounds a backend's response head, so a hostile connector
	// cannot make the edge buffer without end.
	maxResponseHeaderBytes = 1 << 20
	// maxInterimResponses bounds the 1xx responses skipped before the final one.
	maxInterimResponses = 8
)

var errHeadersTooLarge = errors.New("proxy: backend response headers too large")

// memberConn is one HTTP/1.1 connection to a member, carried on a yamux stream. The edge
// writes requests and reads responses on it itself (instead of using http.Transport) so that
// it controls exactly when a request may be retried: never once a byte of it was written.
type memberConn struct {
	t         *Tunnel
	st        mux.Stream
	sr        streamReader
	lim       headLimiter
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	// unhook stops the tunnel-removal hook that closes this stream.
	unhook func() bool
	// closeFn is pc.close as a func value, made once: each exchange hands it to
	// context.AfterFunc (a method value made there would be one allocation a request).
	closeFn func()
	// gate, during an exchange whose request expects 100 Continue, holds its body back
	// until the backend asks for it; closing the stream withholds the body for good.
	gate atomic.Pointer[continueGate]
	// ackPending: the stream is new (Tunnel.openPipelined) and its connector's
	// acknowledgement, which comes ahead of the first response, has not been read yet.
	ackPending bool
	// hold, during the first exchange on a new stream whose request has a body, keeps
	// what was sent of the body until the acknowledgement (nil otherwise).
	hold atomic.Pointer[ackHold]
	// aborted is set once the stream was aborted: readAck's clearing of the open's
	// deadline must not undo the abort's.
	aborted atomic.Bool
}

// headLimiter caps the bytes read while a response head is being parsed, and notes whether
// any arrived.
type headLimiter struct {
	r       io.Reader
	left    int64
	limited bool
	got     bool // a byte arrived while a response head was awaited
}

func (l *headLimiter) Read(p []byte) (int, error) {
	if !l.limited {
		return l.r.Read(p)
	}
	if l.left <= 0 {
		return 0, errHeadersTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if n > 0 {
		l.got = true
	}
	return n, err
}

// streamReader reads a member's stream; the end of a stream whose session died first is an
// error (mux.ErrSessionEnded), never the end of a response.
type streamReader struct{ st mux.Stream }

func (r *streamReader) Read(p []byte) (int, error) {
	n, err := r.st.Read(p)
	return n, mux.StreamEOF(r.st, err)
}

func newMemberConn(t *Tunnel, st mux.Stream) *memberConn {
	pc := &memberConn{t: t, st: st}
	// A removed tunnel's streams end with it, in flight or idle.
	pc.unhook = context.AfterFunc(t.ctx, pc.abort)
	pc.closeFn = pc.close
	pc.sr.st = st
	pc.lim.r = &pc.sr // a pointer into pc: no allocation of its own
	// 4 KiB, as net/http's Transport: enough for a response head; bodies larger than the
	// buffer are read straight into the proxy's copy buffer.
	pc.br = bufio.NewReaderSize(&pc.lim, 4<<10)
	pc.bw = bufio.NewWriterSize(st, 4<<10)
	return pc
}

// alive reports, without blocking, whether an idle stream is still open and quiet: the
// connector closes it when the backend closes its keep-alive connection.
func (pc *memberConn) alive() bool {
	if pc.br.Buffered() > 0 {
		return false // bytes nobody asked for
	}
	_ = pc.st.SetReadDeadline(pastTime)
	_, err := pc.br.Peek(1)
	mux.ClearReadDeadline(pc.st)
	return mux.IsTimeout(err)
}

func (pc *memberConn) tunnel() *Tunnel { return pc.t }

// close aborts the stream: pending reads and writes return at once.
func (pc *memberConn) close() {
	pc.unhook()
	pc.abort()
}

// abort abandons the stream mid-exchange (Tunnel.abandon): the connector resets it and its
// backend connection.
func (pc *memberConn) abort() {
	pc.aborted.Store(true)
	if g := pc.gate.Load(); g != nil {
		g.decide(false)
	}
	pc.hold.Load().decide(false)
	pc.t.abandon(pc.st)
}

// closeIdle closes an idle stream (between exchanges, nothing in flight) with a plain
// half-close: its connector closes the backend's keep-alive connection in turn.
func (pc *memberConn) closeIdle() {
	pc.unhook()
	pc.aborted.Store(true)
	_ = pc.st.SetDeadline(pastTime)
	_ = pc.st.Close()
}

// readAck reads the connector's acknowledgement of a new stream, which comes ahead of the
// first response. A refusal, or a stream that the connector closed or reset without one,
// is an *openError: the connector discarded what the edge sent behind the envelope, and
// the request may go to another member. Any other failure before it (the session died,
// the open's deadline passed, the exchange was aborted) is not: the acknowledgement, and
// the request behind it, may have been on their way.
func (pc *memberConn) readAck() error {
	pc.ackPending = false
	b, err := pc.br.ReadByte()
	if err != nil {
		pc.hold.Load().decide(false)
		if errors.Is(err, io.EOF) || mux.IsStreamReset(err) {
			return &openError{tunnel: pc.t.id, err: fmt.Errorf("waiting for the acknowledgement: %w", err)}
		}
		return fmt.Errorf("proxy: waiting for the acknowledgement: %w", err)
	}
	if a := wire.Ack(b); a != wire.AckOK {
		pc.hold.Load().decide(false)
		return &openError{tunnel: pc.t.id, err: errors.New(a.String())}
	}
	pc.hold.Load().decide(true)
	// The open's deadline is over; an abort that raced this keeps its own.
	mux.ClearDeadline(pc.st)
	if pc.aborted.Load() {
		_ = pc.st.SetDeadline(pastTime)
	}
	return nil
}

// maxHeldBody is how much of a request body the edge sends on a new stream before its
// connector's acknowledgement, and keeps until then for another member.
const maxHeldBody = 64 << 10

// errHoldRefused is what a held body's read returns once the stream it was sent on was
// refused: the rest goes to another member, if any.
var errHoldRefused = errors.New("proxy: the member refused the stream; the request body goes elsewhere")

// ackHold is a request body sent on a new stream before the connector's acknowledgement:
// it passes the public body's bytes on, and keeps them, up to maxHeldBody; a read beyond
// that waits for the acknowledgement. Once the stream is acknowledged it reads straight
// through; once it is refused its reads fail with errHoldRefused and resend gives a body that
// reads the kept bytes again, then the rest of the public body. It does not close the public
// body before the acknowledgement (Request.Write closes the body it wrote): the next
// attempt may need it.
type ackHold struct {
	rc       io.ReadCloser
	mu       sync.Mutex
	kept     []byte
	state    holdState
	decided  chan struct{} // closed once state is no longer holdPending
	closeReq bool          // Close was called before the acknowledgement
}

type holdState uint8

const (
	holdPending holdState = iota
	holdAcked
	holdRefused
)

func newAckHold(rc io.ReadCloser) *ackHold {
	return &ackHold{rc: rc, decided: make(chan struct{})}
}

func (h *ackHold) Read(p []byte) (int, error) {
	for {
		h.mu.Lock()
		state, room := h.state, maxHeldBody-len(h.kept)
		h.mu.Unlock()
		switch {
		case state == holdAcked:
			return h.rc.Read(p)
		case state == holdRefused:
			return 0, errHoldRefused
		case room == 0:
			<-h.decided
			continue
		}
		p = p[:min(len(p), room)]
		n, err := h.rc.Read(p)
		h.mu.Lock()
		if h.state != holdAcked {
			// Refused meanwhile or not: what was read may not have reached this member.
			h.kept = append(h.kept, p[:n]...)
		}
		h.mu.Unlock()
		return n, err
	}
}

// Close closes the public body once the stream was acknowledged; before, it is left for the
// acknowledgement (then closed) or the next attempt.
func (h *ackHold) Close() error {
	h.mu.Lock()
	if h.state != holdAcked {
		h.closeReq = true
		h.mu.Unlock()
		return nil
	}
	h.mu.Unlock()
	return h.rc.Close()
}

// decide settles the hold: ok, the stream was acknowledged (the kept bytes are dropped);
// not ok, it was refused or failed. The first decision stands; a nil hold ignores it.
func (h *ackHold) decide(ok bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if h.state != holdPending {
		h.mu.Unlock()
		return
	}
	closeNow := false
	if ok {
		h.state, h.kept, closeNow = holdAcked, nil, h.closeReq
	} else {
		h.state = holdRefused
	}
	close(h.decided)
	h.mu.Unlock()
	if closeNow {
		_ = h.rc.Close()
	}
}

// resend returns the body of the request's next attempt, after its stream was refused: the
// kept bytes, then the rest of the public body. Call it once the attempt's writer finished.
func (h *ackHold) resend() io.ReadCloser {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.kept) == 0 {
		return h.rc
	}
	return &prefixBody{buf: h.kept, rest: h.rc}
}

func (pc *memberConn) writeRequest(req *http.Request) error {
	if !writeBodylessHead(pc.bw, req) {
		if err := req.Write(pc.bw); err != nil {
			return err
		}
	}
	return pc.bw.Flush()
}

// reqHeadExcluded reports whether k is a header field Request.Write writes itself, or not
// at all (a switch: no map lookup for each field of each request).
func reqHeadExcluded(k string) bool {
	switch k {
	case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
		return true
	}
	return false
}

// writeBodylessHead writes the head of req, a request without a body, to w byte for byte as
// req.Write would, and reports whether it did. It declines, writing nothing, whatever it
// does not handle the same way (a body, trailers, Connection: close, CONNECT, an opaque
// URL, a host that is not plain ASCII or is an IPv6 literal, no User-Agent field): req.Write
// writes those. Most requests are bodyless and take this path: Request.Write formats with
// fmt and allocates a transfer writer and a header sorter each time, about 3 µs a request
// (BenchmarkEdgeHTTP).
func writeBodylessHead(w *bufio.Writer, req *http.Request) bool {
	if !plainBodyless(req) {
		return false
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !plainHost(host) {
		return false
	}
	ua, ok := req.Header["User-Agent"]
	if !ok {
		return false // Request.Write would send its own
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	// req.URL.RequestURI() in two parts, without the string it would allocate for a
	// query (the URL is not opaque: see above).
	path, query, hasQuery := req.URL.EscapedPath(), req.URL.RawQuery, req.URL.ForceQuery || req.URL.RawQuery != ""
	if path == "" {
		path = "/"
	}
	if !validRequestTarget(path) || !validRequestTarget(query) {
		return false // Request.Write fails it
	}

	_, _ = w.WriteString(method)
	_ = w.WriteByte(' ')
	_, _ = w.WriteString(path)
	if hasQuery {
		_ = w.WriteByte('?')
		_, _ = w.WriteString(query)
	}
	_, _ = w.WriteString(" HTTP/1.1\r\nHost: ")
	_, _ = w.WriteString(host)
	_, _ = w.WriteString("\r\n")
	if len(ua) > 0 && ua[0] != "" {
		_, _ = w.WriteString("User-Agent: ")
		_, _ = w.WriteString(headValue(ua[0]))
		_, _ = w.WriteString("\r\n")
	}
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		_, _ = w.WriteString("Content-Length: 0\r\n")
	}
	writeHeaderFields(w, req.Header)
	_, _ = w.WriteString("\r\n")
	return true
}

// plainBodyless reports whether req is one whose head writeBodylessHead writes as
// Request.Write would: no body, no trailers, no Connection: close, no CONNECT, a URL that
// is not opaque.
func plainBodyless(req *http.Request) bool {
	return (req.Body == nil || req.Body == http.NoBody) && req.ContentLength == 0 && !req.Close &&
		req.Trailer == nil && req.TransferEncoding == nil && req.Method != http.MethodConnect &&
		req.URL != nil && req.URL.Opaque == ""
}

// plainHost reports whether Request.Write would send host as it is: plain ASCII (it would
// punycode anything else), a valid Host header (it would drop it) and no IPv6 literal (it
// would take its zone off).
func plainHost(host string) bool {
	for i := 0; i < len(host); i++ {
		if host[i] >= utf8.RuneSelf {
			return false
		}
	}
	return httpguts.ValidHostHeader(host) && !strings.HasPrefix(host, "[")
}

// writeHeaderFields writes the fields of h as Request.Write does, sorted by name, but for
// those it writes itself (reqHeadExcluded) and those with an invalid name (it drops them).
func writeHeaderFields(w *bufio.Writer, h http.Header) {
	// Sorted on the stack: most requests have fewer fields than this.
	var keysArr [32]string
	keys := keysArr[:0]
	for k := range h {
		if !reqHeadExcluded(k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range h[k] {
			_, _ = w.WriteString(k)
			_, _ = w.WriteString(": ")
			_, _ = w.WriteString(headValue(v))
			_, _ = w.WriteString("\r\n")
		}
	}
}

// validRequestTarget reports whether s, a part of a request target, has no control byte
// (Request.Write fails a request whose target has one).
func validRequestTarget(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// headValue is a header value as Request.Write writes it: line breaks become spaces, and
// surrounding white space goes.
func headValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\n", " ", "\r", " ").Replace(v)
	}
	return textproto.TrimString(v)
}

// readResponse reads the final response to req, skipping interim ones; a 100 Continue opens
// gate (when not nil), the body's way to the backend.
func (pc *memberConn) readResponse(req *http.Request, gate *continueGate) (*http.Response, error) {
	pc.lim.left, pc.lim.limited = maxResponseHeaderBytes, true
	defer func() { pc.lim.limited = false }()
	if pc.ackPending {
		if err := pc.readAck(); err != nil {
			return nil, err
		}
		// The acknowledgement is no byte of the response; what came with it is.
		pc.lim.got = pc.br.Buffered() > 0
	}
	for range maxInterimResponses {
		if b, err := pc.br.Peek(1); err == nil && wire.MaybeUnreadNotice(b) {
			// The connector writes a notice in one frame, which arrives whole: fewer bytes
			// at hand are a backend's own (and waiting for more could wait for ever).
			if pc.br.Buffered() >= wire.UnreadNoticeLen {
				notice, _ := pc.br.Peek(wire.UnreadNoticeLen)
				if wire.IsUnreadNotice(notice, pc.t.noticeKey, pc.st.StreamID()) {
					return nil, errUnread
				}
			}
			return nil, errors.New("proxy: malformed response from the backend: it begins with a zero byte")
		}
		resp, err := http.ReadResponse(pc.br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			// Interim (100 Continue, 103 Early Hints): the final response follows. A 100
			// lets the body go (its client gets its own 100 Continue from the public
			// server when the edge first reads the body); the others are relayed to the
			// client, through the reverse proxy's trace.
			if resp.StatusCode == http.StatusContinue {
				if gate != nil {
					gate.decide(true)
				}
			} else {
				if tr := httptrace.ContextClientTrace(req.Context()); tr != nil && tr.Got1xxResponse != nil {
					if err := tr.Got1xxResponse(resp.StatusCode, textproto.MIMEHeader(resp.Header)); err != nil {
						return nil, err
					}
				}
			}
			continue
		}
		return resp, nil
	}
	return nil, errTooManyInterim
}

// failedBeforeResponse reports whether err, which roundTrip returned, means that the member
// failed before any byte of a response arrived: its stream or its backend's connection
// ended or was reset, or its connector sent an unread notice. A failure of the public
// client's request body is not the member's.
func (pc *memberConn) failedBeforeResponse(err error) bool {
	if errors.Is(err, errUnread) {
		return true
	}
	return !pc.lim.got && !clientFault(err)
}

// clientFault reports whether err is the public client's doing: its request body failed
// (over the limit, too slow, malformed, cut off).
func clientFault(err error) bool {
	var (
		rbe *requestBodyError
		mbe *http.MaxBytesError
		bte *bodyTimeoutError
	)
	return errors.As(err, &rbe) || errors.As(err, &mbe) || errors.As(err, &bte)
}

// roundTrip sends req on the stream and returns the response, whose body releases m's
// stream slot and returns the stream to the pool when it has been read to the end. A request
// body is written concurrently with reading the response, so a backend may answer before it
// read the whole upload, or stream both ways.
//
// A request with a body and Expect: 100-continue is sent with it, and its body is held back
// (not read from the public client, who is not sent 100 Continue either) until the backend
// answers 100 or expectContinueTimeout passes, as net/http's client does. A backend that
// gives its final answer first gets no byte of the body; the answer is relayed, and the
// stream is closed after it (the backend may still wait for the body). Without a body, the
// Expect header is dropped.
func (pc *memberConn) roundTrip(req *http.Request, m *group.Member) (*http.Response, error) {
	if req.ProtoMajor == 2 {
		// As for an h2c member (h2Exchange.roundTrip): the request goes out at once (on a
		// new stream too, ahead of the connector's acknowledgement), and the public
		// server's goroutine may already hold the client's reset of the stream (rapid
		// reset) without having run to end the request's context. The processor is
		// yielded once so that a reset already read is seen before anything is sent.
		runtime.Gosched()
	}
	if err := req.Context().Err(); err != nil {
		// The client went away before anything was written: the stream stays usable,
		// unless it is new (its envelope was not even sent: it is closed).
		if pc.ackPending {
			pc.close()
		} else {
			pc.t.pool.put(pc)
		}
		m.Release()
		return nil, err
	}
	pc.lim.got = false
	hasBody := req.Body != nil && req.Body != http.NoBody
	gate := pc.prepareBody(req, hasBody)
	// A client that goes away aborts the exchange, wherever it is blocked.
	stop := context.AfterFunc(req.Context(), pc.closeFn)
	var wdone chan error
	var body *bodyReader
	if hasBody {
		body = &bodyReader{ReadCloser: req.Body, length: req.ContentLength}
		req.Body = body
		if gate != nil {
			req.Body = &gatedBody{ReadCloser: body, gate: gate}
		}
		wdone = make(chan error, 1)
		go func() { wdone <- pc.writeRequestWithBody(req, gate, body) }()
	} else if err := pc.writeRequest(req); err != nil {
		if pc.ackPending {
			// Whether the connector took the stream, its acknowledgement tells (within
			// the open's deadline): a refusal means the request may go elsewhere.
			if aerr := pc.readAck(); aerr != nil {
				err = aerr
			}
		}
		stop()
		pc.close()
		m.Release()
		return nil, err
	}
	resp, err := pc.readResponse(req, gate)
	if err == nil {
		// The final answer: a body not yet asked for is not sent any more.
		gate.decide(false)
	}
	if err == nil && body != nil && body.failed.Load() {
		// The public client's body broke off (over the limit, malformed, too slow, gone)
		// before this answer was read: the answer may be the backend's reaction to the
		// truncated body it was given, so it is not relayed; the client gets the edge's
		// verdict on its upload instead (413, 400, 408).
		err = errors.New("proxy: the request body failed before the response")
	}
	if err != nil {
		stop()
		pc.close()
		if wdone != nil {
			err = failureWithUpload(req, err, <-wdone)
		}
		m.Release()
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return pc.switchProtocols(req, resp, m, wdone, stop)
	}
	resp.Body = &memberBody{pc: pc, m: m, body: resp.Body, wdone: wdone, stop: stop, upload: body,
		abortUpload: bodyAborter(req), reusable: !resp.Close && !req.Close}
	return resp, nil
}

// prepareBody readies req's body and Expect header for the exchange, and returns the gate
// that holds the body back until the backend asks for it (nil when the request does not
// wait for 100 Continue). On a new stream, a body that is not already held in memory is
// wrapped to be kept for another member until the connector acknowledges the stream.
func (pc *memberConn) prepareBody(req *http.Request, hasBody bool) *continueGate {
	var hold *ackHold
	if _, inMemory := req.Body.(*heldBody); hasBody && pc.ackPending && !inMemory {
		hold = newAckHold(req.Body)
		req.Body = hold
	}
	pc.hold.Store(hold)
	var gate *continueGate
	switch {
	case hasBody && expectsContinue(req.Header):
		gate = newContinueGate()
		req.Header.Set("Expect", "100-continue")
	case req.Header.Get("Expect") != "":
		req.Header.Del("Expect")
	}
	pc.gate.Store(gate)
	return gate
}

// writeRequestWithBody writes req, whose body is body (behind gate, when not nil), while
// the response is being read. A body that broke off ends the exchange: the backend would
// wait for the rest for ever.
func (pc *memberConn) writeRequestWithBody(req *http.Request, gate *continueGate, body *bodyReader) error {
	err := pc.writeRequest(req)
	switch {
	case gate.withheld():
		// The backend answered before it asked for the body, or the exchange ended: no
		// byte of the body was read or sent. The head was, so the stream is not reused;
		// whoever ends the exchange closes it.
		return errBodyWithheld
	case body.err != nil:
		// Request.Write hides the cause (e.g. *http.MaxBytesError), and the public
		// client's body failed, not the backend.
		err = &requestBodyError{body.err}
	}
	if err != nil {
		pc.close()
	}
	return err
}

// failureWithUpload is the error of an exchange of req that failed with err while its body
// was being written, the writer having ended with werr: the upload's failure when it came
// first, the refusal of the stream when the writer failed because of it. A public body the
// backend never asked for is no longer waited on.
func failureWithUpload(req *http.Request, err, werr error) error {
	var oe *openError
	refused := errors.As(err, &oe)
	switch {
	case werr == errBodyWithheld && refused:
		// The stream was refused before the backend could ask for the body: the body
		// goes to the next member, if any, which may ask for it.
	case werr == errBodyWithheld:
		// The client still waits to be asked for its body: nothing will read it.
		bodyAborter(req)()
	case refused && !clientFault(werr):
		// The writer failed because the stream was refused: the refusal is the cause, and
		// the body is kept for the next member.
	case werr != nil && !mux.IsTimeout(werr):
		// The upload failed first (e.g. over the body limit); that is the cause.
		return werr
	}
	return err
}

// switchProtocols returns resp, the backend's 101 Switching Protocols to req, with the
// stream as its body, or fails the exchange: a switch to another protocol than req asked
// for, or before the backend read the whole request body. wdone is the body writer's
// outcome (nil without a body); stop undoes the exchange's abort on the client's leaving.
func (pc *memberConn) switchProtocols(req *http.Request, resp *http.Response, m *group.Member, wdone chan error, stop func() bool) (*http.Response, error) {
	if want := req.Header.Get("Upgrade"); want == "" || !strings.EqualFold(want, resp.Header.Get("Upgrade")) {
		// A switch nobody asked for: the proxy would refuse it without closing the body,
		// and the member's stream slot would never be released.
		stop()
		pc.close()
		if wdone != nil {
			<-wdone
		}
		m.Release()
		return nil, fmt.Errorf("proxy: backend switched to protocol %q, the request asked for %q", resp.Header.Get("Upgrade"), want)
	}
	if wdone != nil {
		select {
		case werr := <-wdone:
			if werr == errBodyWithheld {
				werr = errors.New("proxy: backend switched protocols before it asked for the request body")
			}
			if werr != nil {
				stop()
				pc.close()
				m.Release()
				return nil, werr
			}
		default:
			stop()
			pc.close()
			<-wdone
			m.Release()
			return nil, errors.New("proxy: backend switched protocols before reading the request body")
		}
	}
	u := &upgradedConn{pc: pc, m: m}
	stop()
	// Whatever the proxy does with the switch, the end of the request releases it
	// (ReverseProxy closes it itself when it carried the connection; Close is idempotent).
	context.AfterFunc(req.Context(), func() { _ = u.Close() })
	resp.Body = u
	return resp, nil
}

// memberBody is a response body read from a member. Its end decides the stream's fate:
// read to EOF with the request fully written → back to the pool; anything else → closed.
type memberBody struct {
	pc          *memberConn
	m           *group.Member
	body        io.ReadCloser
	wdone       chan error
	stop        func() bool
	upload      *bodyReader // the request body being written, or nil
	abortUpload func()      // ends a blocked read of the public request body
	reusable    bool
	once        sync.Once
}

func (b *memberBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.finish(true)
	}
	return n, err
}

func (b *memberBody) Close() error {
	b.finish(false)
	return nil
}

func (b *memberBody) finish(eof bool) {
	b.once.Do(func() {
		// stop fails when the client already went away and the stream was closed.
		stopped := b.stop()
		reuse := stopped && eof && b.reusable
		// complete: the exchange ended as it should, both ways; a stream that is not kept
		// then needs no reset, only closing (Connection: close, say).
		complete := stopped && eof
		withheld := false
		if b.wdone != nil {
			complete = false
			select {
			case err := <-b.wdone:
				reuse = reuse && err == nil
				complete = stopped && eof && err == nil
				withheld = err == errBodyWithheld
				b.wdone = nil
			default:
				if reuse && b.upload.complete() {
					// The whole body was read and the backend answered it: the writer is
					// finishing its last write. The stream is kept if that ends soon
					// (without the wait, a third of the streams of requests with a body
					// were lost to this race, and new ones opened).
					if err, ok := waitWriter(b.wdone); ok {
						reuse = err == nil
						complete = reuse
						b.wdone = nil
						break
					}
				}
				reuse = false
			}
		}
		if !reuse {
			if complete {
				b.pc.closeIdle()
			} else {
				b.pc.close()
			}
			if withheld {
				// The client was never asked for its body, and nothing will read it now:
				// end the public server's wait for it at once (the connection closes after
				// the answer, as net/http does for an Expect it did not honour).
				b.abortUpload()
			}
			if b.wdone != nil {
				if !b.upload.done.Load() {
					// The writer may be waiting for the public client's next body bytes
					// (the backend answered before reading them all), or for the
					// backend's 100: stop that read too.
					b.abortUpload()
				}
				<-b.wdone
			}
		} else {
			b.pc.t.pool.put(b.pc)
		}
		b.m.Release()
	})
}

// writerGrace bounds memberBody's wait for a request writer that read its whole body.
const writerGrace = 100 * time.Millisecond

// waitWriter waits up to writerGrace for the writer's result on wdone; ok is false when it
// did not come.
func waitWriter(wdone chan error) (err error, ok bool) {
	t := time.NewTimer(writerGrace)
	defer t.Stop()
	select {
	case err := <-wdone:
		return err, true
	case <-t.C:
		return nil, false
	}
}

// upgradedConn is the backend side of a connection that switched protocols (WebSocket): it
// stays on its member until closed.
type upgradedConn struct {
	pc   *memberConn
	m    *group.Member
	once sync.Once
}

func (u *upgradedConn) Read(p []byte) (int, error)  { return u.pc.br.Read(p) }
func (u *upgradedConn) Write(p []byte) (int, error) { return u.pc.st.Write(p) }
func (u *upgradedConn) Close() error {
	u.once.Do(func() {
		u.pc.close()
		u.m.Release()
	})
	return nil
}

// bodyReader remembers why reading a request body failed, and whether it was read to the end.
type bodyReader struct {
	io.ReadCloser
	err    error        // read by the writer goroutine's owner after it finished, or once failed is set
	done   atomic.Bool  // the body was read to its end
	failed atomic.Bool  // reading the body failed (set before the writer closes the stream)
	closed atomic.Bool  // Close was called: a read failing after it is not the client's doing
	length int64        // the body's announced length; -1 or 0: unknown
	read   atomic.Int64 // bytes read
}

// complete reports whether the whole body was read: to its end, or as many bytes as it
// announced (Request.Write reads the end of such a body only after writing its last bytes).
func (b *bodyReader) complete() bool {
	return b.done.Load() || b.length > 0 && b.read.Load() >= b.length
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.read.Add(int64(n))
	switch {
	case err == io.EOF:
		b.done.Store(true)
	case err != nil && !b.closed.Load() && err != errHoldRefused:
		b.err = err
		b.failed.Store(true)
	}
	return n, err
}

// Close closes the body; the HTTP/2 transport closes it when the backend reset the stream,
// possibly while a read is in progress.
func (b *bodyReader) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

// expectContinueTimeout is how long an HTTP/1.1 member's exchange waits for the backend's
// 100 Continue before it sends the body anyway, as the h2c members' transport does
// (h2Transport's ExpectContinueTimeout) and net/http's own default client. Tests change it.
var expectContinueTimeout = time.Second

// errBodyWithheld is a request body that was never sent: the backend gave its final answer
// before it asked for it (Expect: 100-continue), or the exchange ended first.
var errBodyWithheld = errors.New("proxy: the backend answered before it asked for the request body")

// expectsContinue reports whether h asks for 100 Continue before the body.
func expectsContinue(h http.Header) bool { return hasToken(h, "Expect", "100-continue") }

// hasToken reports whether a comma-separated list in h's field name holds token.
func hasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), token) {
				return true
			}
		}
	}
	return false
}

// h2ExpectsContinue reports whether body, a public HTTP/2 request's body as net/http's server
// made it, is to send 100 Continue on its first read: that server takes the Expect header off
// the request and keeps only this mark, unexported. It is read by reflection, before the body
// is first read (which clears it); a body of another kind, or a net/http that keeps it
// elsewhere, reads as false, and the edge then answers 100 itself when it starts reading.
func h2ExpectsContinue(body io.Reader) bool {
	v := reflect.ValueOf(body)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return false
	}
	f := v.Elem().FieldByName("needsContinue")
	return f.IsValid() && f.Kind() == reflect.Bool && f.Bool()
}

// continueGate is the decision whether a request body that waits for 100 Continue is sent:
// yes when the backend answers 100 or the wait times out, no when it answers anything final
// first or the exchange ends. The first decision stands.
type continueGate struct {
	once    sync.Once
	decided chan struct{}
	send    bool // written before decided is closed
	timeout time.Duration
}

func newContinueGate() *continueGate {
	return &continueGate{decided: make(chan struct{}), timeout: expectContinueTimeout}
}

// decide settles the gate, unless it was settled before. A nil gate ignores it.
func (g *continueGate) decide(send bool) {
	if g == nil {
		return
	}
	g.once.Do(func() {
		g.send = send
		close(g.decided)
	})
}

// wait blocks until the gate is settled, settling it to send when the timeout passes first,
// and returns the decision.
func (g *continueGate) wait() bool {
	t := time.NewTimer(g.timeout)
	defer t.Stop()
	select {
	case <-g.decided:
	case <-t.C:
		g.decide(true)
	}
	<-g.decided
	return g.send
}

// withheld reports whether the gate was settled not to send. A nil gate never is.
func (g *continueGate) withheld() bool {
	if g == nil {
		return false
	}
	select {
	case <-g.decided:
		return !g.send
	default:
		return false
	}
}

// gatedBody is a request body held back by a continueGate: its first read waits for the
// gate (the request head has been written and flushed by then), and fails with
// errBodyWithheld when the body is not to be sent.
type gatedBody struct {
	io.ReadCloser
	gate   *continueGate
	passed bool
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if !b.passed {
		if !b.gate.wait() {
			return 0, errBodyWithheld
		}
		b.passed = true
	}
	return b.ReadCloser.Read(p)
}
