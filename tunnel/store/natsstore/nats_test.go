package natsstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/storetest"
)

// The conformance suite runs against a store in an embedded server of its own per test.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t testing.TB) store.Store {
		return openTestNATS(t, connectNATS(t, startNATS(t, t.TempDir())), Config{})
	})
}

// startNATS starts an embedded NATS server with JetStream, storing in dir, and shuts it down
// at the end of the test.
func startNATS(t testing.TB, dir string) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { stopNATS(ns) })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	return ns
}

// stopNATS shuts ns down and waits until it has (doing it again does nothing).
func stopNATS(ns *server.Server) {
	ns.Shutdown()
	ns.WaitForShutdown()
}

// connectNATS connects to ns, and closes the connection at the end of the test (before the
// server stops).
func connectNATS(t testing.TB, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.NoReconnect(), quietNATS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// quietNATS keeps the client from printing asynchronous errors (a server shut down under it)
// to stderr.
var quietNATS = nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})

// openTestNATS opens a NATS store on nc, closed at the end of the test.
func openTestNATS(t testing.TB, nc *nats.Conn, cfg Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), nc, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// natsKeyRe is a valid NATS key (jetstream's own check).
var natsKeyRe = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func validNATSKey(k string) bool {
	return natsKeyRe.MatchString(k) && k[0] != '.' && k[len(k)-1] != '.' && !strings.Contains(k, "..")
}

func TestNATSKeyEncoding(t *testing.T) {
	for key, want := range map[string]string{
		"http/web":             "http.web",
		"tcp/db":               "tcp.db",
		"http/My-sub_domain-9": "http.My-sub_domain-9",
		"tcp/my group":         "tcp.=bXkgZ3JvdXA",
		"tcp/a.b":              "tcp.=YS5i",
		"tcp/=x":               "tcp.=PXg",
		"tcp/":                 "tcp.=",
		"":                     "=",
		"a/b/c":                "a.=Yi9j",
		"tcp/a/b":              "tcp.=YS9i",
		"web":                  "web",
		"tcp/*":                "tcp.=Kg",
		"tcp/>":                "tcp.=Pg",
		"tcp/ünï":              "tcp.=w7xuw68",
		"/":                    "=.=",
		"tcp//":                "tcp.=Lw",
	} {
		got := natsKey(key)
		if got != want {
			t.Errorf("natsKey(%q) = %q, want %q", key, got, want)
		}
		if !validNATSKey(got) {
			t.Errorf("natsKey(%q) = %q is not a valid NATS key", key, got)
		}
		if back, err := storeKey(got); err != nil || back != key {
			t.Errorf("storeKey(%q) = %q, %v; want %q", got, back, err, key)
		}
	}
	// Longest group name on the wire, of any bytes.
	long := make([]byte, 128)
	for i := range long {
		long[i] = byte(rand.N(256))
	}
	nk := natsKey(store.Key(store.KindTCP, string(long)))
	if !validNATSKey(nk) || len(nk) != 4+1+171 {
		t.Errorf("128-byte group: NATS key %q (%d characters)", nk, len(nk))
	}
	// Keys no encoding gives.
	for _, bad := range []string{"tcp..x", "tcp.=!!", "tcp.a*", "tcp.=YS5i=", "tcp.=YR", "a.b.c", "tcp.=d2Vi", "tcp."} {
		if k, err := storeKey(bad); err == nil {
			t.Errorf("storeKey(%q) = %q, want an error", bad, k)
		}
	}
}

// FuzzNATSKey checks the key encoding is reversible and always gives a valid NATS key.
func FuzzNATSKey(f *testing.F) {
	for _, s := range []string{"http/web", "tcp/my group", "", "/", "a//b", "tcp/\xff\x00", "=", "tcp/=a", "a/b/c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		nk := natsKey(key)
		if !validNATSKey(nk) {
			t.Fatalf("natsKey(%q) = %q: not a valid NATS key", key, nk)
		}
		if back, err := storeKey(nk); err != nil || back != key {
			t.Fatalf("storeKey(natsKey(%q)) = %q, %v", key, back, err)
		}
	})
}

