package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/things-go/go-socks5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warren-tunnel/warren/tunnel"
)

// Connectors behind a proxy (proxy_url, tunnel.WithProxy, HTTPS_PROXY): against Debian's
// tinyproxy (HTTP CONNECT, Basic credentials) and the SOCKS5 server of
// github.com/things-go/go-socks5, both started here on loopback. The tinyproxy tests skip
// where it is not installed, unless WARREN_REQUIRE_PROXY=1 (CI).

// tinyproxyBin returns tinyproxy's path, or skips the test (fails it under
// WARREN_REQUIRE_PROXY=1).
func tinyproxyBin(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"tinyproxy", "/usr/bin/tinyproxy", "/usr/sbin/tinyproxy"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("WARREN_REQUIRE_PROXY") == "1" {
		t.Fatal("tinyproxy is not installed and WARREN_REQUIRE_PROXY=1: apt-get install tinyproxy")
	}
	t.Skip("tinyproxy is not installed (apt-get install tinyproxy); WARREN_REQUIRE_PROXY=1 makes this a failure")
	return ""
}

// tinyproxy is a tinyproxy process on a loopback port, in the foreground (-d), logging to
// its stdout.
type tinyproxy struct {
	t    *testing.T
	bin  string
	port int
	conf string
	cmd  *exec.Cmd
	log  lockedBuffer // every run's output, appended
	done chan struct{}
}

// startTinyproxy runs tinyproxy on a free loopback port, letting CONNECT through to
// connectPorts only; auth is "user password" for BasicAuth, or "" for none.
func startTinyproxy(t *testing.T, auth string, connectPorts ...int) *tinyproxy {
	t.Helper()
	p := &tinyproxy{t: t, bin: tinyproxyBin(t), port: freePorts(t, 1)[0]}
	p.configure(auth, connectPorts...)
	p.start()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("tinyproxy's log:\n%s", p.log.String())
		}
	})
	return p
}

// configure writes the configuration the next start uses.
func (p *tinyproxy) configure(auth string, connectPorts ...int) {
	var b strings.Builder
	fmt.Fprintf(&b, "Port %d\nListen 127.0.0.1\nAllow 127.0.0.1\nTimeout 600\nLogLevel Info\nMaxClients 50\n", p.port)
	for _, port := range connectPorts {
		fmt.Fprintf(&b, "ConnectPort %d\n", port)
	}
	if auth != "" {
		fmt.Fprintf(&b, "BasicAuth %s\n", auth)
	}
	if p.conf == "" {
		p.conf = filepath.Join(p.t.TempDir(), "tinyproxy.conf")
	}
	require.NoError(p.t, os.WriteFile(p.conf, []byte(b.String()), 0o600))
}

