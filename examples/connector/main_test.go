package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/warren-tunnel/warren/examples/connector/internal/connectorcmd"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A connector started without --socket makes its control socket under
	// $XDG_RUNTIME_DIR (else ~/.warren): keep the tests' sockets out of the home directory.
	dir, err := os.MkdirTemp("", "warren-connector-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("XDG_RUNTIME_DIR", dir)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}

func TestRunUsageAndConfigErrors(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{nil, {"stop"}, {"--config", "x.yml"}, {"start", "extra"}, {"start", "--bogus"}} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 2, run(ctx, args, &stdout, &stderr), "args %q", args)
		require.Contains(t, stderr.String(), "usage: connector start", "args %q", args)
		require.Empty(t, stdout.String())
	}

	path := filepath.Join(t.TempDir(), "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: localhost:4040\ntunnels:\n  a:\n    proto: htp\n    local_port: 3000\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run(ctx, []string{"start", "--config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), path+":4: tunnels.a.proto")
	require.Empty(t, stdout.String())
}

// TestRunEdgeDownFailFast: with --fail-fast, an edge that does not answer ends the start at
// the first failed dial: exit 1, the dial's error, no tunnel line, no socket left behind.
func TestRunEdgeDownFailFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there any more

	dir := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", dir)
	path := filepath.Join(dir, "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: "+addr+"\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"start", "--fail-fast", "--config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "connector: tunnel: dial "+addr)
	require.Contains(t, stderr.String(), "connection refused")
	require.Empty(t, stdout.String())
	sock, err := connectorcmd.DefaultControlSocket(path)
	require.NoError(t, err)
	require.NoFileExists(t, sock, "the control socket is removed when the connector exits")

	// With servers, each edge is tried once.
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr2 := l2.Addr().String()
	require.NoError(t, l2.Close())
	require.NoError(t, os.WriteFile(path, []byte("servers: ["+addr+", "+addr2+"]\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"), 0o600))
	stderr.Reset()
	require.Equal(t, 1, run(context.Background(), []string{"start", "--fail-fast", "--config", path}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "dial "+addr2)
	require.Contains(t, stderr.String(), "connect failed", "the first edge's failure is logged too")
}

// TestStartBeforeTheEdge: a connector started while its edge is not up yet logs each failed
// dial, keeps retrying with the reconnect backoff, and serves once the edge comes up.
func TestStartBeforeTheEdge(t *testing.T) {
	lc, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	control := lc.Addr().String()
	require.NoError(t, lc.Close())
	b := startBackend(t, "early")

	dir := t.TempDir()
	path := filepath.Join(dir, "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: "+control+"\ndrain_timeout_secs: 5\ntunnels:\n"+tunnelYAML("a", b.port, "    subdomain: early\n")), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"start", "--config", path, "--socket", filepath.Join(dir, "c.sock")}, &stdout, &stderr)
	}()
	require.Eventually(t, func() bool { return strings.Count(stderr.String(), `"msg":"connect failed"`) >= 2 }, 10*time.Second, 10*time.Millisecond,
		"each failed dial is logged: %s", stderr.String())
	require.Contains(t, stderr.String(), "connection refused")
	require.Empty(t, stdout.String())

	lc, err = net.Listen("tcp", control)
	require.NoError(t, err)
	e := startEdgeOn(t, lc, nil)
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "tunnel a: http://early.localhost:") }, 15*time.Second, 20*time.Millisecond,
		"registered once the edge is up: %s", stderr.String())
	status, body, err := e.get("early.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, "early", body)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code)
	case <-time.After(15 * time.Second):
		t.Fatal("the connector did not stop")
	}
}

// TestStartInterruptedWhileWaiting: Ctrl-C while the edge is not up yet exits 0 at once.
func TestStartInterruptedWhileWaiting(t *testing.T) {
	lc, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	control := lc.Addr().String()
	require.NoError(t, lc.Close())
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: "+control+"\ntunnels:\n  a: {proto: http, local_port: 1, subdomain: a}\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"start", "--config", path, "--socket", filepath.Join(dir, "c.sock")}, io.Discard, &stderr)
	}()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "connect failed") }, 10*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code)
	case <-time.After(5 * time.Second):
		t.Fatal("the connector did not stop")
	}
	require.NoFileExists(t, filepath.Join(dir, "c.sock"))
}

