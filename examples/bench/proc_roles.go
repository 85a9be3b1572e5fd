package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// The hidden subcommands of the process layout: this binary re-executed as a backend, a
// relay or the load generator, each its own process. Each prints one JSON line saying where
// it listens, and runs until its stdin is closed (the parent closes it, or dies).
const (
	procBackendCommand = "proc-backend"
	procRelayCommand   = "proc-relay"
	procLoadCommand    = "proc-load"
)

// procRoleMain runs the hidden subcommand args[0] of the process layout; ok is false when
// args name none.
func procRoleMain(args []string, stdin io.Reader, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	var f func([]string, io.Reader, io.Writer, io.Writer) int
	switch args[0] {
	case procBackendCommand:
		f = procBackendMain
	case procRelayCommand:
		f = procRelayMain
	case procLoadCommand:
		f = procLoadMain
	case procH2ProxyCommand:
		f = procH2ProxyMain
	case procWANDelayCommand:
		f = procWANDelayMain
	case procWANInsideCommand:
		// The whole bench, re-executed by -wan-rtt inside its network namespace: wan.Run
		// stops it with SIGTERM.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		f = func(args []string, _ io.Reader, stdout, stderr io.Writer) int {
			return wanInsideMain(ctx, args, stdout, stderr)
		}
	default:
		return 0, false
	}
	// Ctrl-C reaches the whole process group; the parent handles it and stops its children.
	signal.Ignore(os.Interrupt)
	_, _ = raiseFileLimit()
	return f(args[1:], stdin, stdout, stderr), true
}

// procBackendAddrs is what a backend process announces.
type procBackendAddrs struct {
	HTTP string `json:"http"` // tiny (3 B) and /64k responses
	Sink string `json:"sink"` // counts and checksums what it reads (hashConn)
	// SizedSink is Sink for streams that announce their length (hashSizedConn).
	SizedSink string `json:"sized_sink"`
	OneByte   string `json:"one_byte"` // writes one byte on accept (oneByteConn)
	PID       int    `json:"pid"`
}

// procBackendMain is one backend process: an HTTP server, a TCP sink and a one-byte server.
// -http and -sink choose the first two's listening addresses (the WAN scenario's backend
// over the link listens on delayed ports); by default any free loopback port.
func procBackendMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench backend", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http", "127.0.0.1:0", "the HTTP server's address")
	sinkAddr := fs.String("sink", "127.0.0.1:0", "the TCP sink's address")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	hb := &httpBackend{}
	if err := hb.start(*httpAddr); err != nil {
		fmt.Fprintln(stderr, "bench backend:", err)
		return 1
	}
	defer stopHTTPBackends([]*httpBackend{hb})
	ln, err := net.Listen("tcp", *sinkAddr)
	if err != nil {
		fmt.Fprintln(stderr, "bench backend:", err)
		return 1
	}
	sink := serveTCP(ln, hashConn)
	defer sink.Close()
	sized, err := startTCPBackend(hashSizedConn)
	if err != nil {
		fmt.Fprintln(stderr, "bench backend:", err)
		return 1
	}
	defer sized.Close()
	one, err := startTCPBackend(oneByteConn)
	if err != nil {
		fmt.Fprintln(stderr, "bench backend:", err)
		return 1
	}
	defer one.Close()
	if err := json.NewEncoder(stdout).Encode(procBackendAddrs{HTTP: hb.addr, Sink: sink.addr(), SizedSink: sized.addr(), OneByte: one.addr(), PID: os.Getpid()}); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, stdin)
	return 0
}

// procRelayAddrs is what a relay process announces.
type procRelayAddrs struct {
	Addrs []string `json:"addrs"` // relay A: one listener per route; relay B: its one listener
	PID   int      `json:"pid"`
}

// Copy modes of the plain relays.
const (
	copyBuf    = "buf"    // a read/write loop through a 64 KiB buffer, which cannot splice
	copySplice = "splice" // io.Copy between the two *net.TCPConn, which splices on Linux
	// copyHTTP is relay A only: an HTTP reverse proxy (httputil.ReverseProxy, net/http's
	// server and Transport) on each route's listener, its upstream connections to relay B.
	copyHTTP = "http"
)