// start runs tinyproxy and waits until it accepts connections.
func (p *tinyproxy) start() {
	p.t.Helper()
	p.cmd = exec.Command(p.bin, "-d", "-c", p.conf)
	p.cmd.Stdout, p.cmd.Stderr = &p.log, &p.log
	p.cmd.WaitDelay = 5 * time.Second
	require.NoError(p.t, p.cmd.Start())
	done := make(chan struct{})
	p.done = done
	cmd := p.cmd
	go func() { _ = cmd.Wait(); close(done) }()
	addr := p.addr()
	require.Eventually(p.t, func() bool {
		select {
		case <-done:
			return true
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, waitTimeout, 20*time.Millisecond, "tinyproxy did not listen")
	select {
	case <-done:
		p.t.Fatalf("tinyproxy exited at start:\n%s", p.log.String())
	default:
	}
}

// stop kills tinyproxy (and so every connection through it) and waits for it to exit.
func (p *tinyproxy) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

func (p *tinyproxy) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// connects counts the CONNECT requests tinyproxy logged for target ("host:port").
func (p *tinyproxy) connects(target string) int {
	return strings.Count(p.log.String(), "CONNECT "+target+" HTTP/1.1")
}

// socksProxy is a SOCKS5 server of github.com/things-go/go-socks5 on loopback. It resolves
// the names in resolve itself (a name the connector's machine cannot resolve), and records
// each CONNECT's destination as the client sent it.
type socksProxy struct {
	ln     net.Listener
	served chan struct{}
	mu     sync.Mutex
	dests  []string
}

// mapResolver resolves the names of its map, and only those.
type mapResolver map[string]net.IP

func (m mapResolver) Resolve(ctx context.Context, name string) (context.Context, net.IP, error) {
	if ip, ok := m[name]; ok {
		return ctx, ip, nil
	}
	return ctx, nil, fmt.Errorf("%s: not a name of this test", name)
}

func startSOCKS(t *testing.T, creds socks5.StaticCredentials, resolve mapResolver) *socksProxy {
	t.Helper()
	p := &socksProxy{ln: listenLoopback(t), served: make(chan struct{})}
	opts := []socks5.Option{
		socks5.WithResolver(resolve),
		socks5.WithDialAndRequest(func(ctx context.Context, network, addr string, req *socks5.Request) (net.Conn, error) {
			dest := req.RawDestAddr.FQDN
			if dest == "" {
				dest = req.RawDestAddr.IP.String()
			}
			p.mu.Lock()
			p.dests = append(p.dests, net.JoinHostPort(dest, strconv.Itoa(req.RawDestAddr.Port)))
			p.mu.Unlock()
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		}),
	}
	if creds != nil {
		opts = append(opts, socks5.WithCredential(creds))
	}
	srv := socks5.NewServer(opts...)
	go func() { defer close(p.served); _ = srv.Serve(p.ln) }()
	t.Cleanup(func() { _ = p.ln.Close(); <-p.served })
	return p
}

// connects counts the CONNECT requests for target the SOCKS5 server saw.
func (p *socksProxy) connects(target string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, d := range p.dests {
		if d == target {
			n++
		}
	}
	return n
}

func (p *socksProxy) addr() string { return p.ln.Addr().String() }

// proxiedConnector starts the example connector for the edge at server with proxyURL
// (proxy_url; "" for none) and env added to its environment; it has an HTTP tunnel "web"
// (subdomain web) to httpPort and a TCP tunnel "echo" to echoPort.
func proxiedConnector(t *testing.T, server, proxyURL string, env []string, httpPort, echoPort int, args ...string) (*proc, string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "server: %q\nauth_token: %q\ndrain_timeout_secs: 1\n", server, token)
	if proxyURL != "" {
		fmt.Fprintf(&b, "proxy_url: %q\n", proxyURL)
	}
	fmt.Fprintf(&b, "tunnels:\n  web:\n    proto: http\n    subdomain: web\n    local_port: %d\n", httpPort)
	fmt.Fprintf(&b, "  echo:\n    proto: tcp\n    local_port: %d\n", echoPort)
	path := filepath.Join(t.TempDir(), "connector.yml")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	return startEnv(t, env, "connector", "connector", append([]string{"start", "--config", path}, args...)...), path
}

// requireServes checks that the edge serves both tunnels of proxiedConnector: an HTTP
// request to web.localhost reaches the HTTP backend, and bytes sent to the TCP tunnel's port
// come back from the echo backend.
func requireServes(t *testing.T, e *edge, body string) {
	t.Helper()
	client := publicClient(t, e)
	require.Eventually(t, func() bool {
		resp, err := client.Get("http://web.localhost/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && string(b) == body
	}, waitTimeout, 50*time.Millisecond, "the HTTP tunnel answers through the edge")
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.tcp)), time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "through the proxy\n"); err != nil {
			return false
		}
		r := bufio.NewReader(c)
		name, err1 := r.ReadString('\n')
		echo, err2 := r.ReadString('\n')
		return err1 == nil && err2 == nil && name == "echo-backend\n" && echo == "through the proxy\n"
	}, waitTimeout, 50*time.Millisecond, "the TCP tunnel echoes through the edge")
}