// TestStatusShowsLiveTunnel: status lists a registered tunnel with its URL, group, local
// address, health (from its probe), streams and the edge; while the edge is down it is not
// connected, and after the edge restarts, the reconnect is counted.
func TestStatusShowsLiveTunnel(t *testing.T) {
	lc, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := startEdgeOn(t, lc, nil)
	b := startBackend(t, "web")
	c := startConnector(t, e, "tunnels:\n"+tunnelYAML("web", b.port, poolYAML("pool")+fastHealth))

	var ts connectorcmd.TunnelStatus
	require.Eventually(t, func() bool {
		ts, _ = tunnelNamed(c.status(t), "web")
		return ts.Health == "healthy"
	}, 10*time.Second, 20*time.Millisecond, "the probe's report reaches status")
	st := c.status(t)
	require.Equal(t, e.control, st.Edge)
	require.True(t, st.Connected)
	require.Zero(t, st.Reconnects)
	require.Equal(t, c.socket, st.Socket)
	require.Equal(t, fmt.Sprintf("http://pool.localhost:%d", e.publicPort), ts.URL)
	require.Equal(t, "web", ts.Group)
	require.Equal(t, "registered", ts.State)
	require.Equal(t, "file", ts.Source)
	require.Equal(t, fmt.Sprintf("127.0.0.1:%d", b.port), ts.Local)
	require.NotEmpty(t, ts.ID)
	require.NotNil(t, ts.Streams, "streams are counted on every system")
	require.Zero(t, *ts.Streams, "no request yet: exactly no stream (health probes are not streams)")

	code, out, _ := c.ctl("status")
	require.Equal(t, 0, code)
	require.Regexp(t, `(?m)^web\s+registered\s+http://pool\.localhost:\d+\s+web\s+127\.0\.0\.1:\d+\s+healthy\s+\d+\s+file$`, out)
	require.Contains(t, out, "edge:       "+e.control+" (connected, 0 reconnects)")

	// The edge goes away and comes back on the same port: one reconnect.
	e.close()
	require.Eventually(t, func() bool { return !c.status(t).Connected }, 10*time.Second, 20*time.Millisecond)
	lc2, err := net.Listen("tcp", e.control)
	require.NoError(t, err)
	startEdgeOn(t, lc2, nil)
	require.Eventually(t, func() bool {
		st := c.status(t)
		ts, _ := tunnelNamed(st, "web")
		return st.Connected && st.Reconnects == 1 && ts.State == "registered" && ts.Health == "healthy"
	}, 15*time.Second, 20*time.Millisecond)
}

// TestAttachServesThroughEdge: attach adds a tunnel to a running connector, prints its URL,
// and the edge routes to it; a second attach of the name is refused.
func TestAttachServesThroughEdge(t *testing.T) {
	e := startEdge(t)
	a, b := startBackend(t, "file-backend"), startBackend(t, "attached-backend")
	c := startConnector(t, e, "tunnels:\n"+tunnelYAML("a", a.port, "    subdomain: first\n"))

	keyFile := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(keyFile, []byte(testKey+"\n"), 0o600))
	code, out, errOut := c.ctl("attach", "--subdomain", "pool", "--group", "web", "--group-key-file", keyFile,
		"--health", "tcp", "--health-interval", "0.1", "--weight", "7", "--priority", "2", strconv.Itoa(b.port))
	require.Equal(t, 0, code, errOut)
	url := fmt.Sprintf("http://pool.localhost:%d", e.publicPort)
	require.Equal(t, fmt.Sprintf("tunnel pool-%d: %s -> 127.0.0.1:%d (group web)\n", b.port, url, b.port), out)

	require.Eventually(t, func() bool {
		status, body, err := e.get("pool.localhost", "/")
		return err == nil && status == 200 && body == "attached-backend"
	}, 10*time.Second, 20*time.Millisecond, "the attached tunnel serves requests")
	ts, ok := tunnelNamed(c.status(t), fmt.Sprintf("pool-%d", b.port))
	require.True(t, ok)
	require.Equal(t, "attach", ts.Source)
	pool, ok := e.srv.Registry().LookupHTTP("pool")
	require.True(t, ok)
	require.Equal(t, 7, pool.Members[0].Weight, "the load-balancing flags reach the edge")
	require.Equal(t, 2, pool.Members[0].Priority)
	require.Equal(t, url, ts.URL)

	code, _, errOut = c.ctl("attach", "--name", "a", "--subdomain", "other", strconv.Itoa(b.port))
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `a tunnel named "a" is running`)
	code, _, errOut = c.ctl("attach", "--subdomain", "pool", strconv.Itoa(a.port))
	require.Equal(t, 1, code, "the file's rules apply: a shared subdomain needs the pool's key")
	require.Contains(t, errOut, "tunnels.pool-"+strconv.Itoa(a.port)+".subdomain")
}