// procRelayMain is one plain relay of the floor's chain: client → relay A → relay B →
// backend. Relay A listens on one port per route; for each connection it dials relay B
// (over TLS with -tls), writes the route's index as one byte, and copies both ways. Relay B
// listens on one port (the link's, like the edge's control port), reads the index, dials
// that route's target and copies both ways. Past that byte both copy the bytes as they are.
// With -copy http relay A is an HTTP reverse proxy instead (httpRelayA).
func procRelayMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench relay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	role := fs.String("role", "", `"a" (edge-like) or "b" (connector-like)`)
	mode := fs.String("copy", copySplice, `"buf" (64 KiB buffers), "splice" (io.Copy) or, relay A only, "http" (net/http reverse proxy)`)
	useTLS := fs.Bool("tls", false, "TLS between relay A and relay B")
	listen := fs.String("listen", "127.0.0.1:0", "relay B: its listener")
	cert := fs.String("cert", "", "relay B with -tls: certificate (PEM)")
	key := fs.String("key", "", "relay B with -tls: key (PEM)")
	targets := fs.String("targets", "", "relay B: comma-separated targets, by route index")
	next := fs.String("next", "", "relay A: relay B's address")
	ca := fs.String("ca", "", "relay A with -tls: CA certificate (PEM) that verifies relay B")
	routes := fs.Int("routes", 1, "relay A: routes (listeners)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int { fmt.Fprintln(stderr, "bench relay:", err); return 1 }
	if *mode != copyBuf && *mode != copySplice && (*mode != copyHTTP || *role != "a") {
		return fail(fmt.Errorf("-copy must be %q, %q or, with -role a, %q; got %q", copyBuf, copySplice, copyHTTP, *mode))
	}
	var servers []*tcpBackend
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	out := procRelayAddrs{PID: os.Getpid()}
	switch *role {
	case "b":
		ts := strings.Split(*targets, ",")
		if *targets == "" || len(ts) > 255 {
			return fail(errors.New("-targets: 1 to 255 targets"))
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return fail(err)
		}
		if *useTLS {
			c, err := tls.LoadX509KeyPair(*cert, *key)
			if err != nil {
				_ = ln.Close()
				return fail(err)
			}
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12})
		}
		servers = append(servers, serveTCP(ln, relayBConn(ts, *mode)))
		out.Addrs = []string{ln.Addr().String()}
	case "a":
		if *routes < 1 || *routes > 255 {
			return fail(errors.New("-routes: 1 to 255"))
		}
		var cfg *tls.Config
		if *useTLS {
			pemBytes, err := os.ReadFile(*ca)
			if err != nil {
				return fail(err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pemBytes) {
				return fail(fmt.Errorf("%s: no certificate", *ca))
			}
			host, _, _ := net.SplitHostPort(*next)
			cfg = &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12, ClientSessionCache: tls.NewLRUClientSessionCache(64)}
		}
		for i := range *routes {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return fail(err)
			}
			out.Addrs = append(out.Addrs, ln.Addr().String())
			if *mode == copyHTTP {
				p := startHTTPRelayA(ln, *next, byte(i), cfg, stderr)
				defer p.close()
				continue
			}
			servers = append(servers, serveTCP(ln, relayAConn(*next, byte(i), cfg, *mode)))
		}
	default:
		return fail(fmt.Errorf(`-role must be "a" or "b", got %q`, *role))
	}
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		return 1
	}
	_, _ = io.Copy(io.Discard, stdin)
	return 0
}

// serveTCP runs handle on each connection ln accepts, like startTCPBackend.
func serveTCP(ln net.Listener, handle func(net.Conn)) *tcpBackend {
	b := &tcpBackend{ln: ln, handle: handle, conns: map[net.Conn]struct{}{}}
	b.wg.Go(b.accept)
	return b
}

// relayAConn dials relay B, names the route, and copies both ways.
func relayAConn(next string, route byte, cfg *tls.Config, mode string) func(net.Conn) {
	return func(c net.Conn) {
		u, err := relayDial(context.Background(), next, route, cfg)
		if err != nil {
			return
		}
		defer u.Close()
		pipe(c, u, mode)
	}
}

