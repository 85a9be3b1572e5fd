package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/cluster"
	"github.com/warren-tunnel/warren/tunnel/store"
	"github.com/warren-tunnel/warren/tunnel/store/natsstore"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
)

var (
	natsBinOnce sync.Once
	natsBin     string
	natsBinErr  error
)

// natsServerBinary builds nats-server (the version this module pins) once per test binary:
// a process the test can stop with SIGSTOP, as a NATS host that hangs.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	natsBinOnce.Do(func() {
		natsBin = filepath.Join(binDir, "nats-server")
		if insideNemesisNetns() && fileExists(natsBin) {
			return // built by the test process that re-executed this one
		}
		out, err := exec.Command("go", "build", "-o", natsBin, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBinErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	require.NoError(t, natsBinErr)
	return natsBin
}

// natsProcess is a nats-server process with JetStream on 127.0.0.1.
type natsProcess struct {
	cmd *exec.Cmd
	url string
}

func startNATSProcess(t *testing.T) *natsProcess {
	t.Helper()
	port := freePorts(t, 1)[0]
	cmd := exec.Command(natsServerBinary(t), "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", t.TempDir())
	require.NoError(t, cmd.Start())
	n := &natsProcess{cmd: cmd, url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	require.Eventually(t, func() bool {
		nc, err := nats.Connect(n.url)
		if err != nil {
			return false
		}
		defer nc.Close()
		_, err = nc.JetStream()
		return err == nil
	}, waitTimeout, 50*time.Millisecond, "nats-server did not come up")
	return n
}

// clusterEdgeOn starts an edge of a cluster on the NATS at url, with its edge-to-edge listener.
func clusterEdgeOn(t *testing.T, url, id string, timeout time.Duration) *tunneltest.Edge {
	t.Helper()
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c, err := cluster.New(cluster.Config{NATSURLs: []string{url}, EdgeID: id, Advertise: peer.Addr().String(),
		Token: "cluster-token-0123456789", LeaseTTL: 3 * time.Second, Timeout: timeout,
		NATSOptions: []nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}})
	require.NoError(t, err)
	served := make(chan error, 1)
	// Registered first, so run last: after the edge's Close, which ends ServePeers.
	t.Cleanup(func() { <-served })
	e := tunneltest.NewEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, Cluster: c,
		Limits: tunnel.Limits{MaxTunnelsPerSession: 1000, RegisterRate: 1000, RegisterBurst: 1000}})
	go func() { served <- c.ServePeers(peer) }()
	return e
}

// A NATS that hangs (nats-server stopped with SIGSTOP for 10 s, as a host that freezes) holds
// up nothing on an edge but the route whose write waits for it: in a two-edge cluster, the
// last member of route "x" leaves, and the edge's write of x's emptiness waits for NATS; the
// edge's other routes meanwhile serve requests and their members leave at once (both far
// inside the cluster's 5 s NATS timeout, which is what each would wait if it queued behind
// x's write or under the lock it was written under before). When NATS resumes (SIGCONT),
// x's record converges: it is recorded empty. Registrations of new routes write their claim
// through to NATS before they are acknowledged (the other edges order claims by it), so they
// wait for NATS itself, each for its own route, and are refused as unavailable past the
// timeout.
func TestStoppedNATSHoldsUpOnlyTheRouteWaitingForIt(t *testing.T) {
	const natsTimeout = 5 * time.Second
	n := startNATSProcess(t)
	a := clusterEdgeOn(t, n.url, "a", natsTimeout)
	clusterEdgeOn(t, n.url, "b", natsTimeout)
	web := plainBackend(t, "web")
	sess := tunneltest.Connect(t, a)
	x, err := sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "x"}, web)
	require.NoError(t, err)
	var others []*tunnel.Tunnel
	for i := range 100 {
		tun, err := sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: fmt.Sprintf("y%d", i)}, web)
		require.NoError(t, err)
		others = append(others, tun)
	}

	require.NoError(t, n.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	sigcont := func() { _ = n.cmd.Process.Signal(syscall.SIGCONT) }
	defer sigcont()

	// x's last member leaves: its member is gone from the edge at once, its record waits.
	left := func(sub string) time.Duration {
		start := time.Now()
		require.Eventually(t, func() bool {
			_, ok := a.Registry().LookupHTTP(sub)
			return !ok
		}, natsTimeout, time.Millisecond, "%s's member did not leave", sub)
		return time.Since(start)
	}
	require.NoError(t, x.Close())
	require.Less(t, left("x"), natsTimeout/2, "x's leave waited for NATS")

	// Requests and leaves of the other routes go on at once, one after another.
	for i, tun := range others {
		start := time.Now()
		resp, err := a.Client.Get(a.URL(fmt.Sprintf("y%d", i), "/"))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Less(t, time.Since(start), natsTimeout/2, "a request to y%d waited", i)
		if i%4 == 0 {
			require.NoError(t, tun.Close())
			require.Less(t, left(fmt.Sprintf("y%d", i)), natsTimeout/2, "y%d's leave waited", i)
		}
	}
	// A registration of a new route is a claim every edge must see: it waits for NATS, each
	// for its own write and none behind another's, and is refused as unavailable when NATS
	// does not answer within its timeout (the connector tries again later).
	var regs sync.WaitGroup
	conns := []*tunnel.Session{tunneltest.Connect(t, a), tunneltest.Connect(t, a)}
	regStart := time.Now()
	for i, sub := range []string{"new1", "new2"} {
		regs.Add(1)
		go func() {
			defer regs.Done()
			_, err := conns[i].Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: sub}, web)
			assert.ErrorIs(t, err, tunnel.ErrUnavailable, "%s registered while NATS was stopped", sub)
		}()
	}
	regs.Wait()
	require.Less(t, time.Since(regStart), natsTimeout+natsTimeout/2, "the registrations waited for each other")

	if d := time.Since(stopped); d < 10*time.Second {
		time.Sleep(10*time.Second - d) // NATS stays stopped for 10 s, as the scenario
	}
	sigcont()

	// NATS is back: x's record converges, and a registration of a new route goes through.
	nc, err := nats.Connect(n.url)
	require.NoError(t, err)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	routes, err := natsstore.Open(ctx, nc, natsstore.Config{Bucket: "warren_routes", Timeout: natsTimeout})
	require.NoError(t, err)
	defer routes.Close()
	require.Eventually(t, func() bool {
		r, err := routes.Get(ctx, store.Key(store.KindHTTP, "x"))
		return err == nil && r != nil && !r.EmptySince.IsZero()
	}, 3*natsTimeout, 50*time.Millisecond, "x was never recorded empty")
	_, err = sess.Forward(ctxT(t), tunnel.TunnelSpec{Subdomain: "z"}, web)
	require.NoError(t, err)
}
