package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// buildFlags are the flags the binaries are built with (race_test.go adds -race).
var buildFlags []string

// binDir holds the edge, connector, demo and cluster binaries built by TestMain.
var binDir string

const (
	token = "e2e-connector-token"
	// adminToken is the operator's token on the edges startEdge starts.
	adminToken = "e2e-admin-token-0123456789"
	groupKey   = "shared-secret-for-this-pool"
	// waitTimeout bounds every wait for a process to print a line, become ready or exit.
	waitTimeout = 15 * time.Second
)

func TestMain(m *testing.M) {
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	os.Exit(code)
}

func buildAndRun(m *testing.M) (int, error) {
	if dir := os.Getenv(envE2EBinDir); dir != "" && insideNemesisNetns() {
		// TestNemesis re-executed inside its network namespace: the binaries are built.
		binDir = dir
		return m.Run(), nil
	}
	dir, err := os.MkdirTemp("", "warren-e2e-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	binDir = dir
	// The connectors' control sockets go under $XDG_RUNTIME_DIR (else ~/.warren): keep the
	// tests' out of the home directory.
	if err := os.Setenv("XDG_RUNTIME_DIR", dir); err != nil {
		return 1, err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return 1, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The mains are built in the library's module, not in this one: with the library's
	// go.mod and go.sum, as its users build them, whatever this module requires besides.
	out, err := exec.CommandContext(ctx, goBin, "list", "-m", "-f", "{{.Dir}}", "github.com/warren-tunnel/warren").Output()
	if err != nil {
		return 1, fmt.Errorf("go list -m github.com/warren-tunnel/warren: %w", err)
	}
	root := strings.TrimSpace(string(out))
	for _, name := range []string{"edge", "connector", "demo", "cluster"} {
		args := append([]string{"build", "-o", filepath.Join(dir, name)}, buildFlags...)
		args = append(args, "./examples/"+name)
		cmd := exec.CommandContext(ctx, goBin, args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return 1, fmt.Errorf("go build %s in %s: %v\n%s", name, root, err, out)
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			return 1, err
		}
	}
	return code, nil
}

// lockedBuffer is a bytes.Buffer that a process writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a running example binary. It is killed at the end of the test.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr lockedBuffer
	done           chan struct{} // closed once the process has exited
	code           int           // exit code, valid after done
}

func start(t *testing.T, name, bin string, args ...string) *proc {
	t.Helper()
	return startEnv(t, nil, name, bin, args...)
}

// startEnv is start with env added to the process's environment.
func startEnv(t *testing.T, env []string, name, bin string, args ...string) *proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, filepath.Join(binDir, bin), args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	// A race-enabled binary sleeps 1 s at exit by default, to let late reports arrive.
	p.cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=100"), env...)
	p.cmd.WaitDelay = 5 * time.Second
	require.NoError(t, p.cmd.Start())
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
		}
		<-p.done
		cancel()
		if t.Failed() {
			t.Logf("%s stdout:\n%s\n%s stderr:\n%s", p.name, p.stdout.String(), p.name, p.stderr.String())
		}
	})
	return p
}

// line waits for a line of stdout that starts with prefix and returns it.
func (p *proc) line(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		for l := range strings.Lines(p.stdout.String()) {
			if strings.HasPrefix(l, prefix) && strings.HasSuffix(l, "\n") {
				return strings.TrimSuffix(l, "\n")
			}
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited with %d before printing %q; stderr:\n%s", p.name, p.code, prefix, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s printed no line starting with %q within %s", p.name, prefix, waitTimeout)
		}
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(waitTimeout):
		t.Fatalf("%s did not exit within %s", p.name, waitTimeout)
		return 0
	}
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close() // held open until all are chosen, so that they differ
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// edge is a running edge process.
type edge struct {
	*proc
	control, http, admin, tcp int // tcp is the only port of its TCP range
}

// startEdge writes a server.toml with load balancing on and starts the edge; it returns
// once the admin API answers. httpOff sets http_port = 0; lbExtra are more lines of its
// [load_balancing] table.
func startEdge(t *testing.T, httpOff bool, lbExtra ...string) *edge {
	t.Helper()
	return startEdgeWith(t, httpOff, edgeExtra{lb: lbExtra})
}

// edgeExtra are more lines of the [server], [limits] and [load_balancing] tables of the
// server.toml startEdgeWith writes.
type edgeExtra struct {
	server, limits, lb []string
	control            int // the control port; 0: a free one
}

