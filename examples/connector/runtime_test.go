package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/examples/connector/internal/connectorcmd"
	"github.com/warren-tunnel/warren/tunnel"
)

// Helpers of the runtime tests in main_test.go: an in-process edge on loopback, backends,
// and connectors run in-process by run.

const testKey = "shared-secret-for-this-pool"

// syncBuffer is a bytes.Buffer written by a running command while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testEdge is an edge serving its control and public HTTP listeners on loopback.
type testEdge struct {
	srv             *tunnel.Server
	control, public string // host:port
	publicPort      int
	serving         sync.WaitGroup
}

func startEdge(t *testing.T) *testEdge {
	t.Helper()
	lc, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return startEdgeOn(t, lc, nil)
}

// startEdgeOn serves an edge on the control listener lc and on lp (a new one when nil).
func startEdgeOn(t *testing.T, lc, lp net.Listener) *testEdge {
	t.Helper()
	if lp == nil {
		var err error
		lp, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
	}
	port := lp.Addr().(*net.TCPAddr).Port
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "localhost", LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		Public: tunnel.PublicHTTP{URLHTTPPort: port}, Timeouts: tunnel.Timeouts{Drain: 10 * time.Second}})
	require.NoError(t, err)
	e := &testEdge{srv: srv, control: lc.Addr().String(), public: lp.Addr().String(), publicPort: port}
	e.serving.Go(func() { _ = srv.Serve(lc) })
	e.serving.Go(func() { _ = srv.ServePublic(lp) })
	t.Cleanup(e.close)
	return e
}

func (e *testEdge) close() {
	_ = e.srv.Close()
	e.serving.Wait()
}

// backend is a local HTTP service answering its name; a request to /slow waits for release
// (after telling started).
type backend struct {
	name    string
	port    int
	started chan struct{}
	release chan struct{}
}

func startBackend(t *testing.T, name string) *backend {
	t.Helper()
	b := &backend{name: name, started: make(chan struct{}, 16), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			b.started <- struct{}{}
			select {
			case <-b.release:
			case <-time.After(20 * time.Second):
			}
		}
		_, _ = io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	b.port = srv.Listener.Addr().(*net.TCPAddr).Port
	return b
}

// get sends GET path for host through the edge's public listener.
func (e *testEdge) get(host, path string) (int, string, error) {
	tr := &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.public)
		}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + host + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// connector is a connector run in-process with run.
type connector struct {
	socket, config string
	stdout, stderr syncBuffer
	cancel         context.CancelFunc
	done           chan struct{}
	code           int
}

// startConnector writes yaml (a connector file without its server key, or with a servers
// key first) and starts a connector on it and on edge e; it returns once the control socket
// answers.
func startConnector(t *testing.T, e *testEdge, yaml string) *connector {
	t.Helper()
	dir := t.TempDir()
	c := &connector{socket: filepath.Join(dir, "c.sock"), config: filepath.Join(dir, "config.yml"), done: make(chan struct{})}
	writeConfig(t, c.config, e, yaml)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		c.code = run(ctx, []string{"start", "--config", c.config, "--socket", c.socket}, &c.stdout, &c.stderr)
	}()
	t.Cleanup(func() { c.stop(t) })
	deadline := time.Now().Add(15 * time.Second)
	for {
		if conn, err := net.Dial("unix", c.socket); err == nil {
			_ = conn.Close()
			// The socket is up before the tunnels register; wait for those too.
			require.Eventually(t, func() bool { return strings.Count(c.stdout.String(), "\n") >= strings.Count(yaml, "local_port") },
				15*time.Second, 10*time.Millisecond, "stdout: %s\nstderr: %s", c.stdout.String(), c.stderr.String())
			return c
		}
		select {
		case <-c.done:
			t.Fatalf("the connector exited with %d:\n%s", c.code, c.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the control socket did not come up: %s", c.stderr.String())
	}
}

// writeConfig writes yaml to path with e as its server, unless yaml names its edges itself
// (servers: ...).
func writeConfig(t *testing.T, path string, e *testEdge, yaml string) {
	t.Helper()
	head := "server: " + e.control + "\n"
	if strings.HasPrefix(yaml, "servers:") {
		head = ""
	}
	require.NoError(t, os.WriteFile(path, []byte(head+"drain_timeout_secs: 10\n"+yaml), 0o600))
}

// stop ends the connector as SIGTERM does and waits for it.
func (c *connector) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the connector did not stop")
	}
}

// ctl runs a control command against c and returns its exit code and output.
func (c *connector) ctl(args ...string) (int, string, string) {
	var stdout, stderr syncBuffer
	args = append(args[:1:1], append([]string{"--socket", c.socket}, args[1:]...)...)
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// status returns c's status as JSON.
func (c *connector) status(t *testing.T) connectorcmd.StatusReply {
	t.Helper()
	code, out, errOut := c.ctl("status", "--json")
	require.Equal(t, 0, code, errOut)
	var st connectorcmd.StatusReply
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	return st
}

// tunnelNamed returns the status of the tunnel called name that is not draining.
func tunnelNamed(st connectorcmd.StatusReply, name string) (connectorcmd.TunnelStatus, bool) {
	for _, ts := range st.Tunnels {
		if ts.Name == name && ts.State != "draining" {
			return ts, true
		}
	}
	return connectorcmd.TunnelStatus{}, false
}

func tunnelYAML(name string, port int, extra string) string {
	return fmt.Sprintf("  %s:\n    proto: http\n    local_port: %d\n%s", name, port, extra)
}

func poolYAML(sub string) string {
	return "    subdomain: " + sub + "\n    group: web\n    group_key: " + strconv.Quote(testKey) + "\n"
}

const fastHealth = "    health_check: {type: tcp, interval_secs: 0.1, timeout_secs: 0.5, max_failed: 1}\n"
