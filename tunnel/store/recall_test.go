package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

// Recall is a Store like any other while the store loses nothing.
func TestRecallConformance(t *testing.T) {
	storetest.Run(t, func(testing.TB) store.Store { return store.NewRecall(store.NewMemory()) })
}

// A route the store lost (written through Recall, then gone from the store without a
// deletion through Recall) is what Update decides on, Lost lists and Restore writes back;
// one deleted through Recall, forgotten or reserved is not remembered.
func TestRecallRemembersWhatTheStoreLost(t *testing.T) {
	ctx := context.Background()
	inner := store.NewMemory()
	rc := store.NewRecall(inner)
	put := func(st store.Store, r *store.Route) {
		t.Helper()
		_, err := st.Update(ctx, r.Key(), func(*store.Route) (*store.Route, error) { return r, nil })
		require.NoError(t, err)
	}
	drop := func(st store.Store, key string) {
		t.Helper()
		_, err := st.Update(ctx, key, func(*store.Route) (*store.Route, error) { return nil, nil })
		require.NoError(t, err)
	}
	late := &store.Route{Kind: store.KindHTTP, Label: "late", Tenant: "alpha", Claimed: time.Unix(100, 0).UTC()}
	gone := &store.Route{Kind: store.KindHTTP, Label: "gone", Tenant: "alpha"}
	resv := &store.Route{Kind: store.KindHTTP, Label: "resv", Tenant: "alpha", Reserved: true}
	put(rc, late)
	put(rc, gone)
	put(rc, resv)
	drop(rc, gone.Key()) // deleted through Recall: forgotten
	doubt := rc.Doubt()  // the connection to the store was lost: it may lose writes
	for _, k := range []string{late.Key(), resv.Key()} {
		drop(inner, k) // the store loses them
	}

	lost, err := rc.Lost(ctx)
	require.NoError(t, err)
	require.Equal(t, []*store.Route{late}, lost, "only the route the store lost and Recall saw last (not the reserved one)")

	var seen *store.Route
	_, err = rc.Update(ctx, late.Key(), func(cur *store.Route) (*store.Route, error) {
		seen = cur
		return nil, errNoChange
	})
	require.ErrorIs(t, err, errNoChange)
	require.Equal(t, late, seen, "Update decides on the remembered route")
	got, err := inner.Get(ctx, late.Key())
	require.NoError(t, err)
	require.Nil(t, got, "an Update that wrote nothing wrote nothing")

	wrote, err := rc.Restore(ctx, late.Key())
	require.NoError(t, err)
	require.True(t, wrote)
	got, err = inner.Get(ctx, late.Key())
	require.NoError(t, err)
	require.Equal(t, late, got)
	wrote, err = rc.Restore(ctx, late.Key())
	require.NoError(t, err)
	require.False(t, wrote, "the store holds it: nothing to write back")

	// Another writer's newer version is what Recall remembers once it read it.
	newer := late.Clone()
	newer.Tenant = "beta"
	put(inner, newer)
	_, err = rc.Get(ctx, late.Key())
	require.NoError(t, err)
	drop(inner, late.Key())
	lost, err = rc.Lost(ctx)
	require.NoError(t, err)
	require.Equal(t, []*store.Route{newer}, lost)

	rc.Forget(late.Key())
	lost, err = rc.Lost(ctx)
	require.NoError(t, err)
	require.Empty(t, lost)
	wrote, err = rc.Restore(ctx, late.Key())
	require.NoError(t, err)
	require.False(t, wrote)
	require.True(t, rc.Trust(doubt))
	require.False(t, rc.Doubted())
}

// While the store is trusted (no Doubt, or Trust after it), a route it does not hold was
// deleted by another writer (its claim lapsed, an operator released it): Update decides on
// nothing, and Update and List forget it, so that it is neither kept for its old tenant nor
// written back later. A Trust of an older doubt trusts nothing.
func TestRecallForgetsWhatATrustedStoreDeleted(t *testing.T) {
	ctx := context.Background()
	inner := store.NewMemory()
	rc := store.NewRecall(inner)
	put := func(st store.Store, r *store.Route) {
		t.Helper()
		_, err := st.Update(ctx, r.Key(), func(*store.Route) (*store.Route, error) { return r, nil })
		require.NoError(t, err)
	}
	drop := func(key string) {
		t.Helper()
		_, err := inner.Update(ctx, key, func(*store.Route) (*store.Route, error) { return nil, nil })
		require.NoError(t, err)
	}
	a := &store.Route{Kind: store.KindHTTP, Label: "a", Tenant: "alpha"}
	b := &store.Route{Kind: store.KindHTTP, Label: "b", Tenant: "alpha"}
	put(rc, a)
	put(rc, b)
	drop(a.Key()) // released on another edge
	drop(b.Key())

	var seen *store.Route
	_, err := rc.Update(ctx, a.Key(), func(cur *store.Route) (*store.Route, error) {
		seen = cur
		return nil, errNoChange
	})
	require.ErrorIs(t, err, errNoChange)
	require.Nil(t, seen, "a deleted route is not decided on")
	_, err = rc.List(ctx)
	require.NoError(t, err)
	first := rc.Doubt()
	lost, err := rc.Lost(ctx)
	require.NoError(t, err)
	require.Empty(t, lost, "Update and List forgot the deleted routes")

	put(rc, a)
	second := rc.Doubt()
	require.False(t, rc.Trust(first), "a later doubt stands")
	require.True(t, rc.Doubted())
	drop(a.Key())
	lost, err = rc.Lost(ctx)
	require.NoError(t, err)
	require.Equal(t, []*store.Route{a}, lost, "lost while doubted")
	require.True(t, rc.Trust(second))
	_, err = rc.List(ctx)
	require.NoError(t, err)
	lost, err = rc.Lost(ctx)
	require.NoError(t, err)
	require.Empty(t, lost)
}

var errNoChange = errorString("no change")

type errorString string

func (e errorString) Error() string { return string(e) }
