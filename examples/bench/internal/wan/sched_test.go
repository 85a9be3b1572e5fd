package wan

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeVerdicter records verdicts as the kernel would apply them.
type fakeVerdicter struct {
	mu       sync.Mutex
	queued   []uint32             // ids waiting for a verdict, in arrival order
	accepted map[uint32]time.Time // id -> when it was let through
	order    []uint32             // ids in the order they were let through
	dropped  []uint32
	event    chan struct{}
}

func newFakeVerdicter() *fakeVerdicter {
	return &fakeVerdicter{accepted: map[uint32]time.Time{}, event: make(chan struct{}, 1)}
}

func (f *fakeVerdicter) enqueue(id uint32) {
	f.mu.Lock()
	f.queued = append(f.queued, id)
	f.mu.Unlock()
}

func (f *fakeVerdicter) acceptUpTo(lastID uint32) error {
	f.mu.Lock()
	now := time.Now()
	rest := f.queued[:0]
	for _, id := range f.queued {
		if id <= lastID {
			f.accepted[id] = now
			f.order = append(f.order, id)
		} else {
			rest = append(rest, id)
		}
	}
	f.queued = rest
	f.mu.Unlock()
	select {
	case f.event <- struct{}{}:
	default:
	}
	return nil
}

func (f *fakeVerdicter) drop(id uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, q := range f.queued {
		if q == id {
			f.queued = append(f.queued[:i], f.queued[i+1:]...)
			break
		}
	}
	f.dropped = append(f.dropped, id)
	return nil
}

func (f *fakeVerdicter) acceptedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.order)
}

// waitAccepted waits for n accepted packets (each acceptUpTo signals event).
func (f *fakeVerdicter) waitAccepted(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for f.acceptedCount() < n {
		select {
		case <-f.event:
		case <-deadline:
			t.Fatalf("only %d of %d packets released", f.acceptedCount(), n)
		}
	}
}

func TestSchedulerHoldsEachPacketForTheDelayInOrder(t *testing.T) {
	const oneWay = 20 * time.Millisecond
	f := newFakeVerdicter()
	s := newScheduler(oneWay, 0, 1024, f, 1)
	go s.run()
	defer s.stop()

	arrived := map[uint32]time.Time{}
	const n = 300
	for i := uint32(1); i <= n; i++ {
		now := time.Now()
		arrived[i] = now
		f.enqueue(i)
		s.add(i, now)
		if i%50 == 0 {
			time.Sleep(3 * time.Millisecond) // spread arrivals over several release batches
		}
	}
	f.waitAccepted(t, n)
	// The fake sees a batch before run counts it; stop waits for run to return, so the
	// counters are complete after it.
	s.stop()

	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.order, n)
	for i, id := range f.order {
		require.Equal(t, uint32(i+1), id, "packets must leave in arrival order")
		require.GreaterOrEqual(t, f.accepted[id].Sub(arrived[id]), oneWay, "packet %d left early", id)
	}
	require.Empty(t, f.dropped)
	st := s.snapshot()
	require.Equal(t, uint64(n), st.Seen)
	require.Equal(t, uint64(n), st.Released)
	require.Zero(t, st.unwanted())
}

func TestSchedulerDropsTheConfiguredShare(t *testing.T) {
	f := newFakeVerdicter()
	s := newScheduler(time.Millisecond, 0.25, 1<<15, f, 42)
	go s.run()
	const n = 20000
	for i := uint32(1); i <= n; i++ {
		f.enqueue(i)
		s.add(i, time.Now())
	}
	st := s.snapshot()
	share := float64(st.Lost) / n
	require.InDelta(t, 0.25, share, 0.02, "lost %d of %d", st.Lost, n)
	f.waitAccepted(t, n-int(st.Lost))
	s.stop()
	st = s.snapshot()
	require.Equal(t, uint64(n), st.Released+st.Lost)
	require.Zero(t, st.unwanted(), "deliberate loss is not an unwanted drop")
	require.Len(t, f.dropped, int(st.Lost))
}

func TestSchedulerCountsOverflowAndReleasesHeldPacketsOnStop(t *testing.T) {
	f := newFakeVerdicter()
	s := newScheduler(time.Hour, 0, 4, f, 1)
	go s.run()
	for i := uint32(1); i <= 10; i++ {
		f.enqueue(i)
		s.add(i, time.Now())
	}
	// run takes one packet as its head, so 5 fit (4 queued + head) at most, 4 at least.
	st := s.snapshot()
	require.GreaterOrEqual(t, st.Overflow, uint64(5))
	require.LessOrEqual(t, st.Overflow, uint64(6))
	require.Zero(t, f.acceptedCount(), "nothing is due within the hour")

	s.stop() // returns only once run has released what it held and ended
	st = s.snapshot()
	require.Equal(t, uint64(10), st.Released+st.Overflow)
	require.Equal(t, int(st.Released), f.acceptedCount())
	require.Equal(t, st.Overflow, st.unwanted())

	// After stop, packets go through at once.
	f.enqueue(11)
	s.add(11, time.Now())
	require.Equal(t, int(st.Released)+1, f.acceptedCount())
	s.stop() // idempotent
}

func TestSchedulerSetLossTakesEffectAtOnce(t *testing.T) {
	f := newFakeVerdicter()
	s := newScheduler(time.Millisecond, 0, 1<<15, f, 7)
	go s.run()
	const n = 10000
	for i := uint32(1); i <= n; i++ {
		f.enqueue(i)
		s.add(i, time.Now())
	}
	require.Zero(t, s.snapshot().Lost, "no loss asked for yet")
	s.setLoss(0.03)
	for i := uint32(n + 1); i <= 2*n; i++ {
		f.enqueue(i)
		s.add(i, time.Now())
	}
	lost := s.snapshot().Lost
	require.InDelta(t, 0.03, float64(lost)/n, 0.01, "lost %d of %d", lost, n)
	s.setLoss(0)
	for i := uint32(2*n + 1); i <= 3*n; i++ {
		f.enqueue(i)
		s.add(i, time.Now())
	}
	require.Equal(t, lost, s.snapshot().Lost, "loss back to 0")
	f.waitAccepted(t, 3*n-int(lost))
	s.stop()
}
