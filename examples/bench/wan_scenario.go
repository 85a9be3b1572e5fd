package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-tunnel/warren/examples/bench/internal/wan"
)

// The WAN scenario (-layout processes -wan-rtt RTT): the process layout with a slow link
// between the connectors and the edge, and only there.
//
// This kernel has no netem, so the link is made by internal/wan: the host process checks
// that it can (wan.Check; when not, it prints why and exits 0 having run nothing) and
// re-executes the whole bench, with the same flags and the hidden subcommand
// procWANInsideCommand, in a fresh network namespace whose lo carries everything
// (wan.Run). There the link hook of the layout starts, for each port that stands for the
// link — each edge's control port, each relay B's port, and the ports of a backend reached
// over the link (pathLink, the plain TCP yardstick) — a delaying process of its own
// (procWANDelayCommand, under `chrt -f 10` when it can) that holds that port's packets for
// RTT/2 each way. Client → edge and connector → backend stay fast.
//
// Paths: Warren (per -control), the io.Copy relays (per -control: relay A → delayed relay B
// → backend), plain TCP over the link (the load generator straight to a backend whose ports
// are delayed; no TLS) and direct (no link). Figures: HTTP tiny responses with 1 client and
// with -clients clients (p50, p99), and one TCP stream of -tcp-bytes (64 MiB by default
// here: at ~50 MiB/s a 1 GiB stream would take 20 s per path and round).

// Hidden subcommands of the WAN scenario.
const (
	procWANDelayCommand  = "proc-wan-delay"  // one delaying process for one port
	procWANInsideCommand = "proc-wan-inside" // the whole bench inside the namespace
)

// wanRTTimeLimit is the CPU time (µs) a delaying process may use at real-time priority
// without a blocking system call before the kernel kills it (RLIMIT_RTTIME); a working one
// blocks every few packets.
const wanRTTimeLimit = 2_000_000

// pathLink is the kind of the path "plain TCP over the link".
const pathLink = "link"

// wanScenarios are the scenarios the WAN scenario runs.
var wanScenarios = []string{"http", "tcp", "cold"}

// The "cold" figure: single requests through Warren that each open a new member stream,
// because the edge's idle streams to the members expired (tunnel.ServerConfig's
// Timeouts.IdleStream, 4 s by default and not set by examples/edge) — the request the issue's
// one-round-trip change is about, which the keep-alive workloads above hardly ever make once
// warm.
const (
	wanColdIdle    = 4500 * time.Millisecond // > the edge's Timeouts.IdleStream
	wanColdSamples = 2                       // per path and round
)

// wanDefaultTCPBytes is -tcp-bytes when -wan-rtt is given without it.
const wanDefaultTCPBytes = "64MiB"

// The WAN targets.
const (
	wanOneClientAllowance = 2 * time.Millisecond // one-client p50 and p99 ≤ RTT + this
	wanManyClientsAllow   = 5 * time.Millisecond // -clients p99 ≤ RTT + this
	wanTCPTarget          = 0.90                 // one stream ÷ plain TCP over the link
)

// wanFlags checks -wan-rtt and -wan-json.
func (c *config) wanFlags(set map[string]bool) error {
	switch {
	case set["wan-rtt"] && (c.wanRTT < 2*time.Millisecond || c.wanRTT > 10*time.Second):
		return fmt.Errorf("-wan-rtt must be between 2ms and 10s, got %v", c.wanRTT)
	case set["wan-json"] && c.wanRTT == 0:
		return errors.New("-wan-json needs -wan-rtt")
	}
	return nil
}

