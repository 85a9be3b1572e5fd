package group

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/dispatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func key(s string) KeyHash { return sha256.Sum256([]byte(s)) }

var ids atomic.Uint64

func nextID() string { return fmt.Sprintf("t%d", ids.Add(1)) }

func httpReq(sub, group, k string) JoinRequest {
	return JoinRequest{ID: nextID(), Proto: ProtoHTTP, Label: sub, Group: group, KeyHash: key(k)}
}

func tcpReq(group, k string) JoinRequest {
	return JoinRequest{ID: nextID(), Proto: ProtoTCP, Label: "db", Group: group, KeyHash: key(k)}
}

func lb() *Registry {
	return NewRegistry(Config{LoadBalancing: true, Ports: PortRange{Lo: 20000, Hi: 20009}})
}

func TestHTTPGroupRules(t *testing.T) {
	r := lb()
	a, err := r.Join(httpReq("pool", "web", "secret"))
	require.NoError(t, err)
	b, err := r.Join(httpReq("pool", "other-name", "secret"))
	require.NoError(t, err, "a later joiner with the right key joins whatever name it passes")
	require.Same(t, a.Group(), b.Group())
	require.Equal(t, "web", b.Group().Name, "the first joiner names the group")
	require.Same(t, a.Group(), r.LookupHTTP("pool"))

	_, err = r.Join(httpReq("pool", "web", "wrong"))
	require.ErrorIs(t, err, ErrKeyMismatch)
	require.EqualError(t, err, "group: group key does not match for subdomain 'pool'")

	_, err = r.Join(httpReq("pool", "", ""))
	require.ErrorIs(t, err, ErrInUse)
	require.EqualError(t, err, "group: subdomain 'pool' is already in use")

	req := httpReq("pool", "web", "secret")
	req.Proto = ProtoHTTPS
	_, err = r.Join(req)
	require.ErrorIs(t, err, ErrProtoMismatch)
	require.ErrorContains(t, err, "http")
	require.ErrorContains(t, err, "https")

	// Grouped on a solo subdomain.
	_, err = r.Join(httpReq("solo", "", ""))
	require.NoError(t, err)
	_, err = r.Join(httpReq("solo", "web", "secret"))
	require.ErrorIs(t, err, ErrKeyMismatch)
	_, err = r.Join(httpReq("solo", "", ""))
	require.EqualError(t, err, "group: subdomain 'solo' is already in use")

	// The last member leaving frees the route for a fresh group with another key.
	r.Leave(a)
	require.NotNil(t, r.LookupHTTP("pool"))
	r.Leave(b)
	require.Nil(t, r.LookupHTTP("pool"))
	require.True(t, b.Group().Removed())
	c, err := r.Join(httpReq("pool", "new", "other-secret"))
	require.NoError(t, err)
	require.NotSame(t, a.Group(), c.Group())
	require.Equal(t, "new", c.Group().Name)
}

func TestTCPGroupsSharePortPerKey(t *testing.T) {
	r := lb()
	a, err := r.Join(tcpReq("db", "k1"))
	require.NoError(t, err)
	b, err := r.Join(tcpReq("db", "k1"))
	require.NoError(t, err)
	require.Same(t, a.Group(), b.Group())
	require.Equal(t, 20000, a.Group().Port)

	c, err := r.Join(tcpReq("db", "k2"))
	require.NoError(t, err, "another key with the same name is a separate pool")
	require.NotSame(t, a.Group(), c.Group())
	require.Equal(t, 20001, c.Group().Port)

	solo, err := r.Join(tcpReq("", ""))
	require.NoError(t, err)
	require.Equal(t, 20002, solo.Group().Port)
	require.Equal(t, 3, r.PortsInUse())

	r.Leave(a)
	require.Equal(t, 3, r.PortsInUse(), "a member leaving keeps the port while others remain")
	r.Leave(b)
	require.Equal(t, 2, r.PortsInUse(), "the last member leaving returns the port")
	d, err := r.Join(tcpReq("db", "k1"))
	require.NoError(t, err)
	require.NotSame(t, a.Group(), d.Group(), "a new registration starts a fresh group")
}

