package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

// The nemesis's cluster (nemesis_test.go): three NATS nodes, three edges, the connectors of
// two tenants and their backends, each a process but the backends, each restartable on the
// same ports, files and store. Its topology is fixed; a schedule names its parts by index.

const (
	// nemLeaseSecs is the edges' lease_secs unless a run says otherwise (a regression seed
	// runs with the lease it found its bug with): an edge whose renewal is not seen for this
	// long is gone, and its members leave the other edges' pools. An edge whose NATS node
	// hangs keeps its lease when lease_secs exceeds 4 s and timeout_secs + 2 s (CHANGELOG).
	nemLeaseSecs = 5
	// nemNATSTimeoutSecs is the edges' timeout_secs, the bound of each request to NATS.
	nemNATSTimeoutSecs = 2
	// nemDrainSecs is the connectors' drain_timeout_secs: how long a tunnel that leaves
	// (SIGTERM, a reload that removes or changes it) serves what is in flight.
	nemDrainSecs = 2

	// nemEdgeGID is edge-1's group id in the test's namespace (edge-2's the next, ...).
	nemEdgeGID = 61001

	alphaToken = "nemesis-alpha-tenant-token-0123"
	betaToken  = "nemesis-beta-tenant-token-01234"
)

// The members' identities: "tenant/pool/member/key". A backend answers each request (HTTP)
// or connection (TCP, first line) with its identity, so that the history says who answered.
const (
	hostRot      = "rot.localhost"
	idAlphaWeb1  = "alpha/web/1/ka"
	idAlphaWeb2  = "alpha/web/2/ka"
	idAlphaDB1   = "alpha/db/1/kd"
	idAlphaDB2   = "alpha/db/2/kd"
	idAlphaSolo  = "alpha/solo/1/-"
	idAlphaResv  = "alpha/resv/1/kr"
	idBetaWeb    = "beta/bweb/1/kb"
	idBetaDB     = "beta/bdb/1/kc"
	keyAlphaWeb  = "nemesis-alpha-web-key"
	keyAlphaDB   = "nemesis-alpha-db-key"
	keyBetaWeb   = "nemesis-beta-web-key"
	keyBetaDB    = "nemesis-beta-db-key"
	keyAlphaResv = "nemesis-alpha-reserved-key"
	hostPool     = "pool.localhost"
	hostSolo     = "solo.localhost"
	hostBetaPool = "bpool.localhost"
	// hostResv is a reserved endpoint ([[endpoints]]) of tenant alpha, pool resv.
	hostResv = "resv.localhost"
)

// nemHosts are the edges' addresses: a TCP pool has the same public port on every edge, so
// the edges cannot share one.
var nemHosts = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}

// nemLogs is where a run keeps its processes' output, one file per process start.
type nemLogs struct {
	dir string
	n   map[string]int
}

func (l *nemLogs) next(name string) string {
	l.n[name]++
	return filepath.Join(l.dir, fmt.Sprintf("%s.%d.log", name, l.n[name]))
}

// startProc starts binDir/bin for the whole test (not start's minute), its stdout kept for
// proc.line and both streams appended to logPath; it is killed (after a SIGCONT, in case it
// is stopped) at the end of the test.
func startProc(t *testing.T, name, logPath, bin string, args ...string) (*proc, error) {
	return startProcAs(t, -1, name, logPath, bin, args...)
}

// startProcAs is startProc with the process's group id set to gid (unless -1): iptables
// in the test's namespace match an edge's packets by it (partition faults).
func startProcAs(t *testing.T, gid int, name, logPath, bin string, args ...string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(binDir, bin), args...)
	p.cmd.Stdout = io.MultiWriter(&p.stdout, f)
	p.cmd.Stderr = io.MultiWriter(&p.stderr, f)
	p.cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=100")
	p.cmd.WaitDelay = 5 * time.Second
	if gid >= 0 {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(os.Geteuid()), Gid: uint32(gid), NoSetGroups: true}}
	}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		f.Close()
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Kill()
		}
		<-p.done
	})
	return p, nil
}

// kill9 kills p with SIGKILL and waits for it: nothing is flushed or closed.
func kill9(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// nemNATS is one node of the NATS cluster: JetStream with its store on disk, fsynced before
// each acknowledgement (sync_interval: always, as issue 28's Jepsen note asks).
type nemNATS struct {
	name          string
	conf          string
	client, route int
	p             *proc
}

// store is n's JetStream store directory in the run's directory dir.
func (n *nemNATS) store(dir string) string { return filepath.Join(dir, n.name+"-store") }

func (n *nemNATS) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.client) }

