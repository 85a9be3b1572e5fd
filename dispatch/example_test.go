package dispatch_test

import (
	"fmt"

	"github.com/warren-tunnel/warren/dispatch"
)

// member is one member of a pool as a caller might keep it.
type member struct {
	name   string
	load   int64 // active streams
	weight int   // declared weight times 100, lowered during slow start
}

// members is a pool view: the selectable members of the active tier.
type members []member

func (m members) Len() int          { return len(m) }
func (m members) Load(i int) int64  { return m[i].load }
func (m members) Weight(i int) int  { return m[i].weight }
func (m members) Hash(i int) uint64 { return dispatch.HashString(m[i].name) }

func ExampleLeastStreams() {
	s, _ := dispatch.New(dispatch.NameLeastStreams)
	fmt.Println(s.Pick(members{{"a", 4, 100}, {"b", 1, 100}, {"c", 3, 100}}))
	// Two idle members: sequential picks alternate.
	idle := members{{"a", 0, 100}, {"b", 0, 100}}
	fmt.Println(s.Pick(idle), s.Pick(idle))
	// Load per weight: 4 streams on a member of weight 3 beat 2 streams on one of weight 1.
	fmt.Println(s.Pick(members{{"big", 4, 300}, {"small", 2, 100}}))
	// Output:
	// 1
	// 0 1
	// 0
}

func ExampleRendezvous() {
	pool := members{{"edge-a", 0, 100}, {"edge-b", 0, 100}, {"edge-c", 0, 100}}
	r := new(dispatch.Rendezvous)
	key := dispatch.HashString("203.0.113.7")
	first := r.PickKey(pool, key)
	// The same client keeps landing on the same member.
	fmt.Println(r.PickKey(pool, key) == first, r.PickKey(pool, key) == first)
	// Removing another member does not move it.
	var rest members
	for i, m := range pool {
		if i != (first+1)%len(pool) {
			rest = append(rest, m)
		}
	}
	fmt.Println(rest[r.PickKey(rest, key)].name == pool[first].name)
	// Output:
	// true true
	// true
}

// lowestPerWeight is a custom strategy: the first member with the lowest load per unit of
// weight, without tie rotation. Cross-multiplying avoids division.
type lowestPerWeight struct{}

func (lowestPerWeight) Pick(c dispatch.Candidates) int {
	best := -1
	for i := range c.Len() {
		if best < 0 || c.Load(i)*int64(c.Weight(best)) < c.Load(best)*int64(c.Weight(i)) {
			best = i
		}
	}
	return best
}

// A custom Strategy sees the same view as the built-in ones. Priority tiers, ejected members
// and slow start are already applied: here "warm" is ramping up at a tenth of its weight.
func Example_customStrategy() {
	var s dispatch.Strategy = lowestPerWeight{}
	pool := members{{"old", 30, 100}, {"warm", 2, 10}, {"big", 50, 300}}
	fmt.Println(pool[s.Pick(pool)].name)
	// Keyed strategies also pick by affinity; others are used through Pick only.
	_, keyed := s.(dispatch.Keyed)
	fmt.Println(keyed)
	// Output:
	// big
	// false
}
