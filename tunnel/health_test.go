package tunnel

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
)

// restartableBackend is an HTTP backend on a fixed loopback port that can be stopped and
// started again on the same port, like a restarted process.
type restartableBackend struct {
	t      *testing.T
	name   string
	addr   string
	served atomic.Int64
	mu     sync.Mutex
	srv    *http.Server
	done   chan struct{}
}

func newRestartableBackend(t *testing.T, name string) *restartableBackend {
	b := &restartableBackend{t: t, name: name, addr: "127.0.0.1:0"}
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *restartableBackend) start() {
	var l net.Listener
	require.Eventually(b.t, func() bool {
		var err error
		l, err = net.Listen("tcp", b.addr)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "listen on %s again", b.addr)
	b.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.served.Add(1)
		fmt.Fprintf(w, "%s %s", b.name, r.URL.Path)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	b.mu.Lock()
	b.srv, b.done = srv, done
	b.mu.Unlock()
}

func (b *restartableBackend) stop() {
	b.mu.Lock()
	srv, done := b.srv, b.done
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		<-done
	}
}

// events records health transitions from the edge's OnEvent hook.
type events struct {
	mu   sync.Mutex
	got  []group.Event
	used []bool
}

func newEvents() *events { return &events{} }

func (ev *events) hook(e group.Event) {
	if e.Kind != group.EventHealth {
		return
	}
	ev.mu.Lock()
	ev.got = append(ev.got, e)
	ev.used = append(ev.used, false)
	ev.mu.Unlock()
}

// next waits for the earliest transition of member id to healthy that no earlier call took.
func (ev *events) next(t *testing.T, id string, healthy bool) group.Event {
	t.Helper()
	var found group.Event
	require.Eventually(t, func() bool {
		ev.mu.Lock()
		defer ev.mu.Unlock()
		for i, e := range ev.got {
			if !ev.used[i] && e.Member.ID == id && e.Healthy == healthy {
				ev.used[i], found = true, e
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond, "no transition of %s to healthy=%v", id, healthy)
	return found
}

func tcpCheck(interval time.Duration, maxFailed int) *health.Spec {
	return &health.Spec{Type: health.TypeTCP, Interval: interval, Timeout: interval, MaxFailed: maxFailed}
}

// TestKilledBackendLeavesAndReturns: the down member gets none of 50
// requests, it leaves the rotation within max_failed × interval (plus slack), and after its
// backend restarts both members share again.
func TestKilledBackendLeavesAndReturns(t *testing.T) {
	ev := newEvents()
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, OnEvent: ev.hook})
	a, b := newRestartableBackend(t, "A"), newRestartableBackend(t, "B")
	const interval, maxFailed = 50 * time.Millisecond, 3
	spec := pool("pool")
	spec.Health = tcpCheck(interval, maxFailed)
	ta, err := e.connect().Forward(ctxT(t), spec, a.addr)
	require.NoError(t, err)
	tb, err := e.connect().Forward(ctxT(t), spec, b.addr)
	require.NoError(t, err)
	ev.next(t, ta.ID(), true)
	ev.next(t, tb.ID(), true)
	require.Equal(t, map[string]int{"A": 25, "B": 25}, e.tally("pool", 50))

	b.stop()
	killed := time.Now()
	down := ev.next(t, tb.ID(), false)
	took := time.Since(killed)
	require.Contains(t, down.Reason, fmt.Sprintf("%d consecutive probe failures", maxFailed))
	require.Contains(t, down.Reason, "connection refused")
	// max_failed probes of up to interval+10% jitter each, one interval of slack, and a
	// scheduling allowance for loaded CI machines.
	bound := time.Duration(maxFailed)*interval*11/10 + interval + 250*time.Millisecond
	require.LessOrEqual(t, took, bound, "left the rotation after %s", took)

	before := b.served.Load()
	require.Equal(t, map[string]int{"A": 50}, e.tally("pool", 50), "the down member gets none of 50")
	require.Equal(t, before, b.served.Load())

	b.start()
	ev.next(t, tb.ID(), true)
	require.Equal(t, map[string]int{"A": 25, "B": 25}, e.tally("pool", 50), "both share again")
	hist := e.registry.LookupHTTP("pool").Members()[1].History()
	require.Len(t, hist, 4, "registered, healthy, unhealthy, healthy: %v", hist)
}

func TestMemberWhoseProbeNeverPassesGetsNothing(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	a, b := newRestartableBackend(t, "A"), newRestartableBackend(t, "B")
	_, err := e.connect().Forward(ctxT(t), pool("pool"), a.addr)
	require.NoError(t, err)
	spec := pool("pool")
	spec.Health = &healthSpecNeverPasses
	_, err = e.connect().Forward(ctxT(t), spec, b.addr)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"A": 50}, e.tally("pool", 50))
	require.Zero(t, b.served.Load())
}

