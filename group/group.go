package group

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/warren-tunnel/warren/dispatch"
)

// Kind is what public traffic for a route arrives as.
type Kind uint8

// Route kinds.
const (
	// KindHTTP routes by host name: the Host header (http, https) or the TLS server name
	// (tls passthrough). The route label is the subdomain.
	KindHTTP Kind = iota + 1
	// KindTCP routes by port: the route label is the group name (or the tunnel id of a solo tunnel).
	KindTCP
)

// String returns "http" or "tcp".
func (k Kind) String() string {
	switch k {
	case KindHTTP:
		return "http"
	case KindTCP:
		return "tcp"
	}
	return "unknown"
}

// KeyHash is the SHA-256 of a group key. Only the hash ever reaches the edge.
type KeyHash [32]byte

// HashKey returns the KeyHash of a group key: its SHA-256. Connectors send only this hash,
// and a reserved endpoint or a test can compute the same value from the key.
func HashKey(key string) KeyHash { return sha256.Sum256([]byte(key)) }

// ParseKeyHash parses the 64 hex digits of a KeyHash (as KeyHash.String writes them).
func ParseKeyHash(s string) (KeyHash, error) {
	var h KeyHash
	if len(s) != hex.EncodedLen(len(h)) {
		return h, fmt.Errorf("group: a key hash is %d hex digits, got %d characters", hex.EncodedLen(len(h)), len(s))
	}
	if _, err := hex.Decode(h[:], []byte(s)); err != nil {
		return KeyHash{}, fmt.Errorf("group: a key hash is hex digits: %w", err)
	}
	return h, nil
}

