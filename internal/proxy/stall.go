package proxy

import (
	"hash/maphash"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/throttle"
)

// Responses whose public client does not keep up.
//
// The reverse proxy relays a response body in turns: it reads a chunk (at most 64 KiB) from
// the member, then writes it to the public client. While a write to the client blocks,
// nothing is read from the member, which goes on sending until its stream's receive window
// is full. So a response whose client stopped reading holds at the edge up to that window:
// mux.StreamWindow (4 MiB) for an HTTP/1.1 member, whose yamux stream tops its window up to
// that on every read and cannot be given a smaller one; h2StreamWindow (1 MiB) for a
// request to an h2c member. A yamux receive buffer grows by doubling, and the garbage
// collector lets the heap reach twice what is live, so one such response costs about three
// times its window in resident memory (12 MB measured for 4 MiB). Nothing in the copy loop
// can lower that per response; what is bounded is how many there are and for how long:
//
//   - a response is stalled while a write of it to the client has been blocked for longer
//     than stallGrace. It is then charged what it may hold at the edge (its window, or the
//     rest of its body when that is known and smaller; a body of unknown length is first
//     read ahead, up to 16 KiB for up to 100 ms, to learn whether its member has already
//     finished it: stall_ahead.go) against three budgets: its public
//     connection's (Config.StalledBytesPerConn), its client address's
//     (Config.StalledBytesPerClient; an IPv4 address or an IPv6 /64, as throttle.Key: the
//     connection's remote address, never a forwarding header) and the edge's
//     (Config.StalledBytes). The charge lasts until that write finishes or the response
//     ends. A response whose charge would exceed a budget is cut at once: the responses
//     already stalled keep their place, the newcomer goes;
//   - a response whose write to the client has been blocked for Config.ResponseStallTimeout
//     is cut, budget or not (nginx's send_timeout: the time between two successful writes).
//
// Cutting a response sets its write deadline in the past (the server's SetWriteDeadline, as
// http.ResponseController calls it): the blocked write fails, the reverse proxy aborts the
// handler (http.ErrAbortHandler) and closes the member's response body, which closes the
// member's stream (memberBody.Close, memberConn.close) or resets the request on an h2c
// member's connection. An HTTP/1.x client loses its connection, whose response cannot end
// cleanly any more; an HTTP/2 client loses that stream only (RST_STREAM INTERNAL_ERROR), the
// rest of its connection goes on. What the member's yamux stream received is freed once the
// connector ends its side of the stream too: closing ends only the edge's side, and until
// the connector learns of it the stream goes on filling its window.
//
// The watch costs a request two uncontended locks of its own per write, and a timer once
// its body outgrows what net/http buffers (serverBuffered), armed at a write when none is
// pending; a body of unknown length costs an atomic compare-and-swap and a store per read;
// the read-ahead and the budgets are touched only by stalled responses, under locks sharded by
// client address. An HTTP/1.x response also sets its connection's write deadline once, as
// the handler returns (endResponse).

// stallGrace is how long a write to a public client may block before its response counts
// as stalled. A write that blocks at all means the client's TCP send buffer or HTTP/2 flow
// window is full, and from then on the member refills the response's window at the edge:
// 4 MiB take 50 ms at 80 MB/s, a fast member link, and a response cut then has held that
// much until its member's stream ends. So the grace is short, to let few bytes in before a
// budget is consulted (in the attacks on loopback, a grace of 50 ms let the responses
// cut hold about twice what 20 ms let them). A client that only pauses, whose buffer drains
// within the grace, is never counted; one counted is cut only over a budget or at the stall
// timeout: a slow but steady client is charged while each of its writes waits, and released
// when the write goes through.
const stallGrace = 20 * time.Millisecond

// cutReason is why a response was cut; notCut: it was not.
type cutReason uint8

const (
	notCut cutReason = iota
	cutStallTimeout
	cutConnBudget
	cutClientBudget
	cutEdgeBudget
)

// String is the reason's metric label and log value.
func (r cutReason) String() string {
	switch r {
	case cutStallTimeout:
		return "stall_timeout"
	case cutConnBudget:
		return "conn_budget"
	case cutClientBudget:
		return "ip_budget"
	case cutEdgeBudget:
		return "edge_budget"
	}
	return "none"
}

// CutCounts counts the responses cut because their public client did not keep up, by rule.
type CutCounts struct {
	// StallTimeout: a write to the client was blocked for Config.ResponseStallTimeout.
	StallTimeout atomic.Uint64
	// ConnBudget, ClientBudget, EdgeBudget: the response stalled while its connection's,
	// its client address's or the edge's stalled responses already held their budget.
	ConnBudget, ClientBudget, EdgeBudget atomic.Uint64
}

