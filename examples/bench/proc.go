package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-tunnel/warren/group"
)

// The process layout (-layout processes): every party is its own OS process, as a new user
// deploys Warren. The edge is examples/edge and each connector examples/connector, both
// built with go build and run with generated configuration files; the two backends, the
// relays of the plain-relay floor and the load generator are this binary re-executed in a
// hidden role (proc_roles.go).
//
// Paths measured, each the same workload:
//
//	Warren:  load → edge (HTTP port, or a TCP group's port) → connector 1|2 → backend 1|2
//	relays:  load → relay A → relay B → backend 1|2   (plain copy loops, two processes)
//	proxy:   load → net/http proxy → relay B → backend 1|2   (HTTP tiny responses only)
//	direct:  load → backend 1|2
//
// The relays come in two kinds: io.Copy between *net.TCPConn (splice on Linux) and a
// read/write loop through 64 KiB buffers (no splice). The HTTP figure has a third floor:
// an httputil.ReverseProxy with net/http's server and Transport in relay A's (the edge's)
// place, and the io.Copy relay B in the connector's. With -control tls the edge's control
// listener speaks TLS and the connectors verify it; the relay floor of those rows runs TLS
// between relay A and relay B, the link that stands for the control connection.

// Targets of the issue, judged in this layout.
const (
	procTCPTarget = 0.80 // Warren's TCP throughput ÷ the io.Copy relays'
	procRPSTarget = 0.30 // Warren's HTTP requests/s ÷ direct
	// procCPURatioTarget: the edge's CPU per tiny HTTP/1.1 request ÷ the stock Go reverse
	// proxy's (net/http server, httputil.ReverseProxy, keep-alive http.Transport) in the
	// edge's place, in the same run.
	procCPURatioTarget = 0.40
	procP99Allowance   = 500 * time.Microsecond // Warren's added p99 over the relays' added p99
)

// linkHook is called for every port whose connections stand for the link between an edge and
// its connectors — each edge's control port, and each relay B's port in the relay floor —
// after the port is chosen and before anything dials it. It may shape the link (a WAN
// delay); stop undoes that and is called when the layout is torn down.
type linkHook func(ctx context.Context, controlPort int) (stop func() error, err error)

// procPath is one way the load reaches the backends.
type procPath struct {
	kind string // "warren", copySplice, copyBuf, copyHTTP, pathLink or "direct"
	tls  bool   // Warren: TLS control connections; relays: TLS between relay A and relay B
}

func (p procPath) String() string {
	ctl := "plain"
	if p.tls {
		ctl = "TLS"
	}
	switch p.kind {
	case "warren":
		return "Warren, " + ctl
	case copySplice:
		return "relays io.Copy, " + ctl
	case copyBuf:
		return "relays 64 KiB, " + ctl
	case copyHTTP:
		return "net/http proxy, " + ctl
	case pathLink:
		return "plain TCP over the link"
	case pathWarrenWS:
		return "Warren, WebSocket"
	case pathWarrenQUIC:
		return "Warren, QUIC"
	case pathFRPTCP:
		return "frp, TCP (TLS)"
	case pathFRPQUIC:
		return "frp, QUIC"
	}
	return "direct"
}

// procEdgePorts are one edge's ports. The control port is known here only: the edge's
// server.toml, the connectors' server key and the link hook all take it from Control.
type procEdgePorts struct {
	Control, HTTP, Admin int
	HTTPS                int             // -wan-websocket only: the HTTPS port serving websocket_path (0: none)
	QUIC                 int             // -wan-quic only: the UDP port of quic_port (0: none)
	TCP                  group.PortRange // the TCP groups' public ports
}

func (p procEdgePorts) controlAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Control))
}

// procEdge is one running edge with its two connectors.
type procEdge struct {
	tls bool
	// transport is how the connectors reach the edge: "tcp" (the control port), "websocket"
	// (-wan-websocket) or "quic" (-wan-quic), the connectors' `transport`.
	transport  string
	ports      procEdgePorts
	child      *procChild
	connectors []*procChild
	bulkPort   int // the TCP group "bulk" (to the sinks)
	ttfbPort   int // the TCP group "first-byte" (to the one-byte servers)
}

func (e *procEdge) pids() []int {
	out := []int{e.child.pid()}
	for _, c := range e.connectors {
		out = append(out, c.pid())
	}
	return out
}

// procRelay is one relay chain of the floor. Relay A's listeners are, by route: the two
// HTTP backends, the two sinks, the two one-byte servers (the net/http proxy: the two HTTP
// backends only).
type procRelay struct {
	a, b  *procChild
	addrs []string
}

// Routes of a relay chain.
const (
	routeHTTP    = 0
	routeSink    = 2
	routeOneByte = 4
)

// procLayout is the running process layout.
type procLayout struct {
	b        *bench
	hook     linkHook
	dir      string
	self     string // this binary
	edgeBin  string
	connBin  string
	cert     string
	key      string
	backends []procBackendAddrs
	link     procBackendAddrs // -wan-rtt: a backend listening on delayed ports (pathLink)
	load     *procChild
	edges    map[bool]*procEdge
	wsEdge   *procEdge // -wan-websocket: the edge whose connectors come over WebSocket
	quicEdge *procEdge // -wan-quic: the edge whose connectors come over QUIC
	// frp holds, by path kind (pathFRPTCP, pathFRPQUIC), frps and its two frpc (-wan-frp).
	frp    map[string]*frpSetup
	rotate int // added to the round number when rotating the paths (-wan-loss)
	relays map[procPath]*procRelay
	paths  []procPath // the paths of every figure
	// httpPaths are the paths of the HTTP tiny-response figure: paths and, except under
	// -wan-rtt, the net/http proxy floor.
	httpPaths []procPath
	children  []*procChild
	stops     []func() error // of the link hook
	taken     map[int]bool   // ports handed out
}

// Credentials of the generated configuration (loopback only).
const (
	procToken      = "bench-connector-token-0123456789"
	procAdminToken = "bench-admin-token-0123456789abcd"
)

