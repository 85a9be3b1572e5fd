package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/tunnel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRunBadKeyPair: a TLS key pair that does not load stops the edge at start (exit 2),
// naming the file.
func TestRunBadKeyPair(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert.pem"), []byte("not a certificate"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), []byte("not a key"), 0o600))
	path := filepath.Join(dir, "server.toml")
	require.NoError(t, os.WriteFile(path, []byte("[server]\ndomain = \"localhost\"\n[tls]\ncert_path = \"cert.pem\"\nkey_path = \"key.pem\"\n"), 0o600))
	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", path}, &stderr))
	require.Contains(t, stderr.String(), path+": tls: loading cert_path and key_path")
}

func TestRunBadConfigExits2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.toml")
	require.NoError(t, os.WriteFile(path, []byte("[server]\ndomain = \"localhost\"\ndomian = \"x\"\n"), 0o600))
	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", path}, &stderr))
	require.Contains(t, stderr.String(), path+":3: server.domian: unknown key")

	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", filepath.Join(t.TempDir(), "missing.toml")}, &stderr))
	require.Contains(t, stderr.String(), "missing.toml")

	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), func() {}, []string{"-config", path, "extra"}, &stderr))
	require.Contains(t, stderr.String(), "usage: edge")
}

// syncBuffer is a bytes.Buffer the running edge writes while the test reads it.
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

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

const (
	oldToken = "old-connector-token-0123"
	newToken = "new-connector-token-0123"
)

func edgeFile(control, http int, token string, extra string) string {
	return fmt.Sprintf("[server]\ndomain = \"localhost\"\nbind = \"127.0.0.1\"\nhttp_port = %d\ncontrol_port = %d\nadmin_port = 0\n"+
		"[auth]\nrequire_auth = true\ntokens = [%q]\n[limits]\ndrain_timeout_secs = 5\n%s", http, control, token, extra)
}

// runningEdge is run in a goroutine on a file.
type runningEdge struct {
	path, control, public string
	stderr                syncBuffer
	cancel                context.CancelFunc
	done                  chan struct{}
	code                  int
}