// TestNATSOddLabels stores routes whose labels need encoding and reads them back.
func TestNATSOddLabels(t *testing.T) {
	s := openTestNATS(t, connectNATS(t, startNATS(t, t.TempDir())), Config{})
	labels := []string{"web", "my group", "a.b", "a/b", "*", ">", "ünïcödé", "=x", "", strings.Repeat("ü", 64)}
	for _, l := range labels {
		r := storetest.SampleRoute(l)
		if _, err := s.Update(t.Context(), r.Key(), storetest.Set(r)); err != nil {
			t.Fatalf("Update(%q): %v", r.Key(), err)
		}
		if got := storetest.MustGet(t, s, r.Key()); !storetest.SameRoute(t, got, r) {
			t.Fatalf("Get(%q) = %+v, want %+v", r.Key(), got, r)
		}
	}
	l, err := s.List(t.Context())
	if err != nil || len(l) != len(labels) {
		t.Fatalf("List = %d routes, %v; want %d", len(l), err, len(labels))
	}
	for i, r := range l {
		if i > 0 && l[i-1].Key() >= r.Key() {
			t.Fatalf("List out of key order at %d: %q then %q", i, l[i-1].Key(), r.Key())
		}
	}
	// Under the hood: "*" is not a wildcard, "a.b" not two tokens.
	keys, err := s.kv.Keys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if !validNATSKey(k) || !strings.HasPrefix(k, "tcp.") || strings.Count(k, ".") != 1 {
			t.Errorf("NATS key %q", k)
		}
	}
}

func TestNATSOpen(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	nc := connectNATS(t, ns)
	s := openTestNATS(t, nc, Config{})
	if s.Bucket() != DefaultBucket || s.timeout != DefaultTimeout {
		t.Fatalf("defaults: bucket %q, timeout %v", s.Bucket(), s.timeout)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	if st.History() != 1 || info.Config.Storage != jetstream.FileStorage || info.Config.Replicas != 1 || st.TTL() != 0 {
		t.Fatalf("bucket: history %d, storage %v, replicas %d, TTL %v", st.History(), info.Config.Storage, info.Config.Replicas, st.TTL())
	}

	// A second store binds the same bucket and sees the first's routes at once.
	s2 := openTestNATS(t, nc, Config{})
	r := storetest.SampleRoute("web")
	if _, err := s.Update(t.Context(), r.Key(), storetest.Set(r)); err != nil {
		t.Fatal(err)
	}
	if got := storetest.MustGet(t, s2, r.Key()); !storetest.SameRoute(t, got, r) {
		t.Fatalf("second store: Get = %+v", got)
	}

	// Another bucket is another store.
	other := openTestNATS(t, nc, Config{Bucket: "other_routes", Timeout: time.Second})
	if got := storetest.MustGet(t, other, r.Key()); got != nil {
		t.Fatalf("other bucket: Get = %+v, want nil", got)
	}
	if _, err := Open(context.Background(), nc, Config{Bucket: "bad bucket"}); err == nil {
		t.Fatal("Open with an invalid bucket name succeeded")
	}
	if _, err := Open(context.Background(), nil, Config{}); err == nil {
		t.Fatal("Open with no connection succeeded")
	}

	// A bucket with a TTL would let routes lapse: refused.
	if _, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "ttl_routes", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), nc, Config{Bucket: "ttl_routes"}); err == nil || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("Open of a bucket with a TTL = %v, want an error", err)
	}

	// Close leaves the caller's connection open and usable.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !nc.IsConnected() {
		t.Fatal("Close closed the connection")
	}
	if got := storetest.MustGet(t, s2, r.Key()); !storetest.SameRoute(t, got, r) {
		t.Fatalf("after the first store's Close: Get = %+v", got)
	}

	// A server without JetStream: Open fails within its timeout.
	plain, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	plain.Start()
	t.Cleanup(func() { stopNATS(plain) })
	if !plain.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	start := time.Now()
	if _, err := Open(context.Background(), connectNATS(t, plain), Config{Timeout: time.Second}); err == nil {
		t.Fatal("Open on a server without JetStream succeeded")
	} else {
		t.Logf("no JetStream: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
	}
}

