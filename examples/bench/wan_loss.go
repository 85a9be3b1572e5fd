package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The lossy-link mode of the WAN scenario (-wan-rtt RTT -wan-loss 0,1,3): the same link,
// with a share of its packets dropped at random by the delaying processes (the drop happens
// where the delay does, on the link's ports only, both directions, each packet on its own).
// The layout starts once; in every round each loss level is set on every delaying process
// in turn (wanLink.setLoss) and, at that level, the figures are measured on every path
// (paths rotated from round to round, levels too). -wan-websocket adds Warren with its
// connectors over WebSocket (wss to the edge's HTTPS port, which is then a port of the link);
// -wan-quic adds Warren with its connectors over QUIC (transport: quic to the edge's
// quic_port, a UDP port of the link).

// pathWarrenWS is the kind of the path "Warren, connectors over WebSocket".
const pathWarrenWS = "warren-ws"

// pathWarrenQUIC is the kind of the path "Warren, connectors over QUIC".
const pathWarrenQUIC = "warren-quic"

// wanWSPath is the WebSocket path of the edge of pathWarrenWS ([server] websocket_path).
const wanWSPath = "/_warren/connect"

// wanMaxLoss bounds -wan-loss: beyond it TCP over the link hardly moves and the cells would
// only time out.
const wanMaxLoss = 0.20

// parseLossList parses -wan-loss: comma-separated percentages ("0,1,3", "0.5%"), each in
// [0, 20], no repeats, in the order given; "" is none (nil). The result is shares (0.01).
func parseLossList(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []float64
	for part := range strings.SplitSeq(s, ",") {
		t := strings.TrimSuffix(strings.TrimSpace(part), "%")
		if t == "" {
			return nil, fmt.Errorf("empty level in %q", s)
		}
		pct, err := strconv.ParseFloat(t, 64)
		if err != nil || math.IsNaN(pct) || math.IsInf(pct, 0) {
			return nil, fmt.Errorf("%q is not a percentage", part)
		}
		share := pct / 100
		if share < 0 || share > wanMaxLoss {
			return nil, fmt.Errorf("%s%% out of range 0-%g%%", t, wanMaxLoss*100)
		}
		if slices.Contains(out, share) {
			return nil, fmt.Errorf("%s%% given twice", t)
		}
		out = append(out, share)
	}
	return out, nil
}

// fmtLoss formats a share as a percentage: "1 %", "0.5 %".
func fmtLoss(share float64) string {
	return strconv.FormatFloat(share*100, 'f', -1, 64) + " %"
}

// wanLossFlags checks -wan-loss, -wan-websocket and -wan-quic against the other flags.
func (c *config) wanLossFlags(set map[string]bool) error {
	if c.wanLoss == nil && !c.wanWebSocket && !c.wanQUIC {
		return nil
	}
	switch {
	case c.wanRTT == 0:
		return errors.New("-wan-loss, -wan-websocket and -wan-quic need -wan-rtt")
	case c.wanLoss == nil && c.wanWebSocket:
		return errors.New(`-wan-websocket needs -wan-loss (its paths are in the lossy-link table; "-wan-loss 0" for the link without loss)`)
	case c.wanLoss == nil:
		return errors.New(`-wan-quic needs -wan-loss (its paths are in the lossy-link table; "-wan-loss 0" for the link without loss)`)
	case c.wanJSON != "":
		return errors.New("-wan-json does not cover -wan-loss: the tables carry the figures")
	}
	if c.wanLoss != nil {
		if !set["only"] {
			c.scenarios = []string{"http", "tcp"}
		}
		if c.has("cold") {
			return errors.New(`-only: scenario "cold" does not run with -wan-loss (it has http, tcp)`)
		}
	}
	return nil
}

// setLoss sets the loss of every delaying process of the link.
func (w *wanLink) setLoss(ctx context.Context, share float64) error {
	w.mu.Lock()
	ds := slices.Clone(w.delays)
	w.mu.Unlock()
	for i, c := range ds {
		var ack wanDelayReady
		if err := c.call(ctx, 10*time.Second, wanDelayCommand{Loss: share}, &ack); err != nil {
			return fmt.Errorf("setting %s loss on port %d: %w", fmtLoss(share), w.ports[i], err)
		}
	}
	return nil
}

// wanDelayCommand is a line a delaying process reads on stdin while it runs.
type wanDelayCommand struct {
	Loss float64 `json:"loss"`
}

// wanLossFigs are the figures of one loss level over the rounds.
type wanLossFigs struct {
	http1, httpN map[procPath]*procHTTPFig
	tcp1         map[procPath]*procTCPFig
	others       series // other processes' CPU during each cell, in cores
}