// wanSetUp starts the WAN scenario. Outside a namespace of wan.Run it re-executes the bench
// inside one (or says why it cannot) and returns inside false: the caller is done. Inside,
// it sets b.wan and the link hook and returns inside true.
func (b *bench) wanSetUp(ctx context.Context, stdout, stderr io.Writer) (inside bool, err error) {
	if !wan.InNamespace() {
		if err := wan.Check(); err != nil {
			fmt.Fprintf(stdout, "WAN scenario skipped, nothing was run: %v\n", err)
			return false, nil
		}
		self, err := os.Executable()
		if err != nil {
			return false, err
		}
		b.say("WAN: re-executing the bench in a network namespace of its own, %v added to the connector↔edge link", b.cfg.wanRTT)
		return false, wan.Run(ctx, append([]string{self, procWANInsideCommand}, b.cfg.args...), stdout, stderr)
	}
	self, err := os.Executable()
	if err != nil {
		return false, err
	}
	if n := b.cfg.wanMTU; n > 0 {
		// lo's MTU is the size of the packets the link delays and drops (the kernel
		// segments a larger send before it queues the pieces): 65536 by default, where TCP
		// sends up to 64 KiB per packet and QUIC ~1.4 KiB, so a per-packet loss hits QUIC
		// far more often per byte; an Ethernet-like 1500 evens that out.
		out, err := exec.CommandContext(ctx, "ip", "link", "set", "lo", "mtu", strconv.Itoa(n)).CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("-wan-mtu: ip link set lo mtu %d: %w: %s", n, err, strings.TrimSpace(string(out)))
		}
	}
	w := &wanLink{rtt: b.cfg.wanRTT, self: self, buffers: tcpBufferLimits()}
	if p, err := exec.LookPath("chrt"); err != nil {
		w.prioNote = fmt.Sprintf("chrt not found (%v): the delaying processes ran at normal priority, so their releases may be late on a busy machine", err)
	} else if out, err := exec.CommandContext(ctx, p, "-f", "10", "true").CombinedOutput(); err != nil {
		w.prioNote = fmt.Sprintf("chrt -f 10 failed (%v: %s): the delaying processes ran at normal priority, so their releases may be late on a busy machine", err, strings.TrimSpace(string(out)))
	} else {
		w.chrt = p
		w.prioNote = "each delaying process ran alone at real-time priority (chrt -f 10)"
	}
	b.wan, b.linkHook = w, w.hook
	return true, nil
}

// wanInsideMain is the bench re-executed inside the WAN namespace.
func wanInsideMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if !wan.InNamespace() {
		fmt.Fprintf(stderr, "bench: %s runs only inside the namespace -wan-rtt makes\n", procWANInsideCommand)
		return 2
	}
	defer stopProcChildren()
	if _, err := run(ctx, args, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "bench (inside the WAN namespace):", err)
		return 1
	}
	return 0
}

// wanLink delays the link ports inside the namespace and collects what the delaying
// processes said when they stopped.
type wanLink struct {
	rtt      time.Duration
	self     string // this binary
	chrt     string // the chrt command, "" when it cannot be used
	prioNote string
	buffers  string // the kernel's TCP buffer limits

	mu      sync.Mutex
	sec     *section // the WAN table, which gets the "figures suspect" notes
	ports   []int
	suspect []string
	delays  []*procChild
}

// wanDelayReady and wanDelayResult are what a delaying process says: once its rules are
// in, and when it has stopped.
type (
	wanDelayReady struct {
		PID int `json:"pid"`
	}
	wanDelayResult struct {
		Err     string `json:"err,omitempty"`
		Late    bool   `json:"late,omitempty"`
		Dropped bool   `json:"dropped,omitempty"`
	}
)