func TestTCPRangeFull(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, Ports: PortRange{Lo: 30000, Hi: 30001}})
	_, err := r.Join(tcpReq("", ""))
	require.NoError(t, err)
	m, err := r.Join(tcpReq("", ""))
	require.NoError(t, err)
	_, err = r.Join(tcpReq("", ""))
	require.ErrorIs(t, err, ErrNoPorts)
	require.EqualError(t, err, "group: no TCP ports available")
	r.Leave(m)
	_, err = r.Join(tcpReq("", ""))
	require.NoError(t, err)
}

func TestOnCreateSkipsUnavailablePorts(t *testing.T) {
	var tried []int
	r := NewRegistry(Config{Ports: PortRange{Lo: 40000, Hi: 40003}, OnCreate: func(g *Group) error {
		tried = append(tried, g.Port)
		if g.Port < 40002 {
			return fmt.Errorf("listen: %w", ErrPortUnavailable)
		}
		return nil
	}})
	m, err := r.Join(tcpReq("", ""))
	require.NoError(t, err)
	require.Equal(t, 40002, m.Group().Port)
	require.Equal(t, []int{40000, 40001, 40002}, tried)
	require.Equal(t, 1, r.PortsInUse(), "ports that could not be bound are not kept")

	boom := errors.New("boom")
	r2 := NewRegistry(Config{Ports: PortRange{Lo: 40000, Hi: 40003}, OnCreate: func(*Group) error { return boom }})
	_, err = r2.Join(tcpReq("", ""))
	require.ErrorIs(t, err, boom)
	require.Zero(t, r2.PortsInUse())
	require.Empty(t, r2.Groups())
}

func TestKillSwitchMakesEverythingSolo(t *testing.T) {
	r := NewRegistry(Config{Ports: PortRange{Lo: 20000, Hi: 20009}})
	a, err := r.Join(httpReq("pool", "web", "secret"))
	require.NoError(t, err)
	require.True(t, a.Group().Solo(), "group fields are ignored")
	_, err = r.Join(httpReq("pool", "web", "secret"))
	require.ErrorIs(t, err, ErrInUse)
	require.EqualError(t, err, "group: subdomain 'pool' is already in use")

	x, err := r.Join(tcpReq("db", "k"))
	require.NoError(t, err)
	y, err := r.Join(tcpReq("db", "k"))
	require.NoError(t, err)
	require.NotEqual(t, x.Group().Port, y.Group().Port, "TCP tunnels get their own ports")
}

func TestInvalidRequests(t *testing.T) {
	r := lb()
	_, err := r.Join(JoinRequest{Proto: ProtoHTTP, Label: "x"})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = r.Join(JoinRequest{ID: "a", Proto: "udp", Label: "x"})
	require.ErrorIs(t, err, ErrInvalid)
	_, err = r.Join(JoinRequest{ID: "a", Proto: ProtoHTTP})
	require.ErrorIs(t, err, ErrInvalid)
}

func TestHealthGatesDispatch(t *testing.T) {
	var events []Event
	r := NewRegistry(Config{LoadBalancing: true, OnEvent: func(e Event) { events = append(events, e) }})
	probed := httpReq("pool", "web", "k")
	probed.HealthKind = "tcp"
	a, err := r.Join(probed)
	require.NoError(t, err)
	require.False(t, a.Healthy(), "a member with a health check starts unhealthy")
	g := a.Group()
	require.Nil(t, g.Pick())

	b, err := r.Join(httpReq("pool", "web", "k"))
	require.NoError(t, err)
	require.True(t, b.Healthy(), "a member without a health check is always healthy")
	for range 10 {
		m := g.Pick()
		require.Same(t, b, m)
		m.Release()
	}
	require.False(t, r.SetHealth(b, false, "ignored"), "members without a probe ignore health reports")

	require.True(t, r.SetHealth(a, true, "probe succeeded"))
	require.False(t, r.SetHealth(a, true, "probe succeeded"), "steady state is not a change")
	seen := map[*Member]int{}
	for range 10 {
		m := g.Pick()
		seen[m]++
		m.Release()
	}
	require.Equal(t, map[*Member]int{a: 5, b: 5}, seen, "least-streams alternates between idle members")

	require.True(t, r.SetHealth(a, false, "3 consecutive probe failures: refused"))
	hist := a.History()
	require.Len(t, hist, 3)
	require.Equal(t, []bool{false, true, false}, []bool{hist[0].Healthy, hist[1].Healthy, hist[2].Healthy})
	require.Equal(t, "3 consecutive probe failures: refused", hist[2].Reason)

	last := events[len(events)-1]
	require.Equal(t, EventHealth, last.Kind)
	require.Equal(t, a.ID, last.Member.ID)
	require.False(t, last.Member.Healthy)
	require.Equal(t, 2, last.MemberCount)
	require.Equal(t, 1, last.HealthyCount)
	require.Equal(t, 1, last.SelectableCount)
}