// ByReason returns the counts by the reason's metric label: stall_timeout, conn_budget,
// ip_budget, edge_budget.
func (c *CutCounts) ByReason() map[string]uint64 {
	return map[string]uint64{
		cutStallTimeout.String(): c.StallTimeout.Load(),
		cutConnBudget.String():   c.ConnBudget.Load(),
		cutClientBudget.String(): c.ClientBudget.Load(),
		cutEdgeBudget.String():   c.EdgeBudget.Load(),
	}
}

func (c *CutCounts) add(r cutReason) {
	switch r {
	case cutStallTimeout:
		c.StallTimeout.Add(1)
	case cutConnBudget:
		c.ConnBudget.Add(1)
	case cutClientBudget:
		c.ClientBudget.Add(1)
	case cutEdgeBudget:
		c.EdgeBudget.Add(1)
	}
}

// stallShards is how many locks the per-address budgets are spread over.
const stallShards = 32

// stallLedger holds the budgets of stalled responses: bytes charged per connection, per
// client address and in all. It is touched only when a response stalls or recovers.
type stallLedger struct {
	perConn, perClient, total int64 // caps in bytes; 0: none
	held                      atomic.Int64
	seed                      maphash.Seed
	shards                    [stallShards]stallShard
}

type stallShard struct {
	mu      sync.Mutex
	clients map[throttle.Key]*clientStalls // only addresses with a charge
}

// clientStalls is what one client address's stalled responses are charged, in all and by
// connection (its remote address, "ip:port").
type clientStalls struct {
	held  int64
	conns map[string]int64
}

func newStallLedger(perConn, perClient, total int64) *stallLedger {
	l := &stallLedger{perConn: max(perConn, 0), perClient: max(perClient, 0), total: max(total, 0), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].clients = map[throttle.Key]*clientStalls{}
	}
	return l
}

func (l *stallLedger) shard(key throttle.Key) *stallShard {
	return &l.shards[maphash.Comparable(l.seed, key)%stallShards]
}

// charge charges n bytes to conn (a remote address), its client address key and the edge,
// unless that would take one of them over its budget: then it charges nothing and returns
// that budget's cutReason. A connection whose address is not an IP address (key is zero)
// counts toward the edge's budget only.
func (l *stallLedger) charge(key throttle.Key, conn string, n int64) cutReason {
	if held := l.held.Add(n); l.total > 0 && held > l.total {
		l.held.Add(-n)
		return cutEdgeBudget
	}
	if key.IsZero() || l.perConn == 0 && l.perClient == 0 {
		return notCut
	}
	s := l.shard(key)
	s.mu.Lock()
	c := s.clients[key]
	reason := notCut
	switch {
	case l.perClient > 0 && c != nil && c.held+n > l.perClient, l.perClient > 0 && n > l.perClient:
		reason = cutClientBudget
	case l.perConn > 0 && c != nil && c.conns[conn]+n > l.perConn, l.perConn > 0 && n > l.perConn:
		reason = cutConnBudget
	default:
		if c == nil {
			c = &clientStalls{conns: map[string]int64{}}
			s.clients[key] = c
		}
		c.held += n
		c.conns[conn] += n
	}
	s.mu.Unlock()
	if reason != notCut {
		l.held.Add(-n)
	}
	return reason
}

// release takes back a charge of n bytes made with the same key and conn.
func (l *stallLedger) release(key throttle.Key, conn string, n int64) {
	l.held.Add(-n)
	if key.IsZero() || l.perConn == 0 && l.perClient == 0 {
		return
	}
	s := l.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.clients[key]
	if c == nil {
		return
	}
	c.held -= n
	if left := c.conns[conn] - n; left > 0 {
		c.conns[conn] = left
	} else {
		delete(c.conns, conn)
	}
	if c.held <= 0 {
		delete(s.clients, key)
	}
}

// StalledBytes is what the responses whose client is not keeping up are charged now.
func (h *HTTP) StalledBytes() int64 { return h.stalls.held.Load() }

