package group

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/dispatch"
)

// share picks n times sequentially (each stream released at once) and counts picks per member.
func share(t *testing.T, pick func() *Member, n int) map[*Member]int {
	t.Helper()
	got := map[*Member]int{}
	for range n {
		m := pick()
		require.NotNil(t, m)
		got[m]++
		m.Release()
	}
	return got
}

func join(t *testing.T, r *Registry, req JoinRequest) *Member {
	t.Helper()
	m, err := r.Join(req)
	require.NoError(t, err)
	return m
}

func TestWeightsSplitSequentialRequests(t *testing.T) {
	for _, strategy := range []string{dispatch.NameLeastStreams, dispatch.NameRandom} {
		t.Run(strategy, func(t *testing.T) {
			r := NewRegistry(Config{LoadBalancing: true, NewStrategy: func() dispatch.Strategy {
				s, err := dispatch.New(strategy)
				require.NoError(t, err)
				return s
			}})
			heavy, light := httpReq("pool", "web", "k"), httpReq("pool", "web", "k")
			heavy.Weight, light.Weight = 3, 1
			a, b := join(t, r, heavy), join(t, r, light)
			got := share(t, a.Group().Pick, 2000)
			frac := float64(got[a]) / 2000
			t.Logf("%s: weight 3 got %d of 2000 (%.1f%%), weight 1 got %d", strategy, got[a], 100*frac, got[b])
			require.InDelta(t, 0.75, frac, 0.05)
		})
	}
}

func TestEqualWeightsStillAlternate(t *testing.T) {
	r := lb()
	a := join(t, r, httpReq("pool", "web", "k"))
	join(t, r, httpReq("pool", "web", "k"))
	prev := (*Member)(nil)
	for range 10 {
		m := a.Group().Pick()
		require.NotSame(t, prev, m, "two idle members of weight 1 alternate, as before weights existed")
		prev = m
		m.Release()
	}
}

