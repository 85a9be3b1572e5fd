package dispatch

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// loads is a fixed set of equally weighted candidates (weight 100, the edge's weight for a
// declared 1), identified by their index.
type loads []int64

func (l loads) Len() int          { return len(l) }
func (l loads) Load(i int) int64  { return l[i] }
func (l loads) Weight(int) int    { return 100 }
func (l loads) Hash(i int) uint64 { return uint64(i) }

// pool is a fixed set of candidates with explicit weights and identity hashes. Nil weights
// mean 100 each; nil hashes mean the member's index.
type pool struct {
	loads   []int64
	weights []int
	hashes  []uint64
}

func (p *pool) Len() int         { return len(p.loads) }
func (p *pool) Load(i int) int64 { return p.loads[i] }

func (p *pool) Weight(i int) int {
	if p.weights == nil {
		return 100
	}
	return p.weights[i]
}

func (p *pool) Hash(i int) uint64 {
	if p.hashes == nil {
		return uint64(i)
	}
	return p.hashes[i]
}

// live is a set of candidates whose loads and weights change while picks run.
type live struct {
	loads   []atomic.Int64
	weights []atomic.Int64
}

// newLive returns n idle members of weight 100.
func newLive(n int) *live {
	l := &live{loads: make([]atomic.Int64, n), weights: make([]atomic.Int64, n)}
	for i := range l.weights {
		l.weights[i].Store(100)
	}
	return l
}

func (l *live) Len() int          { return len(l.loads) }
func (l *live) Load(i int) int64  { return l.loads[i].Load() }
func (l *live) Weight(i int) int  { return int(l.weights[i].Load()) }
func (l *live) Hash(i int) uint64 { return uint64(i) * 0x9E3779B97F4A7C15 }

// String shows the loads in failure messages.
func (l *live) String() string {
	s := make([]int64, len(l.loads))
	for i := range l.loads {
		s[i] = l.loads[i].Load()
	}
	return fmt.Sprint(s)
}

// strategies returns one fresh instance of every built-in strategy.
func strategies() []Strategy {
	return []Strategy{Random{}, new(LeastStreams), new(Rendezvous)}
}

// share is counts[i] as a fraction of all counts.
func share(counts []int, i int) float64 {
	total := 0
	for _, c := range counts {
		total += c
	}
	return float64(counts[i]) / float64(total)
}

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
	for _, s := range strategies() {
		require.Equal(t, -1, s.Pick(loads{}), "%T", s)
		require.Equal(t, 0, s.Pick(loads{42}), "%T", s)
	}
	r := new(Rendezvous)
	require.Equal(t, -1, r.PickKey(loads{}, 7))
	require.Equal(t, 0, r.PickKey(loads{42}, 7))
}