// hook is the layout's link hook: it delays port by RTT/2 each way in a process of its
// own until the returned stop is called.
func (w *wanLink) hook(ctx context.Context, port int) (func() error, error) {
	bin, args := w.self, []string{procWANDelayCommand, "-port", strconv.Itoa(port), "-delay", (w.rtt / 2).String()}
	if w.chrt != "" {
		bin, args = w.chrt, append([]string{"-f", "10", w.self}, args...)
	}
	c, err := startProcChild(fmt.Sprintf("WAN delayer (port %d)", port), bin, args, true, nil)
	if err != nil {
		return nil, err
	}
	var ready wanDelayReady
	if err := c.readJSON(ctx, 30*time.Second, &ready); err != nil {
		return nil, errors.Join(err, c.stop(5*time.Second))
	}
	w.mu.Lock()
	w.ports = append(w.ports, port)
	w.delays = append(w.delays, c)
	w.mu.Unlock()
	return func() error {
		serr := c.stop(10 * time.Second)
		var res wanDelayResult
		select {
		case l := <-c.lines:
			if err := json.Unmarshal([]byte(l), &res); err != nil {
				res = wanDelayResult{Err: fmt.Sprintf("the delaying process said %q: %v", l, err)}
			}
		default:
			res.Err = fmt.Sprintf("the delaying process said nothing when it stopped (%s: %s)", c.cmd.ProcessState, c.stderr)
		}
		if res.Err != "" {
			w.mu.Lock()
			why := "the delay failed"
			switch {
			case res.Late && res.Dropped:
				why = "packets were released late and dropped"
			case res.Late:
				why = "packets were released late (the delaying process lacked CPU)"
			case res.Dropped:
				why = "packets were dropped that no loss was asked for"
			}
			msg := fmt.Sprintf("FIGURES SUSPECT: on port %d %s: %s", port, why, res.Err)
			w.suspect = append(w.suspect, msg)
			if w.sec != nil {
				w.sec.note("%s", msg)
			}
			w.mu.Unlock()
		}
		return serr
	}, nil
}

// close kills the delaying processes still running (on the way out after an error; the
// layout's teardown has stopped them otherwise).
func (w *wanLink) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	ds := w.delays
	w.mu.Unlock()
	for _, c := range ds {
		_ = c.stop(0)
	}
}

// procWANDelayMain is one delaying process: it delays -port by -delay each way (wan.Delay),
// says so on stdout, and when its stdin ends stops and says how it went.
func procWANDelayMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench wan-delay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.Int("port", 0, "the TCP port whose packets are delayed")
	delay := fs.Duration("delay", 0, "the one-way delay")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Under chrt -f a process that stops blocking would take a core from everything else
	// on the machine: past wanRTTimeLimit of CPU without a blocking call the kernel kills
	// it, its port goes dark and the run fails loudly instead.
	if err := limitRTTime(wanRTTimeLimit); err != nil {
		fmt.Fprintln(stderr, "bench wan-delay: RLIMIT_RTTIME:", err)
		return 1
	}
	link, err := wan.Start(context.Background(), *port, *delay, 0)
	if err != nil {
		fmt.Fprintln(stderr, "bench wan-delay:", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(wanDelayReady{PID: os.Getpid()}); err != nil {
		_ = link.Stop()
		return 1
	}
	// Each line on stdin is a wanDelayCommand (a new loss), answered with wanDelayReady;
	// the end of stdin stops the delay.
	dec := json.NewDecoder(stdin)
	for {
		var cmd wanDelayCommand
		if err := dec.Decode(&cmd); err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintln(stderr, "bench wan-delay: reading a command:", err)
			}
			break
		}
		if err := link.SetLoss(cmd.Loss); err != nil {
			fmt.Fprintln(stderr, "bench wan-delay:", err)
			break
		}
		if err := enc.Encode(wanDelayReady{PID: os.Getpid()}); err != nil {
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdin)
	var res wanDelayResult
	if err := link.Stop(); err != nil {
		res = wanDelayResult{Err: err.Error(), Late: errors.Is(err, wan.ErrLate), Dropped: errors.Is(err, wan.ErrDropped)}
	}
	if err := enc.Encode(res); err != nil {
		return 1
	}
	return 0
}

