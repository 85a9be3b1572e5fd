package tunnel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
)

func pool(sub string) TunnelSpec {
	return TunnelSpec{Subdomain: sub, Group: "web", GroupKey: "shared-secret"}
}

// tally sends n requests to sub and counts the answers by body prefix (the backend's name).
func (e *testEdge) tally(sub string, n int) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	for range n {
		code, body := e.get(sub, "/")
		require.Equal(e.t, http.StatusOK, code, body)
		got[strings.Fields(body)[0]]++
	}
	return got
}

func TestSeedScenarioHTTPGroup(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	a, b := backend(t, "A"), backend(t, "B")
	ta, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(a.URL))
	require.NoError(t, err)
	tb, err := e.connect().Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "other-name", GroupKey: "shared-secret"}, hostPort(b.URL))
	require.NoError(t, err)
	require.Equal(t, "web", ta.Group())
	require.Equal(t, "web", tb.Group(), "the first joiner names the group")
	require.Equal(t, ta.URL(), tb.URL())

	got := e.tally("pool", 50)
	require.Equal(t, map[string]int{"A": 25, "B": 25}, got, "least-streams alternates between idle members")
}

func TestRandomStrategySharesToo(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, Strategy: "random"}})
	a, b := backend(t, "A"), backend(t, "B")
	_, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(a.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)
	got := e.tally("pool", 200)
	require.Greater(t, got["A"], 60)
	require.Greater(t, got["B"], 60)
}

func TestSeedScenarioTCPGroupSharesAPort(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, TCP: TCPTunnels{Ports: tcpRange(43300), BindHost: "127.0.0.1"}})
	namer := func(name string) func(net.Conn) {
		return func(c net.Conn) { _, _ = io.WriteString(c, name) }
	}
	spec := TunnelSpec{Proto: ProtoTCP, Group: "db", GroupKey: "k"}
	ta, err := e.connect().Forward(ctxT(t), spec, tcpBackend(t, namer("A")))
	require.NoError(t, err)
	tb, err := e.connect().Forward(ctxT(t), spec, tcpBackend(t, namer("B")))
	require.NoError(t, err)
	require.Equal(t, ta.Port(), tb.Port(), "later members get the same port")

	other, err := e.connect().Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP, Group: "db", GroupKey: "another"}, tcpBackend(t, namer("C")))
	require.NoError(t, err)
	require.NotEqual(t, ta.Port(), other.Port(), "another key with the same name is another pool")

	got := map[string]int{}
	for range 50 {
		c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port())))
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		require.NoError(t, err)
		c.Close()
		got[string(b)]++
	}
	// Roughly half each: a connection's slot is released when its copy loops end, which
	// may be just after the next connection was dispatched.
	require.Len(t, got, 2)
	require.GreaterOrEqual(t, got["A"], 15, "%v", got)
	require.GreaterOrEqual(t, got["B"], 15, "%v", got)
}

func TestRegistrationRejectionsReachTheConnector(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, TCP: TCPTunnels{Ports: group1Port(freePort(t)), BindHost: "127.0.0.1"}})
	sess := e.connect()
	_, err := sess.Forward(ctxT(t), pool("pool"), "127.0.0.1:9")
	require.NoError(t, err)

	var rej *RejectedError
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "wrong"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrKeyMismatch)
	require.ErrorIs(t, err, ErrRejected)
	require.ErrorAs(t, err, &rej)
	// The edge's sentence verbatim in Message, as the product document requires it shown;
	// Error puts the package's prefix in front of it, once (the edge sends no prefix).
	require.Equal(t, "group key does not match for subdomain 'pool'", rej.Message)
	require.Equal(t, "tunnel: group key does not match for subdomain 'pool'", err.Error())

	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "pool"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrInUse)
	require.ErrorAs(t, err, &rej)
	require.Equal(t, "subdomain 'pool' is already in use", rej.Message)
	require.EqualError(t, err, "tunnel: subdomain 'pool' is already in use")

	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoHTTPS, Subdomain: "pool", Group: "web", GroupKey: "shared-secret"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrProtoMismatch)
	require.ErrorContains(t, err, "serves http, this tunnel is https")

	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "Bad_Name"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrInvalid)

	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, "127.0.0.1:9")
	require.NoError(t, err, "the one port of the range")
	_, err = sess.Forward(ctxT(t), TunnelSpec{Proto: ProtoTCP}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrNoPorts)
	require.EqualError(t, err, "tunnel: no TCP ports available")
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	l := listenLoopback(t)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// group1Port is a range of one port.
func group1Port(p int) group.PortRange { return group.PortRange{Lo: p, Hi: p} }

