package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/warren-tunnel/warren/tunnel"
)

// memPerConnectorTarget is the target for the edge's memory per idle connector.
const memPerConnectorTarget = 64 << 10

// memTargetConnectors is how many idle connectors one edge must hold.
const memTargetConnectors = 10000

// memDataConnsPerSession is how many idle data connections a connector keeps open while it
// has a TCP tunnel (the tunnel package's pool size), for -mem-proto tcp's open-file count.
const memDataConnsPerSession = 4

// memTCPPorts is how many TCP ports the bench's edge has (pickPortRange): one per TCP group.
const memTCPPorts = 100

// memSummary is the edge's memory at one connector count.
type memSummary struct {
	n, groups                       int
	connected, registered           int
	base, sessions, members, closed memSample
	// fdsBase, fdsSessions and fdsMembers are the edge's open files (sockets, mostly) at
	// the same moments as base, sessions and members.
	fdsBase, fdsSessions, fdsMembers     int
	connectTime, registerTime, closeTime time.Duration
	reachable, checked                   int
}

// perConnector returns (b − a) / n for a field of two samples.
func (s memSummary) per(a, b memSample, f func(memSample) float64) float64 {
	return (f(b) - f(a)) / float64(s.n)
}

func heapOf(m memSample) float64  { return float64(m.HeapInuse) }
func rssOf(m memSample) float64   { return float64(m.RSS) }
func stackOf(m memSample) float64 { return float64(m.StackInuse) }
func gorOf(m memSample) float64   { return float64(m.Goroutines) }

// runMem measures the edge's memory per idle connector session and per idle member.
func (b *bench) runMem(ctx context.Context, rep *report) error {
	backends, err := startHTTPBackends(1, false)
	if err != nil {
		return err
	}
	defer stopHTTPBackends(backends)
	for _, n := range b.cfg.memConnectors {
		s, err := b.memOnce(ctx, n, backends[0].addr)
		if err != nil {
			return fmt.Errorf("%d connectors: %w", n, err)
		}
		rep.mem = append(rep.mem, s)
	}
	rep.add(b.memSection(rep.mem))
	return nil
}

// route returns the subdomain (and group) of connector i.
func (b *bench) route(i int) (sub, grp string) {
	if b.cfg.memGroupSize == 0 {
		return fmt.Sprintf("solo%d", i), ""
	}
	g := fmt.Sprintf("m%d", i/b.cfg.memGroupSize)
	return g, g
}

