package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The h2load part of the h2 scenario: nghttp2's h2load (-h2load, found on PATH by default)
// opens -h2load-conns HTTPS connections with -h2load-streams streams each, HTTP/2 over TLS,
// to Warren's public HTTPS listener and, in the same rounds, to the stock Go reverse proxy
// in the edge's place: net/http's server with TLS (HTTP/2 in ALPN, as net/http offers it)
// and an httputil.ReverseProxy whose keep-alive http.Transport reaches the same two
// backends, over HTTP/1.1 or over h2c as the edge's members are reached. Both run as child
// processes; the figure is Warren's requests/s ÷ the proxy's.

// procH2ProxyCommand is the hidden role of the stock proxy of the h2load table.
const procH2ProxyCommand = "proc-h2proxy"

// h2loadPath is one way h2load's requests reach the backends.
type h2loadPath string

const (
	h2loadWarren h2loadPath = "Warren"
	h2loadProxy  h2loadPath = "net/http proxy"
	h2loadDirect h2loadPath = "direct (h2c, backend 1)"
)

// h2loadRun is one h2load invocation's result.
type h2loadRun struct {
	rps       float64
	done      int // requests answered with 2xx (succeeded less 3xx)
	failed    int // requests that failed, errored, timed out or were answered with 3xx, 4xx or 5xx
	cpu       time.Duration
	meanTotal string // h2load's "time for request" line: min, max, mean, sd
}

// h2loadFigs are one workload's figures over the rounds, by path.
type h2loadFigs struct {
	member string // "HTTP/1.1" or "h2c"
	pool   string
	runs   map[h2loadPath][]h2loadRun
}

// h2loadSummary is the h2load table's figures.
type h2loadSummary struct {
	workloads []*h2loadFigs
	note      string // why it did not run, when it did not
}

// h2proxyAddrs is what the stock proxy process announces.
type h2proxyAddrs struct {
	Addr string `json:"addr"`
	PID  int    `json:"pid"`
}

// procH2ProxyMain is the stock proxy of the h2load table: net/http's server with TLS
// (ServeTLS: HTTP/2 and HTTP/1.1 in ALPN) and an httputil.ReverseProxy taking the backends
// in turn, over one keep-alive http.Transport (HTTP/1.1, or h2c with prior knowledge with
// -member h2c).
func procH2ProxyMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench h2proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cert := fs.String("cert", "", "certificate (PEM)")
	key := fs.String("key", "", "key (PEM)")
	backends := fs.String("backends", "", "comma-separated backend addresses, taken in turn")
	member := fs.String("member", "http1", `"http1" or "h2c": what the proxy speaks to the backends`)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int { fmt.Fprintln(stderr, "bench h2proxy:", err); return 1 }
	bs := strings.Split(*backends, ",")
	if *backends == "" || *cert == "" || *key == "" || (*member != "http1" && *member != "h2c") {
		return fail(errors.New(`need -cert, -key, -backends and -member "http1" or "h2c"`))
	}
	tr := &http.Transport{
		Proxy:                 nil,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		DisableCompression:    true,
	}
	if *member == "h2c" {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
	}
	ups := make([]*url.URL, len(bs))
	for i, b := range bs {
		ups[i] = &url.URL{Scheme: "http", Host: b}
	}
	var next atomic.Uint64
	logger := log.New(stderr, "bench h2proxy: ", 0)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(ups[next.Add(1)%uint64(len(ups))])
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		ErrorLog:  logger,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: logger}
	served := make(chan struct{})
	go func() { // owned: waited for below
		defer close(served)
		_ = srv.ServeTLS(ln, *cert, *key)
	}()
	if err := json.NewEncoder(stdout).Encode(h2proxyAddrs{Addr: ln.Addr().String(), PID: os.Getpid()}); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, stdin)
	_ = srv.Close()
	tr.CloseIdleConnections()
	<-served
	return 0
}