// A buggy Candidates (weights below 1, negative loads, absurd values) never makes a pick
// panic or leave the range, and a weight below 1 counts as 1.
func TestBadCandidates(t *testing.T) {
	bad := []*pool{
		{loads: []int64{0, 0}, weights: []int{0, -3}},
		{loads: []int64{-5, 2, -1}, weights: []int{1, math.MinInt, math.MaxInt}},
		{loads: []int64{math.MaxInt64, math.MaxInt64, math.MinInt64}, weights: []int{math.MaxInt, 1, 0}},
	}
	for _, c := range bad {
		for _, s := range strategies() {
			for k := range 50 {
				i := s.Pick(c)
				require.True(t, i >= 0 && i < c.Len(), "%T picked %d of %v", s, i, c)
				i = new(Rendezvous).PickKey(c, uint64(k))
				require.True(t, i >= 0 && i < c.Len(), "rendezvous picked %d of %v", i, c)
			}
		}
	}
	// Weights 0 and -3 both count as 1: equal weights, so least-streams strictly alternates.
	s := new(LeastStreams)
	prev := s.Pick(bad[0])
	for range 5 {
		next := s.Pick(bad[0])
		require.NotEqual(t, prev, next)
		prev = next
	}
	// Loads near the int64 limit times the largest weight do not overflow the comparison
	// (naive int64 cross products would wrap around here).
	const half = math.MaxInt64 / 2 // (MaxInt64-1)/10000 == half/5000
	require.Equal(t, 1, s.Pick(&pool{loads: []int64{math.MaxInt64, math.MaxInt64 - 1}, weights: []int{10000, 10000}}))
	require.Equal(t, 1, s.Pick(&pool{loads: []int64{1 << 62, 1}, weights: []int{10000, 10000}}))               // 2^62*10000 wraps to 0
	require.Equal(t, 1, s.Pick(&pool{loads: []int64{math.MaxInt64/10000 + 1, 3}, weights: []int{100, 10000}})) // wraps negative
	require.Equal(t, 0, s.Pick(&pool{loads: []int64{3, math.MaxInt64/10000 + 1}, weights: []int{10000, 100}})) // both orders
	require.Equal(t, 1, s.Pick(&pool{loads: []int64{math.MaxInt64, half}, weights: []int{10000, 5000}}))
	require.Equal(t, 0, s.Pick(&pool{loads: []int64{math.MaxInt64 - 2, half}, weights: []int{10000, 5000}}))
	tied := &pool{loads: []int64{math.MaxInt64 - 1, half}, weights: []int{10000, 5000}}
	seen := map[int]bool{}
	for range 10 {
		seen[s.Pick(tied)] = true
	}
	require.Len(t, seen, 2, "the two members tie")
}

func TestLeastStreamsPicksFewest(t *testing.T) {
	s := new(LeastStreams)
	for range 20 {
		require.Equal(t, 2, s.Pick(loads{3, 5, 1, 4}))
	}
	require.Equal(t, 3, s.Pick(loads{3, 5, 1, 0}))
}

// Least-streams compares load per unit of weight, not raw load.
func TestLeastStreamsPicksLowestLoadPerWeight(t *testing.T) {
	for _, tc := range []struct {
		name    string
		loads   []int64
		weights []int
		want    []int // the members allowed to be picked
	}{
		{"4/300 > 1/100", []int64{4, 1}, []int{300, 100}, []int{1}},
		{"2/300 < 1/100", []int64{2, 1}, []int{300, 100}, []int{0}},
		{"3/300 == 1/100 ties", []int64{3, 1}, []int{300, 100}, []int{0, 1}},
		{"2/300 > 0/100", []int64{2, 0}, []int{300, 100}, []int{1}},
		{"raw load loses to weight", []int64{5, 2, 9}, []int{100, 100, 1000}, []int{2}},
		{"slow start lowers the weight", []int64{1, 3}, []int{10, 100}, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := new(LeastStreams)
			seen := map[int]bool{}
			for range 40 {
				i := s.Pick(&pool{loads: tc.loads, weights: tc.weights})
				require.Contains(t, tc.want, i)
				seen[i] = true
			}
			require.Len(t, seen, len(tc.want), "every tied member gets picks")
		})
	}
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

	// Equal but non-default weights (and equal non-zero load per weight) still rotate strictly.
	c := &pool{loads: []int64{6, 9, 6, 6}, weights: []int{300, 300, 300, 300}}
	got = got[:0]
	for range 9 {
		got = append(got, s.Pick(c))
	}
	for i := 3; i < len(got); i++ {
		require.Equal(t, got[i-3], got[i], "picks %v do not cycle over the 3 tied members", got)
	}
	require.ElementsMatch(t, []int{0, 2, 3}, got[:3])
}

