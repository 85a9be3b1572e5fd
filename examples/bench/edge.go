package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"math/rand/v2"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"

	// The memory scenario's connectors over QUIC (-mem-transport quic).
	_ "github.com/warren-tunnel/warren/tunnel/quic"
)

// edgeCommand is the hidden subcommand that runs the edge in a child process.
const edgeCommand = "edge"

// benchDomain is the edge's public domain; the HTTP pool is reached as pool.localhost.
const benchDomain = "localhost"

// edgeOptions configures one edge.
type edgeOptions struct {
	tcpPorts   group.PortRange
	cpuprofile string
	verbose    bool
	// memProfileRate, when positive, sets runtime.MemProfileRate in a child edge (for
	// detailed heap profiles).
	memProfileRate int
	// retryIdempotent turns the edge's idempotent retry on for every pool
	// (tunnel.ServerConfig.LoadBalancing.RetryIdempotent).
	retryIdempotent bool
	// publicH2C makes the public listener serve HTTP/2 with prior knowledge (h2c) too
	// (tunnel.ServerConfig.Public.H2C), for the h2 scenario.
	publicH2C bool
	// quic makes the edge accept connectors over QUIC too, on a UDP port of its own with a
	// certificate it makes (the memory scenario's -mem-transport quic).
	quic bool
	// publicTLSCert and publicTLSKey (PEM files), when set, add a public HTTPS listener
	// (ServePublicTLS, HTTP/2 offered in ALPN) with that certificate, for the h2 scenario's
	// h2load table.
	publicTLSCert, publicTLSKey string
}

// pickPortRange returns 100 ports for TCP tunnels between 21000 and 30999: below the
// kernel's ephemeral range (32768+), and clear of the 20000-20100 default that other tests
// and examples use. The edge skips ports that are taken.
func pickPortRange() group.PortRange {
	lo := 21000 + 100*rand.IntN(100)
	return group.PortRange{Lo: lo, Hi: lo + 99}
}

// edgeAddrs is what a started edge announces: where to reach it.
type edgeAddrs struct {
	Control string `json:"control"` // connectors dial this
	Public  string `json:"public"`  // public HTTP
	Stats   string `json:"stats"`   // the bench's own JSON endpoint (/mem, /groups)
	// PublicTLS is the public HTTPS listener, with edgeOptions.publicTLSCert only.
	PublicTLS string `json:"public_tls,omitempty"`
	PID       int    `json:"pid"`
	// QUIC is the UDP address connectors reach the edge on over QUIC, and QUICCert its
	// certificate (DER), when the edge serves QUIC.
	QUIC     string `json:"quic,omitempty"`
	QUICCert []byte `json:"quic_cert,omitempty"`
}

// memSample is the edge's memory after a forced GC, as served on /mem.
type memSample struct {
	HeapInuse  uint64 `json:"heap_inuse"`
	HeapAlloc  uint64 `json:"heap_alloc"`
	StackInuse uint64 `json:"stack_inuse"`
	Sys        uint64 `json:"sys"`
	Goroutines int    `json:"goroutines"`
	RSS        int64  `json:"rss"` // filled in by the parent from /proc/<pid>/status
}

// groupInfo is one group of the edge's routing table, as served on /groups.
type groupInfo struct {
	Kind       string `json:"kind"`
	Label      string `json:"label"`
	Port       int    `json:"port"`
	Members    int    `json:"members"`
	Healthy    int    `json:"healthy"`
	Selectable int    `json:"selectable"`
}

// edgeServer is a Warren edge on 127.0.0.1 plus a small stats endpoint. It runs in the
// child process, or in this process with -edge inproc.
type edgeServer struct {
	srv   *tunnel.Server
	stats *http.Server
	addrs edgeAddrs
	prof  *os.File
	wg    sync.WaitGroup
	once  sync.Once

	relayMu sync.Mutex
	relays  []*tcpBackend // plain relays started in this process for the TCP scenario's scale
}

