package tunnel

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
)

// excuses records the time spans in which a failure is expected: a member's connection was
// cut without goodbye or its backend died while requests were in flight on it, or the edge
// itself restarted. A failure outside every span is a bug.
type excuses struct {
	mu    sync.Mutex
	spans []span
	used  map[string]int // excused failures by reason
}

type span struct {
	reason   string
	from, to time.Time
}

// open starts a span now; the returned func ends it grace later.
func (x *excuses) open(reason string, grace time.Duration) func() {
	x.mu.Lock()
	i := len(x.spans)
	x.spans = append(x.spans, span{reason: reason, from: time.Now()})
	x.mu.Unlock()
	return func() {
		x.mu.Lock()
		x.spans[i].to = time.Now().Add(grace)
		x.mu.Unlock()
	}
}

// cover reports whether a failure of an exchange between start and end is excused.
func (x *excuses) cover(start, end time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, s := range x.spans {
		if !s.from.After(end) && (s.to.IsZero() || !s.to.Before(start)) {
			if x.used == nil {
				x.used = map[string]int{}
			}
			x.used[s.reason]++
			return true
		}
	}
	return false
}

// chaosMember is one connector session with one tunnel, which chaos drains, cuts and replaces.
type chaosMember struct {
	name    string
	spec    TunnelSpec
	target  string
	backend *restartableBackend // nil for TCP members
	mu      sync.Mutex
	sess    *Session
	tun     *Tunnel
	raw     atomic.Pointer[net.Conn]
}

func (m *chaosMember) join(t *testing.T, control string) {
	dial := func(ctx context.Context, n, a string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, n, a)
		if err == nil {
			m.raw.Store(&c)
		}
		return c, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sess, err := Dial(ctx, control, WithDialer(dial), WithBackoff(10*time.Millisecond, 100*time.Millisecond),
		WithDrainTimeout(5*time.Second))
	require.NoError(t, err)
	tun, err := sess.Forward(ctx, m.spec, m.target)
	require.NoError(t, err)
	m.mu.Lock()
	m.sess, m.tun = sess, tun
	m.mu.Unlock()
}