// MarshalText writes the hash as 64 hex digits (and so in JSON).
func (h KeyHash) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText reads 64 hex digits.
func (h *KeyHash) UnmarshalText(b []byte) error {
	v, err := ParseKeyHash(string(b))
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// String is the full hash in hex. Prefer Short in logs.
func (h KeyHash) String() string { return hex.EncodeToString(h[:]) }

// Short is the first 8 hex characters, safe to log and to show.
func (h KeyHash) Short() string { return hex.EncodeToString(h[:4]) }

// Group is a pool of members sharing one route. A solo tunnel is a group of one.
type Group struct {
	// Kind is the route kind.
	Kind Kind
	// Proto is the members' protocol.
	Proto Proto
	// Label is the subdomain (http, https, tls) or the TCP group name or tunnel label.
	Label string
	// Name is the pool's display name as the first joiner set it; "" for a solo tunnel.
	Name string
	// Port is the public TCP port (tcp only).
	Port int
	// ID is unique per group instance on this edge, also across re-creations of a route.
	ID string
	// Affinity is the pool's affinity setting ("", "cookie", "client_ip" or
	// "header:<Name>"), which every member declares alike.
	Affinity string
	// RetryIdempotent is the pool's opt-in idempotent retry, which every member declares
	// alike.
	RetryIdempotent bool

	// lock names the route's shard lock: the subdomain, or the TCP pool's name, so that
	// every key of a pool whose key is rotating shares one lock.
	lock string
	// routeKeys are the registry keys the group is stored under: its route, and for a TCP
	// pool whose key is rotating, its old key's route while a member still holds that key.
	// Guarded by the route's shard lock.
	routeKeys []string
	keyHash   atomic.Pointer[KeyHash]
	strategy  dispatch.Strategy
	keyed     dispatch.Keyed // picks by affinity key: the strategy if it can, else rendezvous
	// remoteHandicap is added to a remote member's doubled load (Config.PreferLocalStreams);
	// 0: none.
	remoteHandicap int64

	// snap is the immutable list of selectable members, swapped on every change.
	snap       atomic.Pointer[snapshot]
	dispatches atomic.Uint64

	mu      sync.Mutex // guards members, removed and member histories
	members []*Member
	removed bool

	// outMu guards the events waiting for delivery (see Registry.deliver).
	outMu      sync.Mutex
	outbox     []Event
	delivering bool
}

// Solo reports whether the group is a single, ungrouped tunnel.
func (g *Group) Solo() bool { return g.Name == "" }

// KeyHash is the pool's current key hash (zero for a solo tunnel); it changes when a member
// rotates the pool's key.
func (g *Group) KeyHash() KeyHash {
	if k := g.keyHash.Load(); k != nil {
		return *k
	}
	return KeyHash{}
}

// snapshot is the view a dispatch strategy picks from: the selectable members of one priority
// tier; backup is the next tier with selectable members (nil if none), which only a retry
// uses.
type snapshot struct {
	members []*Member
	backup  *snapshot
	// handicap is set when the pool prefers local members (Config.PreferLocalStreams) and a
	// member is another edge's: loads are then doubled, and a remote member's increased by
	// handicap (odd), so that a local member wins while it is less than
	// PreferLocalStreams streams ahead, and any greater difference still decides.
	handicap int64
}

func (s *snapshot) Len() int         { return len(s.members) }
func (s *snapshot) Load(i int) int64 { return s.loadOf(s.members[i]) }

func (s *snapshot) loadOf(m *Member) int64 {
	if s.handicap == 0 {
		return m.load()
	}
	l := 2 * m.load()
	if m.Edge != "" {
		l += s.handicap
	}
	return l
}

// except hides one member of a snapshot (the one a retry must avoid).
type except struct {
	s    *snapshot
	skip int
}

func (e *except) Len() int         { return len(e.s.members) - 1 }
func (e *except) Load(i int) int64 { return e.s.loadOf(e.s.members[e.index(i)]) }

var emptySnapshot = &snapshot{}

// pickIn picks a member of s other than skip with g's strategy, or returns -1.
func (g *Group) pickIn(s *snapshot, skip *Member) int {
	at := slices.Index(s.members, skip)
	if at < 0 {
		return g.strategy.Pick(s)
	}
	i := g.strategy.Pick(&except{s, at})
	if i >= at {
		i++
	}
	if i >= len(s.members) {
		return -1 // out of range: an embedder's strategy bug is no pick, never a panic
	}
	return i
}

// Pick chooses a healthy, non-draining member with the group's strategy and acquires a stream
// on it (the caller must Release it). It returns nil when no member is selectable, or when
// every member it tried is at its cap of active streams. Pick takes no lock and allocates
// nothing.
func (g *Group) Pick() *Member {
	for range 4 {
		s := g.snap.Load()
		i := g.strategy.Pick(s)
		if i < 0 {
			return nil
		}
		if i >= len(s.members) {
			break // a strategy out of range (an embedder's bug): take any member with room
		}
		if m := s.members[i]; m.Acquire() {
			g.dispatches.Add(1)
			return m
		}
		// The member started draining after the snapshot was taken (the next snapshot,
		// already published since draining publishes before it closes, no longer has it),
		// or it is at its cap: look again.
	}
	// The strategy kept choosing members that are full (Random does not look at load):
	// take any member with room rather than turn the request away.
	for _, m := range g.snap.Load().members {
		if m.Acquire() {
			g.dispatches.Add(1)
			return m
		}
	}
	return nil
}

// Saturated reports whether g has selectable members that are all at their cap of active
// streams: the reason a Pick failed, when it is not that nobody is healthy.
func (g *Group) Saturated() bool {
	s := g.snap.Load()
	for _, m := range s.members {
		if m.limit == 0 || uint64(m.Active()) < m.limit {
			return false
		}
	}
	return len(s.members) > 0
}

// PickExcept is Pick among all selectable members of the active priority tier but skip: the
// edge's one retry after a failed attempt. When the tier has no other member, the next tier
// with a selectable member takes the retry. It returns nil if no other member is selectable.
func (g *Group) PickExcept(skip *Member) *Member {
	for range 4 {
		full := false
		for s := g.snap.Load(); s != nil && !full; s = s.backup {
			i := g.pickIn(s, skip)
			if i < 0 {
				continue // nobody else in this tier: try the next
			}
			if m := s.members[i]; m.Acquire() {
				g.dispatches.Add(1)
				return m
			}
			full = true // it filled up or left since the snapshot: look again
		}
		if !full {
			return nil
		}
	}
	return nil
}

// Dispatches is the number of streams handed to the group's members so far.
func (g *Group) Dispatches() uint64 { return g.dispatches.Load() }

// Members returns the group's current members (a copy).
func (g *Group) Members() []*Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Member(nil), g.members...)
}

// Counts returns the number of members, how many are healthy (probe passing, not ejected),
// and how many are selectable (healthy and not draining).
func (g *Group) Counts() (members, healthy, selectable int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.countsLocked()
}

func (g *Group) countsLocked() (members, healthy, selectable int) {
	for _, m := range g.members {
		if m.Healthy() {
			healthy++
			if !m.Draining() {
				selectable++
			}
		}
	}
	return len(g.members), healthy, selectable
}

// Removed reports whether the group's last member has left and the route is gone.
func (g *Group) Removed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.removed
}

// publishLocked rebuilds the selectable snapshot: the healthy, non-draining, non-ejected
// members of the lowest-numbered priority tier that has any. The caller holds g.mu.
func (g *Group) publishLocked() {
	var sel []*Member
	for _, m := range g.members {
		if m.selectable() {
			sel = append(sel, m)
		}
	}
	if len(sel) == 0 {
		g.snap.Store(emptySnapshot)
		return
	}
	g.snap.Store(tiers(sel, g.remoteHandicap))
}