// startEdgeServer starts an edge with load balancing on and its listeners on loopback.
func startEdgeServer(o edgeOptions, log *zap.Logger) (_ *edgeServer, err error) {
	e := &edgeServer{}
	if o.cpuprofile != "" {
		if e.prof, err = os.Create(o.cpuprofile); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(e.prof); err != nil {
			_ = e.prof.Close()
			return nil, err
		}
	}
	// The edge's TLSConfig serves its QUIC listener (the memory scenario's -mem-transport
	// quic) or its public HTTPS listener (the h2 scenario's h2load table), never both here:
	// the control listener below is plain.
	var tlsConf *tls.Config
	var certDER []byte
	if o.quic {
		if tlsConf, certDER, err = quicEdgeTLS(); err != nil {
			e.stopProfile()
			return nil, err
		}
	}
	if o.publicTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(o.publicTLSCert, o.publicTLSKey)
		if err != nil {
			e.stopProfile()
			return nil, err
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	e.srv, err = tunnel.NewServer(tunnel.ServerConfig{
		TLSConfig: tlsConf,
		Domain:    benchDomain,
		LoadBalancing: tunnel.LoadBalancing{
			Enabled: true,
			// Off by default (a request is replayed only when no byte of it was written);
			// on here so that the churn report shows what it saves.
			RetryUnreadRequests: true,
			// Off by default too: the churn scenario runs its kill once more with it on.
			RetryIdempotent: o.retryIdempotent,
		},
		TCP:    tunnel.TCPTunnels{Ports: o.tcpPorts, BindHost: "127.0.0.1"},
		Logger: log,
		// Off by default; on for the h2 scenario, whose clients speak h2c to the edge.
		Public: tunnel.PublicHTTP{H2C: o.publicH2C},
		// Every connector here dials from 127.0.0.1, mem-parallel of them at a time: the
		// defaults (256 in all, 16 per address, waiting to authenticate) are for a public
		// edge, and would refuse the memory scenario's connectors as a flood.
		PreAuth: tunnel.PreAuthLimits{MaxConns: 4096, MaxConnsPerIP: 4096},
	})
	if err != nil {
		e.stopProfile()
		return nil, err
	}
	lns := make([]net.Listener, 3, 4)
	if o.publicTLSCert != "" {
		lns = lns[:4]
	}
	for i := range lns {
		if lns[i], err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			for _, l := range lns[:i] {
				_ = l.Close()
			}
			_ = e.srv.Close()
			e.stopProfile()
			return nil, err
		}
	}
	e.addrs = edgeAddrs{Control: lns[0].Addr().String(), Public: lns[1].Addr().String(), Stats: lns[2].Addr().String(), PID: os.Getpid()}
	e.stats = &http.Server{Handler: e.statsHandler(), ReadHeaderTimeout: 5 * time.Second}
	e.wg.Go(func() { _ = e.srv.Serve(lns[0]) })
	e.wg.Go(func() { _ = e.srv.ServePublic(lns[1]) })
	e.wg.Go(func() { _ = e.stats.Serve(lns[2]) })
	if o.quic {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			e.Close()
			return nil, err
		}
		e.addrs.QUIC, e.addrs.QUICCert = pc.LocalAddr().String(), certDER
		e.wg.Go(func() { _ = tunnel.ServeQUIC(e.srv, pc) })
	}
	if o.publicTLSCert != "" {
		e.addrs.PublicTLS = lns[3].Addr().String()
		e.wg.Go(func() { _ = e.srv.ServePublicTLS(lns[3]) })
	}
	return e, nil
}

// quicEdgeName is the name the bench edge's QUIC certificate is for.
const quicEdgeName = "edge." + benchDomain

// quicEdgeTLS makes the bench edge's certificate for QUIC, self-signed.
func quicEdgeTLS() (*tls.Config, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: quicEdgeName}, DNSNames: []string{quicEdgeName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, der, nil
}