// TestDetachWaitsForInFlight: detach drains: it returns only after the request in flight
// finished, counting the streams down, and the tunnel is gone afterwards.
func TestDetachWaitsForInFlight(t *testing.T) {
	e := startEdge(t)
	b := startBackend(t, "slow")
	c := startConnector(t, e, "tunnels:\n"+tunnelYAML("web", b.port, "    subdomain: web\n"))

	type result struct {
		status int
		body   string
		err    error
	}
	inflight := make(chan result, 1)
	go func() {
		s, body, err := e.get("web.localhost", "/slow")
		inflight <- result{s, body, err}
	}()
	<-b.started

	type detached struct {
		code        int
		out, errOut string
	}
	done := make(chan detached, 1)
	go func() {
		code, out, errOut := c.ctl("detach", "web")
		done <- detached{code, out, errOut}
	}()
	require.Eventually(t, func() bool {
		for _, ts := range c.status(t).Tunnels {
			if ts.Name == "web" && ts.State == "draining" && ts.Streams != nil && *ts.Streams == 1 {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond, "the tunnel drains with its stream open")
	select {
	case d := <-done:
		t.Fatalf("detach returned while a request was in flight: %+v", d)
	case <-time.After(300 * time.Millisecond):
	}
	close(b.release)
	r := <-inflight
	require.NoError(t, r.err)
	require.Equal(t, 200, r.status, "the request in flight finishes")
	require.Equal(t, "slow", r.body)

	var d detached
	select {
	case d = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("detach did not return after the drain")
	}
	require.Equal(t, 0, d.code, d.errOut)
	require.Contains(t, d.out, "draining web: 1 stream left\n")
	require.Contains(t, d.out, "draining web: 0 streams left\n")
	require.Less(t, strings.Index(d.out, "1 stream left"), strings.Index(d.out, "0 streams left"), "counting down")
	require.Regexp(t, `tunnel web detached \(drained in [0-9.]+m?s\)\n$`, d.out)

	require.Empty(t, c.status(t).Tunnels)
	status, _, err := e.get("web.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 404, status, "the route is gone")

	code, _, errOut := c.ctl("detach", "web")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `no such tunnel "web"`)
}

// TestSIGHUPReload: SIGHUP applies the file: an added tunnel registers, a removed one
// drains, an unchanged one is left alone, and a changed pool member registers anew before
// the old registration drains: a loop of requests to the pool sees no failure.
func TestSIGHUPReload(t *testing.T) {
	e := startEdge(t)
	keep, gone, oldB, newB, added := startBackend(t, "keep"), startBackend(t, "gone"), startBackend(t, "old"), startBackend(t, "new"), startBackend(t, "added")
	const slowHealth = "    health_check: {type: tcp, interval_secs: 1, timeout_secs: 0.5, max_failed: 1}\n"
	c := startConnector(t, e, "tunnels:\n"+
		tunnelYAML("keep", keep.port, "    subdomain: keep\n")+
		tunnelYAML("gone", gone.port, "    subdomain: gone\n")+
		tunnelYAML("chg", oldB.port, poolYAML("pool")+slowHealth))
	require.Eventually(t, func() bool {
		ts, _ := tunnelNamed(c.status(t), "chg")
		return ts.Health == "healthy"
	}, 10*time.Second, 20*time.Millisecond)
	keepID := func() string { ts, _ := tunnelNamed(c.status(t), "keep"); return ts.ID }
	before := keepID()

	// Requests to the pool, one after the other, until stop.
	stop := make(chan struct{})
	var (
		mu       sync.Mutex
		failures []string
		bodies   []string
	)
	var loop sync.WaitGroup
	loop.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			status, body, err := e.get("pool.localhost", "/")
			mu.Lock()
			if err != nil || status != 200 {
				failures = append(failures, fmt.Sprintf("%d %q %v", status, body, err))
			} else {
				bodies = append(bodies, body)
			}
			mu.Unlock()
		}
	})

	writeConfig(t, c.config, e, "tunnels:\n"+
		tunnelYAML("keep", keep.port, "    subdomain: keep\n")+
		tunnelYAML("chg", newB.port, poolYAML("pool")+slowHealth)+
		tunnelYAML("added", added.port, "    subdomain: added\n"))
	time.Sleep(200 * time.Millisecond) // some requests before the change
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))

	require.Eventually(t, func() bool {
		st := c.status(t)
		chg, ok := tunnelNamed(st, "chg")
		return ok && chg.Local == fmt.Sprintf("127.0.0.1:%d", newB.port) && len(st.Tunnels) == 3
	}, 15*time.Second, 20*time.Millisecond, "chg re-registered, gone drained, added registered")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bodies) > 0 && bodies[len(bodies)-1] == "new"
	}, 10*time.Second, 10*time.Millisecond, "the pool is served by the new registration")
	time.Sleep(200 * time.Millisecond)
	close(stop)
	loop.Wait()
	mu.Lock()
	require.Empty(t, failures, "no failed request to the pool during the change")
	require.Greater(t, len(bodies), 20, "the loop ran")
	require.Equal(t, "old", bodies[0])
	mu.Unlock()

	require.Equal(t, before, keepID(), "an unchanged tunnel is not registered again")
	status, body, err := e.get("added.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, "added", body)
	status, _, err = e.get("gone.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 404, status)
	require.Contains(t, c.stderr.String(), "reload: tunnel gone removed; draining it")
	require.Contains(t, c.stderr.String(), "reload: tunnel chg changed; registered anew, draining the old registration")

	// A file that does not parse changes nothing; a changed server is not applied.
	require.NoError(t, os.WriteFile(c.config, []byte("server: "+e.control+"\ntunnels:\n  x: {proto: htp, local_port: 1}\n"), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(c.stderr.String(), c.config+":3: tunnels.x.proto") }, 5*time.Second, 10*time.Millisecond)
	require.Len(t, c.status(t).Tunnels, 3)
	writeConfig(t, c.config, e, "auth_token: other-token-0123456789\ndata_read_buffer: 65536\ntunnels:\n"+
		tunnelYAML("keep", keep.port, "    subdomain: keep\n")+
		tunnelYAML("chg", newB.port, poolYAML("pool")+slowHealth)+
		tunnelYAML("added", added.port, "    subdomain: added\n"))
	notApplied := func(n int) func() bool {
		return func() bool {
			out := c.stderr.String()
			return strings.Count(out, "not applied: auth_token") == n && strings.Count(out, "not applied: data_read_buffer (0 -> 65536)") == n
		}
	}
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, notApplied(1), 5*time.Second, 10*time.Millisecond)
	// Not applied means the running values stay what the next reload compares with: the same
	// file again is still not applied, and says so again.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, notApplied(2), 5*time.Second, 10*time.Millisecond)
}