func TestPolicyValidation(t *testing.T) {
	r := lb()
	for _, c := range []struct {
		name string
		edit func(*JoinRequest)
		want string
	}{
		{"weight over", func(q *JoinRequest) { q.Weight = 101 }, "weight 101 is out of range (1 to 100)"},
		{"weight negative", func(q *JoinRequest) { q.Weight = -1 }, "weight -1 is out of range"},
		{"priority", func(q *JoinRequest) { q.Priority = -2 }, "priority -2 is out of range"},
		{"slow start", func(q *JoinRequest) { q.SlowStart = 2 * time.Hour }, "slow start 2h0m0s is out of range"},
		{"affinity", func(q *JoinRequest) { q.Affinity = "sticky" }, `affinity "sticky": want cookie, client_ip or header:<Name>`},
		{"header name", func(q *JoinRequest) { q.Affinity = "header:a b" }, `"a b" is not a header name`},
	} {
		req := httpReq("v", "web", "k")
		c.edit(&req)
		_, err := r.Join(req)
		require.ErrorIs(t, err, ErrInvalid, c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
	req := tcpReq("db", "k")
	req.Affinity = "cookie"
	_, err := r.Join(req)
	require.ErrorContains(t, err, "a TCP pool takes client_ip")
	require.Zero(t, r.PortsInUse(), "a refused TCP registration takes no port")

	req = httpReq("h", "web", "k")
	req.Affinity = "header:x-user-id"
	m := join(t, r, req)
	require.Equal(t, "header:X-User-Id", m.Group().Affinity, "header names are canonical")
	require.Equal(t, 1, m.Weight, "weight 0 means 1")
}

func TestPoolSettingsMustMatch(t *testing.T) {
	r := lb()
	first := httpReq("pool", "web", "k")
	first.Affinity = "cookie"
	join(t, r, first)

	_, err := r.Join(httpReq("pool", "web", "k"))
	require.ErrorIs(t, err, ErrProtoMismatch)
	require.EqualError(t, err, "group: affinity mismatch: the pool on subdomain 'pool' uses affinity cookie, this tunnel declares none")

	same := httpReq("pool", "web", "k")
	same.Affinity = "cookie"
	same.RetryIdempotent = true
	_, err = r.Join(same)
	require.ErrorIs(t, err, ErrProtoMismatch)
	require.ErrorContains(t, err, "retry_idempotent mismatch")

	same.RetryIdempotent = false
	join(t, r, same)

	tcp := tcpReq("db", "k")
	tcp.Affinity = "client_ip"
	join(t, r, tcp)
	_, err = r.Join(tcpReq("db", "k"))
	require.ErrorContains(t, err, "the pool on TCP group 'db' uses affinity client_ip")
}

func TestPriorityTiersFailOverAndBack(t *testing.T) {
	r := lb()
	req := func(prio int) JoinRequest {
		q := httpReq("pool", "web", "k")
		q.Priority, q.HealthKind = prio, "tcp"
		return q
	}
	p0a, p0b, p1 := join(t, r, req(0)), join(t, r, req(0)), join(t, r, req(1))
	g := p0a.Group()
	for _, m := range []*Member{p0a, p0b, p1} {
		r.SetHealth(m, true, "ok")
	}
	only := func(want ...*Member) {
		t.Helper()
		got := share(t, g.Pick, 40)
		for m := range got {
			require.Contains(t, want, m, "a member outside the active tier took work")
		}
		require.Len(t, got, len(want))
	}
	only(p0a, p0b)
	r.SetHealth(p0a, false, "down")
	only(p0b)
	r.SetHealth(p0b, false, "down")
	only(p1)
	_, healthy, _ := g.Counts()
	require.Equal(t, 1, healthy, "the pool is not at zero healthy while a later tier is")
	r.SetHealth(p0b, true, "back")
	only(p0b)

	// The one retry goes to the next tier when the active one has no other member.
	m := g.Pick()
	require.Same(t, p0b, m)
	retry := g.PickExcept(m)
	require.Same(t, p1, retry)
	retry.Release()
	m.Release()
	m = g.PickExcept(p1)
	require.Same(t, p0b, m, "a retry after a member of another tier stays in the active tier")
	m.Release()
	r.SetHealth(p1, false, "down")
	require.Nil(t, g.PickExcept(p0b), "nobody else anywhere")
}

func TestSlowStartRampsUp(t *testing.T) {
	r := lb()
	old := join(t, r, httpReq("pool", "web", "k"))
	req := httpReq("pool", "web", "k")
	req.SlowStart = 400 * time.Millisecond
	fresh := join(t, r, req)
	require.True(t, fresh.Ramping())
	require.Less(t, fresh.weightNow(), 100, "a member that just joined starts below its weight")
	early := share(t, old.Group().Pick, 200)[fresh]
	require.Less(t, early, 60, "while ramping it gets well under half (%d of 200)", early)

	require.Eventually(t, func() bool { return !fresh.Ramping() }, 5*time.Second, 20*time.Millisecond)
	late := share(t, old.Group().Pick, 200)[fresh]
	require.InDelta(t, 100, late, 10, "at full weight it gets half")
	require.Equal(t, int64(0), fresh.rampFrom.Load(), "a finished ramp costs nothing more")

	// Turning healthy again ramps again.
	req = httpReq("pool", "web", "k")
	req.SlowStart, req.HealthKind = time.Hour, "tcp"
	probed := join(t, r, req)
	require.False(t, probed.Ramping(), "an unhealthy member does not ramp")
	r.SetHealth(probed, true, "ok")
	require.True(t, probed.Ramping())
	info := probed.Group().Info()
	require.True(t, info.Members[2].Ramping)
}

func ejecting(e Ejection) *Registry {
	return NewRegistry(Config{LoadBalancing: true, Ejection: &e})
}

func TestOutlierEjection(t *testing.T) {
	var mu sync.Mutex
	var events []Event
	e := Ejection{Failures: 5, Window: 10 * time.Second, Duration: 150 * time.Millisecond, MaxDuration: 400 * time.Millisecond}
	r := NewRegistry(Config{LoadBalancing: true, Ejection: &e, OnEvent: func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Kind == EventHealth {
			events = append(events, ev)
		}
	}})
	bad, good := join(t, r, httpReq("pool", "web", "k")), join(t, r, httpReq("pool", "web", "k"))
	g := bad.Group()

	for i := range 4 {
		r.ReportOutcome(bad, true, "reset before a response")
		require.False(t, bad.Ejected(), "ejected after only %d failures", i+1)
	}
	r.ReportOutcome(bad, false, "")
	for range 4 {
		r.ReportOutcome(bad, true, "reset before a response")
	}
	require.False(t, bad.Ejected(), "a success ends the run")
	r.ReportOutcome(bad, true, "backend answered 502")
	require.True(t, bad.Ejected())
	require.False(t, bad.Healthy())
	mu.Lock()
	require.Len(t, events, 1, "one health event: the ejection")
	require.True(t, events[0].Ejection && events[0].Member.Ejected)
	mu.Unlock()
	require.Equal(t, map[*Member]int{good: 20}, share(t, g.Pick, 20), "an ejected member takes no work")
	members, healthy, selectable := g.Counts()
	require.Equal(t, [3]int{2, 1, 1}, [3]int{members, healthy, selectable})

	// It returns after the ejection time, with an event.
	require.Eventually(t, func() bool { return !bad.Ejected() }, 5*time.Second, 10*time.Millisecond)
	h := bad.History()
	require.Equal(t, "ejection over", h[len(h)-1].Reason)
	require.Contains(t, h[len(h)-2].Reason, "ejected for 150ms after 5 failed streams in a row (last: backend answered 502)")

	// Failing again at once doubles the ejection.
	for range 5 {
		r.ReportOutcome(bad, true, "open refused")
	}
	require.True(t, bad.Ejected())
	h = bad.History()
	require.Contains(t, h[len(h)-1].Reason, "ejected for 300ms")
	require.Eventually(t, func() bool { return !bad.Ejected() }, 5*time.Second, 10*time.Millisecond)
	for range 5 {
		r.ReportOutcome(bad, true, "open refused")
	}
	h = bad.History()
	require.Contains(t, h[len(h)-1].Reason, "ejected for 400ms", "capped at the maximum")
	require.Eventually(t, func() bool { return !bad.Ejected() }, 5*time.Second, 10*time.Millisecond)

	// A success after the return resets the doubling.
	r.ReportOutcome(bad, false, "")
	for range 5 {
		r.ReportOutcome(bad, true, "open refused")
	}
	h = bad.History()
	require.Contains(t, h[len(h)-1].Reason, "ejected for 150ms")

	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(events), 7)
	require.False(t, events[0].Healthy)
	require.Equal(t, 1, events[0].HealthyCount)
	require.True(t, events[0].Member.Ejected)
	require.True(t, events[1].Healthy)
	require.Equal(t, "ejection over", events[1].Reason)
}