// stallWatch is a public response's writer as the reverse proxy sees it: it times each
// write to the client and applies the stall rules above. Its zero value watches nothing
// until start.
type stallWatch struct {
	http.ResponseWriter
	h      *HTTP
	remote string // the public connection's remote address

	mu       sync.Mutex
	timer    *time.Timer // runs check; made at the first write
	armed    bool        // a check is scheduled or running
	writing  bool        // a write to the client is in progress
	writes   uint64      // writes begun
	watching uint64      // the write the scheduled check is about
	stalled  bool        // that write has been blocked for stallGrace
	charged  int64       // what the budgets hold for it
	key      throttle.Key
	written  int64 // body bytes written to the client
	window   int64 // what the member may hold unread: its stream's receive window (0: no member)
	length   int64 // the response body's length; -1: unknown
	ended    bool  // the handler returned: the response writer is not to be touched
	wasStall bool  // the response stalled at some point
	cut      cutReason

	// body is the member's body of unknown length, which a stalled write may read ahead
	// (stall_ahead.go); its body is nil otherwise.
	body    aheadBody
	probing bool // the check of the write being watched waits for the read-ahead
}

// start makes w watch rw, a response to a client at remote.
func (w *stallWatch) start(h *HTTP, rw http.ResponseWriter, remote string) {
	w.ResponseWriter, w.h, w.remote, w.length = rw, h, remote, -1
}

// expect tells the watch what the member's response may hold at the edge: window, its
// stream's receive window, and length, its body's length (-1: unknown).
func (w *stallWatch) expect(window, length int64) {
	w.mu.Lock()
	w.window, w.length = window, length
	w.mu.Unlock()
}

// windowOf is what a member exchange may hold of one response that nobody reads.
func windowOf(x exchange) int64 {
	if _, ok := x.(*h2Exchange); ok {
		return h2StreamWindow
	}
	return mux.StreamWindow
}

// Unwrap lets http.ResponseController reach the server's own ResponseWriter.
func (w *stallWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *stallWatch) Write(p []byte) (int, error) {
	w.begin(len(p))
	n, err := w.ResponseWriter.Write(p)
	w.end(n)
	return n, err
}