// tcpBufferLimits describes the kernel's TCP buffer limits in this namespace, which cap one
// TCP connection over a long link (in flight ≤ about the send buffer).
func tcpBufferLimits() string {
	var parts []string
	for _, name := range []string{"net/ipv4/tcp_wmem", "net/ipv4/tcp_rmem", "net/core/wmem_max", "net/core/rmem_max"} {
		b, err := os.ReadFile("/proc/sys/" + name)
		v := strings.Join(strings.Fields(string(b)), " ")
		if err != nil {
			v = "unreadable: " + err.Error()
		}
		parts = append(parts, strings.ReplaceAll(name[strings.Index(name, "/")+1:], "/", ".")+" = "+v)
	}
	return strings.Join(parts, "; ")
}

// startLinkBackend starts the backend of the path "plain TCP over the link": its HTTP
// server and sink listen on ports the link hook delays.
func (l *procLayout) startLinkBackend(ctx context.Context) error {
	ps, err := freePorts(2, l.taken)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if err := l.callHook(ctx, p); err != nil {
			return err
		}
	}
	addr := func(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }
	c, err := l.startRole("backend over the link", procBackendCommand, "-http", addr(ps[0]), "-sink", addr(ps[1]))
	if err != nil {
		return err
	}
	return c.readJSON(ctx, 30*time.Second, &l.link)
}

// runWAN measures the WAN scenario's figures and adds its table to rep.
func (l *procLayout) runWAN(ctx context.Context, s *procSummary, rep *report) error {
	cfg := l.b.cfg
	if cfg.wanLoss != nil {
		return l.runWANLoss(ctx, s, rep)
	}
	for _, name := range cfg.scenarios {
		start := time.Now()
		l.b.say("WAN: %s", name)
		var err error
		switch name {
		case "http":
			if s.http1, s.noise["http1"], err = l.measureHTTPClients(ctx, 1); err == nil {
				err = l.measureHTTP(ctx, s)
			}
		case "tcp":
			s.streams = 1
			err = l.measureTCP(ctx, s)
		case "cold":
			err = l.measureCold(ctx, s)
		}
		if err != nil {
			return fmt.Errorf("WAN, %s: %w", name, err)
		}
		l.b.say("WAN: %s done in %s", name, time.Since(start).Round(100*time.Millisecond))
	}
	sec := l.b.wan.section(cfg, s)
	rep.add(sec)
	return nil
}

// wanCols are the WAN table's columns.
var wanCols = []string{"figure", "Warren", "relays, io.Copy (splice)", "plain TCP over the link", "direct (no link)", "comparison", "target"}

