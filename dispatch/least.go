package dispatch

import (
	"math/bits"
	"sync/atomic"
)

// golden is 2^64 divided by the golden ratio: multiplying a counter by it (mod 2^64) gives the
// fractional parts of counter·φ in 0.64 fixed point, a low-discrepancy (Weyl) sequence.
const golden = 0x9E3779B97F4A7C15

// LeastStreams picks the member with the fewest active streams per unit of weight: member i
// beats member j when Load(i)/Weight(i) < Load(j)/Weight(j) (compared exactly, without
// division).
//
// Ties are rotated: every pick that meets a tie advances a counter. When all tied members
// weigh the same, the pick takes the tied member at position counter mod k (k tied members),
// so sequential requests to equally idle members strictly alternate instead of all landing on
// the first. When tied weights differ, the fractional part of counter·φ (the golden ratio),
// scaled to the total tied weight, selects a member along the cumulative weights: over many
// picks each tied member's share is proportional to its weight, and picks interleave rather
// than going to one member in long runs.
//
// The zero value is ready to use. A LeastStreams must not be copied after first use.
type LeastStreams struct {
	next atomic.Uint64
}

// Pick implements Strategy.
func (s *LeastStreams) Pick(c Candidates) int {
	n := c.Len()
	switch {
	case n <= 0:
		return -1
	case n == 1:
		return 0
	}
	t := leastPerWeight(c, n)
	if t.count == 1 {
		return t.first
	}
	turn := s.next.Add(1) - 1
	if t.sameWeight {
		return t.nth(c, n, int(turn%uint64(t.count)))
	}
	target, _ := bits.Mul64(turn*golden, uint64(t.tiedWeight))
	return t.atWeight(c, n, int64(target))
}

// ties describes the members sharing the lowest load per unit of weight.
type ties struct {
	first      int   // index of the first of them
	load       int64 // the first one's load
	weight     int64 // the first one's weight
	count      int   // how many there are
	tiedWeight int64 // the sum of their weights
	sameWeight bool  // whether they all weigh the same
}

// leastPerWeight finds the members of c with the lowest load per unit of weight.
func leastPerWeight(c Candidates, n int) ties {
	l, w := loadOf(c, 0), weightOf(c, 0)
	t := ties{first: 0, load: l, weight: w, count: 1, tiedWeight: w, sameWeight: true}
	for i := 1; i < n; i++ {
		l, w := loadOf(c, i), weightOf(c, i)
		switch cmpPerWeight(l, w, t.load, t.weight) {
		case -1:
			t = ties{first: i, load: l, weight: w, count: 1, tiedWeight: w, sameWeight: true}
		case 0:
			t.count++
			t.tiedWeight += w
			t.sameWeight = t.sameWeight && w == t.weight
		}
	}
	return t
}

// tied reports whether member i (read again now) still ties with t.
func (t *ties) tied(c Candidates, i int) (bool, int64) {
	w := weightOf(c, i)
	return cmpPerWeight(loadOf(c, i), w, t.load, t.weight) == 0, w
}

// nth returns the k-th tied member (from 0). Loads move while we look; if the k-th is gone
// by now, the first tied member seen is as good an answer.
func (t *ties) nth(c Candidates, n, k int) int {
	for i := t.first; i < n; i++ {
		if ok, _ := t.tied(c, i); ok {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return t.first
}

// atWeight returns the tied member whose span of the cumulative tied weights contains target
// (0 <= target < t.tiedWeight). If loads or weights moved and no span contains it, the first
// tied member seen is returned.
func (t *ties) atWeight(c Candidates, n int, target int64) int {
	var cum int64
	for i := t.first; i < n; i++ {
		if ok, w := t.tied(c, i); ok {
			cum += w
			if target < cum {
				return i
			}
		}
	}
	return t.first
}
