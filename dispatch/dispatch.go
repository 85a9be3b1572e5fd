// Package dispatch chooses one member of a pool for each new request or connection.
//
// A Strategy sees only a view of the selectable members (Candidates): each member's current
// load (active streams), weight and identity hash. It knows nothing about groups, tunnels or
// networking. Priority tiers, ejection of failing members and slow start are applied by the
// caller (package group) before a strategy runs: a strategy only sees the selectable members
// of the active tier, and a member's Weight already includes any slow-start reduction.
//
// # Weights
//
// Members declare a weight of 1–100; the edge passes the declared weight times 100, lowered
// while a member ramps up after turning healthy. Every strategy here gives each member a share
// of new work proportional to its weight. A Weight below 1 (a buggy Candidates) counts as 1,
// and one above 1<<24 counts as 1<<24, so no input makes a pick panic or overflow.
//
// # Strategies
//
// LeastStreams picks the member with the lowest load per unit of weight. Ties among equally
// weighted members rotate strictly (two idle members alternate); ties among members of
// different weights are spread in proportion to weight by a low-discrepancy sequence, so a
// 3:1 pair gets picks interleaved about three to one rather than in long runs.
//
// Random picks at random in proportion to weight, ignoring load.
//
// Rendezvous additionally implements Keyed: given an affinity key (HashString of a cookie,
// header value or client address) it keeps sending the same key to the same member while the
// pool does not change, and when a member leaves or joins only the keys of that member move.
// It uses weighted rendezvous (highest-random-weight) hashing with bounded loads: a member that
// would carry more than Bound times its weighted fair share of the current load is skipped for
// the key's next-best member, so one hot key cannot overload a member.
//
// All strategies here are safe for concurrent use, take no lock and allocate nothing per pick,
// because picking is on the edge's hot path.
package dispatch

import (
	"fmt"
	"math/bits"
)

// Candidates is the view a Strategy picks from: Len members, indexed from 0, each with its
// current load, weight and identity hash. Implementations must be safe to read while other
// picks run; values may change between two reads, and strategies tolerate that.
type Candidates interface {
	// Len is the number of selectable members.
	Len() int
	// Load is member i's current number of active streams.
	Load(i int) int64
	// Weight is member i's current weight, at least 1. Members declare 1–100; the edge passes
	// the declared weight times 100, lowered while a member ramps up after turning healthy
	// (slow start). Shares of new work are proportional to weights.
	Weight(i int) int
	// Hash is a stable hash of member i's identity for consistent hashing: it does not
	// change while the member stays in the pool.
	Hash(i int) uint64
}

// Strategy picks one member for a new request or connection.
type Strategy interface {
	// Pick returns the index of the chosen member, or -1 when c has no members.
	Pick(c Candidates) int
}

// Keyed is implemented by strategies that can also pick by an affinity key (a hash of a
// cookie, header value or client address): the same key keeps landing on the same member
// while the pool does not change.
type Keyed interface {
	// PickKey returns the index of the member chosen for key, or -1 when c has no members.
	PickKey(c Candidates, key uint64) int
}

// Names accepted by New and by the edge's strategy setting.
const (
	NameLeastStreams = "least_streams"
	NameRandom       = "random"
)

// New returns a fresh strategy by its configuration name; "" means least_streams, the
// default. Each pool should own its own strategy so that tie rotation is per pool.
func New(name string) (Strategy, error) {
	switch name {
	case "", NameLeastStreams:
		return new(LeastStreams), nil
	case NameRandom:
		return Random{}, nil
	}
	return nil, fmt.Errorf("dispatch: unknown strategy %q (want %q or %q)", name, NameLeastStreams, NameRandom)
}

// maxWeight caps the weight a strategy uses, so that sums of weights over any pool fit an
// int64 with room to spare.
const maxWeight = 1 << 24

// weightOf is member i's weight clamped to [1, maxWeight].
func weightOf(c Candidates, i int) int64 {
	w := c.Weight(i)
	switch {
	case w < 1:
		return 1
	case w > maxWeight:
		return maxWeight
	}
	return int64(w)
}

// loadOf is member i's load; a negative load (a buggy Candidates) counts as 0.
func loadOf(c Candidates, i int) int64 {
	return max(c.Load(i), 0)
}

// cmpPerWeight compares l1/w1 with l2/w2 without division or overflow (the cross products
// are taken in 128 bits): -1 if less, 0 if equal, +1 if greater. Loads and weights must not
// be negative.
func cmpPerWeight(l1, w1, l2, w2 int64) int {
	hi1, lo1 := bits.Mul64(uint64(l1), uint64(w2))
	hi2, lo2 := bits.Mul64(uint64(l2), uint64(w1))
	switch {
	case hi1 < hi2, hi1 == hi2 && lo1 < lo2:
		return -1
	case hi1 == hi2 && lo1 == lo2:
		return 0
	}
	return 1
}

// weightSum is the total weight of c's first n members and whether they all weigh the same.
func weightSum(c Candidates, n int) (total int64, same bool) {
	first := weightOf(c, 0)
	total, same = first, true
	for i := 1; i < n; i++ {
		w := weightOf(c, i)
		total += w
		same = same && w == first
	}
	return total, same
}