// TestChaosSoak runs HTTP and TCP traffic through two groups while members drain, leave,
// come back and crash, backends die and return, and the edge restarts once. It then checks:
// every completed TCP transfer is byte-exact; every failure falls in an excused span (a
// crash, a backend death, the edge restart); no TCP port is shared by two pools or leaked;
// the registry is empty once everyone left; and (goleak, package-wide) no goroutine is left.
// WARREN_CHAOS_DURATION sets the chaos phase (default 40s; 8s with -short).
func TestChaosSoak(t *testing.T) {
	duration := 40 * time.Second
	if testing.Short() {
		duration = 8 * time.Second
	}
	if v := os.Getenv("WARREN_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		duration = d
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("chaos seed %d, duration %s", seed, duration)
	rng := rand.New(rand.NewPCG(seed, 42))

	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0",
		cfg: ServerConfig{LoadBalancing: LoadBalancing{Enabled: true}, TCP: TCPTunnels{Ports: tcpRange(44000), BindHost: "127.0.0.1"}, Timeouts: Timeouts{Drain: 5 * time.Second}}}
	r.start()
	var edgeMu sync.RWMutex // held for writing while the edge restarts
	edge := func() *Server { edgeMu.RLock(); defer edgeMu.RUnlock(); return r.cur }

	probe := &health.Spec{Type: health.TypeTCP, Interval: 50 * time.Millisecond, Timeout: 200 * time.Millisecond, MaxFailed: 2}
	var members []*chaosMember
	for i := range 4 {
		b := newRestartableBackend(t, fmt.Sprint("h", i))
		members = append(members, &chaosMember{name: fmt.Sprint("h", i), backend: b, target: b.addr,
			spec: TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "k1", Health: probe}})
	}
	tcpTarget := tcpBackend(t, digestBackend)
	for i := range 3 {
		members = append(members, &chaosMember{name: fmt.Sprint("t", i), target: tcpTarget,
			spec: TunnelSpec{Proto: ProtoTCP, Group: "db", GroupKey: "k2"}})
	}
	for _, m := range members {
		m.join(t, r.control)
	}
	require.Eventually(t, func() bool { _, _, n := edge().registry.LookupHTTP("pool").Counts(); return n == 4 }, 10*time.Second, 5*time.Millisecond)

	var (
		x                             excuses
		httpOK, httpFail, httpExcused atomic.Int64
		tcpOK, tcpFail, tcpExcused    atomic.Int64
		corrupt                       atomic.Int64
		firstBad                      atomic.Value
		stop                          = make(chan struct{})
		load                          sync.WaitGroup
	)
	bad := func(format string, args ...any) { firstBad.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
	client := publicClient(r.public)
	defer client.CloseIdleConnections()

	for w := range 6 {
		load.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				path := fmt.Sprintf("/w%d/%d", w, i)
				start := time.Now()
				resp, err := client.Get("http://pool." + testDomain + path)
				var body []byte
				if err == nil {
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && (resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), " "+path)) {
						err = fmt.Errorf("status %d body %q", resp.StatusCode, body)
					}
				}
				switch {
				case err == nil:
					httpOK.Add(1)
				case x.cover(start, time.Now()):
					httpExcused.Add(1)
				default:
					httpFail.Add(1)
					bad("HTTP %s at %s: %v", path, start.Format("15:04:05.000"), err)
				}
			}
		})
	}
	tcpPort := func() int {
		for _, g := range edge().registry.Groups() {
			if g.Kind == group.KindTCP && g.Name == "db" {
				return g.Port
			}
		}
		return 0
	}
	for w := range 3 {
		load.Go(func() {
			lr := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				port := tcpPort()
				if port == 0 {
					time.Sleep(10 * time.Millisecond) // the edge is restarting; poll for the new port
					continue
				}
				start := time.Now()
				payload := make([]byte, 1+lr.IntN(512<<10))
				for i := range payload {
					payload[i] = byte(lr.Uint32())
				}
				want := fmt.Sprintf("%d %x", len(payload), sha256.Sum256(payload))
				got, err := tcpExchange(port, payload)
				switch {
				case err == nil && got == want:
					tcpOK.Add(1)
				case err == nil && got != "":
					corrupt.Add(1)
					bad("TCP transfer of %d bytes came back as %q", len(payload), got)
				case x.cover(start, time.Now()):
					tcpExcused.Add(1)
				default:
					tcpFail.Add(1)
					bad("TCP transfer of %d bytes at %s: %v (got %q)", len(payload), start.Format("15:04:05.000"), err, got)
				}
			}
		})
	}

	// Chaos.
	restarted := false
	deadline := time.Now().Add(duration)
	actions := map[string]int{}
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(150+rng.IntN(250)) * time.Millisecond) // pacing between actions
		if !restarted && time.Until(deadline) < duration/2 {
			restarted = true
			actions["edge restart"]++
			end := x.open("edge restart", time.Second)
			edgeMu.Lock()
			r.stop()
			r.start()
			edgeMu.Unlock()
			require.Eventually(t, func() bool {
				g := edge().registry.LookupHTTP("pool")
				return g != nil && len(g.Members()) == 4 && tcpPort() != 0
			}, 20*time.Second, 5*time.Millisecond, "every member re-joins the restarted edge")
			end()
			continue
		}
		m := members[rng.IntN(len(members))]
		switch k := rng.IntN(4); {
		case k == 0: // drain, then register again: never a failure
			actions["drain+rejoin"]++
			m.mu.Lock()
			require.NoError(t, m.tun.Shutdown(ctxT(t)))
			tun, err := m.sess.Forward(ctxT(t), m.spec, m.target)
			require.NoError(t, err)
			m.tun = tun
			m.mu.Unlock()
		case k == 1: // the whole connector leaves gracefully and a new one joins: never a failure
			actions["leave+join"]++
			m.mu.Lock()
			require.NoError(t, m.sess.Close())
			m.mu.Unlock()
			m.join(t, r.control)
		case k == 2: // crash: the connection is cut without goodbye; the session reconnects
			actions["crash"]++
			end := x.open("crash", 300*time.Millisecond)
			if c := m.raw.Load(); c != nil {
				_ = (*c).Close()
			}
			end()
		case m.backend != nil: // the backend dies for a while and comes back
			actions["backend death"]++
			end := x.open("backend death", 300*time.Millisecond)
			m.backend.stop()
			end()
			time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
			m.backend.start()
		}
		// No two pools ever share a TCP port.
		ports := map[int]string{}
		for _, g := range edge().registry.Groups() {
			if g.Kind == group.KindTCP {
				if other, dup := ports[g.Port]; dup {
					bad("port %d shared by %s and %s", g.Port, other, g.ID)
				}
				ports[g.Port] = g.ID
			}
		}
	}
	close(stop)
	load.Wait()
	t.Logf("actions %v; excused failures by reason %v", actions, x.used)
	t.Logf("HTTP ok %d, excused %d, failed %d; TCP ok %d, excused %d, failed %d, corrupt %d",
		httpOK.Load(), httpExcused.Load(), httpFail.Load(), tcpOK.Load(), tcpExcused.Load(), tcpFail.Load(), corrupt.Load())

	// Membership as the registry sees it matches the members that are up.
	require.Eventually(t, func() bool {
		g := edge().registry.LookupHTTP("pool")
		return g != nil && len(g.Members()) == 4
	}, 10*time.Second, 5*time.Millisecond)

	for _, m := range members {
		require.NoError(t, m.sess.Close())
	}
	require.Eventually(t, func() bool { return len(edge().registry.Groups()) == 0 }, 10*time.Second, 5*time.Millisecond,
		"every group is removed once its members left")
	require.Zero(t, edge().registry.PortsInUse(), "no TCP port leaked")
	r.stop()

	if v := firstBad.Load(); v != nil {
		t.Fatalf("first unexplained failure: %v", v)
	}
	require.Zero(t, corrupt.Load())
	require.Greater(t, httpOK.Load(), int64(100))
	require.Greater(t, tcpOK.Load(), int64(10))
}

// tcpExchange sends payload through the TCP group on port, half-closes and returns the reply.
func tcpExchange(port int, payload []byte) (string, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(payload); err != nil {
		return "", err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	reply, err := io.ReadAll(c)
	if err == nil && len(reply) == 0 {
		err = io.ErrUnexpectedEOF
	}
	return string(reply), err
}
