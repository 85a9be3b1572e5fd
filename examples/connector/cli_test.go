package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
)

const quickToken = "quick-connector-token-0123"

// authEdge is an edge that takes quickToken only, with one TCP port on loopback.
func authEdge(t *testing.T) (e *testEdge, tcpPort int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tcpPort = l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	lc, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := lp.Addr().(*net.TCPAddr).Port
	auth, err := tunnel.NewStaticTokens([]string{quickToken}, nil)
	require.NoError(t, err)
	srv, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "localhost", Auth: auth, LoadBalancing: tunnel.LoadBalancing{Enabled: true},
		Public: tunnel.PublicHTTP{URLHTTPPort: port}, TCP: tunnel.TCPTunnels{Ports: group.PortRange{Lo: tcpPort, Hi: tcpPort}, BindHost: "127.0.0.1"},
		Timeouts: tunnel.Timeouts{Drain: 5 * time.Second}})
	require.NoError(t, err)
	e = &testEdge{srv: srv, control: lc.Addr().String(), public: lp.Addr().String(), publicPort: port}
	e.serving.Go(func() { _ = srv.Serve(lc) })
	e.serving.Go(func() { _ = srv.ServePublic(lp) })
	t.Cleanup(e.close)
	return e, tcpPort
}

// quick runs a one-liner in the background until the test's end (or stop).
type quick struct {
	stdout, stderr syncBuffer
	stop           context.CancelFunc
	done           chan int
}

func startQuick(t *testing.T, args ...string) *quick {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	q := &quick{stop: cancel, done: make(chan int, 1)}
	go func() { q.done <- run(ctx, args, &q.stdout, &q.stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-q.done:
		case <-time.After(15 * time.Second):
			t.Error("the one-liner did not stop")
		}
	})
	return q
}

// url waits for the one line of stdout.
func (q *quick) url(t *testing.T) string {
	t.Helper()
	require.Eventually(t, func() bool { return strings.HasSuffix(q.stdout.String(), "\n") }, 15*time.Second, 10*time.Millisecond, "stderr: %s", q.stderr.String())
	out := q.stdout.String()
	require.Equal(t, 1, strings.Count(out, "\n"), "one line: %q", out)
	return strings.TrimSuffix(out, "\n")
}

func (q *quick) exit(t *testing.T) int {
	t.Helper()
	q.stop()
	select {
	case code := <-q.done:
		q.done <- code // for the cleanup
		return code
	case <-time.After(15 * time.Second):
		t.Fatal("the one-liner did not stop")
		return -1
	}
}

func secretFile(t *testing.T, s string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret.txt")
	require.NoError(t, os.WriteFile(path, []byte(s+"\n"), 0o600))
	return path
}

// TestQuickHTTP: "connector http PORT" prints the public URL on one line, the edge routes
// to the local port through it, and Ctrl-C exits 0. Without --subdomain the name is random.
func TestQuickHTTP(t *testing.T) {
	e, _ := authEdge(t)
	b := startBackend(t, "quick-backend")
	tok := secretFile(t, quickToken)

	q := startQuick(t, "http", fmt.Sprint(b.port), "--server", e.control, "--token-file", tok, "--subdomain", "app", "--health-path", "/")
	require.Equal(t, fmt.Sprintf("http://app.localhost:%d", e.publicPort), q.url(t))
	require.Eventually(t, func() bool {
		status, body, err := e.get("app.localhost", "/")
		return err == nil && status == 200 && body == "quick-backend"
	}, 15*time.Second, 50*time.Millisecond, "served once its health check passes")
	require.Equal(t, 0, q.exit(t))
	require.Contains(t, q.stderr.String(), "signal received; draining tunnels")

	// HOST:PORT, a random subdomain, flags after the port or before it.
	q = startQuick(t, "http", "--server", e.control, fmt.Sprintf("127.0.0.1:%d", b.port), "--token-file", tok)
	url := q.url(t)
	require.Regexp(t, `^http://q-[0-9a-f]{8}\.localhost:\d+$`, url)
	host := strings.TrimPrefix(url[:strings.LastIndex(url, ":")], "http://")
	status, body, err := e.get(host, "/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, "quick-backend", body)
	require.Equal(t, 0, q.exit(t))
}

// TestQuickTCP: "connector tcp PORT" prints tcp://host:port; a connection to that port
// reaches the local service; --remote-port names the port it must get.
func TestQuickTCP(t *testing.T) {
	e, tcpPort := authEdge(t)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	tok := secretFile(t, quickToken)
	local := fmt.Sprint(echo.Addr().(*net.TCPAddr).Port)

	q := startQuick(t, "tcp", local, "--server", e.control, "--token-file", tok, "--remote-port", fmt.Sprint(tcpPort))
	require.Equal(t, fmt.Sprintf("tcp://localhost:%d", tcpPort), q.url(t))
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", tcpPort), 5*time.Second)
	require.NoError(t, err)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Write([]byte("ping\n"))
	require.NoError(t, err)
	line, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ping\n", line)
	require.NoError(t, c.Close())
	require.Equal(t, 0, q.exit(t))

	// Another port than the edge gives: refused, nothing printed, exit 1.
	q = startQuick(t, "tcp", local, "--server", e.control, "--token-file", tok, "--remote-port", fmt.Sprint(tcpPort+1))
	select {
	case code := <-q.done:
		q.done <- code
		require.Equal(t, 1, code)
	case <-time.After(15 * time.Second):
		t.Fatal("a wrong --remote-port did not end the one-liner")
	}
	require.Empty(t, q.stdout.String())
	require.Contains(t, q.stderr.String(), fmt.Sprintf("the edge gave this tunnel port %d, not --remote-port %d", tcpPort, tcpPort+1))
}

// TestQuickRefusals: the edge's refusal is printed verbatim with exit 1 (no retry); usage
// errors exit 2 before anything is dialled.
func TestQuickRefusals(t *testing.T) {
	e, _ := authEdge(t)
	var stdout, stderr syncBuffer
	require.Equal(t, 1, run(context.Background(), []string{"http", "3000", "--server", e.control, "--token-file", secretFile(t, "not-the-token-0123456789")}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "invalid auth token")
	require.Empty(t, stdout.String())

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"http", "3000"}, "--server HOST:PORT is required"},
		{[]string{"http", "x", "--server", e.control}, `"x" is not a local port (1-65535) or HOST:PORT`},
		{[]string{"tcp", "5432", "--server", e.control, "--group", "db"}, "--group and --key-file go together"},
		{[]string{"http", "3000", "--server", e.control, "--subdomain", "Bad_Name"}, "tunnels.http-3000.subdomain"},
		{[]string{"http", "--server", e.control}, "usage: connector http PORT"},
	} {
		stdout, stderr := syncBuffer{}, syncBuffer{}
		require.Equal(t, 2, run(context.Background(), tc.args, &stdout, &stderr), "%q", tc.args)
		require.Contains(t, stderr.String(), tc.msg, "%q", tc.args)
	}
}

