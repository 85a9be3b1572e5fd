package group

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An OnEvent callback may read the registry: the group's members, its counts, a member's
// history, the View. Before events were delivered with no lock held, each of these
// deadlocked the registry (the callback ran under the group's lock).
func TestOnEventMayReadTheRegistry(t *testing.T) {
	var r *Registry
	var mu sync.Mutex
	var seen []string
	r = NewRegistry(Config{LoadBalancing: true, OnEvent: func(ev Event) {
		m, g, ok := r.View().Member(ev.Member.ID)
		members, _, _ := g.Counts()
		hist, _ := r.View().History(ev.Member.ID)
		if gr := r.LookupHTTP("pool"); gr != nil {
			_ = gr.Members()
			_, _, _ = gr.Counts()
		}
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %v %d %d", ev.Kind, ok && m.ID == ev.Member.ID, members, len(hist)))
		mu.Unlock()
	}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a, err := r.Join(httpReq("pool", "web", "k"))
		require.NoError(t, err)
		b, err := r.Join(httpReq("pool", "web", "k"))
		require.NoError(t, err)
		r.Drain(a)
		r.Leave(a)
		r.Leave(b)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the registry deadlocked on an OnEvent that reads it")
	}
	require.Equal(t, []string{"joined true 1 1", "joined true 2 1", "draining true 2 1", "left false 0 0", "left false 0 0"}, seen)
}

// An OnEvent callback may even change the registry (join another member): its events are
// delivered after the one being handled, in order, and nothing deadlocks.
func TestOnEventMayChangeTheRegistry(t *testing.T) {
	var r *Registry
	var kinds []string
	r = NewRegistry(Config{LoadBalancing: true, OnEvent: func(ev Event) {
		kinds = append(kinds, fmt.Sprintf("%s %d", ev.Kind, ev.MemberCount))
		if ev.Kind == EventJoined && ev.MemberCount == 1 {
			_, err := r.Join(httpReq("pool", "web", "k"))
			require.NoError(t, err)
		}
	}})
	_, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	require.Equal(t, []string{"joined 1", "joined 2"}, kinds)
}

// Events of one group arrive in the order the changes happened, also when many goroutines
// change the group at once: the member counts of successive join events go up by one.
func TestEventsStayInOrderUnderConcurrency(t *testing.T) {
	var mu sync.Mutex
	var counts []int
	r := NewRegistry(Config{LoadBalancing: true, OnEvent: func(ev Event) {
		mu.Lock()
		counts = append(counts, ev.MemberCount)
		mu.Unlock()
	}})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			_, err := r.Join(httpReq("pool", "web", "k"))
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Len(t, counts, 64)
	for i, n := range counts {
		require.Equal(t, i+1, n, "event %d", i)
	}
}

// The View hands out copies: changing what it returned changes nothing in the registry.
func TestViewIsACopy(t *testing.T) {
	r := lb()
	m, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	v := r.View()
	gi, ok := v.LookupHTTP("pool")
	require.True(t, ok)
	require.Equal(t, "web", gi.Name)
	require.Len(t, gi.Members, 1)
	gi.Name, gi.Members[0].ID, gi.Members[0].Healthy = "evil", "x", false
	again, _ := v.LookupHTTP("pool")
	require.Equal(t, "web", again.Name)
	require.Equal(t, m.ID, again.Members[0].ID)
	require.True(t, again.Members[0].Healthy)

	mi, g, ok := v.Member(m.ID)
	require.True(t, ok)
	require.Equal(t, g.ID, gi.ID)
	require.Equal(t, "none", mi.HealthKind)
	require.Len(t, v.Groups(), 1)

	r.Leave(m)
	_, _, ok = v.Member(m.ID)
	require.False(t, ok, "a member that left is not in the view")
	_, ok = v.History(m.ID)
	require.False(t, ok)
	require.Empty(t, v.Groups())
	require.Empty(t, View{}.Groups(), "the zero View sees an empty registry")
}

// Dispatch totals are per pool name and never go down when a pool is removed and made again.
func TestDispatchTotalsOutliveTheirPools(t *testing.T) {
	r := lb()
	a, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	b, err := r.Join(httpReq("other", "web", "k"))
	require.NoError(t, err)
	solo, err := r.Join(httpReq("solo", "", ""))
	require.NoError(t, err)
	for _, m := range []*Member{a, a, b, solo} {
		p := m.Group().Pick()
		require.Same(t, m, p)
		p.Release()
	}
	require.Equal(t, map[string]uint64{"web": 3}, r.View().Dispatches(), "pools sharing a name are summed; solo tunnels are not pools")
	r.Leave(a)
	require.Equal(t, map[string]uint64{"web": 3}, r.View().Dispatches(), "a removed pool's dispatches stay in its name's total")
	c, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	c.Group().Pick().Release()
	require.Equal(t, map[string]uint64{"web": 4}, r.View().Dispatches())
}

func TestKeyHashHelpers(t *testing.T) {
	h := HashKey("shared-secret")
	require.Equal(t, "d3046ecc", h.Short())
	back, err := ParseKeyHash(h.String())
	require.NoError(t, err)
	require.Equal(t, h, back)
	_, err = ParseKeyHash("d3046ecc")
	require.ErrorContains(t, err, "64 hex digits")
	_, err = ParseKeyHash(strings.Repeat("zz", 32))
	require.ErrorContains(t, err, "hex")
}

// A held port is never given to a new pool, only to the pool that asks for it by number;
// released, it is free again.
func TestHeldPortsGoOnlyToTheirPool(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, Ports: PortRange{Lo: 20000, Hi: 20002}})
	r.HoldPorts(20000, 20001)
	a, err := r.Join(tcpReq("other", "k"))
	require.NoError(t, err)
	require.Equal(t, 20002, a.Group().Port, "held ports are skipped")
	_, err = r.Join(tcpReq("another", "k"))
	require.ErrorIs(t, err, ErrNoPorts, "the held ports are not free")

	req := tcpReq("db", "k")
	req.Port = 20001
	b, err := r.Join(req)
	require.NoError(t, err)
	require.Equal(t, 20001, b.Group().Port, "the owner's pool gets its port back")
	r.Leave(b)
	r.ReleasePorts(20000)
	c, err := r.Join(tcpReq("third", "k"))
	require.NoError(t, err)
	require.Equal(t, 20000, c.Group().Port)

	req = tcpReq("busy", "k")
	req.Port = 20002 // in use by "other": the next free port instead
	_, err = r.Join(req)
	require.ErrorIs(t, err, ErrNoPorts, "20002 is in use and 20001, free since db left, is still held for it")
}
