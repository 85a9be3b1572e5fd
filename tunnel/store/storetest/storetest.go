// Package storetest checks that an implementation of store.Store behaves as the interface
// says: Run is one conformance suite, run by the tests of every implementation in this
// module (store.Memory, boltstore, natsstore) and usable by the tests of any other. The
// helpers it exports are the ones those tests share. It is meant to be imported by tests
// only, as golang.org/x/net/nettest is.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel/store"
)

// Run runs the conformance suite: each test as a subtest of t, on a fresh store that open
// returns and that Run closes at the end of the subtest (a store that Close was called on
// already must accept a second Close).
func Run(t *testing.T, open func(t testing.TB) store.Store) {
	for _, test := range []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"CreateModifyDelete", testCreateModifyDelete},
		{"FnErrorChangesNothing", testFnErrorChangesNothing},
		{"FnSeesACopy", testFnSeesACopy},
		{"GetListReturnCopies", testGetListReturnCopies},
		{"ListInKeyOrder", testListInKeyOrder},
		{"ConcurrentUpdatesSerialised", testConcurrentUpdatesSerialised},
		{"ContextDone", testContextDone},
		{"Close", testClose},
	} {
		t.Run(test.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { _ = s.Close() })
			test.fn(t, s)
		})
	}
}

// BenchUpdate measures one Update that rewrites one route (a TCP pool's port changes), the
// write-through cost of a registration.
func BenchUpdate(b *testing.B, s store.Store) {
	key := store.Key(store.KindTCP, "web")
	r := SampleRoute("web")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := s.Update(b.Context(), key, func(cur *store.Route) (*store.Route, error) {
			r.Ports["p"] = i
			return r, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// SampleRoute is a route with every field set, labelled label.
func SampleRoute(label string) *store.Route {
	return &store.Route{
		Kind:       store.KindTCP,
		Label:      label,
		Tenant:     "acme",
		Group:      "web",
		KeyHash:    group.HashKey("secret-" + label),
		Ports:      map[string]int{group.HashKey("a").String(): 40001, group.HashKey("b").String(): 40002},
		Reserved:   true,
		EmptySince: time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC),
	}
}

// SameRoute reports whether two routes hold the same data (compared as stored: JSON).
func SameRoute(t testing.TB, got, want *store.Route) bool {
	t.Helper()
	g, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	return string(g) == string(w)
}

// MustGet returns the route at key in s, failing t if Get fails.
func MustGet(t testing.TB, s store.Store, key string) *store.Route {
	t.Helper()
	r, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return r
}

// Set is an Update function that stores r whatever is stored (nil: deletes the key).
func Set(r *store.Route) func(*store.Route) (*store.Route, error) {
	return func(*store.Route) (*store.Route, error) { return r, nil }
}

func testCreateModifyDelete(t *testing.T, s store.Store) {
	want := SampleRoute("web")
	key := want.Key()
	if r := MustGet(t, s, key); r != nil {
		t.Fatalf("Get of an absent key = %+v, want nil", r)
	}

	// Create: fn sees nil, Update returns what is stored.
	got, err := s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
		if cur != nil {
			t.Errorf("create: fn saw %+v, want nil", cur)
		}
		return want, nil
	})
	if err != nil || !SameRoute(t, got, want) {
		t.Fatalf("create: Update = %+v, %v; want %+v", got, err, want)
	}
	if r := MustGet(t, s, key); !SameRoute(t, r, want) {
		t.Fatalf("after create: Get = %+v, want %+v", r, want)
	}

	// Modify: fn sees the stored route and changes it.
	got, err = s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
		if !SameRoute(t, cur, want) {
			t.Errorf("modify: fn saw %+v, want %+v", cur, want)
		}
		cur.Tenant = "globex"
		cur.Ports["extra"] = 40003
		cur.EmptySince = time.Time{}
		return cur, nil
	})
	want.Tenant, want.Ports["extra"], want.EmptySince = "globex", 40003, time.Time{}
	if err != nil || !SameRoute(t, got, want) {
		t.Fatalf("modify: Update = %+v, %v; want %+v", got, err, want)
	}
	if r := MustGet(t, s, key); !SameRoute(t, r, want) {
		t.Fatalf("after modify: Get = %+v, want %+v", r, want)
	}

	// Writing the same route again is no change and no error.
	if got, err = s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) { return cur, nil }); err != nil || !SameRoute(t, got, want) {
		t.Fatalf("rewrite: Update = %+v, %v; want %+v", got, err, want)
	}

	// Delete: fn returns nil.
	got, err = s.Update(t.Context(), key, Set(nil))
	if err != nil || got != nil {
		t.Fatalf("delete: Update = %+v, %v; want nil, nil", got, err)
	}
	if r := MustGet(t, s, key); r != nil {
		t.Fatalf("after delete: Get = %+v, want nil", r)
	}
	// Deleting an absent key is no error.
	if got, err = s.Update(t.Context(), key, Set(nil)); err != nil || got != nil {
		t.Fatalf("delete absent: Update = %+v, %v; want nil, nil", got, err)
	}
	if l, err := s.List(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("List after delete = %v, %v; want empty", l, err)
	}
}

