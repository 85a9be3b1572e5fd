package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/warren-tunnel/warren/tunnel"
)

// callTimeout bounds one HTTP/2 request or gRPC call of the h2 scenario, as the HTTP/1.1
// clients' ResponseHeaderTimeout bounds theirs: a stuck request fails instead of hanging the
// load.
const callTimeout = 15 * time.Second

// h2Summary is one workload of the h2 scenario over the runs.
type h2Summary struct {
	name   string // "HTTP/1.1 member", "h2c member", "gRPC"
	pool   string // the tunnel's subdomain
	grpc   bool   // gRPC unary calls rather than HTTP/2 GETs
	member string // what the edge speaks to its members: "HTTP/1.1" or "h2c"

	clients, conns           int
	tunnel, direct           []loadResult
	tunnelDials, directDials []int           // client connections opened in each run
	edgeCPU                  []time.Duration // the edge's CPU time while each tunnel run was recorded
	noise                    *noise
}

// runH2 measures HTTP/2 and gRPC through the tunnel and directly: -clients request loops
// share -h2-conns connections that speak HTTP/2 with prior knowledge (h2c) to the edge's
// public listener (Public.H2C) or, directly, to the backends. Tiny GETs go through a 2-member
// pool whose members the edge reaches over HTTP/1.1 and through one whose members it reaches
// over h2c (BackendProtocol "h2c"), both over the same two net/http backends; gRPC unary
// calls (the standard health service's Check) go through a 2-member h2c pool over two
// grpc-go servers.
func (b *bench) runH2(ctx context.Context, rep *report) error {
	backends, err := startH2CBackends(2)
	if err != nil {
		return err
	}
	defer stopHTTPBackends(backends)
	gbs, err := startGRPCBackends(2)
	if err != nil {
		return err
	}
	defer stopGRPCBackends(gbs)
	o := b.edgeOptions("h2")
	o.publicH2C = true
	h2loadWhy, h2loadOn := b.h2loadOK()
	var certPath, keyPath string
	if h2loadOn {
		dir, err := os.MkdirTemp("", "warren-bench-h2-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if certPath, keyPath, err = writeSelfSigned(dir); err != nil {
			return err
		}
		o.publicTLSCert, o.publicTLSKey = certPath, keyPath
	}
	e, err := startEdge(ctx, b.cfg.edgeMode, o, b.log, b.progress)
	if err != nil {
		return err
	}
	defer e.Close()
	httpAddrs := []string{backends[0].addr, backends[1].addr}
	grpcAddrs := []string{gbs[0].addr(), gbs[1].addr()}
	workloads := []h2Summary{
		{name: "HTTP/1.1 member", pool: "h2-http1", member: "HTTP/1.1"},
		{name: "h2c member", pool: "h2-h2c", member: "h2c"},
		{name: "gRPC", pool: "grpc", grpc: true, member: "h2c"},
	}
	for _, w := range workloads {
		spec := tunnel.TunnelSpec{Subdomain: w.pool, Group: w.pool, GroupKey: "bench"}
		targets := httpAddrs
		if w.member == "h2c" {
			spec.BackendProtocol = "h2c"
		}
		if w.grpc {
			targets = grpcAddrs
		}
		cs, err := connectGroup(ctx, e, spec, targets, b.log)
		if err != nil {
			return err
		}
		defer cs.Close()
		if err := e.waitGroup(ctx, w.pool, 2, 2); err != nil {
			return err
		}
	}
	warmup := min(time.Second, b.cfg.duration/5)
	for _, s := range workloads {
		s.clients, s.conns = b.cfg.clients, b.cfg.h2Conns
		direct := httpAddrs
		if s.grpc {
			direct = grpcAddrs
		}
		what := fmt.Sprintf("h2 %s, %d client(s) on %d connection(s)", s.name, s.clients, s.conns)
		var err error
		s.noise, err = b.runPairs(ctx, what,
			func() (func(), error) {
				var marks []time.Duration
				res, dials, err := b.h2Load(ctx, s.grpc, []string{e.Public}, s.pool+"."+benchDomain, warmup,
					func() { marks = append(marks, e.cpu()) })
				var cpu time.Duration
				if len(marks) == 2 {
					cpu = marks[1] - marks[0]
				}
				return func() {
					s.tunnel, s.tunnelDials, s.edgeCPU = append(s.tunnel, res), append(s.tunnelDials, dials), append(s.edgeCPU, cpu)
				}, err
			},
			func() (func(), error) {
				res, dials, err := b.h2Load(ctx, s.grpc, direct, "", warmup, nil)
				return func() { s.direct, s.directDials = append(s.direct, res), append(s.directDials, dials) }, err
			})
		if err != nil {
			return err
		}
		rep.h2 = append(rep.h2, s)
	}
	rep.add(h2Section(b.cfg, rep.h2[:2], e.child()))
	rep.add(h2Section(b.cfg, rep.h2[2:], e.child()))
	if b.cfg.h2load == "" {
		return nil
	}
	sum := &h2loadSummary{note: h2loadWhy}
	if h2loadOn {
		if sum, err = b.measureH2load(ctx, e, httpAddrs, certPath, keyPath); err != nil {
			return err
		}
	}
	rep.h2load = sum
	rep.add(sum.section(b.cfg))
	return nil
}