// nemEdge is an edge process of the cluster, every listener on host.
type nemEdge struct {
	id, host, conf             string
	control, http, admin, peer int
	// debug serves the edge's Go runtime profiles (-debug-addr): its goroutines, rule (e).
	debug int
	// gid is the group id the edge runs with inside the test's namespace.
	gid int
	p   *proc
}

func (e *nemEdge) controlAddr() string { return net.JoinHostPort(e.host, fmt.Sprint(e.control)) }
func (e *nemEdge) httpAddr() string    { return net.JoinHostPort(e.host, fmt.Sprint(e.http)) }

// goroutines returns each edge's goroutines now (-1 for one that does not answer).
func (c *nemCluster) goroutines() map[string]int {
	out := map[string]int{}
	for _, e := range c.edges {
		n, err := e.goroutines()
		if err != nil {
			n = -1
		}
		out[e.id] = n
	}
	adminClient.CloseIdleConnections()
	return out
}

// goroutines returns how many goroutines the edge runs now (its goroutine profile).
func (e *nemEdge) goroutines() (int, error) {
	resp, err := adminClient.Get("http://" + net.JoinHostPort(e.host, fmt.Sprint(e.debug)) + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("%s: goroutine profile: %w", e.id, err)
	}
	var n int
	if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &n); err != nil {
		return 0, fmt.Errorf("%s: goroutine profile begins %q: %w", e.id, line, err)
	}
	return n, nil
}

func (e *nemEdge) adminURL(path string) string {
	return "http://" + net.JoinHostPort(e.host, fmt.Sprint(e.admin)) + path
}

// nemConnector is a connector process and its file.
type nemConnector struct {
	name, conf string
	servers    []string
	token      string
	// tunnels returns the tunnels of its file as the cluster's state has them now (a
	// detached pool member, a pool's key generation).
	tunnels func() string
	// lines are the prefixes of the lines it prints once its tunnels are registered.
	lines []string
	p     *proc
}

// writeConf writes k's file as the cluster's state has it now.
func (k *nemConnector) writeConf() error {
	return os.WriteFile(k.conf, fmt.Appendf(nil, "servers: [%s]\nauth_token: %q\ndrain_timeout_secs: %d\ntunnels:\n%s",
		strings.Join(k.servers, ", "), k.token, nemDrainSecs, k.tunnels()), 0o600)
}

// nemCluster is the whole cluster of one run.
type nemCluster struct {
	t          *testing.T
	dir        string
	lease      time.Duration // the edges' lease_secs
	logs       *nemLogs
	nats       []*nemNATS
	edges      []*nemEdge
	connectors []*nemConnector
	// tcpLo..tcpHi is the edges' TCP port range; portPool maps each port to the pool its
	// connectors printed ("alpha/db", "beta/bdb"; "" for a port no pool holds).
	tcpLo, tcpHi int
	portPool     map[int]string
	// backends are the identities' backend ports.
	backends map[string]int
	// detached are the connectors whose detachable tunnels are out of their files
	// (connector-detach).
	detached map[string]bool
	// rotGen is the key generation of each member of pool rot (alpha-1's, alpha-2's); both
	// are the same but between the two steps of a key-rotate.
	rotGen [2]int
	// rotDone is the generation both members of pool rot hold (read by the attacker).
	rotDone atomic.Int32
	// netns: the cluster runs in a network namespace of the test's own, each edge with a
	// group id of its own that iptables there match (partition faults).
	netns bool
}