// TestReloadCommand: "connector reload" applies the file and prints what it did; a file
// with errors is printed, exit 1, and changes nothing; "connector status --config" still
// finds the running connector then, and warns that the file has errors.
func TestReloadCommand(t *testing.T) {
	e := startEdge(t)
	a, b := startBackend(t, "a"), startBackend(t, "b")
	dir := t.TempDir()
	sock, path := filepath.Join(dir, "c.sock"), filepath.Join(dir, "config.yml")
	head := "server: " + e.control + "\ncontrol_socket: " + sock + "\ndrain_timeout_secs: 5\ntunnels:\n"
	require.NoError(t, os.WriteFile(path, []byte(head+tunnelYAML("a", a.port, "    subdomain: a\n")), 0o600))
	q := startQuick(t, "start", "--config", path)
	require.Eventually(t, func() bool { return strings.Contains(q.stdout.String(), "tunnel a: ") }, 15*time.Second, 10*time.Millisecond, q.stderr.String())
	ctl := func(args ...string) (int, string, string) {
		var stdout, stderr syncBuffer
		code := run(context.Background(), args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	require.NoError(t, os.WriteFile(path, []byte(head+tunnelYAML("a", a.port, "    subdomain: a\n")+tunnelYAML("b", b.port, "    subdomain: b\n")), 0o600))
	code, out, errOut := ctl("reload", "--config", path)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "reload: tunnel b added\nconfiguration reloaded\n", out)
	status, body, err := e.get("b.localhost", "/")
	require.NoError(t, err)
	require.Equal(t, 200, status)
	require.Equal(t, "b", body)

	// A broken file: the errors, exit 1, nothing changed.
	require.NoError(t, os.WriteFile(path, []byte(head+"  c: {proto: htp, local_port: 1}\n"), 0o600))
	code, out, errOut = ctl("reload", "--config", path)
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, path+":5: tunnels.c.proto")
	code, out, errOut = ctl("status", "--config", path)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^a\s+registered`, out)
	require.Regexp(t, `(?m)^b\s+registered`, out)
	require.Contains(t, errOut, "connector: warning: "+path+" has errors; the running connector keeps the configuration it loaded")
	require.Contains(t, errOut, path+":5: tunnels.c.proto")

	// YAML that does not parse at all: the socket is still found.
	require.NoError(t, os.WriteFile(path, []byte("control_socket: "+sock+"\ntunnels: {\n"), 0o600))
	code, out, errOut = ctl("status", "--config", path)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `(?m)^a\s+registered`, out)
	require.Contains(t, errOut, "has errors")
	require.Equal(t, 0, q.exit(t))
}

// TestVersionAndLogFlags: version in its three spellings; --log-format console and
// --log-level error shape the one log stream.
func TestVersionAndLogFlags(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		var stdout, stderr syncBuffer
		require.Equal(t, 0, run(context.Background(), []string{arg}, &stdout, &stderr))
		require.Regexp(t, regexp.MustCompile(`^connector \S+ go1\.\S+ rev \S+`), stdout.String())
	}
	path := filepath.Join(t.TempDir(), "config.yml")
	require.NoError(t, os.WriteFile(path, []byte("server: localhost:4040\ntunnels:\n  a: {proto: htp, local_port: 3000}\n"), 0o600))
	var stdout, stderr syncBuffer
	require.Equal(t, 2, run(context.Background(), []string{"start", "--config", path, "--log-format", "console"}, &stdout, &stderr))
	require.Regexp(t, `(?m)^\S+\tERROR\t`+regexp.QuoteMeta(path)+`:3: tunnels.a.proto`, stderr.String())

	// At error level the start's info lines are dropped; the refusal stays.
	e, _ := authEdge(t)
	require.NoError(t, os.WriteFile(path, []byte("server: "+e.control+"\nauth_token: wrong-token-0123456789\ntunnels:\n  a: {proto: http, local_port: 3000, subdomain: a}\n"), 0o600))
	stderr = syncBuffer{}
	require.Equal(t, 1, run(context.Background(), []string{"start", "--config", path, "--socket", filepath.Join(t.TempDir(), "s.sock"), "--log-level", "error"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "invalid auth token")
	require.NotContains(t, stderr.String(), `"level":"info"`)
	for l := range strings.Lines(stderr.String()) {
		require.True(t, strings.HasPrefix(l, "{"), "one JSON log stream: %q", l)
	}
}