// h2Load opens -h2-conns client connections, connection j to addrs[j%len(addrs)], runs
// -clients request loops on them (loop i on connection i%conns) for warmup unrecorded and
// -duration recorded, and closes them. The connections speak HTTP/2 with prior knowledge:
// tiny GETs of /tiny, or gRPC health checks when grpcCalls is set. host is the authority the
// requests carry ("": the address itself). It returns the load's result and the connections
// the clients opened (more than -h2-conns if one had to be opened again).
func (b *bench) h2Load(ctx context.Context, grpcCalls bool, addrs []string, host string, warmup time.Duration, mark func()) (loadResult, int, error) {
	var (
		mu    sync.Mutex
		dials int
	)
	d := &net.Dialer{Timeout: 5 * time.Second}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		dials++
		mu.Unlock()
		return d.DialContext(ctx, "tcp", addr)
	}
	n := b.cfg.h2Conns
	o := loadOptions{clients: b.cfg.clients}
	if grpcCalls {
		ccs := make([]*grpc.ClientConn, 0, n)
		defer func() {
			for _, cc := range ccs {
				_ = cc.Close()
			}
		}()
		for j := range n {
			addr := addrs[j%len(addrs)]
			authority := host
			if authority == "" {
				authority = addr
			}
			cc, err := grpc.NewClient("passthrough:///"+authority,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx, addr) }))
			if err != nil {
				return loadResult{}, 0, err
			}
			ccs = append(ccs, cc)
		}
		o.caller = func(i int) func(context.Context) (int, error) {
			return grpcHealthCaller(healthpb.NewHealthClient(ccs[i%len(ccs)]))
		}
	} else {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr := &http.Transport{
			Proxy:              nil,
			Protocols:          &p,
			DialContext:        func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, addr) },
			DisableCompression: true,
		}
		ccs := make([]*http.ClientConn, 0, n)
		urls := make([]string, 0, n)
		defer func() {
			for _, cc := range ccs {
				_ = cc.Close()
			}
		}()
		for j := range n {
			addr := addrs[j%len(addrs)]
			cc, err := tr.NewClientConn(ctx, "http", addr)
			if err != nil {
				return loadResult{}, 0, fmt.Errorf("h2c connection to %s: %w", addr, err)
			}
			ccs, urls = append(ccs, cc), append(urls, "http://"+addr+"/tiny")
		}
		o.caller = func(i int) func(context.Context) (int, error) {
			return h2GetCaller(ccs[i%len(ccs)], urls[i%len(ccs)], host)
		}
	}
	res, err := runLoad(ctx, o, warmup, b.cfg.duration, mark)
	mu.Lock()
	defer mu.Unlock()
	return res, dials, err
}

// h2GetCaller returns a client's way to GET url (a 3-byte answer) on the HTTP/2 connection
// cc, with host as the authority when it is set.
func h2GetCaller(cc *http.ClientConn, url, host string) func(context.Context) (int, error) {
	buf := make([]byte, 32<<10)
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return func(context.Context) (int, error) { return 0, err }
	}
	if host != "" {
		req.Host = host
	}
	return func(ctx context.Context) (int, error) {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		return roundTrip(cc, req.WithContext(ctx), buf, int64(len(tinyBody)))
	}
}

