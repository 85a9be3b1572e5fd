package tunnel

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// These tests drive the route book the way addTunnel does (claim, Join, joined or abandon)
// with a fake clock, so that each race window is forced instead of hoped for.

type testBook struct {
	*routeBook
	clock atomic.Int64
	n     atomic.Int64
}

func newTestBook(t *testing.T, cfg group.Config, eps []Endpoint) *testBook {
	t.Helper()
	cfg.LoadBalancing = true
	var b *routeBook
	cfg.OnRemove = func(g *group.Group) { b.emptied(g) }
	reg := group.NewRegistry(cfg)
	var err error
	b, err = newRouteBook(store.NewMemory(), time.Hour, reg, eps, zaptest.NewLogger(t))
	require.NoError(t, err)
	tb := &testBook{routeBook: b}
	tb.clock.Store(time.Now().UnixNano())
	b.now = func() time.Time { return time.Unix(0, tb.clock.Load()) }
	return tb
}

func (b *testBook) req(proto group.Proto, label, grp, key string) *group.JoinRequest {
	r := &group.JoinRequest{ID: fmt.Sprintf("t%d", b.n.Add(1)), Proto: proto, Label: label, Group: grp}
	if grp != "" {
		r.KeyHash = group.HashKey(key)
	}
	return r
}

// register is addTunnel's claim, Join, joined.
func (b *testBook) register(tenant string, req *group.JoinRequest, maxPorts int) (*group.Member, error) {
	tk, err := b.claim(tenant, req, req.Group != "", TenantLimits{MaxTCPPorts: maxPorts})
	if err != nil {
		return nil, err
	}
	m, err := b.reg.Join(*req)
	if err != nil {
		b.abandon(tk)
		return nil, err
	}
	if err := b.joined(tk, m.Group()); err != nil {
		b.reg.Leave(m)
		return nil, err
	}
	return m, nil
}

// The owner comes back to its claim just as it lapses; the sweeper runs between its claim
// and its Join: the acknowledged registration is still recorded, and still the owner's.
func TestOwnerBackAtLapseSurvivesTheSweep(t *testing.T) {
	b := newTestBook(t, group.Config{Ports: group.PortRange{Lo: 45100, Hi: 45109}}, nil)
	m, err := b.register("acme", b.req(group.ProtoTCP, "db", "db", "k1"), 0)
	require.NoError(t, err)
	b.reg.Leave(m)
	b.clock.Add(int64(time.Hour)) // lapsed, not swept yet

	req := b.req(group.ProtoTCP, "db", "db", "k1")
	tk, err := b.claim("acme", req, true, TenantLimits{})
	require.NoError(t, err)
	b.sweep()
	m2, err := b.reg.Join(*req)
	require.NoError(t, err)
	require.NoError(t, b.joined(tk, m2.Group()))
	r, _ := b.st.Get(t.Context(), "tcp/db")
	require.NotNil(t, r, "the live pool is recorded")
	require.Equal(t, "acme", r.Tenant)

	// And in that window another tenant cannot take it.
	b.reg.Leave(m2)
	b.clock.Add(int64(time.Hour))
	req = b.req(group.ProtoTCP, "db", "db", "k1")
	tk, err = b.claim("acme", req, true, TenantLimits{})
	require.NoError(t, err)
	_, err = b.register("globex", b.req(group.ProtoTCP, "db", "db", "k2"), 0)
	require.ErrorIs(t, err, ErrOwned, "the owner's return renewed its claim")
	m3, err := b.reg.Join(*req)
	require.NoError(t, err)
	require.NoError(t, b.joined(tk, m3.Group()))
}

// A registration whose Join fails does not remove the claim another registration of the same
// tenant has just used.
func TestAbandonKeepsAClaimInUse(t *testing.T) {
	b := newTestBook(t, group.Config{}, nil)
	r1 := b.req(group.ProtoHTTP, "pool", "web", "k") // grouped: writes the first claim
	r2 := b.req(group.ProtoHTTP, "pool", "", "")     // solo, same tenant
	tk1, err := b.claim("acme", r1, true, TenantLimits{})
	require.NoError(t, err)
	tk2, err := b.claim("acme", r2, false, TenantLimits{})
	require.NoError(t, err)
	m2, err := b.reg.Join(*r2) // r2 wins the registry
	require.NoError(t, err)
	_, err = b.reg.Join(*r1)
	require.Error(t, err)
	b.abandon(tk1)
	require.NoError(t, b.joined(tk2, m2.Group()))
	got, _ := b.st.Get(t.Context(), "http/pool")
	require.NotNil(t, got, "the acknowledged route is recorded")
	require.Equal(t, "acme", got.Tenant)
}

// max_tcp_ports holds under concurrent registrations: the slot is taken at claim.
func TestTCPPortQuotaHoldsUnderConcurrentClaims(t *testing.T) {
	b := newTestBook(t, group.Config{Ports: group.PortRange{Lo: 45120, Hi: 45129}}, nil)
	r1, r2 := b.req(group.ProtoTCP, "a", "a", "k"), b.req(group.ProtoTCP, "b", "b", "k")
	tk1, err := b.claim("acme", r1, true, TenantLimits{MaxTCPPorts: 1})
	require.NoError(t, err)
	_, err = b.claim("acme", r2, true, TenantLimits{MaxTCPPorts: 1})
	require.ErrorIs(t, err, ErrLimit, "the first claim's port is being taken")
	m1, err := b.reg.Join(*r1)
	require.NoError(t, err)
	require.NoError(t, b.joined(tk1, m1.Group()))
	require.Equal(t, 1, b.tenantPorts("acme"))
	again, err := b.register("acme", b.req(group.ProtoTCP, "a", "a", "k"), 1)
	require.NoError(t, err, "a second member of the same pool needs no new port")
	require.Equal(t, m1.Group().Port, again.Group().Port)
}