// WriteHeader watches an interim (1xx) response, which goes out at once; a final one only
// sets the head, which goes with the body.
func (w *stallWatch) WriteHeader(code int) {
	if code < 100 || code >= 200 {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.begin(-1)
	w.ResponseWriter.WriteHeader(code)
	w.end(0)
}

// FlushError watches a flush, which writes what the server buffers of the response: a
// small write waits there, and its flush is what blocks.
func (w *stallWatch) FlushError() error {
	w.begin(-1)
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.end(0)
	return err
}

// Flush is FlushError for callers that want an http.Flusher.
func (w *stallWatch) Flush() { _ = w.FlushError() }

// serverBuffered is what net/http holds of a response body before it writes any of it to
// the connection, until a flush or the handler's end: 2 KiB for HTTP/1.x (4 KiB for
// HTTP/2). A write that keeps the body within it cannot block, and is not timed: most
// responses are that small, and pay no timer.
const serverBuffered = 2 << 10

// begin notes a write of size body bytes starting (size -1: a flush, or an interim
// response, which go out at once) and schedules a check of it, unless one is scheduled.
func (w *stallWatch) begin(size int) {
	w.mu.Lock()
	w.writing = true
	w.writes++
	if !w.armed && !w.ended && (size < 0 || w.written+int64(size) > serverBuffered) {
		w.armed, w.watching, w.stalled = true, w.writes, false
		if w.timer == nil {
			w.timer = time.AfterFunc(w.grace(), w.check)
		} else {
			w.timer.Reset(w.grace())
		}
	}
	w.mu.Unlock()
}

// end notes a write that finished (n bytes of body): a response that was stalled is not
// any more, and its charge goes back to the budgets.
func (w *stallWatch) end(n int) {
	w.mu.Lock()
	w.writing = false
	w.written += int64(n)
	charged := w.charged
	w.charged = 0
	if w.stalled {
		// The check pending is the stall timeout of the write that just finished: the
		// next write gets a grace of its own.
		w.stalled = false
		if w.armed && w.timer.Stop() {
			w.armed = false
		}
	}
	w.mu.Unlock()
	if charged > 0 {
		w.h.stalls.release(w.key, w.remote, charged)
	}
}

// grace is stallGrace, or the stall timeout if shorter.
func (w *stallWatch) grace() time.Duration {
	if t := w.h.cfg.ResponseStallTimeout; t > 0 && t < stallGrace {
		return t
	}
	return stallGrace
}

// check runs when a write has had its grace, or its stall timeout: it charges a write still
// blocked after its grace, cuts one still blocked at the stall timeout or over a budget,
// and schedules the next check while a write is in progress. A write of a response of
// unknown length is charged once its body was read ahead, on check's goroutine (a timer's
// own), for probeWait at most.
func (w *stallWatch) check() {
	w.mu.Lock()
	probe := w.checkLocked()
	w.mu.Unlock()
	if probe {
		w.body.readAhead()
	}
}

// checkLocked is check with w.mu held; it reports true when the body is to be read ahead
// (the next check is scheduled at probeWait, unless the read-ahead's answer comes first).
func (w *stallWatch) checkLocked() (probe bool) {
	switch {
	case w.ended || !w.writing:
		w.armed, w.probing = false, false // the next write schedules a check
		return false
	case w.watching != w.writes:
		// A later write than the one this check was for: it gets its grace from now.
		w.watching, w.stalled, w.probing = w.writes, false, false
		w.timer.Reset(w.grace())
		return false
	case w.stalled:
		w.armed = false
		w.cutLocked(cutStallTimeout)
		return false
	case w.probing:
		// The read-ahead answered, or did not within probeWait: the write is charged on
		// what is known now.
		w.probing = false
		w.body.ra.late.Store(true)
	case w.canProbe() && w.body.probe(w.watching):
		// The member's body is read ahead before the write is charged a window.
		w.probing, w.wasStall = true, true
		w.timer.Reset(probeWait)
		return true
	}
	w.stalled, w.wasStall = true, true
	if n := w.holdable(); n > 0 {
		w.key = throttle.KeyOfString(w.remote)
		if reason := w.h.stalls.charge(w.key, w.remote, n); reason != notCut {
			w.armed = false
			w.cutLocked(reason)
			return false
		}
		w.charged = n
	}
	if t := w.h.cfg.ResponseStallTimeout; t > 0 {
		w.timer.Reset(max(t-w.blockedFor(), 0))
		return false
	}
	w.armed = false
	return false
}

// holdable is what the response may hold at the edge while its write is blocked: its
// member's window, or less when its body's rest is known to be shorter (the chunk being
// written is part of that rest). w.mu is held.
func (w *stallWatch) holdable() int64 {
	if w.length >= 0 {
		return min(w.window, max(w.length-w.written, 0))
	}
	return w.window
}

// cutLocked cuts the response: its blocked write fails at once. w.mu is held, so that the
// handler cannot return (and the server recycle the response writer) meanwhile.
func (w *stallWatch) cutLocked(reason cutReason) {
	w.cut = reason
	w.h.cfg.Stats.ResponsesCut.add(reason)
	w.h.cfg.Logger.Debug("response cut: its client is not keeping up",
		zap.String("reason", reason.String()), zap.String("client", w.remote),
		zap.Int64("written", w.written), zap.Int64("stalled_bytes", w.h.stalls.held.Load()))
	setWriteDeadline(w.ResponseWriter, pastTime)
}

// finish ends the watch when the handler returns: no check touches the response any more,
// and a charge still held goes back. It reports whether the response was cut, and whether
// it stalled at some point.
func (w *stallWatch) finish() (cut, stalled bool) {
	w.mu.Lock()
	w.ended = true
	if w.armed && w.timer.Stop() {
		w.armed = false
	}
	charged := w.charged
	w.charged = 0
	cut, stalled = w.cut != notCut, w.wasStall
	w.mu.Unlock()
	if charged > 0 {
		w.h.stalls.release(w.key, w.remote, charged)
	}
	return cut, stalled
}

// endResponse ends the watch of the response to r, if it had one (watch), when the handler
// returns, and bounds by the stall timeout what the server still writes of the response
// afterwards: net/http flushes what it buffers (up to 6 KiB for HTTP/1.x, 4 KiB for HTTP/2)
// with no deadline of its own, and for HTTP/1.x also when it closes the connection after an
// aborted handler. HTTP/1.x clears the deadline once the response is written; an HTTP/2
// stream's ends with the stream. A cut response keeps its deadline in the past.
func (h *HTTP) endResponse(w http.ResponseWriter, r *http.Request, watch *stallWatch) {
	cut, stalled := false, false
	if watch != nil {
		cut, stalled = watch.finish()
	}
	t := h.cfg.ResponseStallTimeout
	if t <= 0 || cut {
		return
	}
	// An HTTP/1.x deadline is a field of the connection's socket; an HTTP/2 stream's is a
	// message to the connection's goroutine and a timer, paid only by a response whose
	// client already fell behind once. (One that never did, and whose last bytes wait for
	// a window its client never grants, holds its stream until the connection ends.)
	if r.ProtoMajor == 1 || stalled {
		setWriteDeadline(w, time.Now().Add(t))
	}
}

// setWriteDeadline is http.ResponseController's SetWriteDeadline without its error for a
// writer that has none (a test's recorder), which costs an allocation a request.
func setWriteDeadline(w http.ResponseWriter, t time.Time) {
	for {
		switch x := w.(type) {
		case interface{ SetWriteDeadline(time.Time) error }:
			_ = x.SetWriteDeadline(t)
			return
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return
		}
	}
}
