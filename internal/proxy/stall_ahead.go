package proxy

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A response of unknown length whose write has been blocked for stallGrace may be one its
// member has already finished (a gRPC answer: a few bytes, then trailers), or one that
// goes on for gigabytes. Before it is charged a whole window, its body is read ahead (see
// stall.go): at most probeChunk bytes, on the goroutine of the check that found the write
// blocked (a timer's own), into a buffer that the reverse proxy's next reads drain. A body
// that ends within the chunk has a known rest, and is charged that; one that fills the
// chunk is charged its window at once, on the same goroutine (no later timer: the member
// goes on sending meanwhile); one that neither ends nor fills it within probeWait is
// charged its window then, and, should its end come later within the chunk, its charge
// comes down to its rest. A response is read ahead once at most. None of this costs a
// response that never stalls more than one atomic compare-and-swap and one store per read
// of its body: no goroutine, no buffer.

// probeChunk is the most the read-ahead of a stalled response takes of its member's body.
// A member that has finished usually has nothing left but its end (the reverse proxy's
// read took all that had come, up to 64 KiB), and one that goes on fills it at once: a
// larger chunk would tell a few more finished responses apart, at the cost of what every
// stalled response reads ahead (and its member then sends more).
const probeChunk = 16 << 10

// probeBufs holds the read-ahead buffers.
var probeBufs = sync.Pool{New: func() any { return new([probeChunk]byte) }}

// probeWait is how long a stalled response of unknown length waits for its read-ahead to
// end (its body's end, or probeChunk bytes) before it is charged its window. A member that
// sends a large body fills the chunk at once and is charged at once, so this wait matters
// only to a member that sends little or nothing meanwhile: then its stream holds little.
// It is long beside stallGrace because a machine whose CPU is so scarce that a healthy
// client's write waits stallGrace delays as much the goroutines that bring the member's
// last bytes (its transport's reader) to the read-ahead.
const probeWait = 5 * stallGrace

// States of an aheadBody.
const (
	bodyIdle    int32 = iota // nobody reads the body
	bodyReading              // the reverse proxy reads it directly
	bodyAhead                // a read-ahead was started: reads go through its buffer
)

// aheadBody is a member's response body of unknown length as the reverse proxy reads it,
// which the response's stall watch may read ahead (probe). Only the reverse proxy's
// goroutine calls Read and Close; probe is called by the watch while that goroutine is
// blocked in a write of the response (were it in Read, as when another goroutine flushes,
// the read-ahead would not start). It is part of the watch, itself part of the request's
// context: what only a read-ahead needs is allocated when one starts.
type aheadBody struct {
	body  io.ReadCloser
	w     *stallWatch
	state atomic.Int32
	read  int64      // bytes read from body before the read-ahead started
	ra    *readAhead // the read-ahead, once started
}

// readAhead is the state of a body's read-ahead.
type readAhead struct {
	// late: the watch charged the response without the read-ahead's answer; the read-ahead
	// ends at its next bytes.
	late  atomic.Bool
	write uint64    // the write of the response that stalled
	at    time.Time // when it started

	mu     sync.Mutex
	cond   sync.Cond // signalled when the read-ahead buffers bytes or ends
	buf    *[probeChunk]byte
	off    int   // buf[off:filled] is buffered, not yet read
	filled int   // bytes the read-ahead took
	done   bool  // the read-ahead ended
	err    error // the body's error (io.EOF: its end) met by the read-ahead
	closed bool
}

func (b *aheadBody) Read(p []byte) (int, error) {
	if b.state.CompareAndSwap(bodyIdle, bodyReading) {
		n, err := b.body.Read(p)
		b.read += int64(n)
		b.state.Store(bodyIdle)
		return n, err
	}
	return b.readBuffered(p)
}

// readBuffered reads what the read-ahead took, waiting for it while it reads; once it has
// ended and its buffer is drained, reads go to the body again.
func (b *aheadBody) readBuffered(p []byte) (int, error) {
	ra := b.ra
	ra.mu.Lock()
	for ra.off == ra.filled && !ra.done {
		ra.cond.Wait()
	}
	if ra.off < ra.filled {
		n := copy(p, ra.buf[ra.off:ra.filled])
		ra.off += n
		ra.mu.Unlock()
		return n, nil
	}
	err := ra.err
	ra.releaseBuf()
	ra.mu.Unlock()
	if err != nil {
		return 0, err
	}
	b.state.Store(bodyIdle) // the read-ahead is over: back to direct reads
	return b.Read(p)
}

