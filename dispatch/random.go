package dispatch

import "math/rand/v2"

// Random picks a member at random in proportion to its weight, ignoring load; when all
// members weigh the same the pick is uniform. The zero value is ready to use, and a Random
// holds no state, so it may be copied freely.
type Random struct{}

// Pick implements Strategy.
func (Random) Pick(c Candidates) int {
	n := c.Len()
	switch {
	case n <= 0:
		return -1
	case n == 1:
		return 0
	}
	total, same := weightSum(c, n)
	if same {
		return rand.IntN(n)
	}
	return walkWeights(c, n, rand.Int64N(total))
}

// walkWeights returns the member whose span of the cumulative weights contains target. If
// weights shrank since target was drawn, the last member is returned.
func walkWeights(c Candidates, n int, target int64) int {
	var cum int64
	for i := range n {
		cum += weightOf(c, i)
		if target < cum {
			return i
		}
	}
	return n - 1
}
