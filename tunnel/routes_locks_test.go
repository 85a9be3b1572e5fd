package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/tunnel/store"
)

// stallingStore is a Memory whose Updates of one key, once stall names it, wait until
// unstall, as a store call waits on a disk that does not answer or a NATS that stopped.
type stallingStore struct {
	*store.Memory
	mu       sync.Mutex
	key      string
	released chan struct{}
	stalled  chan struct{} // closed once an Update of key waits
	once     sync.Once
}

func newStallingStore() *stallingStore {
	return &stallingStore{Memory: store.NewMemory(), released: make(chan struct{}), stalled: make(chan struct{})}
}

func (s *stallingStore) stall(key string) { s.mu.Lock(); s.key = key; s.mu.Unlock() }

func (s *stallingStore) unstall() { s.once.Do(func() { close(s.released) }) }

func (s *stallingStore) Update(ctx context.Context, key string, fn func(*store.Route) (*store.Route, error)) (*store.Route, error) {
	s.mu.Lock()
	stall := key == s.key
	if stall {
		s.key = ""
		close(s.stalled)
	}
	s.mu.Unlock()
	if stall {
		select {
		case <-s.released:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Memory.Update(ctx, key, fn)
}

// A route whose store write hangs holds up no other route: while the edge waits for the
// store to record that route "slow" emptied, the edge's other routes serve requests, leave and
// register at once, although the registry tells the route book of the emptiness under a
// lock that routes share (every route of one of its shards). Once the store answers, the slow
// route's record converges: it is recorded empty. Before, that write ran under the registry's
// lock, and every registration and leave of the routes of its shard waited for it.
func TestSlowRouteWriteHoldsUpNoOtherRoute(t *testing.T) {
	st := newStallingStore()
	e := startEdge(t, ServerConfig{Store: st, Limits: Limits{MaxTunnelsPerSession: 1000, RegisterRate: 10000, RegisterBurst: 10000}})
	t.Cleanup(st.unstall) // before the edge closes: its Close waits for the queued write
	b := backend(t, "b")
	sess := e.connect()
	slow, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "slow"}, hostPort(b.URL))
	require.NoError(t, err)
	// Routes spread over every shard of the registry (64), so that some share the slow
	// route's: 260 routes leave one in 60 shards out by chance.
	var others []*Tunnel
	for i := range 260 {
		tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: fmt.Sprintf("other%d", i)}, hostPort(b.URL))
		require.NoError(t, err)
		others = append(others, tun)
	}

	// The slow route's last member leaves: the edge is to record the route empty, and the
	// store does not answer.
	st.stall(store.Key(store.KindHTTP, "slow"))
	require.NoError(t, slow.Close())
	select {
	case <-st.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow route's emptiness was never written")
	}

	// Meanwhile every other route serves, leaves and registers. (No wall-clock bound: each
	// of these would wait for the stalled write for ever if it queued behind it, and the
	// test's own timeouts end it then.)
	for i, tun := range others {
		code, body := e.get(fmt.Sprintf("other%d", i), "/")
		require.Equal(t, http.StatusOK, code, body)
		if i%2 == 0 {
			require.NoError(t, tun.Close())
		}
	}
	for i := range 100 {
		_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: fmt.Sprintf("later%d", i)}, hostPort(b.URL))
		require.NoError(t, err)
	}
	slowRecord := func() *store.Route {
		r, err := st.Memory.Get(context.Background(), store.Key(store.KindHTTP, "slow"))
		require.NoError(t, err)
		return r
	}
	require.True(t, slowRecord().EmptySince.IsZero(), "the slow route's write is still waiting")

	// The store answers: the slow route's record converges.
	st.unstall()
	require.Eventually(t, func() bool { return !slowRecord().EmptySince.IsZero() }, 5*time.Second, 10*time.Millisecond,
		"the slow route was never recorded empty")
}

// refusingStore is a Memory whose Updates of one key fail once fail names it, as a store
// that is gone (a cluster's NATS, once the edge left the cluster).
type refusingStore struct {
	*store.Memory
	mu      sync.Mutex
	key     string
	refused chan struct{} // closed once an Update of key failed
	once    sync.Once
}

func (s *refusingStore) Update(ctx context.Context, key string, fn func(*store.Route) (*store.Route, error)) (*store.Route, error) {
	s.mu.Lock()
	fail := key == s.key
	s.mu.Unlock()
	if fail {
		s.once.Do(func() { close(s.refused) })
		return nil, errors.New("store gone")
	}
	return s.Memory.Update(ctx, key, fn)
}

// An edge closes although a route's write is being tried again and again (its store
// refuses it) and a registration of that route waits behind that write: the edge stops
// trying once it begins to close. Before, Close waited for the registration, the
// registration for the write, and the write for the end of Close.
func TestCloseEndsWritesTheStoreRefuses(t *testing.T) {
	st := &refusingStore{Memory: store.NewMemory(), refused: make(chan struct{})}
	cfg := ServerConfig{Store: st, Domain: testDomain, Logger: zaptest.NewLogger(t)}
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	ctl := listenLoopback(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctl) }()
	b := backend(t, "b")
	sess, err := Dial(ctxT(t), ctl.Addr().String(), WithToken(""), WithReconnect(false))
	require.NoError(t, err)
	defer sess.Close()
	x, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "x"}, hostPort(b.URL))
	require.NoError(t, err)

	st.mu.Lock()
	st.key = store.Key(store.KindHTTP, "x")
	st.mu.Unlock()
	require.NoError(t, x.Close()) // x's emptiness is refused, and tried again
	<-st.refused
	registered := make(chan error, 1)
	go func() {
		_, err := sess.Forward(context.Background(), TunnelSpec{Subdomain: "x"}, hostPort(b.URL))
		registered <- err
	}()
	time.Sleep(200 * time.Millisecond) // the registration reaches the write queue

	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return: it waits for a write the store refuses")
	}
	require.Error(t, <-registered)
	require.ErrorIs(t, <-served, ErrServerClosed)
}