// TestNATSStoresRaceUpdates runs two stores, on two connections to one bucket, incrementing
// one counter: compare-and-set loses no increment.
func TestNATSStoresRaceUpdates(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	stores := []*Store{
		openTestNATS(t, connectNATS(t, ns), Config{}),
		openTestNATS(t, connectNATS(t, ns), Config{}),
	}
	const n = 100
	key := store.Key(store.KindTCP, "counter")
	var calls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	start := time.Now()
	for _, s := range stores {
		wg.Go(func() {
			for range n {
				_, err := s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
					calls.Add(1)
					if cur == nil {
						cur = &store.Route{Kind: store.KindTCP, Label: "counter", Ports: map[string]int{}}
					}
					cur.Ports["n"]++
					cur.EmptySince = cur.EmptySince.Add(time.Second)
					return cur, nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, s := range stores {
		r := storetest.MustGet(t, s, key)
		if r == nil || r.Ports["n"] != 2*n || r.EmptySince != (time.Time{}).Add(2*n*time.Second) {
			t.Fatalf("counter = %+v, want Ports[n] = %d", r, 2*n)
		}
	}
	t.Logf("%d updates in %v: fn called %d times (%d retries after a conflict)",
		2*n, time.Since(start).Round(time.Millisecond), calls.Load(), calls.Load()-2*n)
}

var errOwned = errors.New("owned by another tenant")

// TestNATSCreateRace has two stores create one absent key for two tenants at once: exactly
// one wins, and the other's fn, called again, sees the winner's route.
func TestNATSCreateRace(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	stores := []*Store{
		openTestNATS(t, connectNATS(t, ns), Config{}),
		openTestNATS(t, connectNATS(t, ns), Config{}),
	}
	key := store.Key(store.KindHTTP, "contested")
	for round := range 10 {
		key := fmt.Sprintf("%s%d", key, round)
		// Both fns see the key absent before either writes.
		var bothRead sync.WaitGroup
		bothRead.Add(2)
		type result struct {
			tenant string
			got    *store.Route
			err    error
			seen   []*store.Route // what fn was called with, in order
		}
		results := make([]result, 2)
		var wg sync.WaitGroup
		for i, s := range stores {
			tenant := fmt.Sprintf("tenant-%d", i)
			results[i].tenant = tenant
			wg.Go(func() {
				res := &results[i]
				res.got, res.err = s.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
					res.seen = append(res.seen, cur.Clone())
					if len(res.seen) == 1 {
						bothRead.Done()
						bothRead.Wait()
					}
					if cur != nil && cur.Tenant != tenant {
						return nil, errOwned
					}
					return &store.Route{Kind: store.KindHTTP, Label: "contested", Tenant: tenant}, nil
				})
			})
		}
		wg.Wait()
		var winner, loser *result
		for i := range results {
			switch res := &results[i]; {
			case res.err == nil:
				if winner != nil {
					t.Fatalf("round %d: both won: %+v", round, results)
				}
				winner = res
			case errors.Is(res.err, errOwned):
				loser = res
			default:
				t.Fatalf("round %d: %s: %v", round, res.tenant, res.err)
			}
		}
		if winner == nil || loser == nil {
			t.Fatalf("round %d: want one winner and one loser: %+v", round, results)
		}
		if winner.got.Tenant != winner.tenant || len(winner.seen) != 1 || winner.seen[0] != nil {
			t.Fatalf("round %d: winner %+v", round, winner)
		}
		if len(loser.seen) != 2 || loser.seen[0] != nil || loser.seen[1] == nil || loser.seen[1].Tenant != winner.tenant {
			t.Fatalf("round %d: the loser's fn saw %v, want nil then the winner's route", round, loser.seen)
		}
		for _, s := range stores {
			if r := storetest.MustGet(t, s, key); r == nil || r.Tenant != winner.tenant {
				t.Fatalf("round %d: stored %+v, want the winner's", round, r)
			}
		}
	}
}

// TestNATSDeleteRace has a delete race an update: the delete, at the revision it read, must
// not remove a route changed since.
func TestNATSDeleteRace(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	a := openTestNATS(t, connectNATS(t, ns), Config{})
	b := openTestNATS(t, connectNATS(t, ns), Config{})
	key := store.Key(store.KindTCP, "web")
	if _, err := a.Update(t.Context(), key, storetest.Set(storetest.SampleRoute("web"))); err != nil {
		t.Fatal(err)
	}
	calls := 0
	got, err := a.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
		calls++
		if calls == 1 {
			// Another edge takes the route between this read and the delete.
			if _, err := b.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
				cur.Tenant, cur.EmptySince = "other", time.Time{}
				return cur, nil
			}); err != nil {
				t.Error(err)
			}
		}
		if cur.EmptySince.IsZero() {
			return cur, nil // in use again: keep it
		}
		return nil, nil // lapsed: delete
	})
	if err != nil || calls != 2 || got == nil || got.Tenant != "other" {
		t.Fatalf("Update = %+v, %v after %d calls; want the other's route after 2", got, err, calls)
	}
	if r := storetest.MustGet(t, a, key); r == nil || r.Tenant != "other" {
		t.Fatalf("stored %+v, want the other's route", r)
	}
	// And deleted then created again (create over a delete marker) works, through both.
	for _, s := range []*Store{a, b, a} {
		if _, err := s.Update(t.Context(), key, storetest.Set(nil)); err != nil {
			t.Fatal(err)
		}
		if r := storetest.MustGet(t, b, key); r != nil {
			t.Fatalf("after delete: %+v", r)
		}
		if _, err := s.Update(t.Context(), key, storetest.Set(storetest.SampleRoute("web"))); err != nil {
			t.Fatal(err)
		}
		if r := storetest.MustGet(t, b, key); !storetest.SameRoute(t, r, storetest.SampleRoute("web")) {
			t.Fatalf("after create: %+v", r)
		}
	}
}