// quicOptions are the options of a connector of e over QUIC, trusting its certificate.
func (a edgeAddrs) quicOptions() ([]tunnel.Option, error) {
	cert, err := x509.ParseCertificate(a.QUICCert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return []tunnel.Option{tunnel.WithQUIC(), tunnel.WithTLS(&tls.Config{RootCAs: pool, ServerName: quicEdgeName})}, nil
}

func (e *edgeServer) statsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /mem", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		debug.FreeOSMemory() // another GC, and return freed pages so that RSS is comparable
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		writeJSON(w, memSample{HeapInuse: ms.HeapInuse, HeapAlloc: ms.HeapAlloc, StackInuse: ms.StackInuse,
			Sys: ms.Sys, Goroutines: runtime.NumGoroutine()})
	})
	// The standard profiles, for a closer look at a running edge:
	// go tool pprof http://<stats>/debug/pprof/heap
	mux.HandleFunc("GET /debug/pprof/", httppprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", httppprof.Profile)
	// A plain relay in the edge's process, to target: the TCP scenario measures two plain
	// relays in a row laid out like the edge and the connector.
	mux.HandleFunc("GET /relay", func(w http.ResponseWriter, r *http.Request) {
		to := r.URL.Query().Get("to")
		if _, _, err := net.SplitHostPort(to); err != nil {
			http.Error(w, "bad ?to: "+err.Error(), http.StatusBadRequest)
			return
		}
		rl, err := startTCPBackend(relayConn(to))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		e.relayMu.Lock()
		e.relays = append(e.relays, rl)
		e.relayMu.Unlock()
		writeJSON(w, map[string]string{"addr": rl.addr()})
	})
	mux.HandleFunc("GET /retries", func(w http.ResponseWriter, _ *http.Request) {
		r, err := e.retries()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, r)
	})
	mux.HandleFunc("GET /groups", func(w http.ResponseWriter, _ *http.Request) {
		var out []groupInfo
		for _, g := range e.srv.Registry().Groups() {
			m, h, s := g.Counts()
			out = append(out, groupInfo{Kind: g.Kind.String(), Label: g.Label, Port: g.Port, Members: m, Healthy: h, Selectable: s})
		}
		writeJSON(w, out)
	})
	return mux
}

// retryCounts are the edge's dispatch retries by reason (warren_dispatch_retries_total).
type retryCounts struct {
	OpenFailed  uint64 `json:"open_failed"`
	ResetUnread uint64 `json:"reset_unread"`
	Idempotent  uint64 `json:"idempotent"`
}

func (e *edgeServer) retries() (retryCounts, error) {
	c := e.srv.Operator().Counters()
	return retryCounts{OpenFailed: c.RetriesOpenFailed, ResetUnread: c.RetriesResetUnread, Idempotent: c.RetriesIdempotent}, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (e *edgeServer) stopProfile() {
	if e.prof != nil {
		pprof.StopCPUProfile()
		_ = e.prof.Close()
	}
}

// Close stops the edge at once and waits for its goroutines; it is idempotent.
func (e *edgeServer) Close() error {
	e.once.Do(func() {
		_ = e.srv.Close()
		_ = e.stats.Close()
		e.wg.Wait()
		e.relayMu.Lock()
		for _, rl := range e.relays {
			rl.Close()
		}
		e.relays = nil
		e.relayMu.Unlock()
		e.stopProfile()
	})
	return nil
}

// edgeMain is the child process: it starts an edge, prints its addresses as one JSON line
// on stdout, and runs until its stdin is closed (the parent closes it, or dies).
func edgeMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ports := fs.String("tcp-ports", "", "TCP tunnel port range lo-hi")
	prof := fs.String("cpuprofile", "", "write the edge's CPU profile to this file")
	verbose := fs.Bool("v", false, "log to stderr")
	memRate := fs.Int("memprofilerate", 0, "runtime.MemProfileRate (0: the default)")
	retryIdem := fs.Bool("retry-idempotent", false, "turn the idempotent retry on for every pool")
	h2c := fs.Bool("public-h2c", false, "serve h2c (HTTP/2 with prior knowledge) on the public listener too")
	quic := fs.Bool("quic", false, "accept connectors over QUIC too")
	tlsCert := fs.String("public-tls-cert", "", "with -public-tls-key: serve public HTTPS (HTTP/2 offered) with this certificate (PEM)")
	tlsKey := fs.String("public-tls-key", "", "the key (PEM) of -public-tls-cert")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *memRate > 0 {
		runtime.MemProfileRate = *memRate
	}
	var o edgeOptions
	o.cpuprofile = *prof
	o.retryIdempotent = *retryIdem
	o.publicH2C = *h2c
	o.quic = *quic
	o.publicTLSCert, o.publicTLSKey = *tlsCert, *tlsKey
	if lo, hi, ok := strings.Cut(*ports, "-"); ok {
		var err1, err2 error
		o.tcpPorts.Lo, err1 = strconv.Atoi(lo)
		o.tcpPorts.Hi, err2 = strconv.Atoi(hi)
		if err1 != nil || err2 != nil {
			fmt.Fprintf(stderr, "bench edge: bad -tcp-ports %q (want lo-hi)\n", *ports)
			return 2
		}
	}
	// Ctrl-C reaches the whole process group; the parent handles it and closes this edge.
	signal.Ignore(os.Interrupt)
	_, _ = raiseFileLimit()
	log := zap.NewNop()
	if *verbose {
		log = zap.Must(zap.NewDevelopment()).Named("edge")
	}
	e, err := startEdgeServer(o, log)
	if err != nil {
		fmt.Fprintln(stderr, "bench edge:", err)
		return 1
	}
	defer e.Close()
	if err := json.NewEncoder(stdout).Encode(e.addrs); err != nil {
		fmt.Fprintln(stderr, "bench edge:", err)
		return 1
	}
	_, _ = io.Copy(io.Discard, stdin) // until the parent closes our stdin
	return 0
}