func TestEjectionNeverTakesMoreThanHalfOrTheLastMember(t *testing.T) {
	r := ejecting(Ejection{Failures: 2, Duration: time.Hour})
	fail := func(m *Member) {
		for range 2 {
			r.ReportOutcome(m, true, "reset before a response")
		}
	}
	var ms []*Member
	for range 4 {
		ms = append(ms, join(t, r, httpReq("pool", "web", "k")))
	}
	fail(ms[0])
	fail(ms[1])
	fail(ms[2])
	require.True(t, ms[0].Ejected())
	require.True(t, ms[1].Ejected())
	require.False(t, ms[2].Ejected(), "a third of four would be more than half")

	// A pool of two whose other member is down keeps its failing member.
	r2 := ejecting(Ejection{Failures: 2, Duration: time.Hour})
	q := httpReq("solo2", "web", "k")
	q.HealthKind = "tcp"
	down := join(t, r2, q)
	r2.SetHealth(down, false, "down")
	last := join(t, r2, httpReq("solo2", "web", "k"))
	for range 2 {
		r2.ReportOutcome(last, true, "reset before a response")
	}
	require.False(t, last.Ejected(), "ejection never leaves a pool with nothing to send to")

	// Leaving stops the return timer (goleak would see a timer's goroutine otherwise only
	// if it fired; the registry must not touch a member that left).
	r.Leave(ms[0])
	r.Leave(ms[1])
	require.Nil(t, ms[0].out.timer)
}

func TestEjectionOffByDefault(t *testing.T) {
	r := lb()
	a := join(t, r, httpReq("pool", "web", "k"))
	join(t, r, httpReq("pool", "web", "k"))
	for range 50 {
		r.ReportOutcome(a, true, "reset")
	}
	require.False(t, a.Ejected())
}