// startNemesisCluster starts the whole cluster in dir and waits until each connector
// printed its tunnels.
func startNemesisCluster(t *testing.T, dir string, lease time.Duration) *nemCluster {
	t.Helper()
	c := &nemCluster{t: t, dir: dir, lease: lease, logs: &nemLogs{dir: dir, n: map[string]int{}}, backends: map[string]int{},
		detached: map[string]bool{}, netns: insideNemesisNetns()}
	natsServerBinary(t)

	// NATS: three nodes, each with its client and cluster (route) port.
	ports := freePorts(t, 6)
	for i := range 3 {
		c.nats = append(c.nats, &nemNATS{name: fmt.Sprintf("nats-%d", i+1), client: ports[2*i], route: ports[2*i+1]})
	}
	for i, n := range c.nats {
		var routes []string
		for j, o := range c.nats {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.route))
			}
		}
		n.conf = filepath.Join(dir, n.name+".conf")
		require.NoError(t, os.WriteFile(n.conf, fmt.Appendf(nil, `server_name: %s
host: 127.0.0.1
port: %d
jetstream {
  store_dir: %q
  sync_interval: always
}
cluster {
  name: warren-nemesis
  host: 127.0.0.1
  port: %d
  routes: [%s]
}
`, n.name, n.client, n.store(dir), n.route, strings.Join(routes, ", ")), 0o600))
	}
	for _, n := range c.nats {
		require.NoError(t, c.startNATS(n))
	}
	for _, n := range c.nats {
		require.NoError(t, waitJetStream(n.url(), 30*time.Second), "%s", n.name)
	}

	// Edges: one per host, the same TCP range and peer port on each.
	c.tcpLo, c.tcpHi = sharedTCPRange(t, nemHosts...)
	peer, _ := sharedTCPRange(t, nemHosts...)
	for peer >= c.tcpLo-2 && peer <= c.tcpHi {
		peer, _ = sharedTCPRange(t, nemHosts...)
	}
	for i, host := range nemHosts {
		p := freePortsOn(t, host, 4)
		e := &nemEdge{id: fmt.Sprintf("edge-%d", i+1), host: host, control: p[0], http: p[1], admin: p[2], debug: p[3], peer: peer, gid: nemEdgeGID + i}
		// Each edge lists its own NATS node first (the client shuffles them anyway).
		var urls []string
		for j := range c.nats {
			urls = append(urls, strconv.Quote(c.nats[(i+j)%len(c.nats)].url()))
		}
		e.conf = filepath.Join(dir, e.id+".toml")
		require.NoError(t, os.WriteFile(e.conf, fmt.Appendf(nil, `[server]
domain = "localhost"
bind = %q
http_port = %d
control_port = %d
admin_port = %d

[auth]
require_auth = true
admin_token = %q
[[auth.tenants]]
name = "alpha"
token = %q
[[auth.tenants]]
name = "beta"
token = %q

[limits]
tcp_port_range = [%d, %d]
drain_timeout_secs = 2

[load_balancing]
enabled = true

[cluster]
nats_urls = [%s]
edge_id = %q
advertise = "%s:%d"
peer_port = %d
token = %q
lease_secs = %g
timeout_secs = %d
replicas = 3

[[endpoints]]
subdomain = "resv"
tenant = "alpha"
group = "resv"
key_sha256 = "%x"
`, host, e.http, e.control, e.admin, adminToken, alphaToken, betaToken, c.tcpLo, c.tcpHi,
			strings.Join(urls, ", "), e.id, host, peer, peer, edgesToken, lease.Seconds(), nemNATSTimeoutSecs,
			sha256.Sum256([]byte(keyAlphaResv))), 0o600))
		c.edges = append(c.edges, e)
	}
	for _, e := range c.edges {
		require.NoError(t, c.startEdge(e))
	}

	// Backends, then connectors: each lists the edges starting with its own first choice,
	// so that the pools span edges.
	for _, id := range []string{idAlphaWeb1, idAlphaWeb2, idAlphaSolo, idAlphaResv, idBetaWeb} {
		c.backends[id] = identityHTTPBackend(t, id)
	}
	for _, id := range []string{idAlphaDB1, idAlphaDB2, idBetaDB} {
		c.backends[id] = identityTCPBackend(t, id)
	}
	web := func(name, id string) string {
		return fmt.Sprintf("  %s:\n    proto: http\n    local_port: %d\n    subdomain: pool\n    group: web\n    group_key: %q\n", name, c.backends[id], keyAlphaWeb)
	}
	db := func(name, id string) string {
		return fmt.Sprintf("  %s:\n    proto: tcp\n    local_port: %d\n    group: db\n    group_key: %q\n", name, c.backends[id], keyAlphaDB)
	}
	// alpha-1 and alpha-2 are the members of pools web, db and rot; web and db leave
	// (connector-detach) and come back, rot's key rotates (key-rotate).
	member := func(name, webID, dbID string, m int) func() string {
		return func() string {
			s := c.rotTunnel(m)
			if !c.detached[name] {
				s = web("web", webID) + db("db", dbID) + s
			}
			return s
		}
	}
	c.addConnector("alpha-1", 0, alphaToken, member("alpha-1", idAlphaWeb1, idAlphaDB1, 0), "tunnel web: ", "tunnel db: ", "tunnel rot: ")
	c.addConnector("alpha-2", 1, alphaToken, member("alpha-2", idAlphaWeb2, idAlphaDB2, 1), "tunnel web: ", "tunnel db: ", "tunnel rot: ")
	c.addConnector("alpha-solo", 2, alphaToken, func() string {
		s := fmt.Sprintf("  resv:\n    proto: http\n    local_port: %d\n    subdomain: resv\n    group: resv\n    group_key: %q\n", c.backends[idAlphaResv], keyAlphaResv)
		if !c.detached["alpha-solo"] {
			s = fmt.Sprintf("  solo:\n    proto: http\n    local_port: %d\n    subdomain: solo\n", c.backends[idAlphaSolo]) + s
		}
		return s
	}, "tunnel solo: ", "tunnel resv: ")
	c.addConnector("beta-1", 2, betaToken, func() string {
		return fmt.Sprintf("  bweb:\n    proto: http\n    local_port: %d\n    subdomain: bpool\n    group: bweb\n    group_key: %q\n", c.backends[idBetaWeb], keyBetaWeb) +
			fmt.Sprintf("  bdb:\n    proto: tcp\n    local_port: %d\n    group: bdb\n    group_key: %q\n", c.backends[idBetaDB], keyBetaDB)
	}, "tunnel bweb: ", "tunnel bdb: ")
	c.portPool = map[int]string{}
	for p := c.tcpLo; p <= c.tcpHi; p++ {
		c.portPool[p] = ""
	}
	for _, k := range c.connectors {
		require.NoError(t, c.startConnector(k))
		for _, prefix := range k.lines {
			line := k.p.line(t, prefix)
			if m := tcpURL.FindStringSubmatch(line); m != nil {
				port, _ := strconv.Atoi(m[1])
				pool := "alpha/db"
				if strings.HasPrefix(k.name, "beta") {
					pool = "beta/bdb"
				}
				if old, ok := c.portPool[port]; !ok || (old != "" && old != pool) {
					t.Fatalf("%s printed port %d, held by %q or outside [%d, %d]", k.name, port, old, c.tcpLo, c.tcpHi)
				}
				c.portPool[port] = pool
			}
		}
	}
	return c
}