// connectorStatus runs `connector status` (with args) for the file path and returns its
// output.
func connectorStatus(t *testing.T, path string, args ...string) string {
	t.Helper()
	args = append([]string{"status", "--config", path}, args...)
	out, err := exec.Command(filepath.Join(binDir, "connector"), args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// TestConnectorThroughTinyproxy: with proxy_url naming tinyproxy (Basic credentials), the
// control connection and the TCP tunnel's data connections go through tinyproxy's CONNECT,
// both tunnels serve, and `connector status` names the proxy without its credentials.
func TestConnectorThroughTinyproxy(t *testing.T) {
	e := startEdge(t, false)
	tp := startTinyproxy(t, "warren s3cret-pass", e.control)
	control := fmt.Sprintf("127.0.0.1:%d", e.control)
	c, path := proxiedConnector(t, control, "http://warren:s3cret-pass@"+tp.addr(), nil, httpBackend(t, "web-backend"), echoBackend(t, "echo-backend"))
	c.line(t, "tunnel echo: ")
	requireServes(t, e, "web-backend")
	require.Eventually(t, func() bool { return tp.connects(control) >= 2 }, waitTimeout, 20*time.Millisecond,
		"tinyproxy saw the control connection's CONNECT and the data connections'")

	st := connectorStatus(t, path)
	require.Contains(t, st, "proxy:      http://"+tp.addr()+"\n")
	require.NotContains(t, st, "s3cret")
	st = connectorStatus(t, path, "--json")
	require.Contains(t, st, `"proxy": "http://`+tp.addr()+`"`)
	require.NotContains(t, st, "s3cret")
}

// TestConnectorThroughSOCKS5: through a SOCKS5 server, with the credentials of proxy_url, and
// without credentials from ALL_PROXY (socks5h://) for an edge named by a host name only the
// proxy resolves: both tunnels serve, and the control and data connections were the
// proxy's CONNECTs (to the name as given, which the connector did not resolve).
func TestConnectorThroughSOCKS5(t *testing.T) {
	t.Run("proxy_url with credentials", func(t *testing.T) {
		e := startEdge(t, false)
		sp := startSOCKS(t, socks5.StaticCredentials{"warren": "s3cret-pass"}, nil)
		control := fmt.Sprintf("127.0.0.1:%d", e.control)
		c, path := proxiedConnector(t, control, "socks5://warren:s3cret-pass@"+sp.addr(), nil, httpBackend(t, "web-backend"), echoBackend(t, "echo-backend"))
		c.line(t, "tunnel echo: ")
		requireServes(t, e, "web-backend")
		require.Eventually(t, func() bool { return sp.connects(control) >= 2 }, waitTimeout, 20*time.Millisecond,
			"the SOCKS5 server saw the control connection's CONNECT and the data connections'")
		st := connectorStatus(t, path)
		require.Contains(t, st, "proxy:      socks5://"+sp.addr()+"\n")
		require.NotContains(t, st, "s3cret")
	})
	t.Run("ALL_PROXY, a name only the proxy resolves", func(t *testing.T) {
		e := startEdge(t, false)
		sp := startSOCKS(t, nil, mapResolver{"edge.warren-proxy.test": net.IPv4(127, 0, 0, 1)})
		control := fmt.Sprintf("edge.warren-proxy.test:%d", e.control)
		env := []string{"HTTPS_PROXY=", "https_proxy=", "NO_PROXY=", "no_proxy=", "ALL_PROXY=socks5h://" + sp.addr()}
		c, _ := proxiedConnector(t, control, "", env, httpBackend(t, "web-backend"), echoBackend(t, "echo-backend"))
		c.line(t, "tunnel echo: ")
		requireServes(t, e, "web-backend")
		require.GreaterOrEqual(t, sp.connects(control), 2, "control and data connections asked the proxy for the name as given")
	})
}

// TestProxyRefusals: wrong credentials (tinyproxy's 401, its 407 for none, the SOCKS5
// server's refusal) and an unreachable proxy stop a connector started with --fail-fast with
// an error naming the proxy and why, never the password. (Without --fail-fast the connector
// retries them with backoff, as any edge it cannot reach yet, logging each attempt's reason.)
func TestProxyRefusals(t *testing.T) {
	e := startEdge(t, false)
	control := fmt.Sprintf("127.0.0.1:%d", e.control)
	httpPort, echoPort := httpBackend(t, "web-backend"), echoBackend(t, "echo-backend")
	run := func(t *testing.T, proxyURL string) string {
		t.Helper()
		c, _ := proxiedConnector(t, control, proxyURL, nil, httpPort, echoPort, "--fail-fast")
		require.Equal(t, 1, c.wait(t), "the connector gives up at start; stderr:\n%s", c.stderr.String())
		out := c.stderr.String()
		require.NotContains(t, out, "wrong-pass")
		return out
	}
	t.Run("tinyproxy, wrong password", func(t *testing.T) {
		tp := startTinyproxy(t, "warren s3cret-pass", e.control)
		out := run(t, "http://warren:wrong-pass@"+tp.addr())
		// The log line is JSON: the message's quotes come escaped.
		require.Contains(t, out, "proxy http://"+tp.addr()+": refused CONNECT "+control+` with \"HTTP/1.0 401 Unauthorized\" (wrong user or password in the proxy URL)`)
	})
	t.Run("tinyproxy, no credentials", func(t *testing.T) {
		tp := startTinyproxy(t, "warren s3cret-pass", e.control)
		out := run(t, "http://"+tp.addr())
		require.Contains(t, out, "407 Proxy Authentication Required")
		require.Contains(t, out, "it wants credentials")
	})
	t.Run("SOCKS5, wrong password", func(t *testing.T) {
		sp := startSOCKS(t, socks5.StaticCredentials{"warren": "s3cret-pass"}, nil)
		out := run(t, "socks5://warren:wrong-pass@"+sp.addr())
		require.Contains(t, out, "proxy socks5://"+sp.addr()+": ")
		require.Contains(t, out, "authentication failed")
	})
	t.Run("unreachable proxy", func(t *testing.T) {
		port := freePorts(t, 1)[0]
		out := run(t, fmt.Sprintf("http://warren:wrong-pass@127.0.0.1:%d", port))
		require.Contains(t, out, fmt.Sprintf("proxy http://127.0.0.1:%d: dial tcp 127.0.0.1:%d: connect: connection refused", port, port))
	})
}

// TestProxyRefusalAfterReconnectBacksOff: a connected session whose proxy restarts with other
// credentials retries with the backoff delay (a handful of attempts in two seconds, not a
// tight loop), logs why each failed, and reconnects once the proxy takes its credentials
// again.
func TestProxyRefusalAfterReconnectBacksOff(t *testing.T) {
	e := startEdge(t, false)
	control := fmt.Sprintf("127.0.0.1:%d", e.control)
	tp := startTinyproxy(t, "warren s3cret-pass", e.control)
	core, logs := observer.New(zap.InfoLevel)
	proxyURL, err := url.Parse("http://warren:s3cret-pass@" + tp.addr())
	require.NoError(t, err)
	sess, err := tunnel.Dial(ctxT(t), control, tunnel.WithToken(token), tunnel.WithProxy(proxyURL),
		tunnel.WithBackoff(100*time.Millisecond, 400*time.Millisecond), tunnel.WithLogger(zap.New(core)))
	require.NoError(t, err)
	defer sess.Close()
	require.Equal(t, "http://"+tp.addr(), sess.Proxy())

	tp.stop()
	tp.configure("warren other-pass", e.control)
	before := tp.connects(control)
	tp.start()
	time.Sleep(2 * time.Second)
	attempts := tp.connects(control) - before
	require.False(t, sess.Connected())
	require.GreaterOrEqual(t, attempts, 2, "the session keeps trying")
	require.LessOrEqual(t, attempts, 12, "with the backoff delay, not in a tight loop")
	failed := logs.FilterMessage("reconnect failed").All()
	require.NotEmpty(t, failed)
	require.Contains(t, fmt.Sprint(failed[len(failed)-1].ContextMap()["error"]), `with "HTTP/1.0 401 Unauthorized" (wrong user or password in the proxy URL)`)
	select {
	case <-sess.Done():
		t.Fatalf("the session gave up: %v", sess.Err())
	default:
	}

	tp.stop()
	tp.configure("warren s3cret-pass", e.control)
	tp.start()
	require.Eventually(t, sess.Connected, waitTimeout, 20*time.Millisecond, "reconnected through the proxy")
	require.GreaterOrEqual(t, sess.Reconnects(), 1)
}
