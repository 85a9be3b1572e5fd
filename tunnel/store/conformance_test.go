package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/warren-tunnel/warren/group"
)

// impls is every Store implementation; each conformance test runs against all of them.
var impls = []struct {
	name string
	open func(t testing.TB) Store
}{
	{"Memory", func(testing.TB) Store { return NewMemory() }},
	{"Bolt", func(t testing.TB) Store {
		s, err := Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// forEachImpl runs test once per implementation, on a fresh store closed at the end.
func forEachImpl(t *testing.T, test func(t *testing.T, s Store)) {
	for _, impl := range impls {
		t.Run(impl.name, func(t *testing.T) {
			s := impl.open(t)
			t.Cleanup(func() { _ = s.Close() })
			test(t, s)
		})
	}
}

// sampleRoute is a route with every field set.
func sampleRoute(label string) *Route {
	return &Route{
		Kind:       KindTCP,
		Label:      label,
		Tenant:     "acme",
		Group:      "web",
		KeyHash:    group.HashKey("secret-" + label),
		Ports:      map[string]int{group.HashKey("a").String(): 40001, group.HashKey("b").String(): 40002},
		Reserved:   true,
		EmptySince: time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC),
	}
}

// sameRoute reports whether two routes hold the same data (compared as stored: JSON).
func sameRoute(t *testing.T, got, want *Route) bool {
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

func mustGet(t *testing.T, s Store, key string) *Route {
	t.Helper()
	r, err := s.Get(key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return r
}

func set(r *Route) func(*Route) (*Route, error) {
	return func(*Route) (*Route, error) { return r, nil }
}

func TestConformanceCreateModifyDelete(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		want := sampleRoute("web")
		key := want.Key()
		if r := mustGet(t, s, key); r != nil {
			t.Fatalf("Get of an absent key = %+v, want nil", r)
		}

		// Create: fn sees nil, Update returns what is stored.
		got, err := s.Update(key, func(cur *Route) (*Route, error) {
			if cur != nil {
				t.Errorf("create: fn saw %+v, want nil", cur)
			}
			return want, nil
		})
		if err != nil || !sameRoute(t, got, want) {
			t.Fatalf("create: Update = %+v, %v; want %+v", got, err, want)
		}
		if r := mustGet(t, s, key); !sameRoute(t, r, want) {
			t.Fatalf("after create: Get = %+v, want %+v", r, want)
		}

		// Modify: fn sees the stored route and changes it.
		got, err = s.Update(key, func(cur *Route) (*Route, error) {
			if !sameRoute(t, cur, want) {
				t.Errorf("modify: fn saw %+v, want %+v", cur, want)
			}
			cur.Tenant = "globex"
			cur.Ports["extra"] = 40003
			cur.EmptySince = time.Time{}
			return cur, nil
		})
		want.Tenant, want.Ports["extra"], want.EmptySince = "globex", 40003, time.Time{}
		if err != nil || !sameRoute(t, got, want) {
			t.Fatalf("modify: Update = %+v, %v; want %+v", got, err, want)
		}
		if r := mustGet(t, s, key); !sameRoute(t, r, want) {
			t.Fatalf("after modify: Get = %+v, want %+v", r, want)
		}

		// Writing the same route again is no change and no error.
		if got, err = s.Update(key, func(cur *Route) (*Route, error) { return cur, nil }); err != nil || !sameRoute(t, got, want) {
			t.Fatalf("rewrite: Update = %+v, %v; want %+v", got, err, want)
		}

		// Delete: fn returns nil.
		got, err = s.Update(key, set(nil))
		if err != nil || got != nil {
			t.Fatalf("delete: Update = %+v, %v; want nil, nil", got, err)
		}
		if r := mustGet(t, s, key); r != nil {
			t.Fatalf("after delete: Get = %+v, want nil", r)
		}
		// Deleting an absent key is no error.
		if got, err = s.Update(key, set(nil)); err != nil || got != nil {
			t.Fatalf("delete absent: Update = %+v, %v; want nil, nil", got, err)
		}
		if l, err := s.List(); err != nil || len(l) != 0 {
			t.Fatalf("List after delete = %v, %v; want empty", l, err)
		}
	})
}

func TestConformanceFnErrorChangesNothing(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		want := sampleRoute("web")
		if _, err := s.Update(want.Key(), set(want)); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		for name, fn := range map[string]func(*Route) (*Route, error){
			"modify": func(cur *Route) (*Route, error) {
				cur.Tenant = "evil"
				cur.Ports["x"] = 1
				return cur, boom
			},
			"delete": func(*Route) (*Route, error) { return nil, boom },
		} {
			got, err := s.Update(want.Key(), fn)
			if err != boom || got != nil {
				t.Fatalf("%s: Update = %+v, %v; want nil and fn's error itself", name, got, err)
			}
			if r := mustGet(t, s, want.Key()); !sameRoute(t, r, want) {
				t.Fatalf("%s: after fn's error Get = %+v, want %+v", name, r, want)
			}
		}
		// An error on an absent key creates nothing.
		if _, err := s.Update("http/none", func(*Route) (*Route, error) { return sampleRoute("none"), boom }); err != boom {
			t.Fatalf("Update = %v, want boom", err)
		}
		if r := mustGet(t, s, "http/none"); r != nil {
			t.Fatalf("fn's error created %+v", r)
		}
	})
}