// relayDial dials relay B (over TLS when cfg is set) and names the route in the first byte.
func relayDial(ctx context.Context, next string, route byte, cfg *tls.Config) (net.Conn, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	var u net.Conn
	var err error
	if cfg != nil {
		u, err = (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", next)
	} else {
		u, err = d.DialContext(ctx, "tcp", next)
	}
	if err != nil {
		return nil, err
	}
	if _, err := u.Write([]byte{route}); err != nil {
		_ = u.Close()
		return nil, fmt.Errorf("naming route %d to relay B: %w", route, err)
	}
	return u, nil
}

// httpRelayA is one route of relay A in copyHTTP mode: an http.Server whose handler is an
// httputil.ReverseProxy, forwarding over its own http.Transport whose every connection is
// to relay B and carries this route only.
type httpRelayA struct {
	srv    *http.Server
	tr     *http.Transport
	served chan struct{} // closed when Serve has returned
}

// startHTTPRelayA serves the reverse proxy of route on ln; the proxy's errors go to stderr.
func startHTTPRelayA(ln net.Listener, next string, route byte, cfg *tls.Config, stderr io.Writer) *httpRelayA {
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return relayDial(ctx, next, route, cfg)
		},
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	// Any host: DialContext ignores the address and dials relay B.
	upstream := &url.URL{Scheme: "http", Host: "relay-b.invalid"}
	logger := log.New(stderr, fmt.Sprintf("bench relay A, route %d: ", route), 0)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		ErrorLog:  logger,
	}
	p := &httpRelayA{
		srv: &http.Server{
			Handler:           rp,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          logger,
		},
		tr:     tr,
		served: make(chan struct{}),
	}
	go func() { // owned: close waits for served
		defer close(p.served)
		_ = p.srv.Serve(ln) // http.ErrServerClosed once close is called
	}()
	return p
}

// close stops serving, closes every connection on both sides and waits for Serve.
func (p *httpRelayA) close() {
	_ = p.srv.Close()
	p.tr.CloseIdleConnections()
	<-p.served
}

// relayBConn reads the route's index, dials its target and copies both ways.
func relayBConn(targets []string, mode string) func(net.Conn) {
	return func(c net.Conn) {
		var idx [1]byte
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, idx[:]); err != nil || int(idx[0]) >= len(targets) {
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		u, err := net.DialTimeout("tcp", targets[idx[0]], 5*time.Second)
		if err != nil {
			return
		}
		defer u.Close()
		pipe(c, u, mode)
	}
}

// pipe copies a to b and b to a until both directions have ended, half-closing each
// direction's writer at its end.
func pipe(a, b net.Conn, mode string) {
	done := make(chan struct{})
	go func() { // owned: waited for below
		defer close(done)
		copyHalf(b, a, mode)
	}()
	copyHalf(a, b, mode)
	<-done
}

// copyHalf copies src to dst and half-closes dst; at an error both are closed so that the
// other direction ends too.
func copyHalf(dst, src net.Conn, mode string) {
	var err error
	if mode == copyBuf {
		_, err = io.CopyBuffer(writerOnly{dst}, readerOnly{src}, make([]byte, 64<<10))
	} else {
		_, err = io.Copy(dst, src) // *net.TCPConn to *net.TCPConn: splice(2)
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
		if cw.CloseWrite() == nil {
			return
		}
	}
	_ = dst.Close()
	_ = src.Close()
}

// procJob is one measurement the load generator makes.
type procJob struct {
	Kind string `json:"kind"` // "http", "http-cold", "bulk" or "ttfb"
	// http-cold: Conns requests to Targets[0], each on a new connection after Idle.
	Idle time.Duration `json:"idle,omitempty"`
	// http: client i sends GETs to Targets[i % len]; every answer must have ExpectLen bytes.
	Targets   []procTarget  `json:"targets,omitempty"`
	Clients   int           `json:"clients,omitempty"`
	ExpectLen int64         `json:"expect_len,omitempty"`
	Warmup    time.Duration `json:"warmup,omitempty"`
	Duration  time.Duration `json:"duration,omitempty"`
	// bulk: stream i of Size bytes to Addrs[i], all at once; ttfb: Conns sequential new
	// connections to Addrs[i % len].
	Addrs []string `json:"addrs,omitempty"`
	Size  int64    `json:"size,omitempty"`
	// Sized: bulk streams announce their length and are not half-closed (hashSizedConn).
	Sized bool `json:"sized,omitempty"`
	Conns int  `json:"conns,omitempty"`
	// PIDs whose CPU time is measured over the measured part of the job.
	PIDs []int `json:"pids,omitempty"`
}

// procTarget is where one HTTP client sends its requests.
type procTarget struct {
	URL  string `json:"url"`
	Host string `json:"host,omitempty"`
}