// grpcHealthCaller returns a client's way to make one unary call, grpc.health.v1.Health/Check
// for the server as a whole; anything but SERVING is an error. Its status is the gRPC code.
func grpcHealthCaller(c healthpb.HealthClient) func(context.Context) (int, error) {
	req := &healthpb.HealthCheckRequest{}
	return func(ctx context.Context) (int, error) {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		resp, err := c.Check(ctx, req)
		if err != nil {
			return int(status.Code(err)), err
		}
		if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
			return 0, fmt.Errorf("health status %s, want SERVING", st)
		}
		return 0, nil
	}
}

// grpcBackend is a grpc-go server on loopback with the standard health service: its Check
// is a map lookup, the smallest real unary call there is.
type grpcBackend struct {
	ln   net.Listener
	srv  *grpc.Server
	done chan struct{} // closed when Serve has returned
}

func (g *grpcBackend) addr() string { return g.ln.Addr().String() }

func startGRPCBackends(n int) ([]*grpcBackend, error) {
	var gs []*grpcBackend
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stopGRPCBackends(gs)
			return nil, err
		}
		g := &grpcBackend{ln: ln, srv: grpc.NewServer(), done: make(chan struct{})}
		healthpb.RegisterHealthServer(g.srv, health.NewServer()) // "" (the server) is SERVING
		go func() { defer close(g.done); _ = g.srv.Serve(ln) }() // owned: stopGRPCBackends waits for it
		gs = append(gs, g)
	}
	return gs, nil
}

func stopGRPCBackends(gs []*grpcBackend) {
	for _, g := range gs {
		g.srv.Stop()
		<-g.done
	}
}

func (s h2Summary) unit() string {
	if s.grpc {
		return "calls"
	}
	return "requests"
}

func (s h2Summary) fmtRate(x float64) string {
	if s.grpc {
		return fmt.Sprintf("%.0f calls/s", x)
	}
	return fmtRate(x)
}

// rows are the workload's rows; suffix, when not empty, ends each metric's name.
func (s h2Summary) rows(suffix string, childEdge bool) []row {
	var rows []row
	name := func(m string) string {
		if suffix == "" {
			return m
		}
		return m + ", " + suffix
	}
	rps := func(r loadResult) float64 { return r.rps() }
	tr, dr := seriesOf(s.tunnel, rps), seriesOf(s.direct, rps)
	rows = append(rows, row{metric: name(s.unit() + "/s"), tunnel: s.fmtRate(tr.median()), direct: s.fmtRate(dr.median()),
		compare: fmtRatio(ratio(tr.median(), dr.median()))})
	for _, p := range []struct {
		name string
		q    float64
	}{{"latency p50", 0.50}, {"latency p99", 0.99}, {"latency p99.9", 0.999}} {
		pf := func(r loadResult) float64 { return float64(r.pct(p.q)) }
		tm, dm := time.Duration(seriesOf(s.tunnel, pf).median()), time.Duration(seriesOf(s.direct, pf).median())
		rows = append(rows, row{metric: name(p.name), tunnel: fmtDur(tm), direct: fmtDur(dm), compare: fmtAdded(tm - dm)})
	}
	tf, tn, df, dn := s.failed()
	rows = append(rows, row{metric: name("failed " + s.unit() + " (all runs)"), tunnel: fmt.Sprintf("%d of %d", tf, tn),
		direct: fmt.Sprintf("%d of %d", df, dn), target: "0", result: check(tf == 0)})
	if childEdge {
		var per []float64
		for i, r := range s.tunnel {
			if r.ok > 0 {
				per = append(per, float64(s.edgeCPU[i])/float64(r.ok))
			}
		}
		if len(per) > 0 {
			rows = append(rows, row{metric: name("edge CPU per " + strings.TrimSuffix(s.unit(), "s")), tunnel: fmtDur(time.Duration(median(per)))})
		}
	}
	return rows
}

// failed counts the failed requests (recorded and during warm-up) and all requests of the
// tunnel and direct runs.
func (s h2Summary) failed() (tf, tn, df, dn int) {
	for _, r := range s.tunnel {
		tf, tn = tf+r.failed+r.warmupFailed, tn+r.requests()
	}
	for _, r := range s.direct {
		df, dn = df+r.failed+r.warmupFailed, dn+r.requests()
	}
	return tf, tn, df, dn
}