// TestControlSocket: the socket is 0600; a second connector on it is refused with a clear
// message while the first keeps running; a stale socket file is replaced.
func TestControlSocket(t *testing.T) {
	e := startEdge(t)
	b := startBackend(t, "web")
	c := startConnector(t, e, "tunnels:\n"+tunnelYAML("web", b.port, "    subdomain: web\n"))
	fi, err := os.Stat(c.socket)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket, fi.Mode().Type())
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	var stdout, stderr syncBuffer
	code := run(context.Background(), []string{"start", "--config", c.config, "--socket", c.socket}, &stdout, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "connector: another connector is already running with control socket "+c.socket)
	require.Empty(t, stdout.String(), "the second connector registered nothing")
	require.Len(t, c.status(t).Tunnels, 1, "the first one still answers")

	// A socket file left by a connector that was killed.
	stale := filepath.Join(t.TempDir(), "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.FileExists(t, stale)
	c.stop(t)
	require.NoFileExists(t, c.socket, "a connector removes its socket when it stops")
	d := startConnectorWith(t, c.config, stale)
	code, out, errOut := d.ctl("status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "web")

	// A path that is not a socket is never removed.
	notSock := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notSock, nil, 0o600))
	stdout, stderr = syncBuffer{}, syncBuffer{}
	require.Equal(t, 1, run(context.Background(), []string{"start", "--config", c.config, "--socket", notSock}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "exists and is not a socket")
	require.FileExists(t, notSock)

	// status without a running connector says so.
	code, _, errOut = (&connector{socket: filepath.Join(t.TempDir(), "none.sock")}).ctl("status")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "no connector is running with control socket")
}

