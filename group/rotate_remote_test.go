package group

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An edge of a cluster learns another edge's members in no set order: the member that moved
// the pool to the new key may arrive before one that has not rotated. That one (a remote
// member, Edge set) is admitted with the key the pool rotated from; a local connector with
// that key is not, once no member holds it (the rule of one edge).
func TestRemoteMemberWithTheKeyThePoolRotatedFrom(t *testing.T) {
	r := lb()
	moved := rotating(httpReq("pool", "web", "new"), "old")
	moved.Edge = "a"
	m := join(t, r, moved)
	g := m.Group()
	require.Equal(t, key("new"), g.KeyHash())
	require.Equal(t, key("new"), m.KeyHash())
	require.Equal(t, []KeyHash{key("old")}, m.PrevKeyHashes())

	_, err := r.Join(httpReq("pool", "web", "old"))
	require.ErrorIs(t, err, ErrKeyMismatch, "a local connector with a key nobody holds")

	notYet := httpReq("pool", "web", "old")
	notYet.Edge = "a"
	old := join(t, r, notYet)
	require.Same(t, g, old.Group())
	require.Equal(t, key("new"), g.KeyHash(), "the pool does not rotate back")
	require.Equal(t, key("old"), old.KeyHash())
	require.True(t, g.HoldsKey(key("old")))

	// While it holds the old key, a local old-key connector is admitted, as on one edge.
	join(t, r, httpReq("pool", "web", "old"))

	other := httpReq("pool", "web", "other")
	other.Edge = "a"
	_, err = r.Join(other)
	require.ErrorIs(t, err, ErrKeyMismatch, "a remote member with a key the pool never had")
}

// A member keeps the session that registered it.
func TestMemberSession(t *testing.T) {
	r := lb()
	req := httpReq("solo", "", "")
	req.Session = "s1"
	require.Equal(t, "s1", join(t, r, req).Session)
}

// The same for a TCP pool, whose key is part of its route: a remote member with the key the
// pool rotated from joins that pool (same port), and the old key routes to it while the
// member holds it; a local connector with that key makes another pool, as on one edge.
func TestRemoteTCPMemberWithTheKeyThePoolRotatedFrom(t *testing.T) {
	r := lb()
	moved := rotating(tcpReq("db", "new"), "old")
	moved.Edge = "a"
	m := join(t, r, moved)
	g := m.Group()

	notYet := tcpReq("db", "old")
	notYet.Edge = "a"
	old := join(t, r, notYet)
	require.Same(t, g, old.Group())
	require.Equal(t, key("new"), g.KeyHash())
	require.Len(t, r.Groups(), 1, "a pool stored under two keys is listed once")
	// While it holds the old key, a local old-key connector joins the same pool.
	require.Same(t, g, join(t, r, tcpReq("db", "old")).Group())

	r2 := lb()
	join(t, r2, rotating(tcpReq("db", "new"), "old"))
	local := join(t, r2, tcpReq("db", "old"))
	require.NotEqual(t, key("new"), local.Group().KeyHash(), "a local connector with a key nobody holds")

	other := tcpReq("db", "other")
	other.Edge = "a"
	require.NotSame(t, g, join(t, r, other).Group())
}

// After a TCP pool rotated from k1 to k2, a connector with k1 alone makes a pool of its own on
// its own port (docs/load-balancing.md, "Rotating a group key"). Another edge learns that member with the
// pool's port: it is not adopted into the k2 pool (whose port differs) but makes the k1 pool
// on that port, which this edge then serves too. A member of the k1 key on the k2 pool's port
// (one that has not rotated yet) is still adopted into the k2 pool.
func TestRemoteTCPMemberOfAnOldKeyOnItsOwnPort(t *testing.T) {
	r := lb()
	moved := rotating(tcpReq("db", "new"), "old")
	moved.Edge, moved.Port = "a", 20003
	rotated := join(t, r, moved).Group()
	require.Equal(t, 20003, rotated.Port)

	own := tcpReq("db", "old")
	own.Edge, own.Port = "a", 20005
	m := join(t, r, own)
	require.NotSame(t, rotated, m.Group(), "the old key's own pool is not the rotated pool")
	require.Equal(t, 20005, m.Group().Port, "the old key's pool is served on its own port")
	require.Equal(t, key("old"), m.Group().KeyHash())
	require.Equal(t, key("new"), rotated.KeyHash(), "the rotated pool keeps its key")

	r2 := lb()
	moved.Port = 20003
	rotated2 := join(t, r2, moved).Group()
	notYet := tcpReq("db", "old")
	notYet.Edge, notYet.Port = "b", 20003
	require.Same(t, rotated2, join(t, r2, notYet).Group(), "a member on the rotated pool's port is adopted")
}