func testFnErrorChangesNothing(t *testing.T, s store.Store) {
	want := SampleRoute("web")
	if _, err := s.Update(t.Context(), want.Key(), Set(want)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("storetest: boom")
	for name, fn := range map[string]func(*store.Route) (*store.Route, error){
		"modify": func(cur *store.Route) (*store.Route, error) {
			cur.Tenant = "evil"
			cur.Ports["x"] = 1
			return cur, boom
		},
		"delete": func(*store.Route) (*store.Route, error) { return nil, boom },
	} {
		got, err := s.Update(t.Context(), want.Key(), fn)
		if err != boom || got != nil {
			t.Fatalf("%s: Update = %+v, %v; want nil and fn's error itself", name, got, err)
		}
		if r := MustGet(t, s, want.Key()); !SameRoute(t, r, want) {
			t.Fatalf("%s: after fn's error Get = %+v, want %+v", name, r, want)
		}
	}
	// An error on an absent key creates nothing.
	if _, err := s.Update(t.Context(), "http/none", func(*store.Route) (*store.Route, error) { return SampleRoute("none"), boom }); err != boom {
		t.Fatalf("Update = %v, want boom", err)
	}
	if r := MustGet(t, s, "http/none"); r != nil {
		t.Fatalf("fn's error created %+v", r)
	}
}

func testFnSeesACopy(t *testing.T, s store.Store) {
	want := SampleRoute("web")
	key := want.Key()
	if _, err := s.Update(t.Context(), key, Set(want)); err != nil {
		t.Fatal(err)
	}
	// fn mutates its argument but returns a different route: only that one is stored.
	var seen *store.Route
	other := &store.Route{Kind: store.KindTCP, Label: "web", Tenant: "acme", Ports: map[string]int{"p": 1}}
	if _, err := s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
		seen = cur
		cur.Tenant = "evil"
		cur.Ports["evil"] = 666
		cur.Reserved = false
		return other, nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := MustGet(t, s, key); !SameRoute(t, r, other) {
		t.Fatalf("Get = %+v, want %+v", r, other)
	}
	// Nor does mutating fn's argument after Update returned.
	seen.Ports["later"] = 1
	seen.Tenant = "later"
	if r := MustGet(t, s, key); !SameRoute(t, r, other) {
		t.Fatalf("mutating fn's argument later changed the store: Get = %+v", r)
	}
	// Nor mutating the route fn returned, or the one Update returned.
	got, err := s.Update(t.Context(), key, Set(want))
	if err != nil {
		t.Fatal(err)
	}
	want.Ports["mine"] = 1
	got.Ports["theirs"] = 2
	got.Tenant = "x"
	delete(want.Ports, "mine")
	if r := MustGet(t, s, key); !SameRoute(t, r, want) {
		t.Fatalf("mutating Update's result changed the store: Get = %+v, want %+v", r, want)
	}
	// fn that mutates its argument and returns an error: covered by FnErrorChangesNothing;
	// fn that returns its (mutated) argument on an absent key cannot: cur is nil there.
}

func testGetListReturnCopies(t *testing.T, s store.Store) {
	want := SampleRoute("web")
	if _, err := s.Update(t.Context(), want.Key(), Set(want)); err != nil {
		t.Fatal(err)
	}
	r := MustGet(t, s, want.Key())
	r.Tenant = "evil"
	r.Ports["evil"] = 1
	l, err := s.List(t.Context())
	if err != nil || len(l) != 1 {
		t.Fatalf("List = %v, %v", l, err)
	}
	l[0].Tenant = "evil"
	l[0].Ports["evil"] = 1
	if r := MustGet(t, s, want.Key()); !SameRoute(t, r, want) {
		t.Fatalf("mutating Get's or List's result changed the store: %+v", r)
	}
	if l, _ := s.List(t.Context()); !SameRoute(t, l[0], want) {
		t.Fatalf("mutating List's result changed the store: %+v", l[0])
	}
}

func testListInKeyOrder(t *testing.T, s store.Store) {
	var keys []string
	for i := range 40 {
		keys = append(keys, store.Key(store.KindHTTP, fmt.Sprintf("h%02d", i)), store.Key(store.KindTCP, fmt.Sprintf("t%02d", i)))
	}
	// store.Store them in a random order, each under its own key.
	for _, i := range rand.Perm(len(keys)) {
		k := keys[i]
		kind, label := store.KindHTTP, k[len("http/"):]
		if k[0] == 't' {
			kind, label = store.KindTCP, k[len("tcp/"):]
		}
		if _, err := s.Update(t.Context(), k, Set(&store.Route{Kind: kind, Label: label})); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.List(t.Context())
	if err != nil || len(l) != len(keys) {
		t.Fatalf("List = %d routes, %v; want %d", len(l), err, len(keys))
	}
	for i, r := range l {
		if i > 0 && l[i-1].Key() >= r.Key() {
			t.Fatalf("List out of key order at %d: %q then %q", i, l[i-1].Key(), r.Key())
		}
	}
	if l[0].Key() != "http/h00" || l[len(l)-1].Key() != "tcp/t39" {
		t.Fatalf("List runs %q … %q", l[0].Key(), l[len(l)-1].Key())
	}
}

func testConcurrentUpdatesSerialised(t *testing.T, s store.Store) {
	const n = 50
	key := store.Key(store.KindTCP, "counter")
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
				if cur == nil {
					cur = &store.Route{Kind: store.KindTCP, Label: "counter", Ports: map[string]int{}}
				}
				cur.Ports["n"]++
				return cur, nil
			})
			errs <- err
		})
	}
	// Readers alongside the writers see no torn state.
	for range 5 {
		wg.Go(func() {
			for range 10 {
				if _, err := s.Get(t.Context(), key); err != nil {
					errs <- err
					return
				}
				if _, err := s.List(t.Context()); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if r := MustGet(t, s, key); r == nil || r.Ports["n"] != n {
		t.Fatalf("counter = %+v, want Ports[n] = %d", r, n)
	}
}

func testClose(t *testing.T, s store.Store) {
	if _, err := s.Update(t.Context(), "http/a", Set(&store.Route{Kind: store.KindHTTP, Label: "a"})); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v, want nil", err)
	}
	called := false
	if _, err := s.Update(t.Context(), "http/a", func(*store.Route) (*store.Route, error) { called = true; return nil, nil }); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Update after Close = %v, want ErrClosed", err)
	}
	if called {
		t.Fatal("Update after Close called fn")
	}
	if _, err := s.Get(t.Context(), "http/a"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Get after Close = %v, want ErrClosed", err)
	}
	if _, err := s.List(t.Context()); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("List after Close = %v, want ErrClosed", err)
	}
}

// testContextDone checks that a call given a context already done fails with the context's
// error, without calling fn or changing anything, and that the store is fine afterwards.
func testContextDone(t *testing.T, s store.Store) {
	want := SampleRoute("web")
	if _, err := s.Update(t.Context(), want.Key(), Set(want)); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	expired, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	for _, ctx := range []context.Context{cancelled, expired} {
		called := false
		if _, err := s.Update(ctx, want.Key(), func(*store.Route) (*store.Route, error) { called = true; return nil, nil }); !errors.Is(err, ctx.Err()) {
			t.Fatalf("Update with a done context = %v, want %v", err, ctx.Err())
		}
		if called {
			t.Fatal("Update with a done context called fn")
		}
		if _, err := s.Get(ctx, want.Key()); !errors.Is(err, ctx.Err()) {
			t.Fatalf("Get with a done context = %v, want %v", err, ctx.Err())
		}
		if _, err := s.List(ctx); !errors.Is(err, ctx.Err()) {
			t.Fatalf("List with a done context = %v, want %v", err, ctx.Err())
		}
	}
	if r := MustGet(t, s, want.Key()); !SameRoute(t, r, want) {
		t.Fatalf("after calls with a done context: Get = %+v, want %+v", r, want)
	}
}