func (b *bench) memOnce(ctx context.Context, n int, target string) (s memSummary, err error) {
	s.n = n
	// The edge runs in its own process, whatever -edge says, so that its memory is its own.
	o := b.edgeOptions(fmt.Sprintf("mem%d", n))
	o.quic = b.cfg.memTransport == "quic"
	if b.cfg.memProfile != "" {
		o.memProfileRate = 4096
	}
	e, err := startEdge(ctx, "child", o, b.log, b.progress)
	if err != nil {
		return s, err
	}
	defer func() {
		if cerr := e.Close(); err == nil {
			err = cerr
		}
	}()
	if s.base, err = e.mem(ctx); err != nil {
		return s, err
	}
	if s.fdsBase, err = countFDs(e.PID); err != nil {
		return s, err
	}

	sessions := make([]*tunnel.Session, n)
	closed := false
	closeAll := func() time.Duration {
		start := time.Now()
		var g errgroup.Group
		g.SetLimit(b.cfg.memParallel)
		for _, sess := range sessions {
			if sess != nil {
				g.Go(sess.Close)
			}
		}
		_ = g.Wait()
		closed = true
		return time.Since(start)
	}
	defer func() {
		if !closed {
			closeAll()
		}
	}()
	// Bounded: opening and registering may take at most 5 minutes each.
	phase := func(what string, f func(ctx context.Context, i int) error) (time.Duration, int, error) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		start := time.Now()
		var done atomic.Int64
		g, gctx := errgroup.WithContext(pctx)
		g.SetLimit(b.cfg.memParallel)
		for i := range n {
			g.Go(func() error {
				if err := f(gctx, i); err != nil {
					return fmt.Errorf("%s %d: %w", what, i, err)
				}
				done.Add(1)
				return nil
			})
		}
		err := g.Wait()
		return time.Since(start), int(done.Load()), err
	}

	opts := []tunnel.Option{tunnel.WithLogger(b.log), tunnel.WithReconnect(false)}
	addr := e.Control
	if o.quic {
		qo, err := e.quicOptions()
		if err != nil {
			return s, err
		}
		opts, addr = append(opts, qo...), e.QUIC
	}
	b.say("mem %d: opening %d connector sessions (%s), %d at a time", n, n, b.cfg.memTransport, b.cfg.memParallel)
	s.connectTime, s.connected, err = phase("connector", func(ctx context.Context, i int) error {
		sess, err := tunnel.Dial(ctx, addr, opts...)
		sessions[i] = sess
		return err
	})
	if err != nil {
		return s, err
	}
	if s.sessions, err = e.mem(ctx); err != nil {
		return s, err
	}
	if s.fdsSessions, err = countFDs(e.PID); err != nil {
		return s, err
	}

	tcp := b.cfg.memProto == "tcp"
	var portsMu sync.Mutex
	ports := map[string]int{} // TCP: each group's public port
	b.say("mem %d: registering one %s tunnel per session", n, strings.ToUpper(b.cfg.memProto))
	s.registerTime, s.registered, err = phase("tunnel", func(ctx context.Context, i int) error {
		sub, grp := b.route(i)
		spec := tunnel.TunnelSpec{Subdomain: sub, Group: grp}
		if grp != "" {
			spec.GroupKey = "bench"
		}
		if tcp {
			spec = tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: grp, GroupKey: "bench"}
		}
		t, err := sessions[i].Forward(ctx, spec, target)
		if err == nil && tcp {
			portsMu.Lock()
			ports[grp] = t.Port()
			portsMu.Unlock()
		}
		return err
	})
	if err != nil {
		return s, err
	}
	if tcp && !o.quic { // over QUIC there are no data connections
		// Each connector now opens its idle data connections: measured once they are all
		// there (the edge's open files stop growing).
		b.say("mem %d: waiting for the connectors' data connections", n)
		if _, err = settledFDs(ctx, e.PID, s.fdsSessions+n*memDataConnsPerSession); err != nil {
			return s, err
		}
	}
	if s.members, err = e.mem(ctx); err != nil {
		return s, err
	}
	if s.fdsMembers, err = countFDs(e.PID); err != nil {
		return s, err
	}
	gs, err := e.groups(ctx)
	if err != nil {
		return s, err
	}
	s.groups = len(gs)
	heapProfile := func(state string) error {
		if b.cfg.memProfile == "" {
			return nil
		}
		ext := filepath.Ext(b.cfg.memProfile)
		return e.saveHeapProfile(ctx, fmt.Sprintf("%s-%d-%s%s", strings.TrimSuffix(b.cfg.memProfile, ext), n, state, ext))
	}
	if err := heapProfile("connected"); err != nil {
		return s, err
	}

	// Only now (the memory is measured) check that the routes work: one request to each of
	// up to 200 routes spread over all of them.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	step := max(1, n/200)
	if b.cfg.memGroupSize > 0 {
		step = max(step, b.cfg.memGroupSize)
	}
	for i := 0; i < n; i += step {
		sub, grp := b.route(i)
		s.checked++
		if tcp {
			if tcpRouteAnswers(ctx, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[grp]))) {
				s.reachable++
			}
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Public+"/tiny", nil)
		if err != nil {
			return s, err
		}
		req.Host = sub + "." + benchDomain
		if resp, err := hc.Do(req); err == nil {
			if resp.StatusCode == http.StatusOK {
				s.reachable++
			}
			_ = resp.Body.Close()
		}
	}

	b.say("mem %d: closing the sessions", n)
	s.closeTime = closeAll()
	// The edge ends a session's goroutines asynchronously; give it a moment to settle.
	for range 50 {
		if s.closed, err = e.mem(ctx); err != nil || s.closed.Goroutines <= s.base.Goroutines+5 {
			break
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return s, err
		}
	}
	if err != nil {
		return s, err
	}
	return s, heapProfile("closed")
}