// procResult is the load generator's answer to a job.
type procResult struct {
	Err string `json:"err,omitempty"`
	// http
	OK, Failed, WarmupFailed, Dials int
	Elapsed                         time.Duration
	P50, P99, P999                  time.Duration
	FirstFailure                    string `json:",omitempty"`
	// bulk: aggregate bytes per second; streams whose count and checksum matched
	BPS      float64
	Verified int
	// ttfb
	Median, P99First time.Duration
	ConnsFailed      int
	// http-cold: each request's time
	Samples []time.Duration `json:",omitempty"`
	// CPU time each of the job's PIDs used over the measured part
	CPU []time.Duration
}

// procLoadMain is the load generator: it reads jobs (JSON lines) on stdin and answers each
// with a JSON line on stdout, until stdin ends.
func procLoadMain(_ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx := context.Background()
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	enc := json.NewEncoder(stdout)
	data := map[[2]int64]streamData{} // by stream index and size
	for sc.Scan() {
		var j procJob
		var res procResult
		if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
			res.Err = err.Error()
		} else if err := runProcJob(ctx, j, data, &res); err != nil {
			res.Err = err.Error()
		}
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(stderr, "bench load:", err)
			return 1
		}
	}
	return 0
}

// cpuOf returns the CPU time of each pid so far.
func cpuOf(pids []int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, p := range pids {
		out[i], _ = readCPU(p)
	}
	return out
}

func cpuSince(pids []int, before []time.Duration) []time.Duration {
	now := cpuOf(pids)
	for i := range now {
		now[i] -= before[i]
	}
	return now
}

func runProcJob(ctx context.Context, j procJob, data map[[2]int64]streamData, res *procResult) error {
	switch j.Kind {
	case "http":
		if j.Clients < 1 || len(j.Targets) == 0 || j.Duration <= 0 {
			return errors.New("http job: clients, targets and duration are required")
		}
		o := loadOptions{clients: j.Clients, expectLen: j.ExpectLen}
		for _, t := range j.Targets {
			o.targets = append(o.targets, loadTarget{url: t.URL, host: t.Host})
		}
		var before []time.Duration
		r, err := runLoad(ctx, o, j.Warmup, j.Duration, func() {
			if before == nil {
				before = cpuOf(j.PIDs)
			} else {
				res.CPU = cpuSince(j.PIDs, before)
			}
		})
		res.OK, res.Failed, res.WarmupFailed, res.Dials, res.Elapsed = r.ok, r.failed, r.warmupFailed, r.dials, r.elapsed
		res.P50, res.P99, res.P999 = r.pct(0.5), r.pct(0.99), r.pct(0.999)
		if r.failed+r.warmupFailed > 0 {
			res.FirstFailure = firstFailure(r)
		}
		return err
	case "bulk":
		if len(j.Addrs) == 0 || j.Size < 1 {
			return errors.New("bulk job: addrs and size are required")
		}
		ds := make([]streamData, len(j.Addrs))
		for i := range ds {
			k := [2]int64{int64(i), j.Size}
			d, ok := data[k]
			if !ok {
				d = newStreamData(uint64(i+1), j.Size)
				data[k] = d
			}
			ds[i] = d
		}
		before := cpuOf(j.PIDs)
		bps, err := bulkStreams(ctx, j.Addrs, ds, j.Sized)
		res.CPU = cpuSince(j.PIDs, before)
		if err != nil {
			return err
		}
		res.BPS, res.Verified = bps, len(ds)
		return nil
	case "http-cold":
		return wanColdJob(ctx, j, res)
	case "ttfb":
		if len(j.Addrs) == 0 || j.Conns < 1 {
			return errors.New("ttfb job: addrs and conns are required")
		}
		before := cpuOf(j.PIDs)
		ds := make([]time.Duration, 0, j.Conns)
		for i := range j.Conns {
			d, err := firstByte(ctx, j.Addrs[i%len(j.Addrs)])
			if err != nil {
				res.ConnsFailed++
				continue
			}
			ds = append(ds, d)
		}
		res.CPU = cpuSince(j.PIDs, before)
		sorted := durations(ds)
		res.Median, res.P99First = percentile(sorted, 0.5), percentile(sorted, 0.99)
		return nil
	}
	return fmt.Errorf("unknown job kind %q", j.Kind)
}
