// Package dispatch chooses one member of a pool for each new request or connection.
//
// A Strategy sees only a view of the selectable members and their current load (active
// streams); it knows nothing about groups, tunnels or networking. Both strategies here are safe
// for concurrent use, take no lock and allocate nothing per pick, because picking is on the
// edge's hot path.
package dispatch

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
)

// Candidates is the view a Strategy picks from: Len members, indexed from 0, each with its
// current load. Implementations must be safe to read while other picks run.
type Candidates interface {
	// Len is the number of selectable members.
	Len() int
	// Load is member i's current number of active streams.
	Load(i int) int64
}

// Strategy picks one member for a new request or connection.
type Strategy interface {
	// Pick returns the index of the chosen member, or -1 when c has no members.
	Pick(c Candidates) int
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

// Random picks a member uniformly at random, ignoring load.
// The zero value is ready to use.
type Random struct{}

// Pick implements Strategy.
func (Random) Pick(c Candidates) int {
	n := c.Len()
	switch n {
	case 0:
		return -1
	case 1:
		return 0
	}
	return rand.IntN(n)
}

// LeastStreams picks the member with the fewest active streams. Ties are rotated: every pick
// advances a counter, and among the k least-loaded members the pick takes the one at position
// counter mod k, so sequential requests to equally idle members alternate instead of all
// landing on the first. The zero value is ready to use.
type LeastStreams struct {
	next atomic.Uint64
}

// Pick implements Strategy.
func (s *LeastStreams) Pick(c Candidates) int {
	n := c.Len()
	switch n {
	case 0:
		return -1
	case 1:
		return 0
	}
	// First pass: the least load and how many members share it.
	first, least, ties := 0, c.Load(0), 1
	for i := 1; i < n; i++ {
		switch l := c.Load(i); {
		case l < least:
			first, least, ties = i, l, 1
		case l == least:
			ties++
		}
	}
	if ties == 1 {
		return first
	}
	// Second pass: the k-th of the tied members. Loads move while we look; if the k-th is
	// gone by now, the first least-loaded member seen is as good an answer.
	k := int((s.next.Add(1) - 1) % uint64(ties))
	for i := first; i < n; i++ {
		if c.Load(i) == least {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return first
}