// startConnectorWith starts a connector on an existing file and socket path.
func startConnectorWith(t *testing.T, path, socket string) *connector {
	t.Helper()
	c := &connector{socket: socket, config: path, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		c.code = run(ctx, []string{"start", "--config", path, "--socket", socket}, &c.stdout, &c.stderr)
	}()
	t.Cleanup(func() { c.stop(t) })
	require.Eventually(t, func() bool { return strings.Contains(c.stdout.String(), "tunnel ") }, 15*time.Second, 10*time.Millisecond, c.stderr.String())
	return c
}

// TestCheck: check validates a file: exit 1 with the line-numbered errors, 0 and "ok".
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yml")
	require.NoError(t, os.WriteFile(bad, []byte("server: localhost:4040\ntunnels:\n  a:\n    proto: htp\n    local_port: 70000\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"check", "--config", bad}, &stdout, &stderr))
	require.Contains(t, stderr.String(), bad+":4: tunnels.a.proto")
	require.Contains(t, stderr.String(), bad+":5: tunnels.a.local_port")
	require.Empty(t, stdout.String())

	good := filepath.Join(dir, "good.yml")
	require.NoError(t, os.WriteFile(good, []byte("server: localhost:4040\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"), 0o600))
	stdout.Reset()
	stderr.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"check", "--config", good}, &stdout, &stderr))
	require.Equal(t, good+": ok (1 tunnels)\n", stdout.String())
	require.Empty(t, stderr.String())

	stdout.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"check", "--config", good, "extra"}, &stdout, &stderr))
}

// TestShutdownCountsStreams: SIGTERM drains and logs the streams left, down to 0.
func TestShutdownCountsStreams(t *testing.T) {
	e := startEdge(t)
	b := startBackend(t, "slow")
	c := startConnector(t, e, "tunnels:\n"+tunnelYAML("web", b.port, "    subdomain: web\n"))
	got := make(chan int, 1)
	go func() {
		s, _, _ := e.get("web.localhost", "/slow")
		got <- s
	}()
	<-b.started
	c.cancel()
	require.Eventually(t, func() bool { return strings.Contains(c.stderr.String(), "draining: 1 stream left") }, 5*time.Second, 10*time.Millisecond)
	select {
	case <-c.done:
		t.Fatal("the connector stopped with a request in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(b.release)
	require.Equal(t, 200, <-got)
	<-c.done
	require.Equal(t, 0, c.code)
	require.Contains(t, c.stderr.String(), "draining: 0 streams left")
}
