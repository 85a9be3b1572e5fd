package dispatch

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// memberHashes returns the identity hashes of members "member-0" to "member-(n-1)".
func memberHashes(n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = HashString(fmt.Sprint("member-", i))
	}
	return h
}

// testKeys returns n affinity keys, the same on every run.
func testKeys(n int) []uint64 {
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = HashString(fmt.Sprintf("203.0.%d.%d:%d", r.IntN(256), r.IntN(256), r.IntN(65536)))
	}
	return keys
}

// owners maps every key to the identity hash of the member it lands on.
func owners(r *Rendezvous, c *pool, keys []uint64) []uint64 {
	out := make([]uint64, len(keys))
	for k, key := range keys {
		out[k] = c.hashes[r.PickKey(c, key)]
	}
	return out
}

// without returns p's hashes with member i left out.
func without(hashes []uint64, i int) []uint64 {
	return slices.Delete(slices.Clone(hashes), i, i+1)
}

// fixed is a strategy that always picks the same index.
type fixed int

func (f fixed) Pick(Candidates) int { return int(f) }

func TestRendezvousSpreadsKeysEvenly(t *testing.T) {
	const n, numKeys = 5, 10000
	c := &pool{loads: make([]int64, n), hashes: memberHashes(n)}
	r := new(Rendezvous)
	counts := make([]int, n)
	for _, key := range testKeys(numKeys) {
		counts[r.PickKey(c, key)]++
	}
	fair := numKeys / n
	t.Logf("keys per member %v: min %d, max %d (fair share %d)", counts, slices.Min(counts), slices.Max(counts), fair)
	for i, got := range counts {
		require.LessOrEqual(t, float64(got), 1.25*float64(fair), "member %d", i)
		require.GreaterOrEqual(t, float64(got), float64(fair)/1.25, "member %d", i)
	}
}

func TestRendezvousMovesFewKeysWhenPoolChanges(t *testing.T) {
	const n, numKeys, gone = 5, 10000, 2
	keys := testKeys(numKeys)
	hashes := memberHashes(n)
	full := &pool{loads: make([]int64, n), hashes: hashes}
	less := &pool{loads: make([]int64, n-1), hashes: without(hashes, gone)}
	r := new(Rendezvous)
	before := owners(r, full, keys)
	after := owners(r, less, keys)

	// Removing a member moves its keys, and only its keys.
	moved := 0
	for k := range keys {
		if before[k] != after[k] {
			moved++
			require.Equal(t, hashes[gone], before[k], "key %d moved from a member that stayed", k)
		}
	}
	t.Logf("removing 1 of %d members moved %d of %d keys (%.2f%%)", n, moved, numKeys, 100*float64(moved)/numKeys)
	require.LessOrEqual(t, float64(moved), numKeys*(1.0/n+0.05))
	require.Positive(t, moved)

	// Adding it back moves keys only onto it, and exactly the keys it had.
	back := owners(r, full, keys)
	movedBack := 0
	for k := range keys {
		if after[k] != back[k] {
			movedBack++
			require.Equal(t, hashes[gone], back[k], "key %d moved to a member that was there already", k)
		}
	}
	require.Equal(t, before, back, "the old assignment returns")
	require.Equal(t, moved, movedBack)

	// A brand-new member takes keys only for itself too, about 1/(n+1) of them.
	more := &pool{loads: make([]int64, n+1), hashes: append(slices.Clone(hashes), HashString("member-new"))}
	grown := owners(r, more, keys)
	joined := 0
	for k := range keys {
		if grown[k] != before[k] {
			joined++
			require.Equal(t, more.hashes[n], grown[k], "key %d moved to an old member", k)
		}
	}
	t.Logf("adding a %dth member moved %d of %d keys (%.2f%%)", n+1, joined, numKeys, 100*float64(joined)/numKeys)
	require.InDelta(t, numKeys/(n+1), joined, numKeys*0.05)
}

// The member a key lands on depends on the members' identities, not their order or the
// Rendezvous value.
func TestRendezvousIsStable(t *testing.T) {
	const n = 6
	c := &pool{loads: make([]int64, n), hashes: memberHashes(n)}
	perm := []int{3, 0, 5, 1, 4, 2}
	shuffled := &pool{loads: make([]int64, n), hashes: make([]uint64, n)}
	for i, p := range perm {
		shuffled.hashes[i] = c.hashes[p]
	}
	for _, key := range testKeys(200) {
		want := new(Rendezvous).PickKey(c, key)
		r := new(Rendezvous)
		for range 20 {
			require.Equal(t, want, r.PickKey(c, key))
		}
		require.Equal(t, want, perm[r.PickKey(shuffled, key)], "key %#x: order changed the member", key)
	}
}