func TestAffinityByKeyAndToken(t *testing.T) {
	r := lb()
	var ms []*Member
	for range 4 {
		q := httpReq("pool", "web", "k")
		q.Affinity = "client_ip"
		ms = append(ms, join(t, r, q))
	}
	g := ms[0].Group()
	owner := map[int]*Member{}
	for k := range 1000 {
		m := g.PickKey(dispatch.HashString(fmt.Sprint("10.0.0.", k)))
		owner[k] = m
		m.Release()
	}
	for k := range 1000 {
		m := g.PickKey(dispatch.HashString(fmt.Sprint("10.0.0.", k)))
		require.Same(t, owner[k], m, "key %d moved in an unchanged pool", k)
		m.Release()
	}
	// One member turns away: only its keys move.
	r.Drain(ms[1])
	moved := 0
	for k := range 1000 {
		m := g.PickKey(dispatch.HashString(fmt.Sprint("10.0.0.", k)))
		if m != owner[k] {
			require.Same(t, ms[1], owner[k], "key %d moved off a member that stayed", k)
			moved++
		}
		m.Release()
	}
	t.Logf("%d of 1000 keys moved when 1 of 4 members drained", moved)
	require.LessOrEqual(t, float64(moved), 1000*(1.0/4+0.05))

	// Tokens name a member; a token of a member that left or a made-up one names nobody.
	tok := ms[2].AffinityToken()
	require.NotEmpty(t, tok)
	require.NotContains(t, tok, ms[2].ID, "the token is opaque")
	m := g.PickToken(tok)
	require.Same(t, ms[2], m)
	m.Release()
	require.Nil(t, g.PickToken(ms[1].AffinityToken()), "a draining member is not picked by its token")
	require.Nil(t, g.PickToken("forged"))
	require.Nil(t, g.PickToken(""))
	other := lb()
	om := join(t, other, httpReq("pool", "web", "k"))
	require.NotEqual(t, om.AffinityToken(), r.affinityToken(om.ID), "tokens are signed with the registry's secret")

	// A token whose member already carries more than its bounded share is not honoured.
	var held []*Member
	for range 6 {
		x := g.PickToken(tok)
		if x == nil {
			break
		}
		held = append(held, x)
	}
	require.Less(t, len(held), 6, "the token's member took every stream")
	for _, x := range held {
		x.Release()
	}
}

// An ejection never outlives the reason it was allowed: when the pool shrinks or its other
// members go down, ejected members come back at once.
func TestEjectedMembersReturnWhenThePoolNeedsThem(t *testing.T) {
	var mu sync.Mutex
	var zeroSelectable int
	r := NewRegistry(Config{LoadBalancing: true, Ejection: &Ejection{Failures: 2, Duration: time.Hour},
		OnEvent: func(ev Event) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Kind != EventJoined && ev.MemberCount > 0 && ev.SelectableCount == 0 { // a probed joiner waits for its probe
				zeroSelectable++
			}
		}})
	eject := func(m *Member) {
		for range 2 {
			r.ReportOutcome(m, true, "reset before a response")
		}
		require.True(t, m.Ejected())
	}

	// The other member leaves.
	a, b := join(t, r, httpReq("one", "web", "k")), join(t, r, httpReq("one", "web", "k"))
	eject(a)
	r.Leave(b)
	require.False(t, a.Ejected(), "the last member is not kept out")
	require.Same(t, a, a.Group().Pick())
	a.Group().Pick().Release()
	h := a.History()
	require.Equal(t, "ejection ended early: the pool needs the member", h[len(h)-1].Reason)

	// The other member's probe fails.
	q := httpReq("two", "web", "k")
	q.HealthKind = "tcp"
	c := join(t, r, q)
	r.SetHealth(c, true, "ok")
	d := join(t, r, httpReq("two", "web", "k"))
	eject(d)
	r.SetHealth(c, false, "down")
	require.False(t, d.Ejected())

	// The other member drains.
	e, f := join(t, r, httpReq("three", "web", "k")), join(t, r, httpReq("three", "web", "k"))
	eject(e)
	r.Drain(f)
	require.False(t, e.Ejected())

	// Four members, two ejected; one healthy member leaves: at most half stay ejected.
	var ms []*Member
	for range 4 {
		ms = append(ms, join(t, r, httpReq("four", "web", "k")))
	}
	eject(ms[0])
	eject(ms[1])
	r.Leave(ms[3])
	ejected := 0
	for _, m := range ms[:3] {
		if m.Ejected() {
			ejected++
		}
	}
	require.Equal(t, 1, ejected, "one of three may stay ejected")
	require.True(t, ms[1].Ejected(), "the one ejected last stays out")

	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, zeroSelectable, "no event ever showed a pool with members and none selectable")
}