// Ties between members of different weights are split in proportion to weight, interleaved.
func TestLeastStreamsWeightedTies(t *testing.T) {
	const picks = 2000
	for _, tc := range []struct {
		name    string
		weights []int
		maxRun  []int // the longest run of consecutive picks allowed per member
	}{
		{"3:1", []int{300, 100}, []int{6, 2}},
		{"1:1:2", []int{100, 100, 200}, []int{2, 2, 3}},
		{"1:3 reversed", []int{100, 300}, []int{2, 6}},
		{"slow start 7:100", []int{7, 100}, []int{1, 40}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := new(LeastStreams)
			c := &pool{loads: make([]int64, len(tc.weights)), weights: tc.weights}
			counts := make([]int, len(tc.weights))
			runs := make([]int, len(tc.weights))
			prev, run := -1, 0
			for range picks {
				i := s.Pick(c)
				counts[i]++
				if i == prev {
					run++
				} else {
					prev, run = i, 1
				}
				runs[i] = max(runs[i], run)
			}
			total := 0
			for _, w := range tc.weights {
				total += w
			}
			for i, w := range tc.weights {
				want := float64(w) / float64(total)
				t.Logf("member %d: weight %d, %d picks (%.2f%%, want %.2f%%), longest run %d",
					i, w, counts[i], 100*share(counts, i), 100*want, runs[i])
				require.InDelta(t, want, share(counts, i), 0.05, "member %d", i)
				require.LessOrEqual(t, runs[i], tc.maxRun[i], "member %d: picks do not interleave", i)
			}
		})
	}
}

func TestLeastStreamsBalancesLiveLoad(t *testing.T) {
	// Each pick takes a stream on the chosen member and holds it: least-streams must keep
	// the members within one stream of each other.
	s := new(LeastStreams)
	c := newLive(5)
	for range 103 {
		c.loads[s.Pick(c)].Add(1)
	}
	lo, hi := c.Load(0), c.Load(0)
	for i := range c.Len() {
		lo, hi = min(lo, c.Load(i)), max(hi, c.Load(i))
	}
	require.LessOrEqual(t, hi-lo, int64(1), "loads %v", c)
}

func TestLeastStreamsBalancesLiveLoadByWeight(t *testing.T) {
	// Held streams on members weighing 3:1: the loads settle at 3:1 too.
	s := new(LeastStreams)
	c := newLive(2)
	c.weights[0].Store(300)
	for range 400 {
		c.loads[s.Pick(c)].Add(1)
	}
	require.InDelta(t, 300, c.Load(0), 1, "loads %v", c)
	require.InDelta(t, 100, c.Load(1), 1, "loads %v", c)
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

func TestRandomIsWeighted(t *testing.T) {
	const picks = 20000
	for _, tc := range []struct {
		name    string
		weights []int
	}{
		{"3:1", []int{300, 100}},
		{"1:1:2", []int{100, 100, 200}},
		{"1:3 with load", []int{100, 300}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &pool{loads: make([]int64, len(tc.weights)), weights: tc.weights}
			c.loads[0] = 50 // random ignores load
			counts := make([]int, len(tc.weights))
			for range picks {
				counts[Random{}.Pick(c)]++
			}
			total := 0
			for _, w := range tc.weights {
				total += w
			}
			for i, w := range tc.weights {
				want := float64(w) / float64(total)
				t.Logf("member %d: weight %d, %.2f%% of picks (want %.2f%%)", i, w, 100*share(counts, i), 100*want)
				// One standard deviation is at most 0.35%; ±2% is more than 5.
				require.InDelta(t, want, share(counts, i), 0.02, "member %d", i)
			}
		})
	}
}

func TestConcurrentPicksStayInRange(t *testing.T) {
	for _, s := range strategies() {
		c := newLive(7)
		stop := make(chan struct{})
		var churn sync.WaitGroup
		// Weights change under the picks, including to values a buggy Candidates might give.
		churn.Go(func() {
			ws := []int64{100, 300, 0, -1, 10000, 1, 7}
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				c.weights[k%7].Store(ws[k%len(ws)])
			}
		})
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for range 2000 {
					i := s.Pick(c)
					if kd, ok := s.(Keyed); ok && r.IntN(2) == 0 {
						i = kd.PickKey(c, r.Uint64())
					}
					if i < 0 || i >= c.Len() {
						t.Errorf("%T: pick %d out of range", s, i)
						return
					}
					c.loads[i].Add(1)
					c.loads[i].Add(-1)
				}
			})
		}
		wg.Wait()
		close(stop)
		churn.Wait()
	}
}