func (b *bench) memSection(ss []memSummary) *section {
	layout := fmt.Sprintf("groups of %d members (HTTP, one subdomain per group)", b.cfg.memGroupSize)
	switch {
	case b.cfg.memProto == "tcp":
		layout = fmt.Sprintf("groups of %d members (TCP, one public port per group; each connector keeps %d idle data connections to the edge besides its control connection, which the open files count)", b.cfg.memGroupSize, memDataConnsPerSession)
	case b.cfg.memGroupSize == 0:
		layout = "solo HTTP tunnels (one subdomain each)"
	}
	title := "Edge memory per idle connector (edge in its own process; after runtime.GC and debug.FreeOSMemory)"
	if b.cfg.memTransport == "quic" {
		title = "Edge memory per idle connector over QUIC (edge in its own process; after runtime.GC and debug.FreeOSMemory)"
	}
	sec := &section{title: title}
	measured10k := false
	for _, s := range ss {
		all := s.connected == s.n && s.registered == s.n
		target, res := "all", check(all)
		if s.n >= memTargetConnectors {
			target = fmt.Sprintf("%d on one edge", memTargetConnectors)
			measured10k = true
		}
		sec.add(row{metric: fmt.Sprintf("N=%d: connectors holding one registered tunnel", s.n),
			tunnel: fmt.Sprintf("%d of %d (%d groups)", min(s.connected, s.registered), s.n, s.groups), target: target, result: res})
		for _, m := range []struct {
			name string
			f    func(memSample) float64
		}{{"heap (HeapInuse)", heapOf}, {"RSS (VmRSS)", rssOf}} {
			v := s.per(s.base, s.members, m.f)
			sec.add(row{metric: fmt.Sprintf("N=%d: edge %s per connector", s.n, m.name), tunnel: fmtKiB(v),
				target: "≤ 64 KiB", result: check(v <= memPerConnectorTarget)})
			sec.add(row{metric: fmt.Sprintf("N=%d:   of which per session (no tunnel)", s.n), tunnel: fmtKiB(s.per(s.base, s.sessions, m.f))})
			sec.add(row{metric: fmt.Sprintf("N=%d:   of which per member", s.n), tunnel: fmtKiB(s.per(s.sessions, s.members, m.f))})
		}
		sec.add(row{metric: fmt.Sprintf("N=%d: edge goroutine stacks per connector", s.n), tunnel: fmtKiB(s.per(s.base, s.members, stackOf))})
		sec.add(row{metric: fmt.Sprintf("N=%d: edge goroutines per connector", s.n), tunnel: fmt.Sprintf("%.2f", s.per(s.base, s.members, gorOf))})
		sec.add(row{metric: fmt.Sprintf("N=%d: edge open files (sockets) per connector", s.n), tunnel: fmt.Sprintf("%.2f", float64(s.fdsMembers-s.fdsBase)/float64(s.n))})
		sec.add(row{metric: fmt.Sprintf("N=%d: routes answering 200 afterwards", s.n), tunnel: fmt.Sprintf("%d of %d checked", s.reachable, s.checked),
			target: "all", result: check(s.reachable == s.checked)})
		sec.note("N=%d: edge baseline heap %s, RSS %s, %d goroutines; with the connectors heap %s, RSS %s, %d goroutines",
			s.n, fmtMiB(s.base.HeapInuse), fmtMiB(uint64(s.base.RSS)), s.base.Goroutines, fmtMiB(s.members.HeapInuse), fmtMiB(uint64(s.members.RSS)), s.members.Goroutines)
		sec.note("N=%d: opened %d sessions in %s, registered their tunnels in %s, closed them in %s (%d at a time); after closing: heap %s, RSS %s, %d goroutines",
			s.n, s.n, s.connectTime.Round(time.Millisecond), s.registerTime.Round(time.Millisecond), s.closeTime.Round(time.Millisecond), b.cfg.memParallel,
			fmtMiB(s.closed.HeapInuse), fmtMiB(uint64(s.closed.RSS)), s.closed.Goroutines)
	}
	if !measured10k {
		sec.note("the %d-connector target was not measured in this run: every -mem-connectors count is below it", memTargetConnectors)
	}
	sec.note("after closing, the edge's heap stays above its baseline mostly because the Go runtime never frees a goroutine's descriptor (about 0.5 KiB each, kept for reuse) once created, and each connector had its goroutines running (see the rows above); goroutines return to the baseline count (see -mem-heapprofile)")
	conn := "its own TCP connection"
	if b.cfg.memTransport == "quic" {
		conn = "its own QUIC connection, on the edge's one UDP socket; a session over QUIC has no data connections, and the edge issues no TLS session tickets"
	}
	sec.note("layout: %s; the members' local target is one backend, and no request flows until the memory is measured; every connector is its own session (%s)", layout, conn)
	return sec
}

// settledFDs waits until process pid has at least want open files, or until their count
// has not changed for a second (at most a minute), and returns the count.
func settledFDs(ctx context.Context, pid, want int) (int, error) {
	last, since := -1, time.Now()
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := countFDs(pid)
		if err != nil || n >= want || time.Now().After(deadline) {
			return n, err
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= time.Second {
			return n, nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return n, err
		}
	}
}

// tcpRouteAnswers reports whether a GET /tiny through the TCP route at addr (its backend is
// the HTTP backend) is answered 200.
func tcpRouteAnswers(ctx context.Context, addr string) bool {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /tiny HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func fmtMiB(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