// outOfRange is an embedder's strategy with a bug.
type outOfRange struct{}

func (outOfRange) Pick(c dispatch.Candidates) int              { return c.Len() + 3 }
func (outOfRange) PickKey(c dispatch.Candidates, _ uint64) int { return c.Len() }

func TestStrategyOutOfRangeNeverPanics(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, NewStrategy: func() dispatch.Strategy { return outOfRange{} }})
	a := join(t, r, httpReq("pool", "web", "k"))
	join(t, r, httpReq("pool", "web", "k"))
	g := a.Group()
	m := g.Pick()
	require.NotNil(t, m, "a member with room is taken instead")
	m.Release()
	m = g.PickKey(42)
	require.NotNil(t, m)
	m.Release()
	require.Nil(t, g.PickExcept(a), "an out-of-range retry pick is no pick")
}

// A pool of a local and a remote member (another edge's): by default, ties rotate over both,
// as on one edge, so sequential requests split evenly. With PreferLocalStreams N, the local
// member is picked while it is less than N streams ahead of the remote one, and no further.
func TestRemoteMembersShareTiesUnlessLocalIsPreferred(t *testing.T) {
	pool := func(prefer int) (local, remote *Member) {
		r := NewRegistry(Config{LoadBalancing: true, PreferLocalStreams: prefer})
		rreq := httpReq("pool", "web", "k")
		rreq.Edge = "b"
		return join(t, r, httpReq("pool", "web", "k")), join(t, r, rreq)
	}

	local, remote := pool(0)
	got := share(t, local.Group().Pick, 40)
	require.Equal(t, 20, got[local], "sequential picks, every one a tie: %d local, %d remote", got[local], got[remote])
	require.Equal(t, 20, got[remote])

	local, remote = pool(1)
	got = share(t, local.Group().Pick, 40)
	require.Equal(t, 40, got[local], "ties go to the local member")
	require.Zero(t, got[remote])

	for _, n := range []int{1, 3} {
		local, remote = pool(n)
		// Streams held open: the local member takes the first n, then they alternate, the
		// local member never more than n streams ahead.
		var held []*Member
		for i := range 20 {
			m := local.Group().Pick()
			require.NotNil(t, m)
			held = append(held, m)
			ahead := local.Active() - remote.Active()
			require.LessOrEqual(t, ahead, int64(n), "pick %d: local %d, remote %d", i, local.Active(), remote.Active())
			require.GreaterOrEqual(t, ahead, int64(min(i+1, n-1)), "pick %d: local %d, remote %d", i, local.Active(), remote.Active())
		}
		for _, m := range held {
			m.Release()
		}
	}
}

// Streams another edge forwards to a local member are that edge's work, held open between its
// requests: they do not make the member look busy to this edge's dispatch, but they count
// against the member's cap.
func TestForwardedStreamsCountAgainstTheCapNotTheLoad(t *testing.T) {
	r := NewRegistry(Config{LoadBalancing: true, MaxActivePerMember: 3})
	a := join(t, r, httpReq("pool", "web", "k"))
	b := join(t, r, httpReq("pool", "web", "k"))
	require.True(t, a.AcquireForwarded())
	require.True(t, a.AcquireForwarded())
	require.Equal(t, int64(2), a.Active())
	require.Equal(t, int64(0), a.OwnActive())
	got := share(t, a.Group().Pick, 40)
	require.Equal(t, 20, got[a], "a, with two forwarded streams open, is as idle here as b")
	require.Equal(t, 20, got[b])

	require.True(t, a.AcquireForwarded())
	require.False(t, a.AcquireForwarded(), "a is at its cap")
	got = share(t, a.Group().Pick, 10)
	require.Equal(t, 10, got[b], "a at its cap of 3 takes no more")
	for range 3 {
		a.ReleaseForwarded()
	}
	require.Equal(t, int64(0), a.Active())
}