func TestConformanceFnSeesACopy(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		want := sampleRoute("web")
		key := want.Key()
		if _, err := s.Update(key, set(want)); err != nil {
			t.Fatal(err)
		}
		// fn mutates its argument but returns a different route: only that one is stored.
		var seen *Route
		other := &Route{Kind: KindTCP, Label: "web", Tenant: "acme", Ports: map[string]int{"p": 1}}
		if _, err := s.Update(key, func(cur *Route) (*Route, error) {
			seen = cur
			cur.Tenant = "evil"
			cur.Ports["evil"] = 666
			cur.Reserved = false
			return other, nil
		}); err != nil {
			t.Fatal(err)
		}
		if r := mustGet(t, s, key); !sameRoute(t, r, other) {
			t.Fatalf("Get = %+v, want %+v", r, other)
		}
		// Nor does mutating fn's argument after Update returned.
		seen.Ports["later"] = 1
		seen.Tenant = "later"
		if r := mustGet(t, s, key); !sameRoute(t, r, other) {
			t.Fatalf("mutating fn's argument later changed the store: Get = %+v", r)
		}
		// Nor mutating the route fn returned, or the one Update returned.
		got, err := s.Update(key, set(want))
		if err != nil {
			t.Fatal(err)
		}
		want.Ports["mine"] = 1
		got.Ports["theirs"] = 2
		got.Tenant = "x"
		delete(want.Ports, "mine")
		if r := mustGet(t, s, key); !sameRoute(t, r, want) {
			t.Fatalf("mutating Update's result changed the store: Get = %+v, want %+v", r, want)
		}
		// fn that mutates its argument and returns an error: covered by FnErrorChangesNothing;
		// fn that returns its (mutated) argument on an absent key cannot: cur is nil there.
	})
}

func TestConformanceGetListReturnCopies(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		want := sampleRoute("web")
		if _, err := s.Update(want.Key(), set(want)); err != nil {
			t.Fatal(err)
		}
		r := mustGet(t, s, want.Key())
		r.Tenant = "evil"
		r.Ports["evil"] = 1
		l, err := s.List()
		if err != nil || len(l) != 1 {
			t.Fatalf("List = %v, %v", l, err)
		}
		l[0].Tenant = "evil"
		l[0].Ports["evil"] = 1
		if r := mustGet(t, s, want.Key()); !sameRoute(t, r, want) {
			t.Fatalf("mutating Get's or List's result changed the store: %+v", r)
		}
		if l, _ := s.List(); !sameRoute(t, l[0], want) {
			t.Fatalf("mutating List's result changed the store: %+v", l[0])
		}
	})
}

func TestConformanceListInKeyOrder(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		var keys []string
		for i := range 40 {
			keys = append(keys, Key(KindHTTP, fmt.Sprintf("h%02d", i)), Key(KindTCP, fmt.Sprintf("t%02d", i)))
		}
		// Store them in a random order, each under its own key.
		for _, i := range rand.Perm(len(keys)) {
			k := keys[i]
			kind, label := KindHTTP, k[len("http/"):]
			if k[0] == 't' {
				kind, label = KindTCP, k[len("tcp/"):]
			}
			if _, err := s.Update(k, set(&Route{Kind: kind, Label: label})); err != nil {
				t.Fatal(err)
			}
		}
		l, err := s.List()
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
	})
}

func TestConformanceConcurrentUpdatesSerialised(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		const n = 50
		key := Key(KindTCP, "counter")
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Go(func() {
				_, err := s.Update(key, func(cur *Route) (*Route, error) {
					if cur == nil {
						cur = &Route{Kind: KindTCP, Label: "counter", Ports: map[string]int{}}
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
					if _, err := s.Get(key); err != nil {
						errs <- err
						return
					}
					if _, err := s.List(); err != nil {
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
		if r := mustGet(t, s, key); r == nil || r.Ports["n"] != n {
			t.Fatalf("counter = %+v, want Ports[n] = %d", r, n)
		}
	})
}

func TestConformanceClose(t *testing.T) {
	forEachImpl(t, func(t *testing.T, s Store) {
		if _, err := s.Update("http/a", set(&Route{Kind: KindHTTP, Label: "a"})); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("Close = %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close = %v, want nil", err)
		}
		called := false
		if _, err := s.Update("http/a", func(*Route) (*Route, error) { called = true; return nil, nil }); !errors.Is(err, ErrClosed) {
			t.Fatalf("Update after Close = %v, want ErrClosed", err)
		}
		if called {
			t.Fatal("Update after Close called fn")
		}
		if _, err := s.Get("http/a"); !errors.Is(err, ErrClosed) {
			t.Fatalf("Get after Close = %v, want ErrClosed", err)
		}
		if _, err := s.List(); !errors.Is(err, ErrClosed) {
			t.Fatalf("List after Close = %v, want ErrClosed", err)
		}
	})
}
