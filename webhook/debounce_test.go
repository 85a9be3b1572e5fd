package webhook

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDebouncerFiresOnceOnFallToZero(t *testing.T) {
	d := NewDebouncer()
	require.False(t, d.Observe("web", 2), "2 of 2 healthy is not an edge")
	require.False(t, d.Observe("web", 1), "1 of 2 healthy must not fire")
	require.True(t, d.Observe("web", 0), "0 of 2 after being healthy must fire")
	require.False(t, d.Observe("web", 0), "a repeated 0 must not re-fire")
	require.False(t, d.Observe("web", 0))
}

func TestDebouncerRecoveryAndSecondFall(t *testing.T) {
	d := NewDebouncer()
	d.Observe("web", 1)
	require.True(t, d.Observe("web", 0))
	require.False(t, d.Observe("web", 1), "recovery alone must not fire")
	require.False(t, d.Observe("web", 2))
	require.True(t, d.Observe("web", 0), "a second fall fires afresh")
}

func TestDebouncerFlappingFiresOncePerDownwardEdge(t *testing.T) {
	d := NewDebouncer()
	fired := 0
	for _, h := range []int{1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 2, 0} {
		if d.Observe("web", h) {
			fired++
		}
	}
	require.Equal(t, 4, fired)
}

func TestDebouncerNeverHealthyGroupDoesNotFire(t *testing.T) {
	d := NewDebouncer()
	require.False(t, d.Observe("cold", 0), "a pool that never came up did not transition to 0")
	require.False(t, d.Observe("cold", 0))
	require.False(t, d.Observe("cold", 1))
	require.True(t, d.Observe("cold", 0), "after its first healthy member, a fall fires")
}

func TestDebouncerNegativeCountIsZero(t *testing.T) {
	d := NewDebouncer()
	d.Observe("web", 1)
	require.True(t, d.Observe("web", -1))
	require.False(t, d.Observe("web", 0))
}

func TestDebouncerGroupsAreIndependent(t *testing.T) {
	d := NewDebouncer()
	d.Observe("a", 1)
	d.Observe("b", 1)
	require.True(t, d.Observe("a", 0))
	require.True(t, d.Observe("b", 0), "b's edge is not debounced by a's")
}

func TestDebouncerForget(t *testing.T) {
	d := NewDebouncer()
	d.Observe("web", 1)
	d.Forget("web")
	require.False(t, d.Observe("web", 0), "a forgotten group starts as never-healthy")

	d.Observe("web", 1)
	require.True(t, d.Observe("web", 0))
	d.Forget("web")
	d.Forget("web") // forgetting twice (or an unknown group) is harmless
	d.Forget("unknown")
	d.Observe("web", 1)
	require.True(t, d.Observe("web", 0), "a re-created group fires on its own edge")
}

func TestDebouncerConcurrentObserve(t *testing.T) {
	d := NewDebouncer()
	const groups, goroutines = 8, 16
	for g := range groups {
		d.Observe("g"+strconv.Itoa(g), 3)
	}
	var fired [groups]atomic.Int32
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range groups {
				name := "g" + strconv.Itoa((g+i)%groups)
				if d.Observe(name, 0) {
					fired[(g+i)%groups].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for g := range groups {
		require.Equal(t, int32(1), fired[g].Load(), "group g%d must fire exactly once", g)
	}
}