func TestHistoryKeepsLast50(t *testing.T) {
	r := lb()
	req := httpReq("h", "", "")
	req.HealthKind = "http"
	m, err := r.Join(req)
	require.NoError(t, err)
	for i := range 120 {
		r.SetHealth(m, i%2 == 0, fmt.Sprintf("change %d", i))
	}
	h := m.History()
	require.Len(t, h, HistoryLen)
	require.Equal(t, "change 70", h[0].Reason, "oldest first")
	require.Equal(t, "change 119", h[HistoryLen-1].Reason)
	for i := 1; i < len(h); i++ {
		require.False(t, h[i].At.Before(h[i-1].At))
	}
}

func TestDrainStopsSelectionAndWaitsForStreams(t *testing.T) {
	var events []Event
	r := NewRegistry(Config{LoadBalancing: true, OnEvent: func(e Event) { events = append(events, e) }})
	a, _ := r.Join(httpReq("pool", "web", "k"))
	b, _ := r.Join(httpReq("pool", "web", "k"))
	g := a.Group()

	require.True(t, a.Acquire())
	require.True(t, a.Acquire())
	drained := r.Drain(a)
	require.True(t, a.Draining())
	require.False(t, a.Acquire(), "a draining member takes no new streams")
	for range 10 {
		m := g.Pick()
		require.Same(t, b, m)
		m.Release()
	}
	require.Equal(t, EventDraining, events[len(events)-1].Kind)
	require.Equal(t, 1, events[len(events)-1].SelectableCount)

	a.Release()
	select {
	case <-drained:
		t.Fatal("drained with a stream still open")
	default:
	}
	a.Release()
	<-drained
	require.Equal(t, drained, r.Drain(a), "Drain is idempotent")

	r.Leave(a)
	r.Leave(a)
	require.Len(t, g.Members(), 1)

	// Draining an idle member completes at once.
	<-r.Drain(b)
	require.Nil(t, g.Pick())
}

func TestPickExcept(t *testing.T) {
	r := lb()
	a, _ := r.Join(httpReq("pool", "web", "k"))
	g := a.Group()
	require.Nil(t, g.PickExcept(a), "no other member")
	b, _ := r.Join(httpReq("pool", "web", "k"))
	c, _ := r.Join(httpReq("pool", "web", "k"))
	for range 30 {
		m := g.PickExcept(b)
		require.NotNil(t, m)
		require.NotSame(t, b, m)
		m.Release()
	}
	_ = c
}

func TestRandomStrategyIsUsed(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, NewStrategy: func() dispatch.Strategy { return dispatch.Random{} }})
	a, _ := r.Join(httpReq("pool", "web", "k"))
	b, _ := r.Join(httpReq("pool", "web", "k"))
	// Random ignores load: even with a held stream on a, a keeps being picked.
	require.True(t, a.Acquire())
	seen := map[*Member]int{}
	for range 400 {
		m := a.Group().Pick()
		seen[m]++
		m.Release()
	}
	require.Greater(t, seen[a], 100)
	require.Greater(t, seen[b], 100)
	a.Release()
}

func TestPickAllocatesNothing(t *testing.T) {
	r := lb()
	a, _ := r.Join(httpReq("pool", "web", "k"))
	_, _ = r.Join(httpReq("pool", "web", "k"))
	g := r.LookupHTTP("pool")
	allocs := testing.AllocsPerRun(1000, func() {
		if m := r.LookupHTTP("pool").Pick(); m != nil {
			m.Release()
		}
	})
	require.Zero(t, allocs)
	require.Same(t, a.Group(), g)
}