func TestRendezvousIsWeighted(t *testing.T) {
	const numKeys = 10000
	keys := testKeys(numKeys)
	for _, tc := range []struct {
		name    string
		weights []int
	}{
		{"3:1", []int{300, 100}},
		{"1:3", []int{100, 300}},
		{"1:1:2", []int{100, 100, 200}},
		{"slow start", []int{100, 100, 100, 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &pool{loads: make([]int64, len(tc.weights)), weights: tc.weights, hashes: memberHashes(len(tc.weights))}
			r := new(Rendezvous)
			counts := make([]int, len(tc.weights))
			for _, key := range keys {
				counts[r.PickKey(c, key)]++
			}
			total := 0
			for _, w := range tc.weights {
				total += w
			}
			for i, w := range tc.weights {
				want := float64(w) / float64(total)
				t.Logf("member %d: weight %d, %.2f%% of keys (want %.2f%%)", i, w, 100*share(counts, i), 100*want)
				require.InDelta(t, want, share(counts, i), 0.05, "member %d", i)
			}
		})
	}
}

// Held streams from random keys, half of them one hot key: the bound keeps every member near
// its fair share. Without a bound (the control case) the hot key's member takes far more.
func TestRendezvousBoundsLoad(t *testing.T) {
	const picks = 1000
	for _, tc := range []struct {
		name    string
		bound   float64
		weights []int
		bounded bool
	}{
		{"default bound", 0, []int{100, 100, 100, 100, 100}, true},
		{"bound 1 means 1.25", 1, []int{100, 100, 100, 100, 100}, true},
		{"weighted", 0, []int{300, 100, 100, 200, 100}, true},
		{"bound 2", 2, []int{100, 100, 100, 100}, true},
		{"control: no bound", math.Inf(1), []int{100, 100, 100, 100, 100}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.weights)
			c := &pool{loads: make([]int64, n), weights: tc.weights, hashes: memberHashes(n)}
			r := &Rendezvous{Bound: tc.bound}
			bound := r.bound()
			if !tc.bounded {
				bound = 1.25 // what the loads are measured against
			}
			wsum := 0
			for _, w := range tc.weights {
				wsum += w
			}
			rng := rand.New(rand.NewPCG(3, 4))
			hot := HashString("hot-client")
			worst := math.Inf(-1) // the most a load has been above ceil(bound * fair share)
			for p := 1; p <= picks; p++ {
				key := rng.Uint64()
				if p%2 == 0 {
					key = hot
				}
				c.loads[r.PickKey(c, key)]++
				for i, l := range c.loads {
					ceil := math.Ceil(bound * float64(p) * float64(tc.weights[i]) / float64(wsum))
					worst = max(worst, float64(l)-ceil)
					if tc.bounded {
						require.LessOrEqual(t, float64(l), ceil+1, "pick %d: member %d over the bound, loads %v", p, i, c.loads)
					}
				}
			}
			t.Logf("bound %.2f, weights %v: final loads %v, highest load - ceil(bound*fair share) over all picks: %+g",
				r.bound(), tc.weights, c.loads, worst)
			if tc.bounded {
				// Sequential picks keep the documented rule exactly: Load+1 <= ceil(bound*fair).
				require.LessOrEqual(t, worst, 0.0)
			} else {
				require.Greater(t, slices.Max(c.loads), int64(picks/2), "without a bound the hot key piles up")
			}
		})
	}
}

func TestRendezvousPickWithoutKey(t *testing.T) {
	r := &Rendezvous{Fallback: fixed(2)}
	require.Equal(t, 2, r.Pick(loads{0, 0, 0}))

	// Nil Fallback: weighted least-streams.
	r = new(Rendezvous)
	require.Equal(t, 1, r.Pick(loads{3, 1, 2}))
	require.Equal(t, 1, r.Pick(&pool{loads: []int64{4, 1}, weights: []int{300, 100}}))
	require.Equal(t, 0, r.Pick(&pool{loads: []int64{2, 1}, weights: []int{300, 100}}))
	a, b := r.Pick(loads{0, 0}), r.Pick(loads{0, 0})
	require.NotEqual(t, a, b, "idle members alternate")
	require.Equal(t, -1, r.Pick(loads{}))
}

func TestHashString(t *testing.T) {
	// Pinned: keys hashed by one edge must match those hashed by another, or by a restarted
	// one. These values are FNV-1a 64 followed by the SplitMix64 finalizer, computed
	// independently of this package.
	for s, want := range map[string]uint64{
		"":               0xf52a15e9a9b5e89b,
		"a":              0x02c0bdbf481420f8,
		"203.0.113.7":    0x12ba66e1b50a1879,
		"session=abc123": 0xdfde1c1f0a7a2c0b,
	} {
		require.Equal(t, want, HashString(s), "HashString(%q) = %#x", s, HashString(s))
	}
	seen := map[uint64]string{}
	for _, s := range []string{"", "a", "b", "ab", "ba", "203.0.113.7", "203.0.113.8", "203.0.113.70"} {
		h := HashString(s)
		require.NotContains(t, seen, h, "%q and %q collide", s, seen[h])
		seen[h] = s
	}
}