// startEdgeWith is startEdge with more lines in three of the file's tables.
func startEdgeWith(t *testing.T, httpOff bool, extra edgeExtra) *edge {
	t.Helper()
	ports := freePorts(t, 4)
	e := &edge{control: ports[0], http: ports[1], admin: ports[2], tcp: ports[3]}
	if extra.control != 0 {
		e.control = extra.control
	}
	if httpOff {
		e.http = 0
	}
	path := filepath.Join(t.TempDir(), "server.toml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `
[server]
domain = "localhost"
bind = "127.0.0.1"
http_port = %d
control_port = %d
admin_port = %d
%s

[auth]
require_auth = true
tokens = [%q]
admin_token = %q

[limits]
tcp_port_range = [%d, %d]
drain_timeout_secs = 5
%s

[load_balancing]
enabled = true
%s
`, e.http, e.control, e.admin, strings.Join(extra.server, "\n"), token, adminToken, e.tcp, e.tcp,
		strings.Join(extra.limits, "\n"), strings.Join(extra.lb, "\n")), 0o600))
	e.proc = start(t, "edge", "edge", "-config", path)

	waitAdmin(t, e.proc, fmt.Sprintf("http://127.0.0.1:%d/healthz", e.admin))
	return e
}

// waitAdmin waits until the edge process p answers 200 on its admin /healthz, and fails the
// test with the edge's output if it exits first.
func waitAdmin(t *testing.T, p *proc, healthz string) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	require.Eventually(t, func() bool {
		select {
		case <-p.done:
			return true // reported below
		default:
		}
		resp, err := client.Get(healthz)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, waitTimeout, 20*time.Millisecond, "the edge's admin API did not come up")
	select {
	case <-p.done:
		t.Fatalf("the edge exited with %d; stderr:\n%s", p.code, p.stderr.String())
	default:
	}
}

// tunnelConf is one tunnel of a connector's YAML file.
type tunnelConf struct {
	name, proto, subdomain, group, key string
	localPort                          int
	// extra are more lines of the tunnel's mapping, e.g. "weight: 3".
	extra []string
}

// startConnector writes a connector YAML file for tunnel tc and starts the connector.
func startConnector(t *testing.T, name string, e *edge, authToken string, tc tunnelConf) *proc {
	t.Helper()
	return start(t, name, "connector", "start", "--config", writeConnectorFile(t, name, e, authToken, tc))
}

// writeConnectorFile writes a connector YAML file for tunnel tc on edge e and returns its path.
func writeConnectorFile(t *testing.T, name string, e *edge, authToken string, tc tunnelConf) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "server: 127.0.0.1:%d\nauth_token: %q\ndrain_timeout_secs: 5\ntunnels:\n", e.control, authToken)
	fmt.Fprintf(&b, "  %s:\n    proto: %s\n    local_port: %d\n", tc.name, tc.proto, tc.localPort)
	if tc.subdomain != "" {
		fmt.Fprintf(&b, "    subdomain: %s\n", tc.subdomain)
	}
	if tc.group != "" {
		fmt.Fprintf(&b, "    group: %s\n    group_key: %q\n", tc.group, tc.key)
	}
	for _, line := range tc.extra {
		fmt.Fprintf(&b, "    %s\n", line)
	}
	path := filepath.Join(t.TempDir(), name+".yml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// httpBackend is an HTTP server in the test process that answers with its name.
func httpBackend(t *testing.T, name string) (port int) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// publicClient sends every request to the edge's public HTTP port, whatever the host.
func publicClient(t *testing.T, e *edge) *http.Client {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", e.http)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
	}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// tally sends n requests to http://pool.localhost/ and counts the answers per backend.
func tally(t *testing.T, c *http.Client, n int) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := range n {
		resp, err := c.Get("http://pool.localhost/")
		require.NoError(t, err, "request %d", i)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "request %d: %s", i, body)
		counts[string(body)]++
	}
	return counts
}

func TestHTTPGroupSharesRequests(t *testing.T) {
	e := startEdge(t, false)
	portA, portB := httpBackend(t, "backend-a"), httpBackend(t, "backend-b")
	a := startConnector(t, "connector-a", e, token, tunnelConf{name: "a", proto: "http", subdomain: "pool", group: "web", key: groupKey, localPort: portA})
	require.Equal(t, fmt.Sprintf("tunnel a: http://pool.localhost:%d -> 127.0.0.1:%d (group web)", e.http, portA), a.line(t, "tunnel a: "))
	b := startConnector(t, "connector-b", e, token, tunnelConf{name: "b", proto: "http", subdomain: "pool", group: "web", key: groupKey, localPort: portB})
	require.Equal(t, fmt.Sprintf("tunnel b: http://pool.localhost:%d -> 127.0.0.1:%d (group web)", e.http, portB), b.line(t, "tunnel b: "))

	c := publicClient(t, e)
	counts := tally(t, c, 50)
	require.Equal(t, 50, counts["backend-a"]+counts["backend-b"], "every answer came from a member: %v", counts)
	require.GreaterOrEqual(t, counts["backend-a"], 15, "%v", counts)
	require.GreaterOrEqual(t, counts["backend-b"], 15, "%v", counts)

	// A third connector with another key for the same subdomain is turned away.
	c3 := startConnector(t, "connector-c", e, token, tunnelConf{name: "c", proto: "http", subdomain: "pool", group: "web", key: "another-key", localPort: portB})
	require.Equal(t, 1, c3.wait(t), "connector c's exit code")
	// The edge's message verbatim, as the message of one line of the connector's log.
	require.Contains(t, c3.stderr.String(), `"msg":"tunnel c rejected: group key does not match for subdomain 'pool'"`)
	require.Empty(t, c3.stdout.String())

	// SIGTERM drains connector b and exits 0; the pool keeps serving through a alone.
	b.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, b.wait(t), "connector b's exit code")
	require.Equal(t, map[string]int{"backend-a": 10}, tally(t, c, 10))

	// SIGTERM shuts the edge down gracefully, with connector a still attached.
	e.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, e.wait(t), "the edge's exit code")
}

// echoBackend is a TCP server in the test process that writes its name and a newline, then
// echoes what it reads.
func echoBackend(t *testing.T, name string) (port int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				if _, err := io.WriteString(c, name+"\n"); err == nil {
					_, _ = io.Copy(c, c)
				}
			})
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().(*net.TCPAddr).Port
}

// whoAnswers opens one connection to the public TCP port, checks the echo, and returns the
// name of the backend behind it.
func whoAnswers(t *testing.T, port int) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = io.WriteString(c, "ping\n")
	require.NoError(t, err)
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	require.NoError(t, err)
	echo, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ping\n", echo)
	return strings.TrimSuffix(name, "\n")
}

var tcpLine = regexp.MustCompile(`^tunnel db: tcp://localhost:(\d+) \(port (\d+)\) -> 127\.0\.0\.1:(\d+) \(group db\)$`)

func TestTCPGroupSharesConnections(t *testing.T) {
	e := startEdge(t, true) // public HTTP off: TCP only
	var lines []string
	for _, name := range []string{"one", "two"} {
		port := echoBackend(t, "backend-"+name)
		p := startConnector(t, "connector-"+name, e, token, tunnelConf{name: "db", proto: "tcp", group: "db", key: groupKey, localPort: port})
		line := p.line(t, "tunnel db: ")
		m := tcpLine.FindStringSubmatch(line)
		require.NotNil(t, m, "line %q", line)
		require.Equal(t, fmt.Sprint(e.tcp), m[1], "the public port comes from the edge's range")
		require.Equal(t, m[1], m[2])
		require.Equal(t, fmt.Sprint(port), m[3])
		lines = append(lines, line[:strings.Index(line, " -> ")])
	}
	require.Equal(t, lines[0], lines[1], "both members print the same port")

	counts := map[string]int{}
	for range 50 {
		counts[whoAnswers(t, e.tcp)]++
	}
	require.Equal(t, 50, counts["backend-one"]+counts["backend-two"], "%v", counts)
	require.GreaterOrEqual(t, counts["backend-one"], 15, "%v", counts)
	require.GreaterOrEqual(t, counts["backend-two"], 15, "%v", counts)
}

func TestConnectorCannotStart(t *testing.T) {
	e := startEdge(t, false)

	t.Run("wrong token", func(t *testing.T) {
		c := startConnector(t, "connector", e, "not-a-token", tunnelConf{name: "a", proto: "http", subdomain: "pool", localPort: 1})
		require.Equal(t, 1, c.wait(t), "exit code")
		require.Contains(t, c.stderr.String(), "invalid auth token")
		require.Empty(t, c.stdout.String())
	})
	t.Run("edge down, --fail-fast", func(t *testing.T) {
		down := &edge{control: freePorts(t, 1)[0]}
		path := writeConnectorFile(t, "connector", down, token, tunnelConf{name: "a", proto: "http", subdomain: "pool", localPort: 1})
		c := start(t, "connector", "connector", "start", "--fail-fast", "--config", path)
		require.Equal(t, 1, c.wait(t), "exit code")
		require.Contains(t, c.stderr.String(), "connection refused")
		require.Empty(t, c.stdout.String())
	})
}

// TestConnectorBeforeEdge: a connector started before its edge (as systemd may start them)
// logs each failed dial, keeps retrying, and registers and serves once the edge is up.
func TestConnectorBeforeEdge(t *testing.T) {
	control := freePorts(t, 1)[0]
	port := httpBackend(t, "early-backend")
	c := startConnector(t, "connector", &edge{control: control}, token, tunnelConf{name: "a", proto: "http", subdomain: "pool", localPort: port})
	require.Eventually(t, func() bool { return strings.Count(c.stderr.String(), `"msg":"connect failed"`) >= 2 }, waitTimeout, 20*time.Millisecond,
		"each failed dial is logged: %s", c.stderr.String())
	require.Empty(t, c.stdout.String())

	e := startEdgeWith(t, false, edgeExtra{control: control})
	c.line(t, "tunnel a: http://pool.localhost:")
	counts := tally(t, publicClient(t, e), 3)
	require.Equal(t, 3, counts["early-backend"], "%v", counts)
	c.signal(t, syscall.SIGTERM)
	require.Equal(t, 0, c.wait(t))
}