// edge is the parent's handle on an edge: a child process, or an in-process edgeServer.
type edge struct {
	edgeAddrs
	hc     *http.Client
	inproc *edgeServer

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *tailBuffer
	exited chan struct{} // closed once cmd.Wait returned
	once   sync.Once
}

// children are the child edges still running, so that a test can kill them all.
var children = struct {
	sync.Mutex
	m map[*edge]struct{}
}{m: map[*edge]struct{}{}}

// stopChildren kills every child edge still running and waits for it.
func stopChildren() {
	children.Lock()
	var es []*edge
	for e := range children.m {
		es = append(es, e)
	}
	children.Unlock()
	for _, e := range es {
		_ = e.cmd.Process.Kill()
		_ = e.Close()
	}
}

// startEdge starts an edge: a child process (mode "child") or in this process ("inproc").
func startEdge(ctx context.Context, mode string, o edgeOptions, log *zap.Logger, stderr io.Writer) (*edge, error) {
	e := &edge{hc: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil}}}
	if mode == "inproc" {
		s, err := startEdgeServer(o, log)
		if err != nil {
			return nil, err
		}
		e.inproc, e.edgeAddrs = s, s.addrs
		return e, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{edgeCommand, "-tcp-ports", fmt.Sprintf("%d-%d", o.tcpPorts.Lo, o.tcpPorts.Hi)}
	if o.cpuprofile != "" {
		args = append(args, "-cpuprofile", o.cpuprofile)
	}
	if o.verbose {
		args = append(args, "-v")
	}
	if o.memProfileRate > 0 {
		args = append(args, "-memprofilerate", strconv.Itoa(o.memProfileRate))
	}
	if o.retryIdempotent {
		args = append(args, "-retry-idempotent")
	}
	if o.publicH2C {
		args = append(args, "-public-h2c")
	}
	if o.quic {
		args = append(args, "-quic")
	}
	if o.publicTLSCert != "" {
		args = append(args, "-public-tls-cert", o.publicTLSCert, "-public-tls-key", o.publicTLSKey)
	}
	e.cmd = exec.Command(exe, args...)
	e.cmd.SysProcAttr = childAttrs()
	// A binary built with -race (the smoke test's) otherwise sleeps 1 s on exit.
	e.cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	if e.stdin, err = e.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	line := &firstLine{ch: make(chan string, 1)}
	e.cmd.Stdout = line
	e.stderr = &tailBuffer{max: 8 << 10}
	e.cmd.Stderr = e.stderr
	if o.verbose {
		e.cmd.Stderr = io.MultiWriter(e.stderr, stderr)
	}
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the edge process: %w", err)
	}
	e.exited = make(chan struct{})
	children.Lock()
	children.m[e] = struct{}{}
	children.Unlock()
	go func() { _ = e.cmd.Wait(); close(e.exited) }() // owned by e: Close waits for it
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case l := <-line.ch:
		if err := json.Unmarshal([]byte(l), &e.edgeAddrs); err != nil {
			_ = e.Close()
			return nil, fmt.Errorf("edge process announced %q: %w", l, err)
		}
		return e, nil
	case <-e.exited:
		_ = e.Close()
		return nil, fmt.Errorf("edge process exited at start: %s: %s", e.cmd.ProcessState, e.stderr)
	case <-timer.C:
		_ = e.Close()
		return nil, fmt.Errorf("edge process did not start within 30s: %s", e.stderr)
	case <-ctx.Done():
		_ = e.Close()
		return nil, ctx.Err()
	}
}

