package tunnel_test

// Traps an embedder of the edge falls into, seen from an outside module: only the exported
// API, an in-memory edge and net/http.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/dispatch"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
)

// serveName serves, on a Listen tunnel, a handler that answers name; stopped at cleanup.
func serveName(t *testing.T, sess *tunnel.Session, spec tunnel.TunnelSpec, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ln, err := sess.Listen(ctx, spec)
	require.NoError(t, err)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, name)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close(); <-done })
}

// get sends one public request through the edge's handler and returns status and body.
func get(edge *tunnel.Server, host string) (int, string) {
	rec := httptest.NewRecorder()
	edge.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://"+host+"/", nil))
	return rec.Code, rec.Body.String()
}

// An OnEvent callback that reads the routing table (groups, a member, its history) used to
// deadlock the whole edge: it ran under the group's lock, so Listen and even Close hung.
func TestOnEventMayReadTheRoutingTable(t *testing.T) {
	var edge *tunnel.Server
	var mu sync.Mutex
	var seen []string
	ready := make(chan struct{})
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: embedDomain, LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		OnEvent: func(ev group.Event) {
			<-ready
			view := edge.Registry()
			m, g, ok := view.Member(ev.Member.ID)
			hist, _ := view.History(ev.Member.ID)
			members, healthy, _ := g.Counts()
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s live=%v members=%d healthy=%d history=%d groups=%d",
				ev.Kind, ok && m.ID == ev.Member.ID, members, healthy, len(hist), len(view.Groups())))
			mu.Unlock()
		}})
	require.NoError(t, err)
	close(ready)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		sess := dialInMemory(t, edge)
		serveName(t, sess, tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, "a")
		code, body := get(edge, "pool."+embedDomain)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "a", body)
		require.NoError(t, edge.Close())
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the edge hung on an OnEvent callback that reads the routing table")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "joined live=true members=1 healthy=1 history=1 groups=1", seen[0])
	require.Contains(t, seen, "left live=false members=0 healthy=0 history=0 groups=0")
}

// Server.Registry is read-only: what it returns are copies. It used to be the mutable
// registry, and a Join through it made the next request panic the edge.
func TestRegistryViewCannotBreakTheEdge(t *testing.T) {
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: embedDomain, LoadBalancing: tunnel.LoadBalancing{Enabled: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = edge.Close() })
	sess := dialInMemory(t, edge)
	serveName(t, sess, tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}, "a")

	g, ok := edge.Registry().LookupHTTP("pool")
	require.True(t, ok)
	require.Equal(t, group.HashKey("k"), g.KeyHash, "the view shows the pool's key hash, as group.HashKey computes it")
	g.Members[0].ID, g.Members[0].Healthy, g.Members[0].Draining = "forged", false, true
	g.Label, g.Members = "other", nil

	code, body := get(edge, "pool."+embedDomain)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "a", body)
	again, _ := edge.Registry().LookupHTTP("pool")
	require.Len(t, again.Members, 1)
	require.True(t, again.Members[0].Healthy)
	require.NotEqual(t, "forged", again.Members[0].ID)
}

// lastMember is an embedder's strategy: always the last selectable member.
type lastMember struct{ picks *atomic.Int64 }

func (s lastMember) Pick(c dispatch.Candidates) int {
	s.picks.Add(1)
	return c.Len() - 1
}

// An embedder can plug its own dispatch.Strategy into the edge (ServerConfig.LoadBalancing.NewStrategy);
// it used to take only a strategy name.
func TestCustomStrategy(t *testing.T) {
	var picks atomic.Int64
	var pools atomic.Int64
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: embedDomain, LoadBalancing: tunnel.LoadBalancing{Enabled: true,
		Strategy: "no-such-name", // ignored when NewStrategy is set
		NewStrategy: func() dispatch.Strategy {
			pools.Add(1)
			return lastMember{&picks}
		}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = edge.Close() })
	sess := dialInMemory(t, edge)
	spec := tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k"}
	serveName(t, sess, spec, "first")
	serveName(t, sess, spec, "second")
	for range 20 {
		code, body := get(edge, "pool."+embedDomain)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "second", body, "the custom strategy chose every member")
	}
	require.EqualValues(t, 20, picks.Load())
	require.EqualValues(t, 1, pools.Load(), "one strategy per pool")

	_, err = tunnel.NewServer(tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Strategy: "no-such-name"}})
	require.ErrorContains(t, err, `LoadBalancing.Strategy: "no-such-name" is not a strategy`, "without NewStrategy the name is still checked")
}
