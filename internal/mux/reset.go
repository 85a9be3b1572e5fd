package mux

import (
	"context"
	"errors"
	"sync"
)

// ErrStreamReset is the cause of a stream context that Resets ended: the peer that opened the
// stream abandoned it.
var ErrStreamReset = errors.New("mux: the peer reset the stream")

// maxEarlyResets bounds the resets a Resets table keeps for streams it has not seen accepted
// yet. A reset overtakes its stream's accept only by the time between yamux queueing the stream
// and the accept loop taking it, so a handful is the norm; the bound only stops a broken peer
// from growing the table.
const maxEarlyResets = 4096

// Resets routes a peer's stream resets (wire.Reset, sent on another stream than the ones it
// names) to the streams this side accepted. yamux has no per-stream reset: the side that
// opened a stream can only half-close it, so the peer says "reset" in a frame of its own and
// this side ends the stream and what it is joined to.
//
// The accept loop calls Track for each stream in the order yamux hands them out, which is
// the order of their IDs: a reset for an ID above the last one tracked is for a stream still
// on its way to the accept loop, and is kept until that stream is tracked. The zero value is
// ready to use.
type Resets struct {
	mu    sync.Mutex
	live  map[uint32]context.CancelCauseFunc
	early map[uint32]struct{}
	last  uint32 // the highest ID tracked
}

// Track returns the context of accepted stream id, derived from parent; it ends with cause
// ErrStreamReset when the peer resets the stream (at once if the reset came first). Call
// untrack when the stream is done with.
func (r *Resets) Track(parent context.Context, id uint32) (ctx context.Context, untrack func()) {
	ctx, cancel := context.WithCancelCause(parent)
	r.mu.Lock()
	if id > r.last {
		r.last = id
	}
	_, reset := r.early[id]
	if len(r.early) > 0 {
		for e := range r.early {
			if e <= r.last {
				delete(r.early, e)
			}
		}
	}
	if !reset {
		if r.live == nil {
			r.live = make(map[uint32]context.CancelCauseFunc)
		}
		r.live[id] = cancel
	}
	r.mu.Unlock()
	if reset {
		cancel(ErrStreamReset)
		return ctx, func() {}
	}
	return ctx, func() {
		r.mu.Lock()
		delete(r.live, id)
		r.mu.Unlock()
		cancel(nil)
	}
}

// Reset ends the streams named by ids. An ID not tracked yet is remembered for its Track;
// one that was tracked and is done with is ignored.
func (r *Resets) Reset(ids []uint32) {
	var ends []context.CancelCauseFunc
	r.mu.Lock()
	for _, id := range ids {
		if cancel, ok := r.live[id]; ok {
			delete(r.live, id)
			ends = append(ends, cancel)
			continue
		}
		if id > r.last && len(r.early) < maxEarlyResets {
			if r.early == nil {
				r.early = make(map[uint32]struct{})
			}
			r.early[id] = struct{}{}
		}
	}
	r.mu.Unlock()
	for _, cancel := range ends {
		cancel(ErrStreamReset)
	}
}

// Len reports how many streams are tracked (for tests and metrics).
func (r *Resets) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

// maxQueuedResets bounds the resets a ResetSender holds while its frames are written. Past it
// a reset is dropped (and counted): its stream is then freed only by yamux's stream close
// timeout, as before resets existed. A peer that reads its control stream takes thousands a
// millisecond, so only a peer that stopped reading gets there.
const maxQueuedResets = 8192

// maxResetsPerSend is how many stream IDs one send carries at most (wire.MaxResetStreams).
const maxResetsPerSend = 1024

// ResetSender sends stream resets to the peer of a session, in batches, off the caller's
// goroutine: the caller is a request or connection ending, which must not wait on a control
// stream write (nor hold up the others that end at the same time). Its goroutine runs only
// while resets are queued.
type ResetSender struct {
	// Send writes one reset frame naming ids (at most 1024); an error ends the batch
	// (the session is ending, and its streams with it).
	Send func(ids []uint32) error
	// Go runs f on a goroutine its owner waits for, or reports false when the owner is
	// stopping (the resets are then dropped: the session ends with the owner).
	Go func(f func()) bool

	mu      sync.Mutex
	ids     []uint32
	running bool
	dropped uint64
}

// Reset queues a reset of stream id.
func (s *ResetSender) Reset(id uint32) {
	s.mu.Lock()
	if len(s.ids) >= maxQueuedResets {
		s.dropped++
		s.mu.Unlock()
		return
	}
	s.ids = append(s.ids, id)
	start := !s.running
	s.running = true
	s.mu.Unlock()
	if start && !s.Go(s.flush) {
		s.mu.Lock()
		s.dropped += uint64(len(s.ids))
		s.ids, s.running = nil, false
		s.mu.Unlock()
	}
}

// Dropped reports how many resets were never sent (queue full, or the session ending).
func (s *ResetSender) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

func (s *ResetSender) flush() {
	var batch []uint32
	for {
		s.mu.Lock()
		n := min(len(s.ids), maxResetsPerSend)
		if n == 0 {
			s.running = false
			s.ids = nil // an idle session keeps no queue
			s.mu.Unlock()
			return
		}
		batch = append(batch[:0], s.ids[:n]...)
		s.ids = append(s.ids[:0], s.ids[n:]...)
		s.mu.Unlock()
		if err := s.Send(batch); err != nil {
			s.mu.Lock()
			s.dropped += uint64(len(batch) + len(s.ids))
			s.ids, s.running = nil, false
			s.mu.Unlock()
			return
		}
	}
}
