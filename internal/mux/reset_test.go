package mux

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	waitFor = 5 * time.Second
	tick    = time.Millisecond
)

// TestResetsEndTrackedStreams: a reset ends the context of the stream it names, with cause
// ErrStreamReset, and no other; a stream done with (untracked) is not reset any more.
func TestResetsEndTrackedStreams(t *testing.T) {
	var r Resets
	a, untrackA := r.Track(context.Background(), 2)
	b, untrackB := r.Track(context.Background(), 4)
	defer untrackB()
	require.Equal(t, 2, r.Len())

	r.Reset([]uint32{2})
	<-a.Done()
	require.ErrorIs(t, context.Cause(a), ErrStreamReset)
	require.NoError(t, b.Err())

	untrackB()
	require.Zero(t, r.Len())
	require.ErrorIs(t, context.Cause(b), context.Canceled, "untrack ends the context, not as a reset")
	require.False(t, errors.Is(context.Cause(b), ErrStreamReset))
	untrackA() // after the reset: harmless
}

// TestResetsBeforeTheStreamIsTracked: a reset that overtakes its stream (the reset frame read
// before the accept loop took the stream) ends the stream as soon as it is tracked; resets
// for streams already done with, or long gone, are not kept.
func TestResetsBeforeTheStreamIsTracked(t *testing.T) {
	var r Resets
	_, untrack := r.Track(context.Background(), 2)
	untrack()
	r.Reset([]uint32{2, 6}) // 2 is done with; 6 is on its way
	ctx4, untrack4 := r.Track(context.Background(), 4)
	defer untrack4()
	require.NoError(t, ctx4.Err(), "4 was not reset")
	ctx6, untrack6 := r.Track(context.Background(), 6)
	defer untrack6()
	require.ErrorIs(t, context.Cause(ctx6), ErrStreamReset)
	require.Empty(t, r.early, "the early reset was used")

	// An early reset for a stream that never arrives (refused by yamux's backlog) is
	// dropped once a later stream is tracked.
	r.Reset([]uint32{8})
	_, untrack10 := r.Track(context.Background(), 10)
	defer untrack10()
	require.Empty(t, r.early)
}

// TestResetsEarlyBounded: a peer naming streams that never come cannot grow the table past
// maxEarlyResets.
func TestResetsEarlyBounded(t *testing.T) {
	var r Resets
	ids := make([]uint32, 0, maxEarlyResets+100)
	for i := range maxEarlyResets + 100 {
		ids = append(ids, uint32(2*i+2))
	}
	r.Reset(ids)
	require.Len(t, r.early, maxEarlyResets)
}

// TestResetSenderBatches: resets queued while a send is under way go out together, in
// order, at most maxResetsPerSend in one send; the goroutine stops when the queue is empty.
func TestResetSenderBatches(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	release := make(chan struct{})
	var mu sync.Mutex
	var sent [][]uint32
	s := &ResetSender{
		Send: func(ids []uint32) error {
			mu.Lock()
			sent = append(sent, append([]uint32(nil), ids...))
			first := len(sent) == 1
			mu.Unlock()
			if first {
				<-release // the first send blocks while more resets are queued
			}
			return nil
		},
		Go: func(f func()) bool { wg.Go(f); return true },
	}
	s.Reset(1)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(sent) == 1 }, waitFor, tick)
	for id := uint32(2); id < 2+maxResetsPerSend+5; id++ {
		s.Reset(id)
	}
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, sent, 3)
	require.Equal(t, []uint32{1}, sent[0])
	require.Len(t, sent[1], maxResetsPerSend)
	require.Len(t, sent[2], 5)
	require.Equal(t, uint32(2), sent[1][0])
	require.Equal(t, uint32(2+maxResetsPerSend+4), sent[2][4])
	require.Zero(t, s.Dropped())
}

// TestResetSenderBounded: a peer that stops reading its control stream costs at most
// maxQueuedResets queued IDs; the rest are counted as dropped, and so are those of a send
// that failed.
func TestResetSenderBounded(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	stuck := make(chan struct{})
	s := &ResetSender{
		Send: func([]uint32) error { <-stuck; return errors.New("session closed") },
		Go:   func(f func()) bool { wg.Go(f); return true },
	}
	for id := range uint32(maxQueuedResets + 10) {
		s.Reset(id)
	}
	s.mu.Lock()
	queued := len(s.ids)
	s.mu.Unlock()
	require.LessOrEqual(t, queued, maxQueuedResets)
	close(stuck)
	wg.Wait()
	require.Equal(t, uint64(maxQueuedResets+10), s.Dropped())

	refused := &ResetSender{Send: func([]uint32) error { return nil }, Go: func(func()) bool { return false }}
	refused.Reset(1)
	require.Equal(t, uint64(1), refused.Dropped())
}
