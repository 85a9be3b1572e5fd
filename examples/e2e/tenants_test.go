package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const (
	ownerToken    = "owner-tenant-token-0123456789"
	attackerToken = "attacker-tenant-token-0123456789"
)

// tenantEdge is an edge process with two tenants and a state directory, restartable on the
// same ports and directory.
type tenantEdge struct {
	t                            *testing.T
	path                         string
	control, http, admin, tcpLow int
	proc                         *proc
}

func newTenantEdge(t *testing.T) *tenantEdge {
	ports := freePorts(t, 4)
	dir := t.TempDir()
	e := &tenantEdge{t: t, path: filepath.Join(dir, "server.toml"),
		control: ports[0], http: ports[1], admin: ports[2], tcpLow: ports[3]}
	// Three TCP ports from one that was free a moment ago (the edge skips a taken one).
	lo, hi := ports[3], ports[3]+2
	require.NoError(t, os.WriteFile(e.path, fmt.Appendf(nil, `
[server]
domain = "localhost"
bind = "127.0.0.1"
http_port = %d
control_port = %d
admin_port = %d
state_dir = "state"

[auth]
require_auth = true
[[auth.tenants]]
name = "owner"
token = %q
[[auth.tenants]]
name = "attacker"
token = %q

[limits]
tcp_port_range = [%d, %d]
drain_timeout_secs = 2

[load_balancing]
enabled = true
`, e.http, e.control, e.admin, ownerToken, attackerToken, lo, hi), 0o600))
	return e
}

// start runs the edge and waits for its admin API.
func (e *tenantEdge) start() {
	t := e.t
	e.proc = start(t, "edge", "edge", "-config", e.path)
	waitAdmin(t, e.proc, fmt.Sprintf("http://127.0.0.1:%d/healthz", e.admin))
}

// kill9 kills the edge with SIGKILL: nothing is flushed or closed.
func (e *tenantEdge) kill9() {
	require.NoError(e.t, e.proc.cmd.Process.Kill())
	<-e.proc.done
}

// connectorFile writes a connector YAML with an HTTP tunnel "web" on pool and a TCP tunnel
// "db", both grouped, for token.
func connectorFile(t *testing.T, name string, e *tenantEdge, token string, httpPort, tcpPort int) string {
	path := filepath.Join(t.TempDir(), name+".yml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `server: 127.0.0.1:%d
auth_token: %q
drain_timeout_secs: 2
tunnels:
  web:
    proto: http
    local_port: %d
    subdomain: pool
    group: web
    group_key: %q
  db:
    proto: tcp
    local_port: %d
    group: db
    group_key: %q
`, e.control, token, httpPort, name+"-web-key", tcpPort, name+"-db-key"), 0o600))
	return path
}

// bannerBackend accepts TCP connections and writes its name to each.
func bannerBackend(t *testing.T, name string) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name + "\n"))
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); <-done })
	return l.Addr().(*net.TCPAddr).Port
}

var tcpURL = regexp.MustCompile(`tcp://localhost:(\d+)`)

// A tenant that loops on registering another tenant's subdomain and TCP group right after
// an edge restart (kill -9) is refused, with the edge's words; the owner's connector comes
// back by itself, serves every public request, and its TCP pool has the same public port.
// Before route ownership, the first to register after a restart won the hostname and the
// ports moved between tenants.
func TestOwnershipSurvivesAnEdgeKill9(t *testing.T) {
	e := newTenantEdge(t)
	e.start()
	ownerHTTP, ownerTCP := httpBackend(t, "owner"), bannerBackend(t, "owner")
	attackerHTTP, attackerTCP := httpBackend(t, "attacker"), bannerBackend(t, "attacker")

	owner := start(t, "owner", "connector", "start", "--config", connectorFile(t, "owner", e, ownerToken, ownerHTTP, ownerTCP))
	owner.line(t, "tunnel web: ")
	m := tcpURL.FindStringSubmatch(owner.line(t, "tunnel db: "))
	require.NotNil(t, m)
	port := m[1]

	attack := func() {
		t.Helper()
		a := start(t, "attacker", "connector", "start", "--config", connectorFile(t, "attacker", e, attackerToken, attackerHTTP, attackerTCP))
		require.Equal(t, 1, a.wait(t), "the attacker's connector is refused")
		require.Contains(t, a.stderr.String(), "belongs to another tenant")
	}
	attack()

	e.kill9()
	e.start()
	attack() // the owner's connector may not be back yet: the edge remembers anyway

	// The owner's connector reconnects with backoff and registers again.
	client := publicClientAt(t, e.http)
	require.Eventually(t, func() bool {
		resp, err := client.Get("http://pool.localhost/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b := make([]byte, 16)
		n, _ := resp.Body.Read(b)
		return resp.StatusCode == http.StatusOK && string(b[:n]) == "owner"
	}, waitTimeout, 50*time.Millisecond, "the owner serves pool again")
	for range 20 {
		resp, err := client.Get("http://pool.localhost/")
		require.NoError(t, err)
		b := make([]byte, 16)
		n, _ := resp.Body.Read(b)
		resp.Body.Close()
		require.Equal(t, "owner", string(b[:n]), "every request reaches the owner")
	}
	require.Eventually(t, func() bool {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err != nil {
			return false
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, _ := bufio.NewReader(conn).ReadString('\n')
		return strings.TrimSpace(line) == "owner"
	}, waitTimeout, 50*time.Millisecond, "the owner's TCP pool is back on its port %s", port)
}

// publicClientAt sends every request to 127.0.0.1:port, whatever the host.
func publicClientAt(t *testing.T, port int) *http.Client {
	return publicClient(t, &edge{http: port})
}
