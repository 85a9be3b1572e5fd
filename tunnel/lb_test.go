package tunnel

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
)

// Load-balancing policies end to end: registrations carry the settings over the wire, the
// edge applies them per request, its registry shows them (and the operator plane's API:
// tunnel/admin's edge_listing_test.go).

// poolInfo is the edge's view of the HTTP pool on sub.
func poolInfo(t *testing.T, e *testEdge, sub string) group.Info {
	t.Helper()
	g, ok := e.Registry().LookupHTTP(sub)
	require.True(t, ok, "no group on %s", sub)
	return g
}

func weighted(sub string, weight, priority int) TunnelSpec {
	sp := pool(sub)
	sp.Weight, sp.Priority = weight, priority
	return sp
}

func TestWeightedPoolSplitsRequests(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	a, b := backend(t, "A"), backend(t, "B")
	_, err := e.connect().Forward(ctxT(t), weighted("pool", 3, 0), hostPort(a.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), weighted("pool", 1, 0), hostPort(b.URL))
	require.NoError(t, err)

	got := e.tally("pool", 2000)
	t.Logf("weights 3:1 over 2000 sequential requests: %v", got)
	require.InDelta(t, 0.75, float64(got["A"])/2000, 0.05)

	require.Len(t, e.Registry().Groups(), 1)
	weights := map[int]bool{}
	for _, m := range poolInfo(t, e, "pool").Members {
		weights[m.Weight] = true
		require.Zero(t, m.Priority)
	}
	require.Equal(t, map[int]bool{1: true, 3: true}, weights, "the registry shows each member's weight")
}

func TestPriorityTierTakesOverAndGivesBack(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	primary, backup := backend(t, "P"), backend(t, "B")
	sess := e.connect()
	tp, err := sess.Forward(ctxT(t), weighted("pool", 1, 0), hostPort(primary.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), weighted("pool", 1, 1), hostPort(backup.URL))
	require.NoError(t, err)
	require.Equal(t, map[string]int{"P": 20}, e.tally("pool", 20), "only the first tier takes work")

	require.NoError(t, tp.Close())
	require.Eventually(t, func() bool { return e.tally("pool", 1)["B"] == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, map[string]int{"B": 20}, e.tally("pool", 20), "the next tier takes over")

	_, err = sess.Forward(ctxT(t), weighted("pool", 1, 0), hostPort(primary.URL))
	require.NoError(t, err)
	require.Equal(t, map[string]int{"P": 20}, e.tally("pool", 20), "new work goes back to the first tier")
}

func TestMismatchedAffinityIsRefused(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	b := backend(t, "A")
	sp := pool("pool")
	sp.Affinity = "cookie"
	_, err := e.connect().Forward(ctxT(t), sp, hostPort(b.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.ErrorIs(t, err, ErrProtoMismatch)
	require.ErrorContains(t, err, "affinity mismatch: the pool on subdomain 'pool' uses affinity cookie, this tunnel declares none")

	bad := pool("other")
	bad.Weight = 101
	_, err = e.connect().Forward(ctxT(t), bad, hostPort(b.URL))
	require.ErrorIs(t, err, ErrInvalid, "checked before anything is sent")
}

func TestCookieAffinityKeepsAClientOnItsMember(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	for _, name := range []string{"A", "B", "C"} {
		sp := pool("pool")
		sp.Affinity = "cookie"
		_, err := e.connect().Forward(ctxT(t), sp, hostPort(backend(t, name).URL))
		require.NoError(t, err)
	}
	get := func(cookie string) (name, setCookie string) {
		req, err := http.NewRequest(http.MethodGet, e.url("pool", "/"), nil)
		require.NoError(t, err)
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := e.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return strings.Fields(string(body))[0], resp.Header.Get("Set-Cookie")
	}
	first, set := get("")
	require.Contains(t, set, "warren_affinity=")
	require.Contains(t, set, "HttpOnly")
	cookie := strings.SplitN(set, ";", 2)[0]
	for range 20 {
		name, again := get(cookie)
		require.Equal(t, first, name, "a client with the cookie stays on its member")
		require.Empty(t, again, "the cookie is set only when it changes")
	}
	// A made-up cookie is not honoured: the client gets a fresh, valid one.
	_, fresh := get("warren_affinity=forged")
	require.Contains(t, fresh, "warren_affinity=")
	require.NotContains(t, fresh, "forged")
}

func TestOutlierEjectionEndToEnd(t *testing.T) {
	var events atomic.Int32
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, OutlierEjection: &group.Ejection{Failures: 3, Duration: time.Hour}},

		OnEvent: func(ev group.Event) {
			if ev.Ejection {
				events.Add(1)
			}
		}})
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "upstream down", http.StatusBadGateway)
	}))
	t.Cleanup(sick.Close)
	good := backend(t, "G")
	_, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(sick.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(good.URL))
	require.NoError(t, err)

	bad := 0
	for range 20 {
		if code, _ := e.get("pool", "/"); code == http.StatusBadGateway {
			bad++
		}
	}
	require.Equal(t, 3, bad, "the member is ejected after 3 502s in a row, its probe notwithstanding")
	require.Equal(t, int32(1), events.Load())
	ejected := 0
	for _, m := range poolInfo(t, e, "pool").Members {
		if m.Ejected {
			ejected++
			require.False(t, m.Healthy)
		}
	}
	require.Equal(t, 1, ejected)
	// The API and warren_member_ejections_total: tunnel/admin's TestOutlierEjectionInTheAPIAndMetrics.
}

func TestKeyRotationWithLiveTraffic(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	old := func() TunnelSpec { return TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k1"} }
	rotated := func() TunnelSpec {
		return TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k2", PreviousGroupKeys: []string{"k1"}}
	}
	var members []*Tunnel
	for _, name := range []string{"A", "B"} {
		tn, err := e.connect().Forward(ctxT(t), old(), hostPort(backend(t, name).URL))
		require.NoError(t, err)
		members = append(members, tn)
	}

	var failed, sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent.Add(1)
			resp, err := e.client.Get(e.url("pool", "/"))
			if err != nil {
				failed.Add(1)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
		}
	}()
	// Rolling rotation: each member's replacement starts with the new key (naming the old
	// one), then the old member drains away.
	// Traffic flows through every step: after each change, wait for 20 more requests.
	flowing := func() {
		n := sent.Load() + 20
		require.Eventually(t, func() bool { return sent.Load() >= n }, 5*time.Second, time.Millisecond)
	}
	for i, name := range []string{"A2", "B2"} {
		_, err := e.connect().Forward(ctxT(t), rotated(), hostPort(backend(t, name).URL))
		require.NoError(t, err, "replacement %d", i)
		flowing()
		require.NoError(t, members[i].Shutdown(ctxT(t)))
		flowing()
	}
	close(stop)
	<-done
	t.Logf("%d requests during the rotation, %d failed", sent.Load(), failed.Load())
	require.Positive(t, sent.Load())
	require.Zero(t, failed.Load(), "no request fails during a rotation")

	// Every member now presents the new key: the old key is refused.
	_, err := e.connect().Forward(ctxT(t), old(), hostPort(backend(t, "late").URL))
	require.ErrorIs(t, err, ErrKeyMismatch)
	want := group.HashKey("k2").Short()
	require.Equal(t, want, poolInfo(t, e, "pool").KeyHash.Short())
}