// addNoise keeps what n measured of the other processes' CPU use.
func (f *wanLossFigs) addNoise(n *procNoise) {
	if n == nil {
		return
	}
	for _, v := range n.others {
		f.others = append(f.others, v...)
	}
}

func mergeHTTP(dst map[procPath]*procHTTPFig, src map[procPath]*procHTTPFig) {
	for p, f := range src {
		d := dst[p]
		if d == nil {
			d = &procHTTPFig{}
			dst[p] = d
		}
		d.rps, d.p50, d.p99, d.p999 = append(d.rps, f.rps...), append(d.p50, f.p50...), append(d.p99, f.p99...), append(d.p999, f.p999...)
		d.ok, d.failed, d.dials = d.ok+f.ok, d.failed+f.failed, d.dials+f.dials
		d.failures = append(d.failures, f.failures...)
	}
}

// runWANLoss measures every loss level in every round and adds the lossy-link table.
func (l *procLayout) runWANLoss(ctx context.Context, s *procSummary, rep *report) error {
	cfg := l.b.cfg
	levels := cfg.wanLoss
	figs := make([]wanLossFigs, len(levels))
	for i := range figs {
		figs[i] = wanLossFigs{http1: map[procPath]*procHTTPFig{}, httpN: map[procPath]*procHTTPFig{}, tcp1: map[procPath]*procTCPFig{}}
	}
	runs := cfg.runs
	cfg.runs = 1 // each call below is one round; this loop makes the rounds
	defer func() { cfg.runs = runs }()
	start := time.Now()
	for r := range runs {
		for k := range levels {
			i := (k + r) % len(levels)
			l.rotate = r + k
			l.b.say("WAN lossy link, round %d/%d: %s loss (%s so far)", r+1, runs, fmtLoss(levels[i]), time.Since(start).Round(time.Second))
			if err := l.b.wan.setLoss(ctx, levels[i]); err != nil {
				return err
			}
			for _, name := range cfg.scenarios {
				switch name {
				case "http":
					h1, n1, err := l.measureHTTPClients(ctx, 1)
					if err != nil {
						return fmt.Errorf("WAN, %s loss, http 1 client: %w", fmtLoss(levels[i]), err)
					}
					mergeHTTP(figs[i].http1, h1)
					figs[i].addNoise(n1)
					hn, nn, err := l.measureHTTPClients(ctx, cfg.clients)
					if err != nil {
						return fmt.Errorf("WAN, %s loss, http %d clients: %w", fmtLoss(levels[i]), cfg.clients, err)
					}
					mergeHTTP(figs[i].httpN, hn)
					figs[i].addNoise(nn)
				case "tcp":
					s.streams = 1
					if err := l.measureTCP(ctx, s); err != nil {
						return fmt.Errorf("WAN, %s loss, tcp: %w", fmtLoss(levels[i]), err)
					}
					for p, f := range s.tcp1 {
						d := figs[i].tcp1[p]
						if d == nil {
							d = &procTCPFig{}
							figs[i].tcp1[p] = d
						}
						d.bps, d.verified = append(d.bps, f.bps...), d.verified+f.verified
					}
					figs[i].addNoise(s.noise["tcp1"])
				}
			}
		}
	}
	l.rotate = 0
	if err := l.b.wan.setLoss(ctx, 0); err != nil {
		return err
	}
	l.b.say("WAN lossy link: done in %s", time.Since(start).Round(time.Second))
	rep.add(l.b.wan.lossSection(cfg, runs, l.paths, levels, figs))
	return nil
}

// medRange formats a series' median with its range over the rounds: "52.1 ms (51.9–53.0)".
func medRange(s series, f func(float64) string) string {
	if len(s) == 0 {
		return "—"
	}
	if len(s) == 1 {
		return f(s[0])
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.median()), f(slices.Min(s)), f(slices.Max(s)))
}

// lossCols are the lossy-link table's columns: the figure, then one per path.
func lossCols(paths []procPath) []string {
	cols := []string{"loss", "figure"}
	for _, p := range paths {
		cols = append(cols, p.String())
	}
	return cols
}

