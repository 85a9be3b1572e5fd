package cluster

import (
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel"
)

// A leases watch that stalled (its consumer lived on a NATS node that went away) and was
// restarted is no evidence by its restart: the view is fresh again only once the new watch
// delivered this edge's own renewal, and another edge whose renewals the stalled watch missed
// is not taken for lapsed before the view was fresh for a whole lease. Before, the restart
// counted as a renewal seen, and the next check, a tenth of a lease later, took every other
// edge for lapsed: issue 28's nemesis killed one NATS node of three (buckets of 3 replicas)
// and every edge dropped the other edges' members for about two seconds, their hosts
// answering 404 (seed 1, nats-kill nats-2).
func TestRestartedLeasesWatchIsNoEvidence(t *testing.T) {
	const lease = time.Second
	c := &Cluster{cfg: Config{LeaseTTL: lease}, log: zap.NewNop(), watchers: map[jetstream.KeyWatcher]struct{}{}}
	c.leaseOK.Store(true)
	c.connected.Store(true)
	start := time.Now()
	c.selfSeen.Store(start.Add(-lease).UnixNano()) // renewals written, not seen for a lease
	require.False(t, c.viewFresh(), "stale: the watches are restarted")
	require.False(t, c.viewFresh(), "restarted, but nothing delivered yet")
	c.selfSeen.Store(time.Now().UnixNano()) // the new watch delivers this edge's renewal
	require.True(t, c.viewFresh())

	other := &remoteEdge{lastSeen: start.Add(-2 * lease)} // the stalled watch missed its renewals too
	fresh := time.Now()
	require.False(t, c.lapsed(other, fresh, fresh), "the view just turned fresh")
	require.False(t, c.lapsed(other, fresh.Add(lease/2), fresh))
	require.True(t, c.lapsed(other, fresh.Add(lease), fresh), "no renewal seen in a lease of a fresh view")
	other.lastSeen = fresh.Add(lease / 4) // the restarted watch delivered its renewal
	require.False(t, c.lapsed(other, fresh.Add(lease), fresh))
	require.True(t, c.lapsed(other, fresh.Add(lease/4+lease), fresh))
	other.expired = true
	require.False(t, c.lapsed(other, fresh.Add(10*lease), fresh), "lapsed once")
}

// freezeProxy forwards TCP connections to target until frozen: from then on it forwards
// nothing either way and keeps every connection open, as a NATS host that hangs (a frozen
// VM, a process stopped with SIGSTOP) does.
type freezeProxy struct {
	addr   string
	frozen atomic.Bool
	closed atomic.Bool
}

func newFreezeProxy(t testing.TB, target string) *freezeProxy {
	t.Helper()
	p := &freezeProxy{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = l.Addr().String()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	pipe := func(dst, src net.Conn) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			for p.frozen.Load() && !p.closed.Load() {
				time.Sleep(5 * time.Millisecond)
			}
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { pipe(up, c) })
			wg.Go(func() { pipe(c, up) })
		}
	})
	t.Cleanup(func() {
		p.closed.Store(true)
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// An edge whose NATS server hangs (its connection open, nothing answered) moves to another
// node of the NATS cluster before its lease lapses: the other edges keep its members all
// along, and it claims new routes again. Before, the NATS client left a hung server only
// after two unanswered pings two minutes apart: issue 28's nemesis stopped one NATS node of
// three with SIGSTOP for a few seconds, and the edges connected to it lost their leases, their
// members dropped by the other edges (their hosts answered 404 there), although the two
// other nodes served.
func TestEdgeLeavesAHungNATSServerWithinTheLease(t *testing.T) {
	nodes := startNATSCluster(t, 3)
	p := newFreezeProxy(t, strings.TrimPrefix(nodes[0].ClientURL(), "nats://"))
	// The harness's NATS timeout is 2 s: a renewal sent as the server hung waits that long,
	// and the client leaves the server after up to three pings, half a lease; with the
	// renewals a second apart, the lease must outlast about 2 s + half a lease.
	const lease = 5 * time.Second
	a := startClusterEdge(t, nodes, "a", clusterOpts{lease: lease, replicas: 3, cluster: func(c *Config) {
		c.NATSURLs = []string{"nats://" + p.addr, nodes[1].ClientURL(), nodes[2].ClientURL()}
		c.NATSOptions = append(c.NATSOptions, nats.IgnoreDiscoveredServers(), nats.DontRandomize())
	}})
	b := startClusterEdge(t, nodes[1:2], "b", clusterOpts{lease: lease, replicas: 3})
	_, err := a.connect().Forward(ctxT(t), clusterPool("k"), hostPort(backend(t, "A").URL))
	require.NoError(t, err)
	b.waitMembers(t, "pool", map[string]int{"a": 1})
	require.Equal(t, "nats://"+p.addr, a.c.nc.ConnectedUrl())

	p.frozen.Store(true)
	for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		require.Equal(t, map[string]int{"a": 1}, b.members("pool"), "b dropped a's member: a's lease lapsed")
	}
	require.NotEqual(t, "nats://"+p.addr, a.c.nc.ConnectedUrl(), "a is still on the hung server")
	_, err = a.connect(tunnel.WithReconnect(false)).Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "later"}, hostPort(backend(t, "L").URL))
	require.NoError(t, err, "a claims a new route")
}

// A member record names the incarnation of the edge that wrote it: the records a killed
// edge left behind, until its next run deletes them, are not joined once the others see the
// next run's lease (they would dispatch to members that are gone); a record of an older
// version, which names none, is joined as before.
func TestRecordsOfAPreviousIncarnationAreNotJoined(t *testing.T) {
	first, second := time.Unix(100, 0), time.Unix(200, 0)
	e := &remoteEdge{started: second}
	require.False(t, e.current(memberRecord{Started: first}), "the previous run's record")
	require.True(t, e.current(memberRecord{Started: second}))
	require.True(t, e.current(memberRecord{}), "an older version's record")
	e.started = time.Time{} // no lease seen yet
	require.True(t, e.current(memberRecord{Started: first}))
}

// A member record deleted while this edge's members watch was down (or lost with a bucket
// created anew) is delivered by no watch: once a restarted watch delivered the bucket's
// records without it, it is dropped a lease later, unless it is delivered again meanwhile
// (its edge writes it again after a NATS restart).
func TestRecordsAWatchMissedLeaveALeaseLater(t *testing.T) {
	const lease = time.Second
	c := &Cluster{cfg: Config{LeaseTTL: lease, EdgeID: "a"}, log: zap.NewNop()}
	c.remote.edges = map[string]*remoteEdge{}
	rec := func(id string) []byte {
		return []byte(`{"edge":"b","tunnel":"` + id + `","proto":"tcp"}`) // solo TCP: no route to settle
	}
	for _, id := range []string{"gone", "back", "kept"} {
		c.onMemberRecord("b."+id, rec(id), false)
	}
	b := c.remote.edges["b"]
	require.Len(t, b.records, 3)

	c.membersSynced(map[string]bool{"b.kept": true}, false) // a restarted watch: "gone" and "back" missing
	c.onMemberRecord("b.back", rec("back"), false)          // written again by its edge
	now := time.Now()
	c.remote.mu.Lock()
	c.dropUnconfirmedLocked(b, now)
	require.Len(t, b.records, 3, "within the lease: kept")
	c.dropUnconfirmedLocked(b, now.Add(lease))
	require.ElementsMatch(t, []string{"back", "kept"}, slices.Collect(maps.Keys(b.records)))
	c.remote.mu.Unlock()
}