func TestKillSwitchOff(t *testing.T) {
	e := startEdge(t, ServerConfig{TCP: TCPTunnels{Ports: tcpRange(43500), BindHost: "127.0.0.1"}})
	a := backend(t, "A")
	ta, err := e.connect().Forward(ctxT(t), pool("pool"), hostPort(a.URL))
	require.NoError(t, err, "group fields are accepted and ignored")
	require.Empty(t, ta.Group(), "the tunnel is solo")
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(a.URL))
	require.ErrorIs(t, err, ErrInUse)

	spec := TunnelSpec{Proto: ProtoTCP, Group: "db", GroupKey: "k"}
	x, err := e.connect().Forward(ctxT(t), spec, "127.0.0.1:9")
	require.NoError(t, err)
	y, err := e.connect().Forward(ctxT(t), spec, "127.0.0.1:9")
	require.NoError(t, err)
	require.NotEqual(t, x.Port(), y.Port(), "TCP tunnels get their own ports")
}

func TestNoSelectableMemberIs503(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	spec := pool("pool")
	spec.Health = &healthSpecNeverPasses
	_, err := e.connect().Forward(ctxT(t), spec, "127.0.0.1:9")
	require.NoError(t, err)
	code, body := e.get("pool", "/")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "pool."+testDomain)
}

// TestRetryAvoidsADeadBackend: one member's backend is down and it has no health check;
// opening a stream to it fails before any request byte is written, so the edge retries on
// the other member and no request fails.
func TestRetryAvoidsADeadBackend(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	var served atomic.Int64
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		_, _ = io.WriteString(w, "live")
	}))
	defer live.Close()
	dead := listenLoopback(t)
	deadAddr := dead.Addr().String()
	require.NoError(t, dead.Close())

	_, err := e.connect().Forward(ctxT(t), pool("pool"), deadAddr)
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(live.URL))
	require.NoError(t, err)

	for i := range 200 {
		// A POST: never replayable, so success proves the retry happened before writing.
		resp, err := e.client.Post(e.url("pool", "/"), "text/plain", strings.NewReader(fmt.Sprint(i)))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, body)
	}
	require.Equal(t, int64(200), served.Load(), "every request reached the live backend exactly once")
	// Each request that picked the dead member first went to the live one instead.
	// (The counters are warren_dispatch_retries_total's: tunnel/admin's TestMetricsRenderTheEdgeCounters.)
	retries := e.Operator().Counters()
	require.InDelta(t, 100, retries.RetriesOpenFailed, 60, "about half the requests picked the dead member first")
	require.Zero(t, retries.RetriesResetUnread)
}

// loadGen sends requests to sub from n goroutines until stop, counting failures.
type loadGen struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	wg         sync.WaitGroup
	stop       chan struct{}
}

func (e *testEdge) load(sub string, n int) *loadGen {
	g := &loadGen{stop: make(chan struct{})}
	for range n {
		g.wg.Go(func() {
			for {
				select {
				case <-g.stop:
					return
				default:
				}
				resp, err := e.client.Get(e.url(sub, "/"))
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				if err != nil {
					g.failed.Add(1)
					g.firstErr.CompareAndSwap(nil, err.Error())
				} else {
					g.ok.Add(1)
				}
			}
		})
	}
	return g
}

