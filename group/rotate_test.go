package group

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func rotating(req JoinRequest, prev ...string) JoinRequest {
	for _, p := range prev {
		req.PrevKeyHashes = append(req.PrevKeyHashes, key(p))
	}
	return req
}

func TestHTTPKeyRotation(t *testing.T) {
	r := lb()
	a := join(t, r, httpReq("pool", "web", "old"))
	b := join(t, r, httpReq("pool", "web", "old"))
	g := a.Group()

	// A connector with the new key alone is refused: rotation starts by naming the old key.
	_, err := r.Join(httpReq("pool", "web", "new"))
	require.ErrorIs(t, err, ErrKeyMismatch)

	// The first member presenting the new key (and the old one as previous) moves the pool.
	a2 := join(t, r, rotating(httpReq("pool", "web", "new"), "old"))
	require.Same(t, g, a2.Group())
	require.Equal(t, key("new"), g.KeyHash())
	require.Equal(t, key("new"), g.Info().KeyHash)
	r.Leave(a) // a restarted with the new key

	// c has not rotated yet: it connects with the old key and is admitted while b holds it.
	c := join(t, r, httpReq("pool", "web", "old"))
	require.Same(t, g, c.Group())
	r.Leave(c)
	// A wrong key is refused throughout.
	_, err = r.Join(rotating(httpReq("pool", "web", "wrong"), "other"))
	require.ErrorIs(t, err, ErrKeyMismatch)

	// b restarts with the new key: no member holds the old key any more, so it is refused.
	b2 := join(t, r, rotating(httpReq("pool", "web", "new"), "old"))
	r.Leave(b)
	_, err = r.Join(httpReq("pool", "web", "old"))
	require.ErrorIs(t, err, ErrKeyMismatch)
	require.EqualError(t, err, "group: group key does not match for subdomain 'pool'")
	join(t, r, httpReq("pool", "web", "new"))
	require.Len(t, g.Members(), 3)
	_ = b2
}

func TestTCPKeyRotationKeepsThePort(t *testing.T) {
	r := lb()
	a := join(t, r, tcpReq("db", "old"))
	g := a.Group()
	port := g.Port

	a2 := join(t, r, rotating(tcpReq("db", "new"), "old"))
	require.Same(t, g, a2.Group(), "the rotating member joins the pool, on its port")
	require.Equal(t, key("new"), g.KeyHash())
	require.Equal(t, 1, r.PortsInUse())

	// A connector still on the old key joins the same pool while a member holds that key.
	old := join(t, r, tcpReq("db", "old"))
	require.Same(t, g, old.Group())
	fresh := join(t, r, tcpReq("db", "new"))
	require.Same(t, g, fresh.Group(), "the new key is now the pool's route")

	// Once no member holds the old key, the old key is another pool (TCP keys are routes).
	r.Leave(a)
	r.Leave(old)
	other := join(t, r, tcpReq("db", "old"))
	require.NotSame(t, g, other.Group())
	require.NotEqual(t, port, other.Group().Port)
	require.Equal(t, port, g.Port)

	// The rotated pool is removed cleanly, all its route keys with it.
	r.Leave(a2)
	r.Leave(fresh)
	require.True(t, g.Removed())
	again := join(t, r, tcpReq("db", "new"))
	require.NotSame(t, g, again.Group())
	r.Leave(other)
	r.Leave(again)
	require.Zero(t, r.PortsInUse())
	require.Empty(t, r.Groups())
}

// Picks go on while a pool's members rotate one by one: the pool never has no member.
func TestRotationNeverEmptiesThePool(t *testing.T) {
	r := lb()
	var ms []*Member
	for range 3 {
		ms = append(ms, join(t, r, httpReq("pool", "web", "k1")))
	}
	g := ms[0].Group()
	for i, m := range ms {
		n := join(t, r, rotating(httpReq("pool", "web", "k2"), "k1")) // new process first
		require.Same(t, g, n.Group(), "member %d", i)
		p := g.Pick()
		require.NotNil(t, p)
		p.Release()
		r.Leave(m) // then the old one goes
		p = g.Pick()
		require.NotNil(t, p)
		p.Release()
	}
	require.Equal(t, key("k2"), g.KeyHash())
	_, err := r.Join(httpReq("pool", "web", "k1"))
	require.ErrorIs(t, err, ErrKeyMismatch)
}
