package wan

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// verdicter hands queued packets back to the kernel.
type verdicter interface {
	// acceptUpTo lets every still-queued packet with an id up to lastID through.
	acceptUpTo(lastID uint32) error
	// drop discards one packet.
	drop(id uint32) error
}

// held is one packet waiting for its release time.
type held struct {
	id  uint32
	due time.Time
}

// counters are the scheduler's statistics.
type counters struct {
	seen        atomic.Uint64 // packets handed to the scheduler
	released    atomic.Uint64 // accepted after their delay (or at stop)
	lost        atomic.Uint64 // dropped on purpose (loss)
	overflow    atomic.Uint64 // dropped because the scheduler's queue was full
	verdictErrs atomic.Uint64 // verdicts the kernel did not take
	lateMax     atomic.Int64  // the largest release lateness (ns) past a packet's due time
	late1ms     atomic.Uint64 // releases (batches) more than 1 ms past their due time
	releases    atomic.Uint64 // releases (batches)
}

// stats is a snapshot of counters plus the kernel's own drop counts.
type stats struct {
	Seen, Released, Lost, Overflow, VerdictErrs uint64
	// LateMax is the longest a packet stayed past its due time (this process did not get
	// the CPU in time: the machine is overloaded); Late1ms counts releases more than 1 ms
	// late. Both add to the delay the link simulates.
	LateMax           time.Duration
	Late1ms, Releases uint64
	// KernelDropped and KernelUserDropped are nfnetlink_queue's counts for the queue:
	// packets dropped because the queue was full, and because they could not be sent to
	// this process (its socket buffer was full).
	KernelDropped, KernelUserDropped uint64
}

// unwanted is the number of packets lost beyond the configured loss.
func (s stats) unwanted() uint64 {
	return s.Overflow + s.VerdictErrs + s.KernelDropped + s.KernelUserDropped
}

// scheduler holds packets for a fixed delay and releases them in arrival order.
// add is called from one goroutine (the queue reader); run is the releasing goroutine.
type scheduler struct {
	oneWay time.Duration
	loss   atomic.Uint64 // math.Float64bits of the share dropped; setLoss changes it
	rng    *rand.Rand    // used by add only, so from one goroutine
	v      verdicter
	in     chan held // capacity bounds memory: at most cap(in) packets held
	c      counters

	mu        sync.Mutex
	stopping  bool          // guarded by mu: after stop, add lets packets through at once
	quit      chan struct{} // closed by stop
	done      chan struct{} // closed when run returns
	closeOnce sync.Once
}

func newScheduler(oneWay time.Duration, loss float64, capacity int, v verdicter, seed uint64) *scheduler {
	s := &scheduler{
		oneWay: oneWay,
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		v:      v,
		in:     make(chan held, capacity),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	s.setLoss(loss)
	return s
}

// setLoss changes the share of packets dropped from now on; safe while add runs.
func (s *scheduler) setLoss(loss float64) { s.loss.Store(math.Float64bits(loss)) }

// add takes one packet that arrived at now.
func (s *scheduler) add(id uint32, now time.Time) {
	s.c.seen.Add(1)
	if loss := math.Float64frombits(s.loss.Load()); loss > 0 && s.rng.Float64() < loss {
		s.verdict(s.v.drop(id), &s.c.lost)
		return
	}
	// The lock orders add against stop: a packet is either queued before stop (and
	// flushed by run) or let through here after it, never left behind in the queue.
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		s.verdict(s.v.acceptUpTo(id), &s.c.released)
		return
	}
	select {
	case s.in <- held{id: id, due: now.Add(s.oneWay)}:
		s.mu.Unlock()
	default:
		s.mu.Unlock()
		s.verdict(s.v.drop(id), &s.c.overflow)
	}
}

// verdict counts one verdict under ok, or as an error.
func (s *scheduler) verdict(err error, ok *atomic.Uint64) {
	if err != nil {
		s.c.verdictErrs.Add(1)
		return
	}
	ok.Add(1)
}

// release accepts a run of n packets ending with lastID.
func (s *scheduler) release(lastID uint32, n uint64) {
	if err := s.v.acceptUpTo(lastID); err != nil {
		s.c.verdictErrs.Add(n)
		return
	}
	s.c.released.Add(n)
}

// run releases every packet when its time has come, until stop; then it releases the
// packets still held at once and returns.
func (s *scheduler) run() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var head held
	have := false
	for {
		if !have {
			select {
			case head = <-s.in:
				have = true
			case <-s.quit:
				s.flush(held{}, false)
				return
			}
		}
		if wait := time.Until(head.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-s.quit:
				timer.Stop()
				s.flush(head, true)
				return
			}
		}
		// head is due; so may be the packets behind it (they arrived later, so they are
		// due later: the queue is ordered by due time and released in one batch).
		last, n := head.id, uint64(1)
		have = false
		now := time.Now()
		if late := int64(now.Sub(head.due)); late > s.c.lateMax.Load() {
			s.c.lateMax.Store(late) // only run writes it
		}
		s.c.releases.Add(1)
		if now.Sub(head.due) > time.Millisecond {
			s.c.late1ms.Add(1)
		}
	drain:
		for {
			select {
			case h := <-s.in:
				if h.due.After(now) {
					head, have = h, true
					break drain
				}
				last, n = h.id, n+1
			default:
				break drain
			}
		}
		s.release(last, n)
	}
}

// flush releases head (when have) and everything queued behind it.
func (s *scheduler) flush(head held, have bool) {
	var last uint32
	var n uint64
	if have {
		last, n = head.id, 1
	}
	for {
		select {
		case h := <-s.in:
			last, n = h.id, n+1
		default:
			if n > 0 {
				s.release(last, n)
			}
			return
		}
	}
}

// stop makes add let packets through at once, releases what is held and waits for run
// to return. Safe to call more than once.
func (s *scheduler) stop() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.stopping = true
		s.mu.Unlock()
		close(s.quit)
	})
	<-s.done
}

// snapshot returns the counters.
func (s *scheduler) snapshot() stats {
	return stats{
		Seen:        s.c.seen.Load(),
		Released:    s.c.released.Load(),
		Lost:        s.c.lost.Load(),
		Overflow:    s.c.overflow.Load(),
		VerdictErrs: s.c.verdictErrs.Load(),
		LateMax:     time.Duration(s.c.lateMax.Load()),
		Late1ms:     s.c.late1ms.Load(),
		Releases:    s.c.releases.Load(),
	}
}