// TestNATSConflictBound has every write of an Update lose to another writer: Update gives up
// after maxTries with ErrConflict, having written nothing.
func TestNATSConflictBound(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	a := openTestNATS(t, connectNATS(t, ns), Config{})
	b := openTestNATS(t, connectNATS(t, ns), Config{})
	a.maxTries, a.maxBackoff = 10, time.Millisecond
	key := store.Key(store.KindTCP, "hot")
	for _, present := range []bool{true, false} {
		if present {
			if _, err := b.Update(t.Context(), key, storetest.Set(storetest.SampleRoute("hot"))); err != nil {
				t.Fatal(err)
			}
		}
		calls := 0
		_, err := a.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
			calls++
			// Each time, another writer gets in first.
			if _, err := b.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
				if cur == nil {
					cur = storetest.SampleRoute("hot")
				}
				cur.Ports["n"]++
				return cur, nil
			}); err != nil {
				t.Error(err)
			}
			return &store.Route{Kind: store.KindTCP, Label: "hot", Tenant: "a"}, nil
		})
		if !errors.Is(err, ErrConflict) || calls != 10 {
			t.Fatalf("present %v: Update = %v after %d calls; want ErrConflict after 10", present, err, calls)
		}
		if r := storetest.MustGet(t, a, key); r == nil || r.Tenant == "a" {
			t.Fatalf("present %v: stored %+v", present, r)
		}
		if _, err := b.Update(t.Context(), key, storetest.Set(nil)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNATSContextEndsRetries has every write of an Update lose to another writer, as
// TestNATSConflictBound does, until the Update's context is cancelled: the Update stops
// there, with the context's error, having written nothing.
func TestNATSContextEndsRetries(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	a := openTestNATS(t, connectNATS(t, ns), Config{})
	b := openTestNATS(t, connectNATS(t, ns), Config{})
	key := store.Key(store.KindTCP, "hot")
	if _, err := b.Update(t.Context(), key, storetest.Set(storetest.SampleRoute("hot"))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	calls := 0
	_, err := a.Update(ctx, key, func(cur *store.Route) (*store.Route, error) {
		calls++
		if _, err := b.Update(t.Context(), key, func(cur *store.Route) (*store.Route, error) {
			cur.Ports["n"]++
			return cur, nil
		}); err != nil {
			t.Error(err)
		}
		if calls == 3 {
			cancel()
		}
		return &store.Route{Kind: store.KindTCP, Label: "hot", Tenant: "a"}, nil
	})
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrConflict) || calls != 3 {
		t.Fatalf("Update = %v after %d calls; want context.Canceled after 3", err, calls)
	}
	if r := storetest.MustGet(t, a, key); r == nil || r.Tenant == "a" {
		t.Fatalf("stored %+v", r)
	}
}

// TestNATSContextEndsKeyWait has an Update wait for another Update of its key in the same
// store, which holds the key's lock: the waiting one ends with its context.
func TestNATSContextEndsKeyWait(t *testing.T) {
	s := openTestNATS(t, connectNATS(t, startNATS(t, t.TempDir())), Config{})
	key := store.Key(store.KindHTTP, "a")
	inFn, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := s.Update(t.Context(), key, func(*store.Route) (*store.Route, error) {
			close(inFn)
			<-release
			return &store.Route{Kind: store.KindHTTP, Label: "a", Tenant: "first"}, nil
		})
		first <- err
	}()
	<-inFn
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	called := false
	_, err := s.Update(ctx, key, func(*store.Route) (*store.Route, error) { called = true; return nil, nil })
	close(release)
	if !errors.Is(err, context.DeadlineExceeded) || called {
		t.Fatalf("Update waiting for the key = %v (fn called: %v); want the context's error before fn", err, called)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if r := storetest.MustGet(t, s, key); r == nil || r.Tenant != "first" {
		t.Fatalf("stored %+v, want the first Update's route", r)
	}
}

// TestNATSReopenKeepsEverything writes, changes and deletes routes, then reads them back
// through a new store, and again after the server restarts on the same directory.
func TestNATSReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	ns := startNATS(t, dir)
	nc := connectNATS(t, ns)
	s := openTestNATS(t, nc, Config{})
	want := map[string]*store.Route{}
	for i := range 100 {
		r := storetest.SampleRoute(fmt.Sprintf("r%03d", i))
		if i%2 == 0 {
			r.Kind, r.Ports = store.KindHTTP, nil
		}
		if _, err := s.Update(t.Context(), r.Key(), storetest.Set(r)); err != nil {
			t.Fatal(err)
		}
		want[r.Key()] = r
	}
	// Change every third route, delete every sixth.
	for i := 0; i < 100; i += 3 {
		r := storetest.SampleRoute(fmt.Sprintf("r%03d", i))
		if i%2 == 0 {
			r.Kind, r.Ports = store.KindHTTP, nil
			if _, err := s.Update(t.Context(), r.Key(), storetest.Set(nil)); err != nil {
				t.Fatal(err)
			}
			delete(want, r.Key())
			continue
		}
		r.Tenant = "changed"
		if _, err := s.Update(t.Context(), r.Key(), storetest.Set(r)); err != nil {
			t.Fatal(err)
		}
		want[r.Key()] = r
	}
	check := func(s store.Store, when string) {
		t.Helper()
		l, err := s.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(l) != len(want) {
			t.Fatalf("%s: List has %d routes, want %d", when, len(l), len(want))
		}
		for _, r := range l {
			if !storetest.SameRoute(t, r, want[r.Key()]) {
				t.Fatalf("%s: %s = %+v, want %+v", when, r.Key(), r, want[r.Key()])
			}
		}
	}
	check(s, "before close")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(openTestNATS(t, nc, Config{}), "after reopen")

	nc.Close()
	stopNATS(ns)
	check(openTestNATS(t, connectNATS(t, startNATS(t, dir)), Config{}), "after a server restart")
}

