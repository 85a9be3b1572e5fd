package group

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/dispatch"
)

// With a strategy that ignores load (Random) and a per-member cap, a Pick must not fail
// while some member still has room: one member is at its cap, the other idle, and every
// pick lands on the idle one. (Random alone draws the full member half of the time, so a
// bounded number of draws would give up on about one pick in sixteen.)
func TestRandomWithCapNeverFailsWhileAMemberHasRoom(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, MaxActivePerMember: 1,
		NewStrategy: func() dispatch.Strategy { return dispatch.Random{} }})
	full, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	idle, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	g := full.Group()
	require.True(t, full.Acquire(), "the first member takes its one stream")
	defer full.Release()

	for i := range 2000 {
		m := g.Pick()
		require.NotNil(t, m, "pick %d found nobody although a member has room", i)
		require.Same(t, idle, m, "pick %d chose the member at its cap", i)
		require.EqualValues(t, 1, m.Active())
		m.Release()
	}
	require.False(t, g.Saturated())

	// Once both members are at their cap, Pick reports nobody, and the group is saturated.
	require.True(t, idle.Acquire())
	require.Nil(t, g.Pick())
	require.True(t, g.Saturated())
	idle.Release()
	require.Same(t, idle, g.Pick(), "room again after the release")
}