// h2loadRE picks h2load's summary lines apart.
var (
	h2loadFinishedRE = regexp.MustCompile(`finished in [0-9.]+m?s, ([0-9.]+) req/s`)
	h2loadRequestsRE = regexp.MustCompile(`requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatusRE   = regexp.MustCompile(`status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx`)
	h2loadReqTimeRE  = regexp.MustCompile(`time for request:\s+(.*)`)
)

// runH2load runs h2load once against url with authority (empty: the URL's) and returns its
// figures; pids are the processes whose CPU the run is charged with.
func (b *bench) runH2load(ctx context.Context, target, authority string, pids []int) (h2loadRun, error) {
	args := []string{"-c", strconv.Itoa(b.cfg.h2loadConns), "-m", strconv.Itoa(b.cfg.h2loadStreams),
		"-D", strconv.Itoa(max(1, int(b.cfg.duration.Seconds())))}
	if authority != "" {
		args = append(args, "-H", ":authority: "+authority)
	}
	args = append(args, target)
	ctx, cancel := context.WithTimeout(ctx, b.cfg.duration+time.Minute)
	defer cancel()
	before := cpuOf(pids)
	out, err := exec.CommandContext(ctx, b.cfg.h2load, args...).CombinedOutput()
	cpu := cpuSince(pids, before)
	if err != nil {
		return h2loadRun{}, fmt.Errorf("h2load %s: %w: %s", strings.Join(args, " "), err, lastLines(out, 5))
	}
	var r h2loadRun
	for _, c := range cpu {
		r.cpu += c
	}
	s := string(out)
	m := h2loadFinishedRE.FindStringSubmatch(s)
	q := h2loadRequestsRE.FindStringSubmatch(s)
	st := h2loadStatusRE.FindStringSubmatch(s)
	if m == nil || q == nil || st == nil {
		return r, fmt.Errorf("h2load said: %s", lastLines(out, 12))
	}
	r.rps, _ = strconv.ParseFloat(m[1], 64)
	n := func(x string) int { v, _ := strconv.Atoi(x); return v }
	// h2load's "failed" includes its "errored" and "timeout"; an answer other than 2xx may be
	// counted as succeeded (3xx) or failed, so the larger of the two counts is taken.
	r.done = n(q[2]) - n(st[2])
	r.failed = max(n(q[3]), n(st[2])+n(st[3])+n(st[4]))
	if t := h2loadReqTimeRE.FindStringSubmatch(s); t != nil {
		r.meanTotal = strings.Join(strings.Fields(t[1]), " ")
	}
	if r.done == 0 {
		return r, fmt.Errorf("h2load answered no request: %s", lastLines(out, 12))
	}
	return r, nil
}

func lastLines(out []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

// h2loadOK reports whether the h2load table can run, and why not.
func (b *bench) h2loadOK() (string, bool) {
	if b.cfg.h2load == "" {
		return "", false
	}
	p, err := exec.LookPath(b.cfg.h2load)
	if err != nil {
		return fmt.Sprintf("not run: %s not found (Debian: apt-get install nghttp2-client)", b.cfg.h2load), false
	}
	b.cfg.h2load = p
	if b.cfg.edgeMode != "child" {
		return "not run: the edge runs in this process (-edge inproc); the table compares two processes", false
	}
	return "", true
}

// measureH2load runs the h2load table's rounds: in each, for each workload, h2load against
// Warren's HTTPS listener, the stock proxy for that member protocol, and backend 1 directly
// (h2c), in an order rotated from round to round.
func (b *bench) measureH2load(ctx context.Context, e *edge, backends []string, certPath, keyPath string) (*h2loadSummary, error) {
	sum := &h2loadSummary{workloads: []*h2loadFigs{{member: "HTTP/1.1", pool: "h2-http1"}, {member: "h2c", pool: "h2-h2c"}}}
	proxies := map[string]*procChild{}
	defer func() {
		for _, p := range proxies {
			_ = p.stop(5 * time.Second)
		}
	}()
	proxyAddr := map[string]h2proxyAddrs{}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	for _, w := range sum.workloads {
		w.runs = map[h2loadPath][]h2loadRun{}
		member := "http1"
		if w.member == "h2c" {
			member = "h2c"
		}
		c, err := startProcChild("net/http proxy ("+w.member+" member)", self,
			[]string{procH2ProxyCommand, "-cert", certPath, "-key", keyPath, "-backends", strings.Join(backends, ","), "-member", member}, true, nil)
		if err != nil {
			return nil, err
		}
		proxies[w.member] = c
		var a h2proxyAddrs
		if err := c.readJSON(ctx, 30*time.Second, &a); err != nil {
			return nil, err
		}
		proxyAddr[w.member] = a
	}
	paths := []h2loadPath{h2loadWarren, h2loadProxy, h2loadDirect}
	for r := range b.cfg.runs {
		for _, w := range sum.workloads {
			k := r % len(paths)
			for _, p := range append(slices.Clone(paths[k:]), paths[:k]...) {
				b.say("h2 h2load %s member round %d/%d: %s", w.member, r+1, b.cfg.runs, p)
				var target, authority string
				var pids []int
				switch p {
				case h2loadWarren:
					target, authority, pids = "https://"+e.PublicTLS+"/tiny", w.pool+"."+benchDomain, []int{e.PID}
				case h2loadProxy:
					a := proxyAddr[w.member]
					target, authority, pids = "https://"+a.Addr+"/tiny", w.pool+"."+benchDomain, []int{a.PID}
				case h2loadDirect:
					target = "http://" + backends[0] + "/tiny"
				}
				res, err := b.runH2load(ctx, target, authority, pids)
				if err != nil {
					return nil, fmt.Errorf("h2load, %s member, %s: %w", w.member, p, err)
				}
				w.runs[p] = append(w.runs[p], res)
			}
		}
	}
	return sum, nil
}

// h2loadSection is the h2load table.
func (s *h2loadSummary) section(cfg *config) *section {
	sec := &section{
		title: fmt.Sprintf("HTTP/2 over TLS with h2load: %d connections × %d streams, %s per run, median of %d alternated rounds", cfg.h2loadConns, cfg.h2loadStreams, cfg.duration, cfg.runs),
		cols:  []string{"figure", string(h2loadWarren), string(h2loadProxy), string(h2loadDirect), "Warren ÷ net/http proxy", "target"},
	}
	if s.note != "" {
		sec.note("%s", s.note)
		return sec
	}
	med := func(rs []h2loadRun, f func(h2loadRun) float64) float64 {
		v := make(series, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return v.median()
	}
	rps := func(r h2loadRun) float64 { return r.rps }
	cpu := func(r h2loadRun) float64 { return float64(r.cpu) / float64(max(1, r.done)) }
	failed, total := 0, 0
	for _, w := range s.workloads {
		wr, pr, dr := med(w.runs[h2loadWarren], rps), med(w.runs[h2loadProxy], rps), med(w.runs[h2loadDirect], rps)
		// The ratio is taken within each round (the two ran minutes apart at most, on the
		// same machine load) and its median shown; the medians of each column alone can
		// come from different rounds.
		var per series
		for i, r := range w.runs[h2loadWarren] {
			if i < len(w.runs[h2loadProxy]) {
				per = append(per, ratio(r.rps, w.runs[h2loadProxy][i].rps))
			}
		}
		sec.add(row{cells: []string{"requests/s, " + w.member + " member", fmtRate(wr), fmtRate(pr), fmtRate(dr), fmtRatio(per.median()) + " (median of the rounds' ratios)", "—"}})
		sec.note("%s member, Warren ÷ net/http proxy requests/s by round: %s", w.member, per.list(func(x float64) string { return fmtRatio(x) }))
		wc, pc := med(w.runs[h2loadWarren], cpu), med(w.runs[h2loadProxy], cpu)
		sec.add(row{cells: []string{"CPU per request, edge / proxy, " + w.member + " member", fmtDur(time.Duration(wc)), fmtDur(time.Duration(pc)), "", fmtRatio(ratio(wc, pc)), "—"}})
		for _, p := range []h2loadPath{h2loadWarren, h2loadProxy, h2loadDirect} {
			var per []string
			for _, r := range w.runs[p] {
				failed, total = failed+r.failed, total+r.done+r.failed
				per = append(per, fmtNum(r.rps))
			}
			sec.note("%s member, %s, requests/s per round: %s", w.member, p, strings.Join(per, ", "))
		}
	}
	sec.add(row{cells: []string{"failed requests (all runs)", fmt.Sprintf("%d of %d (all paths)", failed, total), "", "", "", "0"}, result: check(failed == 0)})
	sec.note("Warren: h2load → the edge's public HTTPS listener (ServePublicTLS, self-signed certificate, HTTP/2 by ALPN), :authority <pool>.%s → 2-member group over the h2 scenario's two net/http backends; HTTP/1.1 member: the edge's pooled keep-alive tunnel streams, one request at a time on each; h2c member: BackendProtocol h2c, one HTTP/2 connection per member on one tunnel stream. The connectors run in the load tool's process, as in the rest of this scenario", benchDomain)
	sec.note("net/http proxy: a process of its own in the edge's place: net/http's server with ServeTLS (the same certificate, HTTP/2 by ALPN) and an httputil.ReverseProxy (SetXForwarded, Host kept) taking the two backends in turn over one keep-alive http.Transport: HTTP/1.1 (up to 256 idle connections per backend) or, for the h2c member, HTTP/2 with prior knowledge")
	sec.note("direct: h2load → backend 1 over h2c (no TLS, one backend: h2load takes one authority); a reference only")
	sec.note("CPU per request: the edge's or the proxy's process, from /proc/<pid>/stat over the whole h2load run ÷ 2xx answers")
	sec.note("h2load, the edge (or the proxy), the load tool with the connectors and the backends share the machine's cores; the paths and workloads alternate within each round, so compare figures within one run")
	return sec
}