// addConnector adds a connector whose file lists the edges from first on.
func (c *nemCluster) addConnector(name string, first int, token string, tunnels func() string, lines ...string) {
	var servers []string
	for i := range c.edges {
		servers = append(servers, c.edges[(first+i)%len(c.edges)].controlAddr())
	}
	k := &nemConnector{name: name, conf: filepath.Join(c.dir, name+".yml"), servers: servers, token: token, tunnels: tunnels, lines: lines}
	require.NoError(c.t, k.writeConf())
	c.connectors = append(c.connectors, k)
}

// rotKey is pool rot's key of generation gen.
func rotKey(gen int) string { return fmt.Sprintf("nemesis-alpha-rot-key-%d", gen) }

// rotID is the identity of pool rot's member m (0 or 1) holding the key of generation gen:
// each generation has a backend of its own, so that an answer says which key its member
// held.
func rotID(m, gen int) string { return fmt.Sprintf("alpha/rot/%d/g%d", m+1, gen) }

// rotTunnel is member m's tunnel of pool rot at its current key generation: from the first
// rotation on it lists the key before as its previous one (load-balancing.md, "Rotating a
// group key").
func (c *nemCluster) rotTunnel(m int) string {
	gen := c.rotGen[m]
	id := rotID(m, gen)
	if _, ok := c.backends[id]; !ok {
		c.backends[id] = identityHTTPBackend(c.t, id)
	}
	s := fmt.Sprintf("  rot:\n    proto: http\n    local_port: %d\n    subdomain: rot\n    group: rot\n    group_key: %q\n", c.backends[id], rotKey(gen))
	if gen > 0 {
		s += fmt.Sprintf("    previous_group_keys: [%q]\n", rotKey(gen-1))
	}
	return s
}

// reload rewrites k's file from the cluster's state and has the running connector read it
// (connector reload).
func (c *nemCluster) reload(k *nemConnector) error {
	if err := k.writeConf(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "connector"), "reload", "--config", k.conf).CombinedOutput()
	if err != nil {
		return fmt.Errorf("connector reload %s: %v: %s", k.name, err, out)
	}
	return nil
}

func (c *nemCluster) startNATS(n *nemNATS) error {
	p, err := startProc(c.t, n.name, c.logs.next(n.name), "nats-server", "-c", n.conf)
	n.p = p
	return err
}

