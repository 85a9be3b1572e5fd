package dispatch

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// loads is a fixed set of candidates.
type loads []int64

func (l loads) Len() int         { return len(l) }
func (l loads) Load(i int) int64 { return l[i] }

// live is a set of candidates whose loads change while picks run.
type live []atomic.Int64

func (l live) Len() int         { return len(l) }
func (l live) Load(i int) int64 { return l[i].Load() }

func TestNew(t *testing.T) {
	s, err := New("")
	require.NoError(t, err)
	require.IsType(t, &LeastStreams{}, s, "least_streams is the default")
	s, err = New("random")
	require.NoError(t, err)
	require.IsType(t, Random{}, s)
	_, err = New("round_robin")
	require.ErrorContains(t, err, `unknown strategy "round_robin"`)
}

func TestEmptyAndSingle(t *testing.T) {
	for _, s := range []Strategy{Random{}, new(LeastStreams)} {
		require.Equal(t, -1, s.Pick(loads{}))
		require.Equal(t, 0, s.Pick(loads{42}))
	}
}

func TestLeastStreamsPicksFewest(t *testing.T) {
	s := new(LeastStreams)
	for range 20 {
		require.Equal(t, 2, s.Pick(loads{3, 5, 1, 4}))
	}
	require.Equal(t, 3, s.Pick(loads{3, 5, 1, 0}))
}

func TestLeastStreamsRotatesTies(t *testing.T) {
	s := new(LeastStreams)
	var got []int
	for range 6 {
		got = append(got, s.Pick(loads{0, 0}))
	}
	// Sequential requests to two idle members alternate.
	for i := 1; i < len(got); i++ {
		require.NotEqual(t, got[i-1], got[i], "picks %v do not alternate", got)
	}

	// Ties among the least loaded only: member 1 (load 2) is never chosen.
	counts := make([]int, 3)
	for range 300 {
		counts[s.Pick(loads{0, 2, 0})]++
	}
	require.Zero(t, counts[1])
	require.Equal(t, 150, counts[0])
	require.Equal(t, 150, counts[2])
}

func TestLeastStreamsBalancesLiveLoad(t *testing.T) {
	// Each pick takes a stream on the chosen member and holds it: least-streams must keep
	// the members within one stream of each other.
	s := new(LeastStreams)
	c := make(live, 5)
	for range 103 {
		c[s.Pick(c)].Add(1)
	}
	lo, hi := c[0].Load(), c[0].Load()
	for i := range c {
		lo, hi = min(lo, c[i].Load()), max(hi, c[i].Load())
	}
	require.LessOrEqual(t, hi-lo, int64(1), "loads %v", c)
}

func TestRandomIsRoughlyUniform(t *testing.T) {
	const n, picks = 4, 40000
	counts := make([]int, n)
	for range picks {
		counts[Random{}.Pick(loads{0, 9, 0, 9})]++
	}
	for i, c := range counts {
		// Expected 10000 each; 6 standard deviations is ±520.
		require.InDelta(t, picks/n, c, 600, "member %d got %d of %d", i, c, picks)
	}
}

func TestConcurrentPicksStayInRange(t *testing.T) {
	for _, s := range []Strategy{Random{}, new(LeastStreams)} {
		c := make(live, 7)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 2000 {
					i := s.Pick(c)
					if i < 0 || i >= c.Len() {
						t.Errorf("pick %d out of range", i)
						return
					}
					c[i].Add(1)
					c[i].Add(-1)
				}
			})
		}
		wg.Wait()
	}
}

func TestPickAllocatesNothing(t *testing.T) {
	var c Candidates = make(loads, 16)
	for _, s := range []Strategy{Random{}, new(LeastStreams)} {
		allocs := testing.AllocsPerRun(1000, func() { s.Pick(c) })
		require.Zero(t, allocs, "%T", s)
	}
}

func BenchmarkPick(b *testing.B) {
	for _, name := range []string{NameLeastStreams, NameRandom} {
		for _, n := range []int{1, 16, 1024} {
			l := make(live, n)
			for i := range l {
				l[i].Store(int64(i % 3))
			}
			var c Candidates = l
			s, _ := New(name)
			b.Run(fmt.Sprintf("%s/members=%d/serial", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					s.Pick(c)
				}
			})
			b.Run(fmt.Sprintf("%s/members=%d/parallel", name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						s.Pick(c)
					}
				})
			})
		}
	}
}