// section builds the WAN table; the delaying processes' complaints are added to it when
// they stop.
func (w *wanLink) section(cfg *config, s *procSummary) *section {
	sec := &section{cols: wanCols, title: fmt.Sprintf("WAN: %v round trip between the connectors and the edge only, median of %d alternated rounds", w.rtt, cfg.runs)}
	link, direct := procPath{kind: pathLink}, procPath{kind: "direct"}
	floorNoted := map[string]bool{}
	for _, t := range s.controls {
		ctl := ctlName(t)
		wp, rp := procPath{"warren", t}, procPath{copySplice, t}
		httpRows := []struct {
			name  string
			figs  map[procPath]*procHTTPFig
			get   func(*procHTTPFig) series
			allow time.Duration
		}{
			{"HTTP 1 client, p50", s.http1, func(f *procHTTPFig) series { return f.p50 }, wanOneClientAllowance},
			{"HTTP 1 client, p99", s.http1, func(f *procHTTPFig) series { return f.p99 }, wanOneClientAllowance},
			{fmt.Sprintf("HTTP %d clients, p50", cfg.clients), s.http, func(f *procHTTPFig) series { return f.p50 }, 0},
			{fmt.Sprintf("HTTP %d clients, p99", cfg.clients), s.http, func(f *procHTTPFig) series { return f.p99 }, wanManyClientsAllow},
		}
		for _, hr := range httpRows {
			if hr.figs == nil {
				continue
			}
			v := func(p procPath) time.Duration { return medDur(hr.get(hr.figs[p])) }
			r := row{cells: []string{hr.name + ", " + ctl, fmtDur(v(wp)), fmtDur(v(rp)), fmtDur(v(link)), fmtDur(v(direct)),
				fmt.Sprintf("Warren %.2f RTT, relays %.2f RTT, link %.2f RTT", float64(v(wp))/float64(w.rtt), float64(v(rp))/float64(w.rtt), float64(v(link))/float64(w.rtt))}}
			if hr.allow > 0 {
				r.cells = append(r.cells, fmt.Sprintf("≤ RTT + %s", fmtDur(hr.allow)))
				r.result = check(v(wp) <= w.rtt+hr.allow)
				if lv := v(link); lv > w.rtt+hr.allow && !floorNoted[hr.name] {
					floorNoted[hr.name] = true
					sec.note("%s: plain TCP over the link itself took %s, above the target's RTT + %s: on this machine the link (the delaying processes' releases, the clients' scheduling) adds that much; compare Warren with that figure rather than with the target alone",
						hr.name, fmtDur(lv), fmtDur(hr.allow))
				}
			}
			sec.add(r)
		}
		if s.cold != nil {
			v := medDur(s.cold[wp])
			sec.add(row{cells: []string{"HTTP request on a new member stream (1 client, after the idle streams expired), median, " + ctl, fmtDur(v), "", "", "",
				fmt.Sprintf("Warren %.2f RTT", float64(v)/float64(w.rtt)), fmt.Sprintf("≤ RTT + %s", fmtDur(wanOneClientAllowance))},
				result: check(v <= w.rtt+wanOneClientAllowance)})
		}
		if s.http != nil {
			v := func(p procPath) float64 { return s.http[p].rps.median() }
			sec.add(row{cells: []string{fmt.Sprintf("HTTP %d clients, requests/s, %s", cfg.clients, ctl), fmtRate(v(wp)), fmtRate(v(rp)), fmtRate(v(link)), fmtRate(v(direct)),
				fmtRatio(ratio(v(wp), v(link))) + " link"}})
		}
		if s.tcp1 != nil {
			v := func(p procPath) float64 { return s.tcp1[p].bps.median() }
			rl := ratio(v(wp), v(link))
			sec.add(row{cells: []string{"1 TCP stream, " + ctl, fmtMiBps(v(wp)), fmtMiBps(v(rp)), fmtMiBps(v(link)), fmtMiBps(v(direct)),
				fmt.Sprintf("%s plain TCP over the link; %s relays", fmtRatio(rl), fmtRatio(ratio(v(wp), v(rp)))),
				fmt.Sprintf("≥ %.2f× plain TCP over the link", wanTCPTarget)}, result: check(rl >= wanTCPTarget)})
		}
	}
	failed, total, verified, want := 0, 0, 0, 0
	for _, p := range s.paths {
		for _, figs := range []map[procPath]*procHTTPFig{s.http1, s.http} {
			if f := figs[p]; f != nil {
				failed, total = failed+f.failed, total+f.ok+f.failed
			}
		}
		if f := s.tcp1[p]; f != nil {
			verified, want = verified+f.verified, want+len(f.bps)
		}
	}
	if s.http != nil {
		sec.add(row{cells: []string{"failed requests", fmt.Sprintf("%d of %d (all paths)", failed, total), "", "", "", "", "0"}, result: check(failed == 0)})
	}
	if s.tcp1 != nil {
		sec.add(row{cells: []string{"streams with matching count and checksum", fmt.Sprintf("%d of %d (all paths)", verified, want)}, result: check(verified == want && want > 0)})
	}
	sec.note("the link: a network namespace of the tool's own whose lo carries everything; iptables send only the packets of the link's ports (each edge's control port, each relay B's port, the ports of the backend over the link) to an NFQUEUE, where a delaying process holds each for %v (RTT/2) before releasing it; client → edge, client → relay A and connector/relay B → backend are not delayed; %s", w.rtt/2, w.prioNote)
	sec.note("paths: Warren: load → edge → (link) → connector i → backend i; relays: load → relay A → (link) → relay B → backend i, io.Copy (splice); plain TCP over the link: load → (link) → a third backend, no TLS (the TLS rows compare with it too); direct: load → backend i, no link")
	sec.note("kernel TCP buffer limits in the namespace (they cap one connection over a long link, in flight ≤ about the send buffer): %s", w.buffers)
	if s.tcp1 != nil {
		sec.note("1 TCP stream: %s one way to a sink, CRC-32C checked (-tcp-bytes; 64 MiB by default in this scenario, as at ~50 MiB/s a larger stream only takes longer)", fmtBytes(cfg.tcpBytes))
		if cfg.dataReadBuffer > 0 {
			sec.note("data connections: receive buffers fixed at %s at both ends (-data-read-buffer: data_read_buffer in the edges' server.toml and the connectors' YAML)", fmtBytes(int64(cfg.dataReadBuffer)))
		} else {
			sec.note("data connections: receive buffers left to the kernel's autotuning (data_read_buffer unset)")
		}
	}
	for _, fg := range []struct {
		name string
		figs map[procPath]*procHTTPFig
	}{{"HTTP 1 client p99", s.http1}, {fmt.Sprintf("HTTP %d clients p99", cfg.clients), s.http}} {
		if fg.figs == nil {
			continue
		}
		var parts []string
		for _, p := range s.paths {
			parts = append(parts, p.String()+" "+fg.figs[p].p99.list(fmtDurF))
		}
		sec.note("per round, %s: %s", fg.name, strings.Join(parts, "; "))
	}
	if s.cold != nil {
		var parts []string
		for _, t := range s.controls {
			p := procPath{"warren", t}
			parts = append(parts, p.String()+" "+s.cold[p].list(fmtDurF))
		}
		sec.note("request on a new member stream: %d requests per path and round, each on a new client connection (client → edge is not delayed) after %s without requests, longer than the edge's idle-stream timeout (4 s), so that the edge opens a new stream to the member for it; every sample: %s",
			wanColdSamples, wanColdIdle, strings.Join(parts, "; "))
	}
	if s.tcp1 != nil {
		var parts []string
		for _, p := range s.paths {
			parts = append(parts, p.String()+" "+s.tcp1[p].bps.list(func(x float64) string { return fmt.Sprintf("%.1f", x/(1<<20)) }))
		}
		sec.note("per round, 1 TCP stream, MiB/s: %s", strings.Join(parts, "; "))
	}
	for _, p := range s.paths {
		for _, figs := range []map[procPath]*procHTTPFig{s.http1, s.http} {
			if f := figs[p]; f != nil && f.failed > 0 {
				sec.note("%s: %d failed requests, e.g. %s", p, f.failed, strings.Join(f.failures, "; "))
			}
		}
	}
	for _, k := range []string{"http1", "http", "tcp1"} {
		if n := s.noise[k]; n != nil {
			sec.note("%s: %s", k, n.note(s.paths))
		}
	}
	w.mu.Lock()
	w.sec = sec
	w.mu.Unlock()
	return sec
}