// startEdge starts e and waits for its admin API.
func (c *nemCluster) startEdge(e *nemEdge) error {
	gid := -1
	if c.netns {
		gid = e.gid
	}
	p, err := startProcAs(c.t, gid, e.id, c.logs.next(e.id), "edge", "-config", e.conf, "-debug-addr", net.JoinHostPort(e.host, fmt.Sprint(e.debug)))
	if err != nil {
		return err
	}
	e.p = p
	return waitHealthz(p, e.adminURL("/healthz"), 30*time.Second)
}

// startConnector starts k; its lines come later (proc.line).
func (c *nemCluster) startConnector(k *nemConnector) error {
	p, err := startProc(c.t, k.name, c.logs.next(k.name), "connector", "start", "--config", k.conf)
	k.p = p
	return err
}

// waitHealthz waits until url answers 200, or p exits, or d passes.
func waitHealthz(p *proc, url string, d time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(d)
	for {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited with %d before answering %s", p.name, p.code, url)
		default:
		}
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %s within %v", p.name, url, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitJetStream waits until the NATS node at url answers a JetStream account request (the
// cluster elected its meta leader).
func waitJetStream(url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err == nil {
			var js nats.JetStreamContext
			if js, err = nc.JetStream(nats.MaxWait(2 * time.Second)); err == nil {
				_, err = js.AccountInfo()
			}
			nc.Close()
			if err == nil {
				return nil
			}
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("JetStream at %s not ready within %v: %v", url, d, last)
}

// identityHTTPBackend answers every request with id.
func identityHTTPBackend(t *testing.T, id string) int {
	t.Helper()
	return httpBackend(t, id)
}

// identityTCPBackend writes id and a newline to each connection, then echoes what it reads.
func identityTCPBackend(t *testing.T, id string) int {
	t.Helper()
	return echoBackend(t, id)
}

// tcpExchange dials addr, writes a line, and returns the first line the far end writes
// (the identity) after checking the echo of the line written.
func tcpExchange(ctx context.Context, addr string, timeout time.Duration) (string, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	id, err := r.ReadString('\n')
	if err != nil {
		return strings.TrimSuffix(id, "\n"), fmt.Errorf("reading the identity: %w", err)
	}
	id = strings.TrimSuffix(id, "\n")
	echo, err := r.ReadString('\n')
	if err != nil {
		return id, fmt.Errorf("reading the echo: %w", err)
	}
	if echo != "ping\n" {
		return id, fmt.Errorf("echo %q, not %q", echo, "ping\n")
	}
	return id, nil
}

// fdCount is the number of open files of process pid, but for its pipes and its TCP
// connections on local port skip. Go's net package keeps pipes for splice(2) (io.Copy
// between sockets) in a pool the collector empties, so their number follows the heap, not
// a leak; an edge's connections on its control port are its connectors' sessions and their
// pools of data connections (4 per session with a TCP tunnel), which come and go with the
// connectors as they move between edges.
func fdCount(pid, skip int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && !strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	for _, s := range fdSockets(pid) {
		if strings.HasPrefix(s, "127.") && strings.Contains(s, fmt.Sprintf(":%d -> ", skip)) {
			n--
		}
	}
	return n, nil
}

// fdSockets describes process pid's open TCP sockets ("local -> remote STATE", from
// /proc/net/tcp), and counts its other open files by kind, for a report of open files.
func fdSockets(pid int) []string {
	inodes := map[string]bool{}
	other := map[string]int{}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range ents {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
			continue
		}
		kind := l
		if i := strings.IndexAny(l, ":["); i > 0 {
			kind = l[:i]
		}
		other[kind]++
	}
	states := map[string]string{"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "09": "LAST_ACK", "07": "CLOSE"}
	addr := func(hex string) string {
		h, p, _ := strings.Cut(hex, ":")
		b, _ := strconv.ParseUint(h, 16, 32)
		port, _ := strconv.ParseUint(p, 16, 16)
		return fmt.Sprintf("%d.%d.%d.%d:%d", b&0xff, b>>8&0xff, b>>16&0xff, b>>24, port)
	}
	var out []string
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 10 || !inodes[f[9]] {
			continue
		}
		delete(inodes, f[9])
		st := states[f[3]]
		if st == "" {
			st = f[3]
		}
		out = append(out, fmt.Sprintf("%s -> %s %s", addr(f[1]), addr(f[2]), st))
	}
	sort.Strings(out)
	if len(inodes) > 0 {
		out = append(out, fmt.Sprintf("%d other sockets", len(inodes)))
	}
	for k, n := range other {
		out = append(out, fmt.Sprintf("%d × %s", n, k))
	}
	return out
}