// A pool that could not bind its held port takes another; the old one is given back, so
// nothing stays held once the claim lapses.
func TestPortFallbackGivesTheOldPortBack(t *testing.T) {
	var busy atomic.Int64
	cfg := group.Config{Ports: group.PortRange{Lo: 45130, Hi: 45139}, OnCreate: func(g *group.Group) error {
		if int64(g.Port) == busy.Load() {
			return group.ErrPortUnavailable
		}
		return nil
	}}
	b := newTestBook(t, cfg, nil)
	m, err := b.register("acme", b.req(group.ProtoTCP, "db", "db", "k"), 0)
	require.NoError(t, err)
	p := m.Group().Port
	b.reg.Leave(m)
	busy.Store(int64(p)) // something else binds the port meanwhile
	m, err = b.register("acme", b.req(group.ProtoTCP, "db", "db", "k"), 0)
	require.NoError(t, err)
	require.NotEqual(t, p, m.Group().Port)
	require.Equal(t, 1, b.tenantPorts("acme"), "one pool holds one port")
	b.reg.Leave(m)
	b.clock.Add(int64(2 * time.Hour))
	b.sweep()
	busy.Store(0)
	got := 0
	for i := range 10 {
		if _, err := b.register("globex", b.req(group.ProtoTCP, "x", fmt.Sprint("x", i), "k"), 0); err == nil {
			got++
		}
	}
	require.Equal(t, 10, got, "every port of the range is free again")
}

// A reserved TCP endpoint admits only its key.
func TestReservedTCPEndpointChecksTheKey(t *testing.T) {
	ep := Endpoint{Proto: ProtoTCP, Group: "db", Port: 45145, Tenant: "acme", KeyHash: group.HashKey("right")}
	b := newTestBook(t, group.Config{Ports: group.PortRange{Lo: 45140, Hi: 45149}}, []Endpoint{ep})
	_, err := b.register("acme", b.req(group.ProtoTCP, "db", "db", "wrong"), 0)
	require.ErrorIs(t, err, group.ErrKeyMismatch)
	_, err = b.register("globex", b.req(group.ProtoTCP, "db", "db", "right"), 0)
	require.ErrorIs(t, err, ErrOwned)
	m, err := b.register("acme", b.req(group.ProtoTCP, "db", "db", "right"), 0)
	require.NoError(t, err)
	require.Equal(t, 45145, m.Group().Port, "the endpoint's port")
}

// countingStore counts the writes that reach a store.
type countingStore struct {
	store.Store
	writes atomic.Int64
}

func (c *countingStore) Update(ctx context.Context, key string, fn func(*store.Route) (*store.Route, error)) (*store.Route, error) {
	return c.Store.Update(ctx, key, func(cur *store.Route) (*store.Route, error) {
		next, err := fn(cur)
		if err == nil {
			c.writes.Add(1)
		}
		return next, err
	})
}

// After a restart every owner has a full RouteTTL to come back, whether its route was
// empty long before (past its TTL) or had members when the edge stopped, and the start
// writes nothing (a store of many routes would otherwise cost an fsync per route).
func TestRestartGivesEveryOwnerAFullTTLWithoutWriting(t *testing.T) {
	mem := store.NewMemory()
	old := time.Now().Add(-48 * time.Hour)
	for _, r := range []*store.Route{
		{Kind: store.KindHTTP, Label: "stale", Tenant: "acme", EmptySince: old}, // empty for two TTLs
		{Kind: store.KindHTTP, Label: "busy", Tenant: "acme"},                   // had members at the stop
	} {
		_, err := mem.Update(t.Context(), r.Key(), func(*store.Route) (*store.Route, error) { return r, nil })
		require.NoError(t, err)
	}
	st := &countingStore{Store: mem}
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	b, err := newRouteBook(st, 24*time.Hour, reg, nil, zaptest.NewLogger(t))
	require.NoError(t, err)
	require.Zero(t, st.writes.Load(), "the start writes nothing")
	start := b.now()
	for _, label := range []string{"stale", "busy"} {
		var clock atomic.Int64
		clock.Store(start.Add(23 * time.Hour).UnixNano())
		b.now = func() time.Time { return time.Unix(0, clock.Load()) }
		req := &group.JoinRequest{ID: "x-" + label, Proto: group.ProtoHTTP, Label: label}
		_, err := b.claim("globex", req, false, TenantLimits{})
		require.ErrorIs(t, err, ErrOwned, "%s: within a TTL of the start", label)
		clock.Store(start.Add(24 * time.Hour).UnixNano())
		tk, err := b.claim("globex", req, false, TenantLimits{})
		require.NoError(t, err, "%s: lapsed a TTL after the start", label)
		require.NotNil(t, tk)
	}
}