// lossSection builds the lossy-link table: for each loss level and figure, every path's
// median over the rounds with its range.
func (w *wanLink) lossSection(cfg *config, runs int, paths []procPath, levels []float64, figs []wanLossFigs) *section {
	sec := &section{cols: lossCols(paths), title: fmt.Sprintf("WAN, lossy link: %v round trip and random loss between the connectors and the edge only, median (min–max) of %d alternated rounds", w.rtt, runs)}
	ms := func(x float64) string { return fmt.Sprintf("%.1f", x/1e6) }
	mib := func(x float64) string { return fmt.Sprintf("%.1f", x/(1<<20)) }
	rps := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	failed, total, verified, want := 0, 0, 0, 0
	for i, loss := range levels {
		f := figs[i]
		type fig struct {
			name string
			get  func(procPath) series
			fmt  func(float64) string
		}
		// A round in which a path answered no request (a lost SYN costs a 1 s timeout, more
		// than a short round) has no latency: it is left out of the latency cells and
		// counted in a note; its 0 requests/s stays in.
		httpGet := func(m map[procPath]*procHTTPFig, pick func(*procHTTPFig) series, latency bool) func(procPath) series {
			return func(p procPath) series {
				h := m[p]
				if h == nil {
					return nil
				}
				v := pick(h)
				if !latency {
					return v
				}
				var out series
				for j, x := range v {
					if h.rps[j] > 0 {
						out = append(out, x)
					}
				}
				return out
			}
		}
		rows := []fig{
			{"1 TCP stream, MiB/s", func(p procPath) series {
				if t := f.tcp1[p]; t != nil {
					return t.bps
				}
				return nil
			}, mib},
			{"HTTP 1 client, p50, ms", httpGet(f.http1, func(h *procHTTPFig) series { return h.p50 }, true), ms},
			{"HTTP 1 client, p99, ms", httpGet(f.http1, func(h *procHTTPFig) series { return h.p99 }, true), ms},
			{"HTTP 1 client, requests/s", httpGet(f.http1, func(h *procHTTPFig) series { return h.rps }, false), rps},
			{fmt.Sprintf("HTTP %d clients, p50, ms", cfg.clients), httpGet(f.httpN, func(h *procHTTPFig) series { return h.p50 }, true), ms},
			{fmt.Sprintf("HTTP %d clients, p99, ms", cfg.clients), httpGet(f.httpN, func(h *procHTTPFig) series { return h.p99 }, true), ms},
			{fmt.Sprintf("HTTP %d clients, requests/s", cfg.clients), httpGet(f.httpN, func(h *procHTTPFig) series { return h.rps }, false), rps},
		}
		for _, fr := range rows {
			cells := []string{fmtLoss(loss), fr.name}
			seen := false
			for _, p := range paths {
				v := fr.get(p)
				seen = seen || len(v) > 0
				cells = append(cells, medRange(v, fr.fmt))
			}
			if seen {
				sec.add(row{cells: cells})
			}
		}
		for _, p := range paths {
			for _, m := range []map[procPath]*procHTTPFig{f.http1, f.httpN} {
				if h := m[p]; h != nil {
					failed, total = failed+h.failed, total+h.ok+h.failed
					if slices.Contains(h.rps, 0) {
						sec.note("%s loss, %s: a round answered no request within its duration (left out of the latency cells)", fmtLoss(loss), p)
					}
					if h.failed > 0 {
						sec.note("%s loss, %s: %d failed requests, e.g. %s", fmtLoss(loss), p, h.failed, strings.Join(h.failures, "; "))
					}
				}
			}
			if t := f.tcp1[p]; t != nil {
				verified, want = verified+t.verified, want+len(t.bps)
			}
		}
	}
	var noise []string
	for i, loss := range levels {
		if o := figs[i].others; len(o) > 0 {
			noise = append(noise, fmt.Sprintf("%s loss: median %.2f, max %.2f", fmtLoss(loss), o.median(), slices.Max(o)))
		}
	}
	if len(noise) > 0 {
		sec.note("CPU used by other processes and kernel threads during the cells, in cores (of 2): %s", strings.Join(noise, "; "))
	}
	// The head-of-line figure: each path's many-client p99 at each loss ÷ its own at the
	// first level (0 % when given first).
	if len(levels) > 1 {
		var parts []string
		for _, p := range paths {
			base := figs[0].httpN[p]
			if base == nil || p.kind == "direct" {
				continue
			}
			var rs []string
			for i := 1; i < len(levels); i++ {
				if h := figs[i].httpN[p]; h != nil {
					rs = append(rs, fmt.Sprintf("%s %s", fmtLoss(levels[i]), fmtRatio(ratio(h.p99.median(), base.p99.median()))))
				}
			}
			parts = append(parts, fmt.Sprintf("%s: %s", p, strings.Join(rs, ", ")))
		}
		sec.note("HTTP %d clients, p99 ÷ the same path's p99 at %s loss (the issue's QUIC target is ≤ 1.5× at 1 %%): %s", cfg.clients, fmtLoss(levels[0]), strings.Join(parts, "; "))
	}
	if n := quicTargetNote(cfg.clients, paths, levels, figs); n != "" {
		sec.note("%s", n)
	}
	sec.note("failed requests: %d of %d (all paths and levels); streams with matching count and checksum: %d of %d", failed, total, verified, want)
	sec.note("the link: as in the WAN table's notes, and each delaying process also drops each packet of its port with the level's probability, independently, both directions (data and ACKs); client → edge and connector → backend lose nothing; the direct path does not cross the link")
	sec.note("paths: Warren, plain/TLS: connectors over TCP (yamux control connection + TCP data connections for TCP tunnels); Warren, WebSocket: connectors over wss to the edge's HTTPS port (websocket_path %s), TCP tunnels inside the one WebSocket; relays: io.Copy relays A → B, one TCP connection per client connection; plain TCP over the link: the load generator straight to a backend whose ports cross the link", wanWSPath)
	if cfg.wanQUIC {
		sec.note("Warren, QUIC: connectors over QUIC (transport: quic) to the edge's quic_port, a UDP port of the link, delayed and lossy as the control port; the control channel and every request or TCP connection a QUIC stream of the one QUIC connection per connector (quic-go)")
	}
	if cfg.wanFRP != "" {
		sec.note("frp (%s, run from %s): frps in the edge's place, 2 frpc in the connectors' (each an http proxy and a tcp proxy in a loadBalancer.group, to its backend, as Warren's 2-member groups); frp, TCP (TLS): frp's default transport, one TLS connection per frpc to bindPort with its streams multiplexed (tcpMux), work connections on that port too; frp, QUIC: transport.protocol quic to quicBindPort (UDP); the port between frpc and frps is a port of the link, delayed and lossy (TCP and UDP alike); the load reaches frps' vhostHTTPPort (Host pool.%s) and the group's remote port directly", frpVersion(cfg.wanFRP), cfg.wanFRP, benchDomain)
	}
	if cfg.wanMTU > 0 {
		sec.note("loss is per packet; lo's MTU was set to %d (-wan-mtu), so TCP's segments and QUIC's packets are of comparable size and a loss rate means about the same per byte on every path", cfg.wanMTU)
	} else {
		sec.note("loss is per packet, and a packet on lo carries up to 64 KiB (its MTU), so per byte there are fewer packets, and fewer losses, than on a 1500-byte link at the same rate; QUIC's packets stay ~1.4 KiB, so a QUIC path loses far more packets per byte than a TCP path here (-wan-mtu 1500 evens that out)")
	}
	sec.note("order: in round r the levels start at the r-th, and within a level the paths rotate too; %s", w.prioNote)
	w.mu.Lock()
	w.sec = sec // the delaying processes' complaints, when they stop, go under this table
	w.mu.Unlock()
	return sec
}