func (g *loadGen) finish() (ok, failed int64, first any) {
	close(g.stop)
	g.wg.Wait()
	return g.ok.Load(), g.failed.Load(), g.firstErr.Load()
}

// TestRollingRestartLosesNothing restarts each of three members in turn (drain, then
// register again) under continuous load: no request fails.
func TestRollingRestartLosesNothing(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	slow := func(name string) *httptest.Server {
		b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(2 * time.Millisecond) // keep requests in flight while members drain
			_, _ = io.WriteString(w, name)
		}))
		t.Cleanup(b.Close)
		return b
	}
	type member struct {
		sess *Session
		tun  *Tunnel
		addr string
	}
	var ms []*member
	for i := range 3 {
		b := slow(fmt.Sprint("m", i))
		s := e.connect()
		tun, err := s.Forward(ctxT(t), pool("pool"), hostPort(b.URL))
		require.NoError(t, err)
		ms = append(ms, &member{sess: s, tun: tun, addr: hostPort(b.URL)})
	}
	lg := e.load("pool", 8)
	waitFor := func(n int64) {
		target := lg.ok.Load() + n
		require.Eventually(t, func() bool { return lg.ok.Load() >= target }, 10*time.Second, time.Millisecond)
	}
	waitFor(50)
	for _, m := range ms {
		require.NoError(t, m.tun.Shutdown(ctxT(t)), "drain")
		waitFor(30)
		tun, err := m.sess.Forward(ctxT(t), pool("pool"), m.addr)
		require.NoError(t, err)
		m.tun = tun
		waitFor(30)
	}
	// The same with whole connector sessions leaving and coming back.
	for i, m := range ms {
		require.NoError(t, m.sess.Close())
		waitFor(30)
		m.sess = e.connect()
		tun, err := m.sess.Forward(ctxT(t), pool("pool"), m.addr)
		require.NoError(t, err, "member %d", i)
		m.tun = tun
		waitFor(30)
	}
	ok, failed, first := lg.finish()
	t.Logf("%d requests during the rolling restarts", ok)
	require.Zero(t, failed, "first failure: %v", first)
}

// TestUpgradedConnectionStaysOnItsMemberWhileItDrains: a WebSocket-style connection keeps
// working on its member after the member starts draining, while new requests go elsewhere.
func TestUpgradedConnectionStaysOnItsMemberWhileItDrains(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}})
	wsBackend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			echoUpgrade(w, r)
			return
		}
		_, _ = io.WriteString(w, "A")
	}))
	defer wsBackend.Close()
	b := backend(t, "B")
	sa := e.connect()
	ta, err := sa.Forward(ctxT(t), pool("pool"), hostPort(wsBackend.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("pool"), hostPort(b.URL))
	require.NoError(t, err)

	// Open upgraded connections until one lands on A (least-streams alternates).
	var c net.Conn
	var br *bufio.Reader
	for range 4 {
		conn, err := net.Dial("tcp", e.publicAddr)
		require.NoError(t, err)
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: pool.%s\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n", testDomain)
		r := bufio.NewReader(conn)
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err)
		if resp.StatusCode == http.StatusSwitchingProtocols {
			c, br = conn, r
			break
		}
		conn.Close()
	}
	require.NotNil(t, c, "an upgrade reached member A")
	defer c.Close()

	closed := make(chan error, 1)
	go func() { closed <- ta.Shutdown(context.Background()) }()
	require.Eventually(t, func() bool {
		g := e.registry.LookupHTTP("pool")
		for _, m := range g.Members() {
			if m.Draining() {
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond)

	for _, msg := range []string{"still", "here"} {
		_, err := io.WriteString(c, msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(br, got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got), "the upgraded connection stays on its draining member")
	}
	require.Equal(t, map[string]int{"B": 10}, e.tally("pool", 10), "new requests avoid the draining member")
	select {
	case err := <-closed:
		t.Fatalf("the drain finished (%v) while the upgraded connection was open", err)
	default:
	}
	c.Close()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the drain did not finish after the connection closed")
	}
}

var _ = errors.New