// TestNATSUpdateReturnsStoredForm checks Update's result is the route as stored (as Get
// returns it), e.g. with no monotonic clock reading.
func TestNATSUpdateReturnsStoredForm(t *testing.T) {
	s := openTestNATS(t, connectNATS(t, startNATS(t, t.TempDir())), Config{})
	r := &store.Route{Kind: store.KindHTTP, Label: "a", EmptySince: time.Now()}
	got, err := s.Update(t.Context(), r.Key(), storetest.Set(r))
	if err != nil {
		t.Fatal(err)
	}
	again := storetest.MustGet(t, s, r.Key())
	if got.EmptySince != again.EmptySince || !got.EmptySince.Equal(r.EmptySince) {
		t.Fatalf("Update returned %v, Get %v, stored %v", got.EmptySince, again.EmptySince, r.EmptySince)
	}
	// Writing the same route again writes nothing: the revision stays.
	e1, err := s.kv.Get(context.Background(), natsKey(r.Key()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(t.Context(), r.Key(), storetest.Set(got)); err != nil {
		t.Fatal(err)
	}
	e2, err := s.kv.Get(context.Background(), natsKey(r.Key()))
	if err != nil {
		t.Fatal(err)
	}
	if e1.Revision() != e2.Revision() {
		t.Fatalf("an unchanged Update wrote: revision %d → %d", e1.Revision(), e2.Revision())
	}
	// Nor does deleting an absent key (no delete marker).
	before := bucketLastSeq(t, s)
	if _, err := s.Update(t.Context(), "http/none", storetest.Set(nil)); err != nil {
		t.Fatal(err)
	}
	if after := bucketLastSeq(t, s); after != before {
		t.Fatalf("deleting an absent key wrote: last sequence %d → %d", before, after)
	}
}

// bucketLastSeq returns the sequence of the last message of s's bucket.
func bucketLastSeq(t *testing.T, s *Store) uint64 {
	t.Helper()
	st, err := s.kv.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
}

// BenchmarkNATSUpdate is one compare-and-set write per op (read, then write at the revision
// read) to an embedded server in b.TempDir().
func BenchmarkNATSUpdate(b *testing.B) {
	storetest.BenchUpdate(b, openTestNATS(b, connectNATS(b, startNATS(b, b.TempDir())), Config{}))
}

// TestNATSCorrupt puts values that are not routes, and keys no route has, into the bucket:
// the calls that meet them fail with ErrCorrupt naming the bucket and key.
func TestNATSCorrupt(t *testing.T) {
	s := openTestNATS(t, connectNATS(t, startNATS(t, t.TempDir())), Config{})
	ctx := context.Background()
	if _, err := s.kv.Put(ctx, "http.bad", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.kv.Put(ctx, "http.empty", nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"http/bad", "http/empty"} {
		if _, err := s.Get(t.Context(), key); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), DefaultBucket) {
			t.Errorf("Get(%s) = %v, want ErrCorrupt", key, err)
		}
		called := false
		if _, err := s.Update(t.Context(), key, func(*store.Route) (*store.Route, error) { called = true; return nil, nil }); !errors.Is(err, ErrCorrupt) || called {
			t.Errorf("Update(%s) = %v (fn called: %v), want ErrCorrupt before fn", key, err, called)
		}
	}
	if _, err := s.List(t.Context()); !errors.Is(err, ErrCorrupt) {
		t.Errorf("List = %v, want ErrCorrupt", err)
	}
	for _, k := range []string{"http.bad", "http.empty"} {
		if err := s.kv.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := s.List(t.Context()); err != nil || len(l) != 0 {
		t.Fatalf("List = %v, %v; want empty", l, err)
	}
	if _, err := s.kv.Put(ctx, "tcp.x=y", []byte(`{"kind":"tcp"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(t.Context()); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "tcp.x=y") {
		t.Errorf("List with a foreign key = %v, want ErrCorrupt", err)
	}
}

// TestNATSServerGone checks calls fail after the timeout, or when their context ends if
// that is sooner, not hang, when NATS does not answer, and that Close cancels the calls in
// flight.
func TestNATSServerGone(t *testing.T) {
	ns := startNATS(t, t.TempDir())
	// This connection reconnects: requests wait for the server instead of failing at once.
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), quietNATS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	s := openTestNATS(t, nc, Config{Timeout: 300 * time.Millisecond})
	if _, err := s.Update(t.Context(), "http/a", storetest.Set(&store.Route{Kind: store.KindHTTP, Label: "a"})); err != nil {
		t.Fatal(err)
	}
	stopNATS(ns)

	for name, call := range map[string]func() error{
		"Get":    func() error { _, err := s.Get(t.Context(), "http/a"); return err },
		"List":   func() error { _, err := s.List(t.Context()); return err },
		"Update": func() error { _, err := s.Update(t.Context(), "http/a", storetest.Set(nil)); return err },
	} {
		start := time.Now()
		err := call()
		d := time.Since(start)
		if err == nil || d > 3*time.Second {
			t.Fatalf("%s with the server gone = %v after %v; want an error after about the timeout", name, err, d)
		}
		t.Logf("%s: %v after %v", name, err, d.Round(time.Millisecond))
	}

	// A call's context ends it before the store's timeout: the error is the context's.
	s.timeout = time.Minute
	for name, call := range map[string]func(ctx context.Context) error{
		"Get":    func(ctx context.Context) error { _, err := s.Get(ctx, "http/a"); return err },
		"List":   func(ctx context.Context) error { _, err := s.List(ctx); return err },
		"Update": func(ctx context.Context) error { _, err := s.Update(ctx, "http/a", storetest.Set(nil)); return err },
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		d := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || d > 3*time.Second {
			t.Fatalf("%s with the server gone and a 300ms context = %v after %v; want the context's error after about 300ms", name, err, d)
		}
		t.Logf("%s with a 300ms context: %v after %v", name, err, d.Round(time.Millisecond))
	}

	// Close ends a call in flight with store.ErrClosed, well before its timeout.
	done := make(chan error, 1)
	go func() { _, err := s.Get(t.Context(), "http/a"); done <- err }()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, store.ErrClosed) {
			t.Fatalf("Get in flight at Close = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get in flight at Close did not return")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v", d)
	}
}
