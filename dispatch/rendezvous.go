package dispatch

import "math"

// defaultBound is the load bound Rendezvous uses when its Bound is 1 or less.
const defaultBound = 1.25

var _ Keyed = (*Rendezvous)(nil)

// Rendezvous picks by highest-random-weight (rendezvous) hashing, weighted by
// Candidates.Weight, with bounded loads.
//
// For a key, every member i gets the score -w_i / ln(u_i), where u_i in (0,1) is derived by
// mixing the key with Hash(i); the member with the highest score wins. This is weighted
// rendezvous hashing: member i wins a share w_i / sum(w) of all keys, a key's member depends
// only on the members present (not on their order), and when a member leaves or joins only the
// keys that member wins or won change hands.
//
// Bounded loads: a member whose load would exceed Bound times its weighted fair share of the
// current total load, (total+1) * w_i / sum(w), is skipped for the key's next-highest score.
// Precisely, member i is eligible when Load(i) < Bound * (total+1) * w_i / sum(w), which for
// whole loads is the same as Load(i)+1 <= ceil(Bound * (total+1) * w_i / sum(w)). Bound <= 1
// (and NaN) means 1.25. While loads are light every member is eligible and keys stay on their
// own member; a hot key spills over to its next members instead of piling onto one.
//
// Pick without a key uses Fallback; a nil Fallback means weighted least-streams, through a
// LeastStreams the Rendezvous owns.
//
// The zero value is ready to use. Methods have pointer receivers because of that internal
// LeastStreams: a Rendezvous must not be copied after first use.
type Rendezvous struct {
	// Bound is the most a member may carry, as a multiple of its weighted fair share of the
	// current load, before keys spill to their next member. Values <= 1 mean 1.25.
	Bound float64
	// Fallback picks when there is no key (Pick). Nil means weighted least-streams.
	Fallback Strategy

	least LeastStreams
}

// Pick implements Strategy: it picks without a key, through Fallback (nil: weighted
// least-streams).
func (r *Rendezvous) Pick(c Candidates) int {
	if r.Fallback != nil {
		return r.Fallback.Pick(c)
	}
	return r.least.Pick(c)
}

// PickKey implements Keyed: it returns the eligible member with the highest rendezvous score
// for key (see Rendezvous), or -1 when c has no members.
func (r *Rendezvous) PickKey(c Candidates, key uint64) int {
	n := c.Len()
	switch {
	case n <= 0:
		return -1
	case n == 1:
		return 0
	}
	// Eligible: load * sum(w) < Bound * (total+1) * w. Multiplying instead of dividing keeps
	// the edge exact for whole numbers and a Bound such as 1.25 (1.25*28*100 is exactly
	// 7*500, where 1.25*28/500*100 rounds above 7).
	//
	// At least one member is always eligible when the loads read are consistent: if none
	// were, load_i >= Bound*(total+1)*w_i/sum(w) for every i, and summing over all members
	// gives total >= Bound*(total+1) > total (Bound > 1, total >= 0), a contradiction. Loads
	// can move between the two passes below (and rounding can land exactly on the edge), so
	// the best score overall is still kept as the answer if no member qualifies.
	total, weights := loadAndWeight(c, n)
	wsum, limit := float64(weights), r.bound()*(float64(total)+1)
	km := mix64(key)
	best, bestScore := 0, math.Inf(-1)
	fit, fitScore := -1, math.Inf(-1)
	for i := range n {
		w := weightOf(c, i)
		s := score(km, c.Hash(i), w)
		if s > bestScore {
			best, bestScore = i, s
		}
		if s > fitScore && float64(loadOf(c, i))*wsum < limit*float64(w) {
			fit, fitScore = i, s
		}
	}
	if fit >= 0 {
		return fit
	}
	return best
}

// bound is the effective load bound.
func (r *Rendezvous) bound() float64 {
	if r.Bound > 1 { // false for NaN too
		return r.Bound
	}
	return defaultBound
}

// loadAndWeight sums the loads and the weights of c's first n members.
func loadAndWeight(c Candidates, n int) (load, weight int64) {
	for i := range n {
		load += loadOf(c, i)
		weight += weightOf(c, i)
	}
	return load, weight
}

// score is the weighted rendezvous score of a member with identity hash h and weight w for a
// key whose mixed hash is km: w / -ln(u), with u uniform in (0,1) given by the top 52 bits of
// the mixed pair plus one half (so u is never 0 or 1 and the score always finite and positive).
func score(km, h uint64, w int64) float64 {
	u := (float64(mix64(km^mix64(h))>>12) + 0.5) * 0x1p-52
	return float64(w) / -math.Log(u)
}