// releaseBuf gives the read-ahead's buffer back. ra.mu is held.
func (ra *readAhead) releaseBuf() {
	if ra.buf != nil {
		probeBufs.Put(ra.buf)
		ra.buf = nil
	}
}

// Close closes the body, which ends a read of it in progress, and waits for the read-ahead
// to end.
func (b *aheadBody) Close() error {
	if b.state.Load() != bodyAhead {
		return b.body.Close()
	}
	err := b.body.Close()
	ra := b.ra
	ra.mu.Lock()
	ra.closed = true
	for !ra.done {
		ra.cond.Wait()
	}
	ra.releaseBuf()
	ra.mu.Unlock()
	return err
}

// probe readies a read-ahead for the stalled write number write, unless the body is being
// read or was read ahead already, and reports whether it did; readAhead is then to be
// called.
func (b *aheadBody) probe(write uint64) bool {
	if b.body == nil || b.ra != nil {
		return false
	}
	// Set before the state says so: Read and Close find it by the state.
	b.ra = &readAhead{write: write, at: time.Now(), buf: probeBufs.Get().(*[probeChunk]byte)}
	b.ra.cond.L = &b.ra.mu
	if !b.state.CompareAndSwap(bodyIdle, bodyAhead) {
		probeBufs.Put(b.ra.buf)
		b.ra = nil
		return false
	}
	return true
}

// readAhead reads the body into the read-ahead's buffer until its end, an error, a full
// buffer or Close, or (once the watch charged the response without its answer) bytes
// without its end, then tells the watch what it learnt. It is called once, after probe, by
// the watch's check.
func (b *aheadBody) readAhead() {
	ra := b.ra
	ra.mu.Lock()
	for {
		dst := ra.buf[ra.filled:probeChunk]
		ra.mu.Unlock()
		n, err := b.body.Read(dst)
		ra.mu.Lock()
		ra.filled += n
		ra.err = err
		if err != nil || ra.filled == probeChunk || ra.closed || n > 0 && ra.late.Load() {
			break
		}
		ra.cond.Broadcast()
	}
	ra.done = true
	ended := ra.err != nil
	total := b.read + int64(ra.filled)
	ra.cond.Broadcast()
	ra.mu.Unlock()
	b.w.probed(ended, total)
}

// canProbe reports whether a write of the response blocked for its grace may wait for a
// read-ahead of its body before it is charged: its length is unknown, it has a body to
// read ahead and the stall timeout (if any) leaves room for the wait. w.mu is held.
func (w *stallWatch) canProbe() bool {
	t := w.h.cfg.ResponseStallTimeout
	return w.length < 0 && w.body.body != nil && w.body.ra == nil && (t <= 0 || t-w.grace() > probeWait)
}

// expectResponse is expect for resp, whose body, when its length is unknown, the watch
// then reads (for a read-ahead should a write of it stall). A switch of protocols keeps its
// body: the reverse proxy carries the connection on it.
func (w *stallWatch) expectResponse(window int64, resp *http.Response) {
	wrap := resp.ContentLength < 0 && resp.Body != nil && resp.Body != http.NoBody &&
		resp.StatusCode != http.StatusSwitchingProtocols
	w.mu.Lock()
	w.window, w.length = window, resp.ContentLength
	if wrap {
		w.body.body, w.body.w = resp.Body, w
	}
	w.mu.Unlock()
	if wrap {
		resp.Body = &w.body
	}
}

// blockedFor is how long the stalled write being watched has been blocked, past its grace
// (the wait for its read-ahead). w.mu is held.
func (w *stallWatch) blockedFor() time.Duration {
	d := w.grace()
	if ra := w.body.ra; ra != nil && ra.write == w.watching {
		d += time.Since(ra.at)
	}
	return d
}

// probed takes the read-ahead's answer: ended, the body's end was reached, and it has total
// bytes in all. A check waiting for it runs now; a response already charged without it is
// charged no more than its rest.
func (w *stallWatch) probed(ended bool, total int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ended {
		w.length = total
	}
	if w.ended {
		return
	}
	if w.probing {
		if w.armed && w.timer.Stop() {
			// The check scheduled at probeWait will not run: it runs now, on this
			// goroutine (a timer's hop more would let the member send that much more).
			w.checkLocked()
		}
		return
	}
	if n := w.holdable(); w.stalled && w.charged > n {
		w.h.stalls.release(w.key, w.remote, w.charged-n)
		w.charged = n
	}
}