// runProcesses sets the process layout up, measures every figure and adds its tables to rep.
func (b *bench) runProcesses(ctx context.Context, rep *report) (err error) {
	l := &procLayout{b: b, hook: b.linkHook, edges: map[bool]*procEdge{}, relays: map[procPath]*procRelay{}, taken: map[int]bool{}}
	defer func() {
		if cerr := l.close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if err := l.setUp(ctx); err != nil {
		return err
	}
	s := &procSummary{paths: l.paths, httpPaths: l.httpPaths, controls: b.cfg.controls, streams: b.cfg.tcpStreams, noise: map[string]*procNoise{}}
	rep.proc = s
	if b.wan != nil {
		return l.runWAN(ctx, s, rep)
	}
	for _, name := range b.cfg.scenarios {
		start := time.Now()
		b.say("processes: %s", name)
		var err error
		switch name {
		case "http":
			err = l.measureHTTP(ctx, s)
		case "tcp":
			err = l.measureTCP(ctx, s)
		case "ttfb":
			err = l.measureTTFB(ctx, s)
		}
		if err != nil {
			return fmt.Errorf("processes, %s: %w", name, err)
		}
		b.say("processes: %s done in %s", name, time.Since(start).Round(100*time.Millisecond))
	}
	for _, name := range b.cfg.scenarios {
		switch name {
		case "http":
			rep.add(s.httpSection(b.cfg))
		case "tcp":
			rep.add(s.tcpSection(b.cfg))
		case "ttfb":
			rep.add(s.ttfbSection(b.cfg))
		}
	}
	return nil
}

// setUp builds the example mains and starts every process.
func (l *procLayout) setUp(ctx context.Context) error {
	var err error
	if l.self, err = os.Executable(); err != nil {
		return err
	}
	if l.dir, err = os.MkdirTemp("", "warren-bench-"); err != nil {
		return err
	}
	l.b.say("processes: building examples/edge and examples/connector")
	if l.edgeBin, l.connBin, err = buildMains(ctx, l.dir); err != nil {
		return err
	}
	if slices.Contains(l.b.cfg.controls, true) || l.b.cfg.wanWebSocket || l.b.cfg.wanQUIC {
		if l.cert, l.key, err = writeSelfSigned(l.dir); err != nil {
			return fmt.Errorf("generating a self-signed certificate: %w", err)
		}
	}
	for i := range 2 {
		c, err := l.startRole(fmt.Sprintf("backend %d", i+1), procBackendCommand)
		if err != nil {
			return err
		}
		var a procBackendAddrs
		if err := c.readJSON(ctx, 30*time.Second, &a); err != nil {
			return err
		}
		l.backends = append(l.backends, a)
	}
	if l.load, err = l.startRole("load generator", procLoadCommand); err != nil {
		return err
	}
	var used []group.PortRange
	for _, t := range l.b.cfg.controls {
		e, err := l.startEdge(ctx, t, "tcp", used)
		if err != nil {
			return err
		}
		used = append(used, e.ports.TCP)
		l.edges[t] = e
	}
	if l.b.wan != nil && l.b.cfg.wanWebSocket {
		e, err := l.startEdge(ctx, true, "websocket", used)
		if err != nil {
			return err
		}
		used = append(used, e.ports.TCP)
		l.wsEdge = e
	}
	if l.b.wan != nil && l.b.cfg.wanQUIC {
		e, err := l.startEdge(ctx, true, "quic", used)
		if err != nil {
			return err
		}
		l.quicEdge = e
	}
	modes := []string{copySplice, copyBuf}
	if l.b.wan != nil {
		modes = []string{copySplice} // the WAN scenario's floor: the relays that splice
		if err := l.startLinkBackend(ctx); err != nil {
			return err
		}
	}
	for _, t := range l.b.cfg.controls {
		for _, mode := range modes {
			r, err := l.startRelay(ctx, mode, t)
			if err != nil {
				return err
			}
			l.relays[procPath{kind: mode, tls: t}] = r
		}
	}
	for _, kind := range append([]string{"warren"}, modes...) {
		for _, t := range l.b.cfg.controls {
			l.paths = append(l.paths, procPath{kind: kind, tls: t})
		}
		if kind == "warren" && l.wsEdge != nil {
			l.paths = append(l.paths, procPath{kind: pathWarrenWS, tls: true})
		}
		if kind == "warren" && l.quicEdge != nil {
			l.paths = append(l.paths, procPath{kind: pathWarrenQUIC, tls: true})
		}
		if kind == "warren" && l.b.wan != nil && l.b.cfg.wanFRP != "" {
			l.frp = map[string]*frpSetup{}
			for _, k := range []string{pathFRPTCP, pathFRPQUIC} {
				f, err := l.startFRP(ctx, k)
				if err != nil {
					return fmt.Errorf("frp over %s: %w", frpTransports[k], err)
				}
				l.frp[k] = f
				l.paths = append(l.paths, procPath{kind: k, tls: true})
			}
		}
	}
	if l.b.wan != nil {
		l.paths = append(l.paths, procPath{kind: pathLink})
	}
	l.httpPaths = slices.Clone(l.paths)
	if l.b.wan == nil && slices.Contains(l.b.cfg.scenarios, "http") {
		// The net/http proxy floor: the HTTP tiny-response figure only.
		for _, t := range l.b.cfg.controls {
			p := procPath{kind: copyHTTP, tls: t}
			r, err := l.startRelay(ctx, copyHTTP, t)
			if err != nil {
				return err
			}
			l.relays[p] = r
			l.httpPaths = append(l.httpPaths, p)
		}
	}
	l.paths = append(l.paths, procPath{kind: "direct"})
	l.httpPaths = append(l.httpPaths, procPath{kind: "direct"})
	return nil
}

// close stops every process (connectors first, so that the edges see them leave), undoes
// the link hook and removes the temporary files.
func (l *procLayout) close() error {
	var conns, rest []*procChild
	for _, c := range l.children {
		if strings.HasPrefix(c.name, "connector") {
			conns = append(conns, c)
		} else {
			rest = append(rest, c)
		}
	}
	errs := []error{stopAll(conns, 10*time.Second), stopAll(rest, 10*time.Second)}
	for _, s := range slices.Backward(l.stops) {
		errs = append(errs, s())
	}
	if l.dir != "" {
		errs = append(errs, os.RemoveAll(l.dir))
	}
	return errors.Join(errs...)
}

func (l *procLayout) add(c *procChild) *procChild {
	l.children = append(l.children, c)
	return c
}

// startRole starts this binary in one of its hidden roles.
func (l *procLayout) startRole(name, role string, args ...string) (*procChild, error) {
	c, err := startProcChild(name, l.self, append([]string{role}, args...), true, nil)
	if err != nil {
		return nil, err
	}
	return l.add(c), nil
}

// callHook calls the link hook, if any, for port.
func (l *procLayout) callHook(ctx context.Context, port int) error {
	if l.hook == nil {
		return nil
	}
	stop, err := l.hook(ctx, port)
	if err != nil {
		return fmt.Errorf("link hook for port %d: %w", port, err)
	}
	if stop != nil {
		l.stops = append(l.stops, stop)
	}
	return nil
}

// pickEdgePorts chooses an edge's ports: free loopback ports none of taken, and a range of
// 100 TCP ports that overlaps none of used.
func pickEdgePorts(used []group.PortRange, taken map[int]bool) (procEdgePorts, error) {
	var p procEdgePorts
	ps, err := freePorts(3, taken)
	if err != nil {
		return p, err
	}
	p.Control, p.HTTP, p.Admin = ps[0], ps[1], ps[2]
	for {
		p.TCP = pickPortRange()
		if !slices.ContainsFunc(used, func(u group.PortRange) bool { return p.TCP.Lo <= u.Hi && u.Lo <= p.TCP.Hi }) {
			return p, nil
		}
	}
}

// startEdge starts an edge (examples/edge with a generated server.toml) and its two
// connectors (examples/connector with generated YAML files), and waits until every group
// has its two healthy members.
// With transport "websocket" (-wan-websocket) the edge also serves websocket_path on an
// HTTPS port, a port of the link, and the connectors come over WebSocket to it; with "quic"
// (-wan-quic) it serves quic_port, a UDP port of the link, and the connectors come over
// QUIC to it. Both need useTLS (the edge's certificate).
func (l *procLayout) startEdge(ctx context.Context, useTLS bool, transport string, used []group.PortRange) (*procEdge, error) {
	ports, err := pickEdgePorts(used, l.taken)
	if err != nil {
		return nil, err
	}
	e := &procEdge{tls: useTLS, transport: transport, ports: ports}
	if err := l.callHook(ctx, ports.Control); err != nil {
		return nil, err
	}
	ctl := "plain"
	if useTLS {
		ctl = "tls"
	}
	if transport != "tcp" {
		ps, err := freePorts(1, l.taken)
		if err != nil {
			return nil, err
		}
		if err := l.callHook(ctx, ps[0]); err != nil { // delays and drops TCP and UDP alike
			return nil, err
		}
		if transport == "websocket" {
			ctl, e.ports.HTTPS = "ws", ps[0]
		} else {
			ctl, e.ports.QUIC = "quic", ps[0]
		}
	}
	var toml strings.Builder
	fmt.Fprintf(&toml, "# generated by examples/bench -layout processes\n[server]\ndomain = %q\nbind = \"127.0.0.1\"\nhttp_port = %d\nhttps_port = %d\ncontrol_port = %d\nadmin_port = %d\n",
		benchDomain, ports.HTTP, e.ports.HTTPS, ports.Control, ports.Admin)
	switch transport {
	case "websocket":
		fmt.Fprintf(&toml, "websocket_path = %q\n", wanWSPath)
	case "quic":
		fmt.Fprintf(&toml, "quic_port = %d\n", e.ports.QUIC)
	}
	if n := l.b.cfg.dataReadBuffer; n > 0 {
		fmt.Fprintf(&toml, "data_read_buffer = %d\n", n)
	}
	toml.WriteString("\n")
	if useTLS {
		fmt.Fprintf(&toml, "[tls]\ncert_path = %q\nkey_path = %q\n\n", l.cert, l.key)
	}
	fmt.Fprintf(&toml, "[auth]\nrequire_auth = true\ntokens = [%q]\nadmin_token = %q\n\n", procToken, procAdminToken)
	fmt.Fprintf(&toml, "[limits]\ntcp_port_range = [%d, %d]\ndrain_timeout_secs = 1\n\n[load_balancing]\nenabled = true\n", ports.TCP.Lo, ports.TCP.Hi)
	path := filepath.Join(l.dir, "server-"+ctl+".toml")
	if err := os.WriteFile(path, []byte(toml.String()), 0o600); err != nil {
		return nil, err
	}
	var echo io.Writer
	if l.b.cfg.verbose {
		echo = l.b.progress
	}
	c, err := startProcChild("edge ("+ctl+")", l.edgeBin, []string{"-config", path}, false, echo)
	if err != nil {
		return nil, err
	}
	e.child = l.add(c)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	admin := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports.Admin))
	if err := waitFor(ctx, e.child, "the edge's admin listener", func() (bool, string) {
		resp, err := hc.Get(admin + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	}); err != nil {
		return nil, err
	}
	for i, be := range l.backends {
		c, err := l.startConnector(ctx, e, ctl, i, be, echo)
		if err != nil {
			return nil, err
		}
		e.connectors = append(e.connectors, c)
	}
	type apiGroup struct {
		Protocol     string `json:"protocol"`
		Label        string `json:"label"`
		Port         int    `json:"port"`
		MemberCount  int    `json:"member_count"`
		HealthyCount int    `json:"healthy_count"`
	}
	err = waitFor(ctx, e.child, "the groups pool, bulk and first-byte with 2 healthy members each", func() (bool, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/api/groups", nil)
		req.Header.Set("Authorization", "Bearer "+procAdminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var gs []apiGroup
		if err := json.NewDecoder(resp.Body).Decode(&gs); err != nil {
			return false, fmt.Sprintf("%s: %v", resp.Status, err)
		}
		ready := 0
		for _, g := range gs {
			if g.MemberCount != 2 || g.HealthyCount != 2 {
				continue
			}
			switch g.Label {
			case "pool":
				ready++
			case "bulk":
				e.bulkPort = g.Port
				ready++
			case "first-byte":
				e.ttfbPort = g.Port
				ready++
			}
		}
		return ready == 3 && e.bulkPort > 0 && e.ttfbPort > 0, fmt.Sprintf("%+v", gs)
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// startConnector starts connector i of edge e, forwarding to backend be.
func (l *procLayout) startConnector(ctx context.Context, e *procEdge, ctl string, i int, be procBackendAddrs, echo io.Writer) (*procChild, error) {
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	var y strings.Builder
	switch e.transport {
	case "websocket":
		fmt.Fprintf(&y, "# generated by examples/bench -layout processes\ntransport: websocket\nserver: %q\nauth_token: %q\n",
			"wss://"+net.JoinHostPort(benchDomain, strconv.Itoa(e.ports.HTTPS))+wanWSPath, procToken)
	case "quic":
		fmt.Fprintf(&y, "# generated by examples/bench -layout processes\ntransport: quic\nserver: %q\nauth_token: %q\n",
			net.JoinHostPort("127.0.0.1", strconv.Itoa(e.ports.QUIC)), procToken)
	default:
		fmt.Fprintf(&y, "# generated by examples/bench -layout processes\nserver: %q\nauth_token: %q\n", e.ports.controlAddr(), procToken)
	}
	if e.tls {
		fmt.Fprintf(&y, "tls:\n  enabled: true\n  ca_path: %q\n", l.cert)
	}
	if n := l.b.cfg.dataReadBuffer; n > 0 {
		fmt.Fprintf(&y, "data_read_buffer: %d\n", n)
	}
	fmt.Fprintf(&y, "drain_timeout_secs: 1\ncontrol_socket: %q\ntunnels:\n", filepath.Join(l.dir, fmt.Sprintf("c-%s-%d.sock", ctl, i+1)))
	fmt.Fprintf(&y, "  web:\n    proto: http\n    local_port: %s\n    local_host: 127.0.0.1\n    subdomain: pool\n    group: web\n    group_key: bench-web-key\n", port(be.HTTP))
	fmt.Fprintf(&y, "  bulk:\n    proto: tcp\n    local_port: %s\n    local_host: 127.0.0.1\n    group: bulk\n    group_key: bench-bulk-key\n", port(be.Sink))
	fmt.Fprintf(&y, "  first-byte:\n    proto: tcp\n    local_port: %s\n    local_host: 127.0.0.1\n    group: first-byte\n    group_key: bench-first-byte-key\n", port(be.OneByte))
	path := filepath.Join(l.dir, fmt.Sprintf("connector-%s-%d.yml", ctl, i+1))
	if err := os.WriteFile(path, []byte(y.String()), 0o600); err != nil {
		return nil, err
	}
	c, err := startProcChild(fmt.Sprintf("connector %d (%s)", i+1, ctl), l.connBin, []string{"start", "--config", path}, false, echo)
	if err != nil {
		return nil, err
	}
	return l.add(c), nil
}

// waitFor polls ready every 20 ms until it is true, child exits, ctx ends or 30 s pass.
func waitFor(ctx context.Context, child *procChild, what string, ready func() (bool, string)) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := ""
	for {
		var ok bool
		if ok, last = ready(); ok {
			return nil
		}
		select {
		case <-tick.C:
		case <-child.exited:
			return fmt.Errorf("%s exited while waiting for %s: %s: %s", child.name, what, child.cmd.ProcessState, child.stderr)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (last: %s): %w; %s said: %s", what, last, ctx.Err(), child.name, child.stderr)
		}
	}
}

// startRelay starts one relay chain of the floor: relay B, on a port the link hook sees
// first, and relay A. With mode copyHTTP relay A is the net/http proxy, with one listener
// per HTTP backend, and relay B copies with io.Copy.
func (l *procLayout) startRelay(ctx context.Context, mode string, useTLS bool) (*procRelay, error) {
	p := procPath{kind: mode, tls: useTLS}
	modeB, routes := mode, 6
	if mode == copyHTTP {
		modeB, routes = copySplice, 2
	}
	ps, err := freePorts(1, l.taken)
	if err != nil {
		return nil, err
	}
	port := ps[0]
	if err := l.callHook(ctx, port); err != nil {
		return nil, err
	}
	be0, be1 := l.backends[0], l.backends[1]
	targets := strings.Join([]string{be0.HTTP, be1.HTTP, be0.Sink, be1.Sink, be0.OneByte, be1.OneByte}, ",")
	args := []string{"-role", "b", "-copy", modeB, "-listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), "-targets", targets}
	if useTLS {
		args = append(args, "-tls", "-cert", l.cert, "-key", l.key)
	}
	r := &procRelay{}
	if r.b, err = l.startRole("relay B ("+p.String()+")", procRelayCommand, args...); err != nil {
		return nil, err
	}
	var bAddrs procRelayAddrs
	if err := r.b.readJSON(ctx, 30*time.Second, &bAddrs); err != nil {
		return nil, err
	}
	args = []string{"-role", "a", "-copy", mode, "-next", bAddrs.Addrs[0], "-routes", strconv.Itoa(routes)}
	if useTLS {
		args = append(args, "-tls", "-ca", l.cert)
	}
	if r.a, err = l.startRole("relay A ("+p.String()+")", procRelayCommand, args...); err != nil {
		return nil, err
	}
	var aAddrs procRelayAddrs
	if err := r.a.readJSON(ctx, 30*time.Second, &aAddrs); err != nil {
		return nil, err
	}
	if len(aAddrs.Addrs) != routes {
		return nil, fmt.Errorf("relay A announced %d listeners, want %d", len(aAddrs.Addrs), routes)
	}
	r.addrs = aAddrs.Addrs
	return r, nil
}

// tcpAddrs returns where stream i of n goes on path p: route is routeSink or routeOneByte.
func (l *procLayout) tcpAddrs(p procPath, route, n int) []string {
	out := make([]string, n)
	for i := range out {
		switch p.kind {
		case "warren", pathWarrenWS, pathWarrenQUIC:
			e := l.edgeOf(p)
			port := e.bulkPort
			if route == routeOneByte {
				port = e.ttfbPort
			}
			out[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		case "direct":
			out[i] = l.backends[i%2].Sink
			if route == routeOneByte {
				out[i] = l.backends[i%2].OneByte
			}
		case pathLink:
			out[i] = l.link.Sink
		case pathFRPTCP, pathFRPQUIC:
			out[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(l.frp[p.kind].bulkPort))
		default:
			out[i] = l.relays[p].addrs[route+i%2]
		}
	}
	return out
}

// pids returns the processes whose CPU a job on path p measures: the edge and its two
// connectors, or relay A and relay B.
func (l *procLayout) pids(p procPath) []int {
	switch p.kind {
	case "warren", pathWarrenWS, pathWarrenQUIC:
		return l.edgeOf(p).pids()
	case "direct", pathLink:
		return nil
	case pathFRPTCP, pathFRPQUIC:
		return l.frp[p.kind].pids()
	}
	r := l.relays[p]
	return []int{r.a.pid(), r.b.pid()}
}

// edgeOf is the edge of a Warren path.
func (l *procLayout) edgeOf(p procPath) *procEdge {
	switch p.kind {
	case pathWarrenWS:
		return l.wsEdge
	case pathWarrenQUIC:
		return l.quicEdge
	}
	return l.edges[p.tls]
}

// httpPIDs is pids for the HTTP figures, where the direct path measures the two backends:
// what a net/http server costs per request when it only answers, the floor of any edge built
// on net/http's server.
func (l *procLayout) httpPIDs(p procPath) []int {
	if p.kind == "direct" && len(l.backends) == 2 {
		return []int{l.backends[0].PID, l.backends[1].PID}
	}
	return l.pids(p)
}

// job runs one job in the load generator.
func (l *procLayout) job(ctx context.Context, j procJob, timeout time.Duration) (procResult, error) {
	var res procResult
	if err := l.load.call(ctx, timeout, j, &res); err != nil {
		return res, err
	}
	if res.Err != "" {
		return res, errors.New(res.Err)
	}
	return res, nil
}

// procNoise is the other processes' CPU use during each run of one figure, by path.
type procNoise struct {
	others    map[procPath]series
	steal     float64
	unknown   bool
	discarded int
}

// procMeter measures the CPU the rest of the machine used during one run: everything
// minus this process and its children.
type procMeter struct {
	start             time.Time
	busy, steal, ours time.Duration
	err               error
}

func procCPU() (time.Duration, error) {
	d, err := readCPU(os.Getpid())
	for _, p := range procChildPIDs() {
		c, cerr := readCPU(p)
		if cerr != nil && err == nil {
			err = cerr
		}
		d += c
	}
	return d, err
}

func startProcMeter() *procMeter {
	m := &procMeter{start: time.Now()}
	if m.busy, m.steal, m.err = machineCPU(); m.err == nil {
		m.ours, m.err = procCPU()
	}
	return m
}

func (m *procMeter) stop() (others, steal float64, err error) {
	busy, st, err := machineCPU()
	if err != nil || m.err != nil {
		return 0, 0, fmt.Errorf("measuring the machine's load: %v %v", err, m.err)
	}
	ours, err := procCPU()
	if err != nil {
		return 0, 0, err
	}
	wall := time.Since(m.start).Seconds()
	return max(0, (busy-m.busy-(ours-m.ours)).Seconds()/wall), (st - m.steal).Seconds() / wall, nil
}

// rounds runs f on every path of l.paths -runs times, like roundsOver.
func (l *procLayout) rounds(ctx context.Context, what string, f func(procPath) (commit func(), err error)) (*procNoise, error) {
	return l.roundsOver(ctx, what, l.paths, f)
}

// roundsOver runs f on every path of paths -runs times. Each round takes the paths in a
// different order (rotated by one), so that no path always runs first or after the same
// one. A run during which other processes used more than noisyCores is run again, up to
// -noisy-retries times.
func (l *procLayout) roundsOver(ctx context.Context, what string, paths []procPath, f func(procPath) (commit func(), err error)) (*procNoise, error) {
	n := &procNoise{others: map[procPath]series{}}
	runs := l.b.cfg.runs
	for r := range runs {
		k := (r + l.rotate) % len(paths)
		order := append(slices.Clone(paths[k:]), paths[:k]...)
		for _, p := range order {
			for attempt := 0; ; attempt++ {
				if err := ctx.Err(); err != nil {
					return n, err
				}
				l.b.say("%s round %d/%d: %s", what, r+1, runs, p)
				m := startProcMeter()
				commit, err := f(p)
				if err != nil {
					return n, fmt.Errorf("%s round %d (%s): %w", what, r+1, p, err)
				}
				others, steal, merr := m.stop()
				if merr == nil && others > noisyCores && attempt < l.b.cfg.noisyRetries {
					l.b.say("%s round %d/%d: %s: other processes used %.2f cores; running it again", what, r+1, runs, p, others)
					n.discarded++
					continue
				}
				commit()
				if merr != nil {
					n.unknown = true
				} else {
					n.others[p] = append(n.others[p], others)
					n.steal = max(n.steal, steal)
				}
				break
			}
		}
	}
	return n, nil
}

// note describes the machine's other load during one figure's runs.
func (n *procNoise) note(paths []procPath) string {
	if n == nil || n.unknown {
		return "the machine's other load could not be measured (/proc/stat)"
	}
	f := func(x float64) string { return fmt.Sprintf("%.2f", x) }
	var parts []string
	worst := 0.0
	for _, p := range paths {
		parts = append(parts, p.String()+" "+n.others[p].list(f))
		worst = max(worst, slices.Max(append(slices.Clone(n.others[p]), 0)))
	}
	s := fmt.Sprintf("CPU used by other processes and kernel threads during each run, in cores: %s; stolen by the hypervisor: up to %.2f", strings.Join(parts, "; "), n.steal)
	if n.discarded > 0 {
		s += fmt.Sprintf("; %d run(s) during which others used more than %.2f cores were discarded and run again", n.discarded, noisyCores)
	}
	if worst > noisyCores {
		s += fmt.Sprintf(". WARNING: up to %.2f cores were busy with other work; the runs it overlapped are skewed (raise -noisy-retries, or re-run on a quiet machine)", worst)
	}
	return s
}

// procTCPFig is one TCP bulk figure on one path over the runs.
type procTCPFig struct {
	bps      series
	cpu      [][]time.Duration // per run, per measured process (edge, connectors | relay A, B)
	verified int
}

// procTTFBFig is the time-to-first-byte figure on one path over the runs.
type procTTFBFig struct {
	med, p99      series
	failed, total int
}

// procHTTPFig is the HTTP figure on one path over the runs.
type procHTTPFig struct {
	rps, p50, p99, p999 series
	cpuPerReq           [][]float64 // per run, per measured process: CPU ns per answered request
	ok, failed, dials   int
	failures            []string
}

// procSummary is what the process layout measured.
type procSummary struct {
	paths     []procPath
	httpPaths []procPath // of http: paths and the net/http proxy floor
	controls  []bool     // false: plain, true: TLS
	streams   int
	tcp1      map[procPath]*procTCPFig
	tcpN      map[procPath]*procTCPFig
	ttfb      map[procPath]*procTTFBFig
	http      map[procPath]*procHTTPFig
	http1     map[procPath]*procHTTPFig // -wan-rtt: one client
	cold      map[procPath]series       // -wan-rtt: requests on a new member stream, ns
	noise     map[string]*procNoise     // by figure: "tcp1", "tcpN", "ttfb", "http"
}

// measureTCP measures one stream of -tcp-bytes and -tcp-streams concurrent streams sharing
// -tcp-bytes, on every path.
func (l *procLayout) measureTCP(ctx context.Context, s *procSummary) error {
	counts := []int{1, l.b.cfg.tcpStreams}
	if l.b.wan != nil {
		counts = counts[:1] // the WAN scenario: one stream
	}
	for _, streams := range counts {
		figs := map[procPath]*procTCPFig{}
		for _, p := range l.paths {
			figs[p] = &procTCPFig{}
		}
		size := max(1, l.b.cfg.tcpBytes/int64(streams))
		timeout := time.Minute + time.Duration(l.b.cfg.tcpBytes/5e6)*time.Second
		n, err := l.rounds(ctx, fmt.Sprintf("tcp %d stream(s)", streams), func(p procPath) (func(), error) {
			_, frp := frpTransports[p.kind]
			res, err := l.job(ctx, procJob{Kind: "bulk", Addrs: l.tcpAddrs(p, routeSink, streams), Size: size, Sized: frp, PIDs: l.pids(p)}, timeout)
			return func() {
				f := figs[p]
				f.bps, f.cpu, f.verified = append(f.bps, res.BPS), append(f.cpu, res.CPU), f.verified+res.Verified
			}, err
		})
		if err != nil {
			return err
		}
		if streams == 1 {
			s.tcp1, s.noise["tcp1"] = figs, n
		} else {
			s.tcpN, s.noise["tcpN"] = figs, n
		}
		if streams == l.b.cfg.tcpStreams {
			break
		}
	}
	return nil
}

// measureTTFB measures the time from dial to the first byte of -ttfb-conns sequential new
// connections per run, on every path.
func (l *procLayout) measureTTFB(ctx context.Context, s *procSummary) error {
	figs := map[procPath]*procTTFBFig{}
	for _, p := range l.paths {
		figs[p] = &procTTFBFig{}
	}
	conns := l.b.cfg.ttfbConns
	n, err := l.rounds(ctx, "ttfb", func(p procPath) (func(), error) {
		res, err := l.job(ctx, procJob{Kind: "ttfb", Addrs: l.tcpAddrs(p, routeOneByte, 2), Conns: conns}, time.Minute+time.Duration(conns)*50*time.Millisecond)
		return func() {
			f := figs[p]
			f.med, f.p99 = append(f.med, float64(res.Median)), append(f.p99, float64(res.P99First))
			f.failed, f.total = f.failed+res.ConnsFailed, f.total+conns
		}, err
	})
	s.ttfb, s.noise["ttfb"] = figs, n
	return err
}

// measureHTTP measures tiny responses at -clients keep-alive clients on every path.
func (l *procLayout) measureHTTP(ctx context.Context, s *procSummary) error {
	var err error
	s.http, s.noise["http"], err = l.measureHTTPClients(ctx, l.b.cfg.clients)
	return err
}

// measureHTTPClients measures tiny responses at clients keep-alive clients on every path
// of l.httpPaths.
func (l *procLayout) measureHTTPClients(ctx context.Context, clients int) (map[procPath]*procHTTPFig, *procNoise, error) {
	figs := map[procPath]*procHTTPFig{}
	for _, p := range l.httpPaths {
		figs[p] = &procHTTPFig{}
	}
	cfg := l.b.cfg
	warmup := min(time.Second, cfg.duration/5)
	n, err := l.roundsOver(ctx, fmt.Sprintf("http tiny, %d clients", clients), l.httpPaths, func(p procPath) (func(), error) {
		var targets []procTarget
		switch p.kind {
		case "warren", pathWarrenWS, pathWarrenQUIC:
			targets = []procTarget{{URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(l.edgeOf(p).ports.HTTP)) + "/tiny", Host: "pool." + benchDomain}}
		case pathLink:
			targets = []procTarget{{URL: "http://" + l.link.HTTP + "/tiny"}}
		case pathFRPTCP, pathFRPQUIC:
			targets = []procTarget{{URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(l.frp[p.kind].vhost)) + "/tiny", Host: "pool." + benchDomain}}
		case "direct":
			targets = []procTarget{{URL: "http://" + l.backends[0].HTTP + "/tiny"}, {URL: "http://" + l.backends[1].HTTP + "/tiny"}}
		default:
			r := l.relays[p]
			targets = []procTarget{{URL: "http://" + r.addrs[routeHTTP] + "/tiny"}, {URL: "http://" + r.addrs[routeHTTP+1] + "/tiny"}}
		}
		res, err := l.job(ctx, procJob{Kind: "http", Targets: targets, Clients: clients, ExpectLen: int64(len(tinyBody)),
			Warmup: warmup, Duration: cfg.duration, PIDs: l.httpPIDs(p)}, time.Minute+warmup+cfg.duration)
		return func() {
			f := figs[p]
			f.rps = append(f.rps, float64(res.OK)/res.Elapsed.Seconds())
			f.p50, f.p99, f.p999 = append(f.p50, float64(res.P50)), append(f.p99, float64(res.P99)), append(f.p999, float64(res.P999))
			per := make([]float64, len(res.CPU))
			for i, c := range res.CPU {
				per[i] = float64(c) / float64(max(1, res.OK))
			}
			f.cpuPerReq = append(f.cpuPerReq, per)
			f.ok, f.failed, f.dials = f.ok+res.OK, f.failed+res.Failed+res.WarmupFailed, f.dials+res.Dials
			if res.FirstFailure != "" {
				f.failures = append(f.failures, res.FirstFailure)
			}
		}, err
	})
	return figs, n, err
}

// procCols are the columns of the process layout's tables.
var procCols = []string{"figure", "Warren", "relays, io.Copy (splice)", "relays, 64 KiB buffers", "direct", "comparison", "target"}

func ctlName(t bool) string {
	if t {
		return "TLS"
	}
	return "plain"
}

// layoutNote describes the process layout, for every table.
func layoutNote() string {
	return "every party is its own process: examples/edge and 2 examples/connector built with go build and run with generated server.toml and YAML " +
		"(require_auth, load_balancing on, defaults otherwise), 2 backend processes, the load generator; Warren: load → edge → connector i → backend i (2-member groups); " +
		"relays: load → relay A → relay B → backend i, two more processes copying bytes (io.Copy between *net.TCPConn, which splices on Linux, or a 64 KiB read/write loop; " +
		"relay A names the backend to relay B in one byte per connection); direct: load → backend i. " +
		"Plain: plain TCP control connections (relays: plain TCP between A and B); TLS: the edge's control listener speaks TLS with a self-signed certificate the connectors verify (relays: TLS between A and B, a handshake per connection with session resumption)"
}

// medDur returns the median of s as a duration.
func medDur(s series) time.Duration { return time.Duration(s.median()) }

// colMedian returns the median over runs of column i of per-run vectors.
func colMedian(runs [][]float64, i int) float64 {
	var xs []float64
	for _, r := range runs {
		if i < len(r) {
			xs = append(xs, r[i])
		}
	}
	return median(xs)
}

func fmtMiBps(bps float64) string { return fmt.Sprintf("%.0f MiB/s", bps/(1<<20)) }

func (s *procSummary) tcpSection(cfg *config) *section {
	sec := &section{cols: procCols, title: fmt.Sprintf("Process layout, TCP one way to a sink (CRC-32C checked): 1 stream of %s, and %d concurrent streams sharing it; median of %d alternated rounds",
		fmtBytes(cfg.tcpBytes), s.streams, cfg.runs)}
	direct := procPath{kind: "direct"}
	figures := []struct {
		name string
		figs map[procPath]*procTCPFig
	}{{"1 stream", s.tcp1}, {fmt.Sprintf("%d streams", s.streams), s.tcpN}}
	for _, fg := range figures {
		if fg.figs == nil {
			continue
		}
		for _, t := range s.controls {
			w, sp, bf, d := fg.figs[procPath{"warren", t}], fg.figs[procPath{copySplice, t}], fg.figs[procPath{copyBuf, t}], fg.figs[direct]
			rs := ratio(w.bps.median(), sp.bps.median())
			sec.add(row{cells: []string{fg.name + ", " + ctlName(t), fmtMiBps(w.bps.median()), fmtMiBps(sp.bps.median()), fmtMiBps(bf.bps.median()), fmtMiBps(d.bps.median()),
				fmt.Sprintf("%s io.Copy relays; %s 64 KiB relays; %s direct", fmtRatio(rs), fmtRatio(ratio(w.bps.median(), bf.bps.median())), fmtRatio(ratio(w.bps.median(), d.bps.median()))),
				fmt.Sprintf("≥ %.2f× io.Copy relays", procTCPTarget)}, result: check(rs >= procTCPTarget)})
		}
	}
	for _, fg := range figures {
		if fg.figs == nil {
			continue
		}
		for _, t := range s.controls {
			gib := float64(cfg.tcpBytes) / (1 << 30)
			perGiB := func(f *procTCPFig, i int) string {
				var runs [][]float64
				for _, c := range f.cpu {
					var r []float64
					for _, x := range c {
						r = append(r, x.Seconds()/gib)
					}
					runs = append(runs, r)
				}
				return fmt.Sprintf("%.2f s", colMedian(runs, i))
			}
			w, sp, bf := fg.figs[procPath{"warren", t}], fg.figs[procPath{copySplice, t}], fg.figs[procPath{copyBuf, t}]
			sec.add(row{cells: []string{fmt.Sprintf("CPU per GiB, edge / relay A, %s, %s", fg.name, ctlName(t)), perGiB(w, 0), perGiB(sp, 0), perGiB(bf, 0)}})
			sec.add(row{cells: []string{fmt.Sprintf("CPU per GiB, each connector / relay B, %s, %s", fg.name, ctlName(t)),
				perGiB(w, 1) + " + " + perGiB(w, 2), perGiB(sp, 1), perGiB(bf, 1)}})
		}
	}
	verified, want := 0, 0
	for i, fg := range figures {
		streams := 1
		if i == 1 {
			streams = s.streams
		}
		for _, p := range s.paths {
			if f := fg.figs[p]; f != nil {
				verified, want = verified+f.verified, want+len(f.bps)*streams
			}
		}
	}
	sec.add(row{cells: []string{"streams with matching count and checksum", fmt.Sprintf("%d of %d (all paths)", verified, want)}, result: check(verified == want && want > 0)})
	sec.note("%s", layoutNote())
	sec.note("Warren: the streams go to the public port of a 2-member TCP group (one member per connector); relays and direct: stream i to backend i mod 2; CPU per GiB from /proc/<pid>/stat over each run")
	for _, fg := range figures {
		if fg.figs == nil {
			continue
		}
		var parts []string
		for _, p := range s.paths {
			parts = append(parts, p.String()+" "+fg.figs[p].bps.list(func(x float64) string { return fmt.Sprintf("%.0f", x/(1<<20)) }))
		}
		sec.note("per round, %s, MiB/s: %s", fg.name, strings.Join(parts, "; "))
	}
	if n := s.noise["tcp1"]; n != nil {
		sec.note("1 stream: %s", n.note(s.paths))
	}
	if n := s.noise["tcpN"]; n != nil {
		sec.note("%d streams: %s", s.streams, n.note(s.paths))
	}
	return sec
}

func (s *procSummary) ttfbSection(cfg *config) *section {
	sec := &section{cols: procCols, title: fmt.Sprintf("Process layout, TCP time to first byte: %d sequential new connections per run, median of %d alternated rounds", cfg.ttfbConns, cfg.runs)}
	d := s.ttfb[procPath{kind: "direct"}]
	for _, q := range []struct {
		name string
		get  func(*procTTFBFig) series
	}{{"median", func(f *procTTFBFig) series { return f.med }}, {"p99", func(f *procTTFBFig) series { return f.p99 }}} {
		for _, t := range s.controls {
			w, sp, bf := s.ttfb[procPath{"warren", t}], s.ttfb[procPath{copySplice, t}], s.ttfb[procPath{copyBuf, t}]
			dm := medDur(q.get(d))
			added := func(f *procTTFBFig) string { return fmtAdded(medDur(q.get(f)) - dm) }
			sec.add(row{cells: []string{"dial → first byte, " + q.name + ", " + ctlName(t), fmtDur(medDur(q.get(w))), fmtDur(medDur(q.get(sp))), fmtDur(medDur(q.get(bf))), fmtDur(dm),
				fmt.Sprintf("added: Warren %s; io.Copy relays %s; 64 KiB relays %s", added(w), added(sp), added(bf))}})
		}
	}
	failed, total := 0, 0
	for _, p := range s.paths {
		failed, total = failed+s.ttfb[p].failed, total+s.ttfb[p].total
	}
	sec.add(row{cells: []string{"failed connections", fmt.Sprintf("%d of %d (all paths)", failed, total), "", "", "", "", "0"}, result: check(failed == 0)})
	sec.note("%s", layoutNote())
	sec.note("the backend writes one byte on accept; through Warren the edge accepts, opens a stream to a member of the 2-member TCP group, the connector dials the backend, and the byte flows back; through the relays, relay A dials relay B (with TLS: a handshake), sends the route byte, relay B dials the backend")
	var parts []string
	for _, p := range s.paths {
		parts = append(parts, p.String()+" "+s.ttfb[p].med.list(fmtDurF))
	}
	sec.note("per round, median: %s", strings.Join(parts, "; "))
	sec.note("%s", s.noise["ttfb"].note(s.paths))
	return sec
}

// procHTTPCols are the columns of the HTTP tiny-response table: procCols and the net/http
// proxy floor, which runs in that figure only.
var procHTTPCols = []string{"figure", "Warren", "relays, io.Copy (splice)", "relays, 64 KiB buffers", "net/http proxy", "direct", "comparison", "target"}

func (s *procSummary) httpSection(cfg *config) *section {
	sec := &section{cols: procHTTPCols, title: fmt.Sprintf("Process layout, HTTP tiny responses (3 B): %d keep-alive clients, %s per run, median of %d alternated rounds", cfg.clients, cfg.duration, cfg.runs)}
	direct := s.http[procPath{kind: "direct"}]
	fig := func(kind string, t bool) *procHTTPFig {
		if f := s.http[procPath{kind, t}]; f != nil {
			return f
		}
		return &procHTTPFig{} // not measured: its cells read as zero / NaN
	}
	for _, t := range s.controls {
		w, sp, bf, hp := fig("warren", t), fig(copySplice, t), fig(copyBuf, t), fig(copyHTTP, t)
		ctl := ctlName(t)
		rr := ratio(w.rps.median(), direct.rps.median())
		sec.add(row{cells: []string{"requests/s, " + ctl, fmtRate(w.rps.median()), fmtRate(sp.rps.median()), fmtRate(bf.rps.median()), fmtRate(hp.rps.median()), fmtRate(direct.rps.median()),
			fmt.Sprintf("%s direct; %s io.Copy relays; %s net/http proxy", fmtRatio(rr), fmtRatio(ratio(w.rps.median(), sp.rps.median())), fmtRatio(ratio(w.rps.median(), hp.rps.median()))),
			fmt.Sprintf("≥ %.2f× direct", procRPSTarget)}, result: check(rr >= procRPSTarget)})
		for _, q := range []struct {
			name string
			get  func(*procHTTPFig) series
		}{{"latency p50", func(f *procHTTPFig) series { return f.p50 }}, {"latency p99", func(f *procHTTPFig) series { return f.p99 }}, {"latency p99.9", func(f *procHTTPFig) series { return f.p999 }}} {
			dm := medDur(q.get(direct))
			wa, sa, ba, ha := medDur(q.get(w))-dm, medDur(q.get(sp))-dm, medDur(q.get(bf))-dm, medDur(q.get(hp))-dm
			r := row{cells: []string{q.name + ", " + ctl, fmtDur(medDur(q.get(w))), fmtDur(medDur(q.get(sp))), fmtDur(medDur(q.get(bf))), fmtDur(medDur(q.get(hp))), fmtDur(dm),
				fmt.Sprintf("added: Warren %s; io.Copy relays %s; 64 KiB relays %s; net/http proxy %s", fmtAdded(wa), fmtAdded(sa), fmtAdded(ba), fmtAdded(ha))}}
			if q.name == "latency p99" {
				r.cells = append(r.cells, fmt.Sprintf("added ≤ io.Copy relays' added %s", fmtAdded(procP99Allowance)))
				r.result = check(wa <= sa+procP99Allowance)
			}
			sec.add(r)
		}
		cpu := func(f *procHTTPFig, i int) string { return fmtDur(time.Duration(colMedian(f.cpuPerReq, i))) }
		we := time.Duration(colMedian(w.cpuPerReq, 0))
		toProxy := ratio(float64(we), colMedian(hp.cpuPerReq, 0))
		sec.add(row{cells: []string{"CPU per request, edge / relay A, " + ctl, fmtDur(we), cpu(sp, 0), cpu(bf, 0), cpu(hp, 0), "",
			fmt.Sprintf("%s io.Copy relay A; %s net/http proxy relay A", fmtRatio(ratio(float64(we), colMedian(sp.cpuPerReq, 0))), fmtRatio(toProxy)),
			fmt.Sprintf("edge ≤ %.2f× net/http proxy", procCPURatioTarget)}, result: check(toProxy <= procCPURatioTarget)})
		sec.add(row{cells: []string{"CPU per request, each connector / relay B, " + ctl, cpu(w, 1) + " + " + cpu(w, 2), cpu(sp, 1), cpu(bf, 1), cpu(hp, 1)}})
	}
	// The backends, measured on the direct path: each request is answered by one of them, so
	// their CPU per request is the sum of both columns.
	backends := time.Duration(colMedian(direct.cpuPerReq, 0) + colMedian(direct.cpuPerReq, 1))
	sec.add(row{cells: []string{"CPU per request, the net/http backend answering it", "", "", "", "", fmtDur(backends),
		"a net/http server that parses each request and writes a 3-byte answer: the floor of an edge built on net/http's server"}})
	failed, total := 0, 0
	for _, p := range s.httpPaths {
		failed, total = failed+s.http[p].failed, total+s.http[p].ok+s.http[p].failed
	}
	sec.add(row{cells: []string{"failed requests", fmt.Sprintf("%d of %d (all paths)", failed, total), "", "", "", "", "", "0"}, result: check(failed == 0)})
	sec.note("%s", layoutNote())
	sec.note("net/http proxy: load → relay A → relay B → backend i, with an httputil.ReverseProxy with net/http's server and Transport in the edge's place (one listener and one Transport per backend, keep-alive both sides, HTTP/1.1, X-Forwarded-* set, Host kept; each upstream connection to relay B carries one route, named in its first byte) and the io.Copy relay B in the connector's place; this floor runs in this table only")
	sec.note("Warren: the clients → the edge's HTTP port, Host pool.%s → 2-member HTTP group (one member per connector); relays, net/http proxy and direct: client i → backend i mod 2; a closed loop of %d clients, each with its own keep-alive connection; CPU per request from /proc/<pid>/stat over the recorded part of each run ÷ requests answered",
		benchDomain, cfg.clients)
	sec.note("the p99 target compares the latency each path adds over direct: Warren's added p99 ≤ the io.Copy relays' added p99 + %s, per control mode", fmtDur(procP99Allowance))
	var rps, p99 []string
	for _, p := range s.httpPaths {
		rps = append(rps, p.String()+" "+s.http[p].rps.list(fmtNum))
		p99 = append(p99, p.String()+" "+s.http[p].p99.list(fmtDurF))
	}
	sec.note("per round, requests/s: %s", strings.Join(rps, "; "))
	sec.note("per round, p99: %s", strings.Join(p99, "; "))
	var dials []string
	for _, p := range s.httpPaths {
		dials = append(dials, fmt.Sprintf("%s %d", p, s.http[p].dials))
	}
	sec.note("client connections opened (all runs): %s; %d means every client kept its one keep-alive connection", strings.Join(dials, ", "), cfg.clients*cfg.runs)
	for _, p := range s.httpPaths {
		if f := s.http[p]; f.failed > 0 {
			sec.note("%s: %d failed requests, e.g. %s", p, f.failed, strings.Join(f.failures, "; "))
		}
	}
	sec.note("%s", s.noise["http"].note(s.httpPaths))
	return sec
}
