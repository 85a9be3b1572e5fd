package proxy

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
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
// the read-ahead would not start).
type aheadBody struct {
	body  io.ReadCloser
	w     *stallWatch
	state atomic.Int32
	read  int64 // bytes read from body before the read-ahead started
	// late: the watch charged the response without the read-ahead's answer; the read-ahead
	// ends at its next bytes.
	late atomic.Bool

	mu     sync.Mutex
	cond   sync.Cond // signalled when the read-ahead buffers bytes or ends
	buf    *[probeChunk]byte
	off    int   // buf[off:filled] is buffered, not yet read
	filled int   // bytes the read-ahead took
	done   bool  // the read-ahead ended
	err    error // the body's error (io.EOF: its end) met by the read-ahead
	closed bool
}

// wrap makes b the reader of body for the watch w.
func (b *aheadBody) wrap(body io.ReadCloser, w *stallWatch) {
	b.body, b.w = body, w
	b.cond.L = &b.mu
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
	b.mu.Lock()
	for b.off == b.filled && !b.done {
		b.cond.Wait()
	}
	if b.off < b.filled {
		n := copy(p, b.buf[b.off:b.filled])
		b.off += n
		b.mu.Unlock()
		return n, nil
	}
	err := b.err
	b.releaseBuf()
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	b.state.Store(bodyIdle) // the read-ahead is over: back to direct reads
	return b.Read(p)
}

// releaseBuf gives the read-ahead's buffer back. b.mu is held.
func (b *aheadBody) releaseBuf() {
	if b.buf != nil {
		probeBufs.Put(b.buf)
		b.buf = nil
	}
}

// Close closes the body, which ends a read of it in progress, and waits for the read-ahead
// to end.
func (b *aheadBody) Close() error {
	if b.state.Load() != bodyAhead {
		return b.body.Close()
	}
	err := b.body.Close()
	b.mu.Lock()
	b.closed = true
	for !b.done {
		b.cond.Wait()
	}
	b.releaseBuf()
	b.mu.Unlock()
	return err
}

// probe readies the read-ahead, unless the body is being read, and reports whether it did;
// readAhead is then to be called.
func (b *aheadBody) probe() bool {
	if b.body == nil || !b.state.CompareAndSwap(bodyIdle, bodyAhead) {
		return false
	}
	b.buf = probeBufs.Get().(*[probeChunk]byte)
	return true
}

// readAhead reads the body into b.buf until its end, an error, a full buffer or Close, or
// (once the watch charged the response without its answer) bytes without its end, then
// tells the watch what it learnt. It is called once, after probe, by the watch's check.
func (b *aheadBody) readAhead() {
	b.mu.Lock()
	for {
		dst := b.buf[b.filled:probeChunk]
		b.mu.Unlock()
		n, err := b.body.Read(dst)
		b.mu.Lock()
		b.filled += n
		b.err = err
		if err != nil || b.filled == probeChunk || b.closed || n > 0 && b.late.Load() {
			break
		}
		b.cond.Broadcast()
	}
	b.done = true
	ended := b.err != nil
	total := b.read + int64(b.filled)
	b.cond.Broadcast()
	b.mu.Unlock()
	b.w.probed(ended, total)
}

// canProbe reports whether a write of the response blocked for its grace may wait for a
// read-ahead of its body before it is charged: its length is unknown, it has a body to
// read ahead and the stall timeout (if any) leaves room for the wait. w.mu is held.
func (w *stallWatch) canProbe() bool {
	t := w.h.cfg.ResponseStallTimeout
	return w.length < 0 && w.body.body != nil && !w.probeUsed && (t <= 0 || t-w.grace() > probeWait)
}

// wrap makes the watch read resp's body, when its length is unknown, for a read-ahead
// when a write of it stalls. A switch of protocols keeps its body: the reverse proxy
// carries the connection on it.
func (w *stallWatch) wrap(resp *http.Response) {
	if resp.ContentLength >= 0 || resp.Body == nil || resp.Body == http.NoBody ||
		resp.StatusCode == http.StatusSwitchingProtocols {
		return
	}
	w.mu.Lock()
	w.body.wrap(resp.Body, w)
	w.mu.Unlock()
	resp.Body = &w.body
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