// wanFigures are the WAN scenario's medians by path, as -wan-json writes them.
type wanFigures struct {
	RTT     time.Duration             `json:"rtt_ns"`
	Paths   map[string]wanPathFigures `json:"paths"`
	Suspect []string                  `json:"suspect,omitempty"`
}

// wanPathFigures are one path's medians (durations in ns, throughput in bytes/s).
type wanPathFigures struct {
	HTTP1P50, HTTP1P99, HTTPNP50, HTTPNP99 time.Duration
	HTTPFailed                             int
	TCP1BPS                                float64
	ColdMedian                             time.Duration `json:",omitempty"` // Warren: a request on a new member stream
}

// writeJSON writes the WAN figures to path ("" or no WAN scenario: nothing).
func (w *wanLink) writeJSON(path string, s *procSummary) error {
	if w == nil || path == "" || s == nil {
		return nil
	}
	out := wanFigures{RTT: w.rtt, Paths: map[string]wanPathFigures{}}
	for _, p := range s.paths {
		var f wanPathFigures
		if h := s.http1[p]; h != nil {
			f.HTTP1P50, f.HTTP1P99, f.HTTPFailed = medDur(h.p50), medDur(h.p99), h.failed
		}
		if h := s.http[p]; h != nil {
			f.HTTPNP50, f.HTTPNP99, f.HTTPFailed = medDur(h.p50), medDur(h.p99), f.HTTPFailed+h.failed
		}
		if t := s.tcp1[p]; t != nil {
			f.TCP1BPS = t.bps.median()
		}
		if c := s.cold[p]; len(c) > 0 {
			f.ColdMedian = medDur(c)
		}
		out.Paths[p.String()] = f
	}
	w.mu.Lock()
	out.Suspect = w.suspect
	w.mu.Unlock()
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("-wan-json: %w", err)
	}
	return nil
}