func TestHTTPProbeStatusThroughTheEdge(t *testing.T) {
	e := startEdge(t, ServerConfig{})
	sick := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			http.Error(w, "sick", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "app")
	})
	l := listenLoopback(t)
	hs := &http.Server{Handler: sick}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(l) }()
	defer func() { _ = hs.Close(); <-done }()

	probe := func(anyStatus bool) *health.Spec {
		return &health.Spec{Type: health.TypeHTTP, Path: "/health", Interval: 20 * time.Millisecond,
			Timeout: time.Second, MaxFailed: 1, AnyStatus: anyStatus}
	}
	_, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "strict", Health: probe(false)}, l.Addr().String())
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "lenient", Health: probe(true)}, l.Addr().String())
	require.NoError(t, err)

	require.Eventually(t, func() bool { code, _ := e.get("lenient", "/"); return code == http.StatusOK }, 5*time.Second, 10*time.Millisecond,
		"with expect_2xx off, a 500 still counts as healthy")
	code, body := e.get("lenient", "/")
	require.Equal(t, "app", body)
	require.Equal(t, http.StatusOK, code)

	// The strict member reports unhealthy with the status as the reason and stays out.
	m := e.registry.LookupHTTP("strict").Members()[0]
	require.Eventually(t, func() bool { return len(m.History()) == 2 }, 5*time.Second, 10*time.Millisecond)
	require.Contains(t, m.History()[1].Reason, "http status 500")
	code, _ = e.get("strict", "/")
	require.Equal(t, http.StatusServiceUnavailable, code, "solo tunnels honour health too")
}

// TestProbersRestartAcrossReconnects: after the edge restarts, the re-registered member starts
// unhealthy again and a fresh prober makes it healthy; the old prober is gone (goleak checks
// at the end of the package that nothing piles up).
func TestProbersRestartAcrossReconnects(t *testing.T) {
	ev := newEvents()
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0", cfg: ServerConfig{OnEvent: ev.hook}}
	r.start()
	defer func() { r.stop() }()
	b := newRestartableBackend(t, "A")
	sess, err := Dial(ctxT(t), r.control, WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	require.NoError(t, err)
	defer sess.Close()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app", Health: tcpCheck(20*time.Millisecond, 2)}, b.addr)
	require.NoError(t, err)
	ev.next(t, tun.ID(), true)
	for range 3 {
		old := tun.ID()
		r.stop()
		r.start()
		require.Eventually(t, func() bool { id := tun.ID(); return id != "" && id != old }, 10*time.Second, 5*time.Millisecond)
		ev.next(t, tun.ID(), true)
	}
}

func TestHealthReportsOnlyFromTheOwningSession(t *testing.T) {
	// Covered at the frame level by TestHostileConnectorsLeaveOthersServing; here through the
	// public API: a second session cannot change the first one's member.
	e := startEdge(t, ServerConfig{})
	b := newRestartableBackend(t, "A")
	tun, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, b.addr)
	require.NoError(t, err)
	other := e.connect()
	c, err := other.liveConn(ctxT(t))
	require.NoError(t, err)
	require.NoError(t, c.send(healthFrame(tun.ID(), false)))
	require.NoError(t, c.send(drainFrame(tun.ID())))
	code, _ := e.get("app", "/")
	require.Equal(t, http.StatusOK, code)
	require.True(t, e.registry.LookupHTTP("app").Members()[0].Healthy())
}