func startRun(t *testing.T, text string, control, http int) *runningEdge {
	t.Helper()
	e := &runningEdge{path: filepath.Join(t.TempDir(), "server.toml"), done: make(chan struct{}),
		control: fmt.Sprintf("127.0.0.1:%d", control), public: fmt.Sprintf("127.0.0.1:%d", http)}
	require.NoError(t, os.WriteFile(e.path, []byte(text), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() {
		defer close(e.done)
		e.code = run(ctx, func() {}, []string{"-config", e.path}, &e.stderr)
	}()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	require.Eventually(t, func() bool {
		s := e.stderr.String()
		return strings.Contains(s, `"listener":"control"`) && strings.Contains(s, `"listener":"http"`)
	}, 10*time.Second, 10*time.Millisecond, "the edge listens: %s", e.stderr.String())
	return e
}

// get fetches http://<host>/<path> from the edge's public listener at addr.
func get(addr, host, path string) (int, string, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get("http://" + host + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func startBackend(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	b := httptest.NewServer(h)
	t.Cleanup(b.Close)
	return b.Listener.Addr().String()
}

// TestSIGHUPReload: SIGHUP applies a new token and a new limit at once (the removed token
// logs in no more, the next registration over the limit is refused) without dropping the
// connector that logged in with the old token nor its tunnel, and logs the settings it did
// not apply (a port, a limit read only at start) while they keep their running values.
func TestSIGHUPReload(t *testing.T) {
	control, http1, http2 := freePort(t), freePort(t), freePort(t)
	e := startRun(t, edgeFile(control, http1, oldToken, ""), control, http1)
	backend := startBackend(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "app") })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := tunnel.Dial(ctx, e.control, tunnel.WithToken(oldToken))
	require.NoError(t, err)
	defer sess.Close()
	tun, err := sess.Forward(ctx, tunnel.TunnelSpec{Subdomain: "app"}, backend)
	require.NoError(t, err)
	status, body, err := get(e.public, "app.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, "app", body)

	require.NoError(t, os.WriteFile(e.path, []byte(edgeFile(control, http2, newToken, "max_tunnels_per_session = 3\nrequest_body_max_bytes = 1024\n")), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(e.stderr.String(), "configuration reloaded") }, 10*time.Second, 10*time.Millisecond, e.stderr.String())
	logged := e.stderr.String()
	require.Contains(t, logged, fmt.Sprintf("not applied: server.http_port (%d -> %d): listeners and ports are fixed while the edge runs; restart the edge to apply it", http1, http2))
	require.Contains(t, logged, "applied: limits.max_tunnels_per_session (16 -> 3): from the next session, registration or event stream; what is held stays")
	require.NotContains(t, logged, "not applied: limits.max_tunnels_per_session")
	require.Contains(t, logged, "not applied: limits.request_body_max_bytes (0 -> 1024): the edge reads it only when it starts; restart the edge to apply it")
	require.Contains(t, logged, "applied: auth.tokens and auth.tenants: 1 tokens and 0 tenants from now on")
	require.NotContains(t, logged, "not applied: server.control_port")

	// The new max_tunnels_per_session applies to the session already there: it has "app",
	// two more make 3, a fourth is refused.
	for _, sub := range []string{"b", "c"} {
		_, err := sess.Forward(ctx, tunnel.TunnelSpec{Subdomain: sub}, backend)
		require.NoError(t, err)
	}
	_, err = sess.Forward(ctx, tunnel.TunnelSpec{Subdomain: "d"}, backend)
	require.ErrorIs(t, err, tunnel.ErrLimit)
	require.ErrorContains(t, err, "max_tunnels_per_session")

	_, err = tunnel.Dial(ctx, e.control, tunnel.WithToken(oldToken), tunnel.WithReconnect(false))
	require.ErrorIs(t, err, tunnel.ErrUnauthorized, "the removed token logs in no more")
	s2, err := tunnel.Dial(ctx, e.control, tunnel.WithToken(newToken))
	require.NoError(t, err, "the new token logs in")
	require.NoError(t, s2.Close())

	require.NoError(t, sess.Err(), "the connector that logged in with the old token stays")
	select {
	case <-tun.Done():
		t.Fatal("its tunnel ended")
	default:
	}
	status, body, err = get(e.public, "app.localhost", "/")
	require.NoError(t, err, "the public port was not changed")
	require.Equal(t, 200, status)
	require.Equal(t, "app", body)

	// A file that does not load changes nothing.
	require.NoError(t, os.WriteFile(e.path, []byte("[server]\ndomain = \"localhost\"\ndomian = \"x\"\n"), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(e.stderr.String(), "reload failed; the running configuration is kept")
	}, 10*time.Second, 10*time.Millisecond)
	require.Contains(t, e.stderr.String(), e.path+":3: server.domian: unknown key")
	s3, err := tunnel.Dial(ctx, e.control, tunnel.WithToken(newToken))
	require.NoError(t, err)
	require.NoError(t, s3.Close())

	require.NoError(t, sess.Close())
	e.cancel()
	<-e.done
	require.Equal(t, 0, e.code)
}

// TestShutdownCountsStreams: the drain logs the streams left until none is.
func TestShutdownCountsStreams(t *testing.T) {
	control, public := freePort(t), freePort(t)
	e := startRun(t, edgeFile(control, public, oldToken, ""), control, public)
	started, release := make(chan struct{}), make(chan struct{})
	backend := startBackend(t, func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-release
		_, _ = io.WriteString(w, "slow")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := tunnel.Dial(ctx, e.control, tunnel.WithToken(oldToken), tunnel.WithReconnect(false))
	require.NoError(t, err)
	defer sess.Close()
	_, err = sess.Forward(ctx, tunnel.TunnelSpec{Subdomain: "app"}, backend)
	require.NoError(t, err)

	got := make(chan int, 1)
	go func() {
		s, _, _ := get(e.public, "app.localhost", "/")
		got <- s
	}()
	<-started
	e.cancel()
	require.Eventually(t, func() bool { return strings.Contains(e.stderr.String(), "draining: 1 stream left") }, 5*time.Second, 10*time.Millisecond, e.stderr.String())
	select {
	case <-e.done:
		t.Fatal("the edge stopped with a request in flight")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.Equal(t, 200, <-got)
	<-e.done
	require.Equal(t, 0, e.code)
	require.Contains(t, e.stderr.String(), "draining: 0 streams left")
}

// TestCheck: -check prints "ok" and exits 0 for a good file, and the line-numbered errors
// with exit 1 for a bad one, without listening.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(bad, []byte("[server]\ndomain = \"localhost\"\ndomian = \"x\"\n[limits]\ntcp_port_range = [30000, 20000]\n"), 0o600))
	var stdout, stderr bytes.Buffer
	require.Equal(t, 1, runWith(context.Background(), func() {}, []string{"-check", "-config", bad}, &stdout, &stderr))
	require.Contains(t, stderr.String(), bad+":3: server.domian: unknown key")
	require.Contains(t, stderr.String(), bad+":5: limits.tcp_port_range")
	require.Empty(t, stdout.String())

	good := filepath.Join(dir, "good.toml")
	// The ports are in use: -check does not listen.
	var ports []int
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	require.NoError(t, os.WriteFile(good, []byte(edgeFile(ports[0], ports[1], oldToken, "")), 0o600))
	stdout.Reset()
	stderr.Reset()
	require.Equal(t, 0, runWith(context.Background(), func() {}, []string{"-check", "-config", good}, &stdout, &stderr))
	require.Equal(t, "ok\n", stdout.String())
	require.Empty(t, stderr.String())

	// What only loading shows: a TLS key pair that does not load.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cert.pem"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "key.pem"), []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(good, []byte("[server]\ndomain = \"localhost\"\n[tls]\ncert_path = \"cert.pem\"\nkey_path = \"key.pem\"\n"), 0o600))
	stdout.Reset()
	require.Equal(t, 1, runWith(context.Background(), func() {}, []string{"-check", "-config", good}, &stdout, &stderr))
	require.Contains(t, stderr.String(), good+": tls: loading cert_path and key_path")
}

// A SIGHUP while the configuration path is a FIFO (no writer, or a writer that never
// writes) does not hold up the edge: the reload fails within its read timeout (5 s), off the
// signal loop, and a SIGTERM meanwhile starts the shutdown at once (the process ends once the
// reload has given up). Before, the reload waited in the signal loop for a writer, and
// SIGTERM was never heard.
func TestSIGHUPWithAFIFOConfigStillStops(t *testing.T) {
	control, http := freePort(t), freePort(t)
	e := startRun(t, edgeFile(control, http, oldToken, ""), control, http)
	require.NoError(t, os.Remove(e.path))
	require.NoError(t, syscall.Mkfifo(e.path, 0o600))

	// No writer: the reload fails at once.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(e.stderr.String(), "reload failed; the running configuration is kept")
	}, 10*time.Second, 10*time.Millisecond, e.stderr.String())

	// A writer that never writes: the reload waits for its read timeout, and SIGTERM
	// (the run's context) stops the edge meanwhile.
	w, err := os.OpenFile(e.path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	time.Sleep(100 * time.Millisecond) // the reload is reading
	stopped := time.Now()
	e.cancel()
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the edge did not stop: a SIGHUP reading a FIFO held it")
	}
	require.Zero(t, e.code)
	t.Logf("stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	logged := e.stderr.String()
	shutdown, lastFail := strings.Index(logged, "shutting down"), strings.LastIndex(logged, "reload failed")
	require.True(t, shutdown >= 0 && lastFail > shutdown,
		"the edge began to shut down while the reload still read the FIFO (it ends with its read timeout): %s", logged)
	require.Contains(t, logged, "edge stopped")
}