// child reports whether the edge is a separate process.
func (e *edge) child() bool { return e.cmd != nil }

// Close stops the edge: an in-process edge is closed; a child's stdin is closed, which makes
// it close its edge and exit, and it is killed if it has not exited within 15 s. Close
// waits for the child and is idempotent.
func (e *edge) Close() error {
	var err error
	e.once.Do(func() {
		e.hc.CloseIdleConnections()
		if e.inproc != nil {
			err = e.inproc.Close()
			return
		}
		_ = e.stdin.Close()
		t := time.NewTimer(15 * time.Second)
		defer t.Stop()
		select {
		case <-e.exited:
		case <-t.C:
			_ = e.cmd.Process.Kill()
			<-e.exited
			err = errors.New("the edge process did not exit within 15s of being told to; killed")
		}
		children.Lock()
		delete(children.m, e)
		children.Unlock()
		if st := e.cmd.ProcessState; err == nil && st != nil && !st.Success() {
			err = fmt.Errorf("edge process: %s: %s", st, e.stderr)
		}
	})
	return err
}

func (e *edge) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Stats+path, nil)
	if err != nil {
		return err
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("edge stats %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// mem samples the edge's memory after a GC: heap from the edge, RSS from /proc.
func (e *edge) mem(ctx context.Context) (memSample, error) {
	var m memSample
	if err := e.getJSON(ctx, "/mem", &m); err != nil {
		return m, err
	}
	rss, err := readRSS(e.PID)
	m.RSS = rss
	return m, err
}

// saveHeapProfile writes the edge's heap profile (after a GC) to path.
func (e *edge) saveHeapProfile(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Stats+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return err
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("edge heap profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cpu returns the CPU time the edge process has used so far (0 for an in-process edge).
func (e *edge) cpu() time.Duration {
	if !e.child() {
		return 0
	}
	d, _ := readCPU(e.PID)
	return d
}

// relay starts a plain relay to target in the edge's process and returns its address.
func (e *edge) relay(ctx context.Context, target string) (string, error) {
	var out struct{ Addr string }
	err := e.getJSON(ctx, "/relay?to="+url.QueryEscape(target), &out)
	return out.Addr, err
}

// retries returns the edge's retry counters.
func (e *edge) retries(ctx context.Context) (retryCounts, error) {
	var r retryCounts
	err := e.getJSON(ctx, "/retries", &r)
	return r, err
}

// groups returns the edge's groups.
func (e *edge) groups(ctx context.Context) ([]groupInfo, error) {
	var gs []groupInfo
	err := e.getJSON(ctx, "/groups", &gs)
	return gs, err
}

// waitGroup polls the edge until the group with this label has exactly members members of
// which healthy are healthy, or ctx (bounded here to 15 s) ends.
func (e *edge) waitGroup(ctx context.Context, label string, members, healthy int) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last groupInfo
	for {
		gs, err := e.groups(ctx)
		if err == nil {
			last = groupInfo{}
			for _, g := range gs {
				if g.Label == label {
					last = g
				}
			}
			if last.Members == members && last.Healthy == healthy {
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("waiting for group %q to have %d members, %d healthy (it has %d, %d healthy): %w",
				label, members, healthy, last.Members, last.Healthy, ctx.Err())
		}
	}
}

// firstLine captures the first line written to it.
type firstLine struct {
	mu   sync.Mutex
	buf  []byte
	done bool
	ch   chan string // buffered 1
}

func (f *firstLine) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.done {
		f.buf = append(f.buf, p...)
		if i := bytes.IndexByte(f.buf, '\n'); i >= 0 {
			f.done = true
			f.ch <- string(f.buf[:i])
		}
	}
	return len(p), nil
}

// tailBuffer keeps the last max bytes written to it (a child's stderr, for error messages).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.buf))
	if s == "" {
		return "(no output)"
	}
	return s
}