func TestPickAllocatesNothing(t *testing.T) {
	for _, c := range []Candidates{
		make(loads, 16),
		&pool{loads: []int64{0, 3, 1, 0, 2, 0, 5, 0}, weights: []int{300, 100, 200, 100, 100, 700, 100, 50}},
	} {
		for _, s := range strategies() {
			allocs := testing.AllocsPerRun(1000, func() { s.Pick(c) })
			require.Zero(t, allocs, "%T.Pick on %T", s, c)
		}
		r := new(Rendezvous)
		var key uint64
		allocs := testing.AllocsPerRun(1000, func() { key++; r.PickKey(c, key) })
		require.Zero(t, allocs, "Rendezvous.PickKey on %T", c)
	}
	var sink uint64
	allocs := testing.AllocsPerRun(1000, func() { sink += HashString("203.0.113.7:51234") })
	require.Zero(t, allocs, "HashString")
	require.NotZero(t, sink)
}

// benchPool is n members with mixed loads and, when weighted, mixed weights.
func benchPool(n int, weighted bool) *pool {
	p := &pool{loads: make([]int64, n), weights: make([]int, n), hashes: make([]uint64, n)}
	for i := range n {
		p.loads[i] = int64(i % 3)
		p.weights[i] = 100
		if weighted {
			p.weights[i] = 100 * (1 + i%3)
		}
		p.hashes[i] = HashString(fmt.Sprint("member-", i))
	}
	return p
}

func BenchmarkPick(b *testing.B) {
	for _, name := range []string{NameLeastStreams, NameRandom} {
		for _, n := range []int{1, 16, 1024} {
			c := newLive(n)
			for i := range c.loads {
				c.loads[i].Store(int64(i % 3))
			}
			s, _ := New(name)
			benchStrategy(b, fmt.Sprintf("%s/members=%d", name, n), s, c)
		}
	}
	for _, name := range []string{NameLeastStreams, NameRandom} {
		for _, n := range []int{8, 16, 1024} {
			s, _ := New(name)
			benchStrategy(b, fmt.Sprintf("%s/weighted/members=%d", name, n), s, benchPool(n, true))
		}
	}
	// All idle with unequal weights: every least-streams pick takes the weighted-tie path.
	benchStrategy(b, "least_streams/weighted-ties/members=8", new(LeastStreams),
		&pool{loads: make([]int64, 8), weights: []int{100, 200, 300, 100, 200, 300, 100, 200}})
}

// benchStrategy runs s.Pick(c) serially and in parallel.
func benchStrategy(b *testing.B, name string, s Strategy, c Candidates) {
	b.Run(name+"/serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.Pick(c)
		}
	})
	b.Run(name+"/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.Pick(c)
			}
		})
	})
}

func BenchmarkPickKey(b *testing.B) {
	for _, n := range []int{1, 8, 16, 1024} {
		for _, weighted := range []bool{false, true} {
			c := benchPool(n, weighted)
			r := new(Rendezvous)
			b.Run(fmt.Sprintf("rendezvous/members=%d/weighted=%t/serial", n, weighted), func(b *testing.B) {
				b.ReportAllocs()
				var key uint64
				for b.Loop() {
					key++
					r.PickKey(c, key)
				}
			})
			b.Run(fmt.Sprintf("rendezvous/members=%d/weighted=%t/parallel", n, weighted), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					var key uint64
					for pb.Next() {
						key++
						r.PickKey(c, key)
					}
				})
			})
		}
	}
}

func BenchmarkHashString(b *testing.B) {
	b.ReportAllocs()
	var sink uint64
	for b.Loop() {
		sink += HashString("203.0.113.7:51234")
	}
	if sink == 0 {
		b.Fatal("no hash")
	}
}