// The targets for Warren over QUIC on the lossy link.
const (
	wanQUICLoss        = 0.01 // the loss level the targets are judged at
	wanQUICP99Increase = 1.5  // its many-client p99 ÷ the same path's p99 without loss
)

// quicTargetNote judges Warren over QUIC against the targets when the run has the
// path and the levels 0 and 1 %: its many-client p99 at 1 % loss at most 1.5× its own
// without loss, and below frp over QUIC's at 1 % (when frp ran). "" when it cannot judge.
func quicTargetNote(clients int, paths []procPath, levels []float64, figs []wanLossFigs) string {
	q, fq := procPath{kind: pathWarrenQUIC, tls: true}, procPath{kind: pathFRPQUIC, tls: true}
	zero, one := slices.Index(levels, 0), slices.Index(levels, wanQUICLoss)
	if !slices.Contains(paths, q) || zero < 0 || one < 0 {
		return ""
	}
	p99 := func(i int, p procPath) float64 {
		if h := figs[i].httpN[p]; h != nil {
			return h.p99.median()
		}
		return 0
	}
	base, lossy := p99(zero, q), p99(one, q)
	if base == 0 || lossy == 0 {
		return ""
	}
	r := lossy / base
	s := fmt.Sprintf("the issue's QUIC targets, HTTP %d clients, medians: Warren, QUIC p99 %.1f ms at %s loss ÷ %.1f ms at 0 %% = %s (target ≤ %.1f×: %s)",
		clients, lossy/1e6, fmtLoss(wanQUICLoss), base/1e6, fmtRatio(r), wanQUICP99Increase, passFail(r <= wanQUICP99Increase))
	if f := p99(one, fq); slices.Contains(paths, fq) && f > 0 {
		s += fmt.Sprintf("; against frp, QUIC at %s loss: %.1f ms vs %.1f ms (target: below frp's: %s)", fmtLoss(wanQUICLoss), lossy/1e6, f/1e6, passFail(lossy < f))
	}
	return s
}

func passFail(ok bool) string {
	if ok {
		return "pass"
	}
	return "FAIL"
}