// TestStressJoinLeave runs hundreds of goroutines joining and leaving a handful of HTTP and TCP
// routes and checks the registry's invariants: one group per route at a time, no member in a
// removed group, no port handed out twice, and no port leaked at the end.
func TestStressJoinLeave(t *testing.T) {
	var (
		mu        sync.Mutex
		portOwner = map[int]*Group{}
		bad       atomic.Value
	)
	fail := func(format string, args ...any) { bad.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
	r := NewRegistry(Config{
		LoadBalancing: true,
		Ports:         PortRange{Lo: 21000, Hi: 21007},
		OnCreate: func(g *Group) error {
			if g.Kind != KindTCP {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			if other := portOwner[g.Port]; other != nil {
				fail("port %d handed to group %s while group %s holds it", g.Port, g.ID, other.ID)
			}
			portOwner[g.Port] = g
			return nil
		},
		OnRemove: func(g *Group) {
			if g.Kind != KindTCP {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if portOwner[g.Port] != g {
				fail("group %s released port %d it did not hold", g.ID, g.Port)
			}
			delete(portOwner, g.Port)
		},
	})

	const workers, rounds = 300, 60
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				var req JoinRequest
				switch (w + i) % 4 {
				case 0:
					req = httpReq(fmt.Sprintf("s%d", i%3), "web", "k")
				case 1:
					req = tcpReq(fmt.Sprintf("g%d", i%3), "k")
				case 2:
					req = tcpReq(fmt.Sprintf("g%d", i%3), "other")
				default:
					req = tcpReq("", "")
				}
				m, err := r.Join(req)
				if err != nil {
					if !errors.Is(err, ErrNoPorts) {
						fail("join: %v", err)
					}
					continue
				}
				g := m.Group()
				if g.Removed() {
					fail("member %s joined removed group %s", m.ID, g.ID)
				}
				if req.Proto == ProtoHTTP {
					if cur := r.LookupHTTP(req.Label); cur != g {
						fail("route %s served by another group than its member's", req.Label)
					}
				}
				if p := g.Pick(); p != nil {
					p.Release()
				}
				r.Leave(m)
			}
		})
	}
	wg.Wait()
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	require.Empty(t, r.Groups(), "every group is removed when its members leave")
	require.Zero(t, r.PortsInUse(), "no port leaked")
	require.Empty(t, portOwner)
}

func BenchmarkJoinLeave(b *testing.B) {
	r := lb()
	_, _ = r.Join(httpReq("pool", "web", "k"))
	b.ReportAllocs()
	for b.Loop() {
		m, err := r.Join(JoinRequest{ID: "x", Proto: ProtoHTTP, Label: "pool", Group: "web", KeyHash: key("k")})
		if err != nil {
			b.Fatal(err)
		}
		r.Leave(m)
	}
}

func BenchmarkLookupAndPick(b *testing.B) {
	for _, n := range []int{1, 16, 1024} {
		r := lb()
		for range n {
			_, _ = r.Join(httpReq("pool", "web", "k"))
		}
		b.Run(fmt.Sprintf("members=%d/serial", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.LookupHTTP("pool").Pick().Release()
			}
		})
		b.Run(fmt.Sprintf("members=%d/parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r.LookupHTTP("pool").Pick().Release()
				}
			})
		})
	}
}

func TestFirstProbeVerdictIsRecordedEvenWhenUnhealthy(t *testing.T) {
	r := lb()
	req := httpReq("h", "", "")
	req.HealthKind = "tcp"
	m, err := r.Join(req)
	require.NoError(t, err)
	require.True(t, r.SetHealth(m, false, "3 consecutive probe failures: refused"), "the first verdict is news")
	require.False(t, r.SetHealth(m, false, "again"), "a repeat is not")
	h := m.History()
	require.Len(t, h, 2)
	require.Equal(t, "3 consecutive probe failures: refused", h[1].Reason)
	require.False(t, m.Healthy())
}

func TestMemberCapSkipsFullMembers(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, MaxActivePerMember: 2})
	a, _ := r.Join(httpReq("pool", "web", "k"))
	b, _ := r.Join(httpReq("pool", "web", "k"))
	g := a.Group()
	var held []*Member
	for range 4 {
		m := g.Pick()
		require.NotNil(t, m)
		held = append(held, m)
	}
	require.Equal(t, int64(2), a.Active())
	require.Equal(t, int64(2), b.Active())
	require.Nil(t, g.Pick(), "every member is at its cap")
	require.True(t, g.Saturated())
	held[0].Release()
	require.False(t, g.Saturated())
	m := g.Pick()
	require.Same(t, held[0], m, "the member with room takes the next stream")
	for _, h := range append(held[1:], m) {
		h.Release()
	}
	<-r.Drain(a) // draining is unaffected by the cap
}