// measureCold measures single requests through Warren that each open a new member stream
// (the "cold" figure); the other paths have no such stream and are not measured.
func (l *procLayout) measureCold(ctx context.Context, s *procSummary) error {
	s.cold = map[procPath]series{}
	var paths []procPath
	for _, p := range l.paths {
		if p.kind == "warren" {
			paths = append(paths, p)
		}
	}
	for r := range l.b.cfg.runs {
		for _, p := range paths {
			l.b.say("cold round %d/%d: %s (%d requests, %s apart)", r+1, l.b.cfg.runs, p, wanColdSamples, wanColdIdle)
			target := procTarget{URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(l.edges[p.tls].ports.HTTP)) + "/tiny", Host: "pool." + benchDomain}
			res, err := l.job(ctx, procJob{Kind: "http-cold", Targets: []procTarget{target}, Conns: wanColdSamples, Idle: wanColdIdle, ExpectLen: int64(len(tinyBody))},
				time.Minute+wanColdSamples*(wanColdIdle+10*time.Second))
			if err != nil {
				return fmt.Errorf("cold round %d (%s): %w", r+1, p, err)
			}
			for _, d := range res.Samples {
				s.cold[p] = append(s.cold[p], float64(d))
			}
		}
	}
	return nil
}

// wanColdJob runs an "http-cold" job in the load generator: j.Conns requests to
// j.Targets[0], each on a new connection after j.Idle without requests.
func wanColdJob(ctx context.Context, j procJob, res *procResult) error {
	if len(j.Targets) == 0 || j.Conns < 1 || j.Idle <= 0 {
		return errors.New("http-cold job: targets, conns and idle are required")
	}
	t := j.Targets[0]
	for range j.Conns {
		select {
		case <-time.After(j.Idle): // the edge's idle streams expire: a timeout, not an event
		case <-ctx.Done():
			return ctx.Err()
		}
		tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: tr}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
		if err != nil {
			return err
		}
		if t.Host != "" {
			req.Host = t.Host
		}
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("request on a new stream: %w", err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		d := time.Since(start)
		_ = resp.Body.Close()
		tr.CloseIdleConnections()
		if err != nil {
			return fmt.Errorf("request on a new stream: %w", err)
		}
		if resp.StatusCode != http.StatusOK || (j.ExpectLen > 0 && n != j.ExpectLen) {
			return fmt.Errorf("request on a new stream: %s, %d bytes", resp.Status, n)
		}
		res.Samples = append(res.Samples, d)
	}
	return nil
}