func seriesOf(rs []loadResult, f func(loadResult) float64) series {
	out := make(series, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// h2Section is the table of the HTTP/2 workloads (one row group per member protocol) or of
// the gRPC one.
func h2Section(cfg *config, ss []h2Summary, childEdge bool) *section {
	sec := &section{}
	grpcCalls := ss[0].grpc
	if grpcCalls {
		sec.title = fmt.Sprintf("gRPC unary calls (grpc.health.v1.Health/Check), h2c to the edge and to the members: %d callers on %d connection(s), %s per run, median of %d runs",
			ss[0].clients, ss[0].conns, cfg.duration, cfg.runs)
	} else {
		sec.title = fmt.Sprintf("HTTP/2, tiny responses (3 B), h2c to the edge: %d request loops on %d connection(s), %s per run, median of %d runs",
			ss[0].clients, ss[0].conns, cfg.duration, cfg.runs)
	}
	for _, s := range ss {
		suffix := ""
		if !grpcCalls {
			suffix = s.name
		}
		for _, r := range s.rows(suffix, childEdge) {
			sec.add(r)
		}
	}
	if grpcCalls {
		sec.note("tunnel: %d gRPC client connections (grpc-go, insecure credentials: h2c) → edge public listener with PublicH2C, authority %s.%s → 2-member group, BackendProtocol h2c (2 connector sessions → 2 grpc-go servers; the edge keeps one HTTP/2 connection to each member); direct: the same callers with one connection to each server",
			ss[0].conns, ss[0].pool, benchDomain)
		sec.note("each call is a unary Check of the standard health service (protobuf, no code generated here), its deadline sent as grpc-timeout")
	} else {
		sec.note("tunnel: %d HTTP/2 connections with prior knowledge (h2c; no TLS, so no encryption is measured) → edge public listener with PublicH2C, authority <pool>.%s → a 2-member group over the same 2 net/http backends, which serve HTTP/1.1 and h2c; HTTP/1.1 member: the edge sends each request over HTTP/1.1 on its pooled keep-alive tunnel streams (one request at a time on each); h2c member: BackendProtocol h2c, the edge multiplexes the requests on one HTTP/2 connection per member, carried on one tunnel stream; direct: the same request loops with one h2c connection to each backend (the same load for both member protocols, measured alternately with each)",
			ss[0].conns, benchDomain)
	}
	sec.note("loop i sends on connection i mod %d, each %s as soon as its previous one was answered (a closed loop of %d in flight), with a %s deadline; warm-up %s unrecorded, on fresh connections every run",
		ss[0].conns, strings.TrimSuffix(ss[0].unit(), "s"), ss[0].clients, callTimeout, min(time.Second, cfg.duration/5))
	for _, s := range ss {
		label := ""
		if !grpcCalls {
			label = s.name + ": "
		}
		rps := func(r loadResult) float64 { return r.rps() }
		p99 := func(r loadResult) float64 { return float64(r.pct(0.99)) }
		sec.note("%sper run, %s/s: tunnel %s; direct %s; p99: tunnel %s; direct %s", label, s.unit(),
			seriesOf(s.tunnel, rps).list(fmtNum), seriesOf(s.direct, rps).list(fmtNum),
			seriesOf(s.tunnel, p99).list(fmtDurF), seriesOf(s.direct, p99).list(fmtDurF))
		td, dd := 0, 0
		for i := range s.tunnel {
			td += s.tunnelDials[i]
		}
		for i := range s.direct {
			dd += s.directDials[i]
		}
		sec.note("%s%s", label, s.noise.note())
		sec.note("%sclient connections opened (all runs): tunnel %d, direct %d; %d means no connection was opened again", label, td, dd, s.conns*cfg.runs)
		for i, r := range s.tunnel {
			if r.failed+r.warmupFailed > 0 {
				sec.note("%stunnel run %d: %d failed %s, e.g. %s", label, i+1, r.failed+r.warmupFailed, s.unit(), firstFailure(r))
			}
		}
	}
	return sec
}
