// Command bench is Warren's load tool. In one run it starts an edge, connectors and
// backends on 127.0.0.1 and measures the same workloads twice: through the tunnel and
// directly against the same backends, so that every figure comes with its own baseline
// from the same machine at the same time. It is a module of its own, run from the
// repository's root as below (the files it writes are then relative to examples/bench):
//
//	go -C examples/bench run .                   # every scenario, 3 runs each
//	go -C examples/bench run . -only http,tcp -runs 5 -duration 10s -markdown bench.md
//
// Scenarios (-only picks some; the default is all of them):
//
//   - http:  requests/s and latency p50/p99/p99.9 at 32 keep-alive clients through a
//     2-member group (2 connectors, 2 backends), tiny and 64 KiB responses; directly, the
//     clients are split evenly over the same two backends. One more, unloaded workload (1
//     client, -latency-clients) shows the latency the tunnel adds without queueing.
//   - h2:    HTTP/2 and gRPC: requests/s and latency of -clients request loops sharing
//     -h2-conns connections that speak HTTP/2 with prior knowledge (h2c) to the edge
//     (tunnel.ServerConfig.Public.H2C): tiny GETs through a 2-member pool whose members the
//     edge reaches over HTTP/1.1 and through one it reaches over h2c (TunnelSpec.
//     BackendProtocol), and gRPC unary calls (the standard health service's Check) through a
//     2-member h2c pool of grpc-go servers; directly, the same loops speak h2c to the backends.
//   - tcp:   bulk throughput through a 2-member TCP group, 1 stream and 8 concurrent
//     streams of -tcp-bytes each, every stream checksummed (CRC-32C) by the backend.
//   - ttfb:  time from dial to the first byte for new TCP connections; the difference to
//     direct is the time the tunnel adds to a new connection.
//   - churn: failed requests under load through a 3-member group with 100 ms TCP health
//     checks while (a) one backend is killed and restarted and (b) the three members are
//     restarted one after the other (drain, register again); and (c) the same kill through
//     a second edge with the idempotent retry on (tunnel.ServerConfig.LoadBalancing.RetryIdempotent), so
//     that the report shows the failures with the retry off and on side by side.
//   - lb:    the load-balancing policies: each member's share of -lb-requests sequential
//     requests through pools weighted 3:1 and 1:1:2; the affinity keys (-lb-keys, header
//     X-Client) that change member when one of -lb-members members leaves, and how evenly
//     the keys spread; and the failed requests at -clients clients while a 3-member pool's
//     group key is rotated by a rolling restart (new key with PreviousGroupKeys, then the
//     old member drains), one member at a time.
//   - mem:   the edge's heap and RSS per idle connector session and per idle member, at
//     each of -mem-connectors connectors.
//
// Two layouts (-layout). In "shared" (the default) the connectors, backends and load
// generators share this process and only the edge is a child, as described below. In
// "processes" every party is its own OS process, as a new user deploys Warren:
// examples/edge and two examples/connector, built with go build into a temporary directory
// and run with generated server.toml and YAML files, two backend processes and the load
// generator (this binary re-executed in hidden roles). Next to Warren it measures the
// plain-relay floor in the same layout — two relay processes in a row, once with io.Copy
// (splice) and once with 64 KiB buffers — and the backends directly, in alternated rounds:
// one TCP stream of -tcp-bytes and -tcp-streams streams sharing it, the time to the first
// byte of new TCP connections, and tiny HTTP responses at -clients clients with the edge's
// (and relay A's) CPU per request; -control plain|tls|both runs the edge's control
// connections (and the relays' link) plain, over TLS with a generated certificate, or both,
// side by side. Its scenarios are http, tcp and ttfb; every other flag that applies keeps
// its meaning.
//
//	go -C examples/bench run . -layout processes -runs 3 -tcp-bytes 256MiB -duration 5s
//
// With -wan-rtt RTT the process layout runs its WAN scenario instead (wan_scenario.go): the
// whole bench re-executed in a network namespace of its own, where only the link between
// the connectors and the edge (and the relay floor's equivalent link, and a backend reached
// over the link as the plain TCP yardstick) is delayed by RTT/2 each way; HTTP p50/p99 with
// one client and with -clients clients, and one TCP stream. It needs root, ip and iptables;
// without them it prints why and exits 0 having run nothing.
//
//	go -C examples/bench run . -layout processes -wan-rtt 50ms -runs 3 -duration 3s
//
// The edge runs in a child process (the tool re-executes itself with the hidden "edge"
// subcommand) so that its memory and CPU are its own; -edge inproc runs it in this process
// instead, except for the memory scenario. Each pair (tunnel, direct) is repeated -runs
// times in alternating order; the table shows the median of the runs and the ratio of the
// medians, with the target and whether it was met. -markdown writes the same table as
// Markdown with the command line, the code's commit, the machine and the date.
//
// The machines are small and shared: during each run the tool measures the CPU that other
// processes used (from /proc/stat) and runs it again when that exceeds 0.25 cores
// (-noisy-retries); the notes under each table say how busy the machine was. For a closer
// look, -cpuprofile profiles the edge, -client-cpuprofile this process (load, connectors,
// backends), and -mem-heapprofile saves the edge's heap in the memory scenario.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	benchconfig "github.com/warren-tunnel/warren/tunnel/config"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == edgeCommand {
		os.Exit(edgeMain(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	if code, ok := procRoleMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	_, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// The scenarios, in the order they run.
var allScenarios = []string{"http", "h2", "tcp", "ttfb", "churn", "lb", "mem"}

// procScenarios are the scenarios of -layout processes.
var procScenarios = []string{"http", "tcp", "ttfb"}

// Layouts of the processes (-layout).
const (
	layoutShared    = "shared"    // connectors, backends and load in this process; the edge a child
	layoutProcesses = "processes" // every party its own process (proc.go)
)

// config is the parsed command line.
type config struct {
	scenarios      []string
	duration       time.Duration
	runs           int
	clients        int
	latencyClients int
	h2Conns        int
	h2load         string // h2 scenario: the h2load binary of its HTTPS table ("": no such table)
	h2loadConns    int
	h2loadStreams  int
	pacedFraction  float64
	tcpBytes       int64
	tcpStreams     int
	ttfbConns      int
	memConnectors  []int
	memGroupSize   int
	memParallel    int
	memProto       string
	memTransport   string
	killFor        time.Duration
	lbRequests     int
	lbKeys         int
	lbMembers      int
	edgeMode       string
	layout         string
	controls       []bool        // -layout processes: the control connections measured, false plain, true TLS
	wanRTT         time.Duration // -layout processes: the round trip added to the edge↔connector link (0: none)
	dataReadBuffer int           // -layout processes: data_read_buffer of the edges and connectors (0: the kernel's)
	wanJSON        string        // with -wan-rtt: also write the WAN figures as JSON to this file
	wanLoss        []float64     // with -wan-rtt: the random loss levels (shares in [0,1)) measured side by side; nil: none
	wanWebSocket   bool          // with -wan-rtt: also Warren with its connectors over WebSocket (wss)
	wanQUIC        bool          // with -wan-rtt: also Warren with its connectors over QUIC
	wanMTU         int           // with -wan-rtt: lo's MTU in the namespace (0: the kernel's, 65536)
	wanFRP         string        // with -wan-loss: the directory of frps and frpc, measured over TCP and QUIC beside Warren ("": not)
	markdown       string
	cpuprofile     string
	selfProfile    string
	memProfile     string
	noisyRetries   int
	verbose        bool
	args           []string
}

func (c *config) has(scenario string) bool { return slices.Contains(c.scenarios, scenario) }

// parseConfig parses the command line; it returns flag.ErrHelp after printing the usage
// for -h.
func parseConfig(args []string, stderr io.Writer) (*config, error) {
	c := &config{args: args}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go -C examples/bench run . [flags]\n\nWarren's load tool: the same workloads through the tunnel and directly, side by side.\n\n")
		fs.PrintDefaults()
	}
	only := fs.String("only", strings.Join(allScenarios, ","), "comma-separated scenarios to run: "+strings.Join(allScenarios, ", "))
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "measured time of each HTTP run (after a warm-up of a fifth of it, at most 1s)")
	fs.IntVar(&c.runs, "runs", 3, "repetitions of each tunnel/direct pair; the table shows medians")
	fs.IntVar(&c.clients, "clients", 32, "concurrent keep-alive HTTP clients (http, churn, lb), and the request loops of h2")
	fs.Float64Var(&c.pacedFraction, "paced", 0.5, "also run the tiny-response workload at -clients clients paced (open loop) at this fraction of the tunnel's closed-loop requests/s, through the tunnel and directly alike: latency at equal, unsaturated load (0: skip it)")
	fs.IntVar(&c.latencyClients, "latency-clients", 1, "clients of an extra, unloaded tiny-response HTTP workload that shows the latency the tunnel adds without queueing (0: skip it)")
	fs.IntVar(&c.h2Conns, "h2-conns", 2, "client connections of the h2 scenario, shared by its -clients request loops (HTTP/2 and gRPC), through the tunnel and directly alike")
	fs.StringVar(&c.h2load, "h2load", "h2load", `h2 scenario: nghttp2's h2load, for its table of HTTP/2 over TLS against Warren and the stock Go reverse proxy ("": no such table; not on PATH: the table says so)`)
	fs.IntVar(&c.h2loadConns, "h2load-conns", 4, "h2load's connections (-c) in the h2 scenario's HTTPS table")
	fs.IntVar(&c.h2loadStreams, "h2load-streams", 100, "h2load's concurrent streams per connection (-m) in the h2 scenario's HTTPS table")
	tcpBytes := fs.String("tcp-bytes", "1GiB", "bytes per TCP bulk stream; with -layout processes, of the one stream, and shared by the -tcp-streams streams (units B, KiB, MiB, GiB, KB, MB, GB)")
	fs.IntVar(&c.tcpStreams, "tcp-streams", 8, "concurrent streams of the multi-stream TCP run")
	fs.IntVar(&c.ttfbConns, "ttfb-conns", 1000, "sequential new connections per time-to-first-byte run")
	memConns := fs.String("mem-connectors", "1000,10000", "comma-separated connector counts for the memory scenario")
	fs.IntVar(&c.memGroupSize, "mem-group-size", 100, "members per group in the memory scenario (0: every connector's tunnel is solo)")
	fs.IntVar(&c.memParallel, "mem-parallel", 200, "connectors opened or closed at a time in the memory scenario")
	fs.StringVar(&c.memProto, "mem-proto", "http", `the memory scenario's tunnels: "http", or "tcp" (each connector then also keeps its idle data connections to the edge; needs -mem-group-size > 0, at most 100 groups)`)
	fs.StringVar(&c.memTransport, "mem-transport", "tcp", `how the memory scenario's connectors reach the edge: "tcp", or "quic" (the edge then serves QUIC on a UDP port too)`)
	fs.DurationVar(&c.killFor, "kill-for", 2*time.Second, "how long the killed backend stays down in the churn scenario")
	fs.IntVar(&c.lbRequests, "lb-requests", 2000, "sequential requests per weighted pool in the lb scenario")
	fs.IntVar(&c.lbKeys, "lb-keys", 10000, "distinct affinity keys in the lb scenario")
	fs.IntVar(&c.lbMembers, "lb-members", 5, "members of the affinity pool in the lb scenario (one of them leaves)")
	fs.StringVar(&c.edgeMode, "edge", "child", `where the edge runs: "child" (a child process) or "inproc" (this process; not for mem)`)
	fs.StringVar(&c.layout, "layout", layoutShared, `"shared": connectors, backends and load generator in this process, the edge a child; "processes": every party its own process (examples/edge, 2 examples/connector, 2 backends, the load generator) next to a plain-relay floor in the same layout (scenarios http, tcp, ttfb)`)
	control := fs.String("control", "both", `-layout processes: the edge's control connections, "plain", "tls" or "both" (rows side by side)`)
	fs.IntVar(&c.dataReadBuffer, "data-read-buffer", 0, "-layout processes: data_read_buffer (bytes) of the edges' server.toml and the connectors' YAML, the fixed receive buffer of their data connections (0: the kernel's autotuning, the default)")
	fs.DurationVar(&c.wanRTT, "wan-rtt", 0, "-layout processes: run the WAN scenario instead, with this round trip added to the link between the connectors and the edge (and the relay floor's equivalent link) in a network namespace of its own; needs root, ip and iptables (else it says why and exits 0 having run nothing); scenarios http (1 and -clients clients), tcp (1 stream; -tcp-bytes defaults to 64MiB here) and cold (single requests after the edge's idle member streams expired, about 1 min)")
	wanLoss := fs.String("wan-loss", "", `with -wan-rtt: comma-separated random loss levels in percent on the link, e.g. "0,1,3": every level is measured in each round (scenarios http and tcp), levels and paths alternated`)
	fs.IntVar(&c.wanMTU, "wan-mtu", 0, "with -wan-rtt: the MTU of lo in the namespace, so the size of the packets the link delays and drops (0: the kernel's 65536; 1500: Ethernet-like, which a per-packet loss needs to treat TCP and QUIC alike)")
	fs.StringVar(&c.wanFRP, "wan-frp", "", "with -wan-loss: also measure frp (frps in the edge's place, 2 frpc in the connectors') over its tcp and quic transports; the directory holding the frps and frpc binaries")
	fs.BoolVar(&c.wanWebSocket, "wan-websocket", false, "with -wan-rtt: also measure Warren with its connectors over WebSocket (wss to the edge's HTTPS port, websocket_path), that port delayed as the link")
	fs.BoolVar(&c.wanQUIC, "wan-quic", false, "with -wan-rtt: also measure Warren with its connectors over QUIC (transport: quic to the edge's quic_port, a UDP port delayed and lossy as the link)")
	fs.StringVar(&c.wanJSON, "wan-json", "", "with -wan-rtt: also write the WAN figures (medians) as JSON to this file")
	fs.IntVar(&c.noisyRetries, "noisy-retries", 3, "run a tunnel or direct run again, up to this many times, when other processes used more than 0.25 cores during it")
	fs.StringVar(&c.markdown, "markdown", "", "also write the results as Markdown to this file")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "write the edge's CPU profile, one file per scenario (FILE becomes FILE-<scenario>); with -edge inproc it covers this whole process")
	fs.StringVar(&c.selfProfile, "client-cpuprofile", "", "write a CPU profile of this process (load generators, connectors, backends) to this file")
	fs.StringVar(&c.memProfile, "mem-heapprofile", "", "save the edge's heap profiles in the memory scenario (FILE becomes FILE-<N>-connected and FILE-<N>-closed)")
	fs.BoolVar(&c.verbose, "v", false, "log the edge's and the connectors' messages to stderr")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (every setting is a flag; see -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	if c.scenarios, err = parseScenarios(*only); err != nil {
		return nil, err
	}
	if err := c.processLayout(set, *control); err != nil {
		return nil, err
	}
	if c.wanLoss, err = parseLossList(*wanLoss); err != nil {
		return nil, fmt.Errorf("-wan-loss: %w", err)
	}
	if err := c.wanLossFlags(set); err != nil {
		return nil, err
	}
	if c.wanMTU != 0 && (c.wanRTT == 0 || c.wanMTU < 1280 || c.wanMTU > 65536) {
		return nil, fmt.Errorf("-wan-mtu needs -wan-rtt and must be between 1280 and 65536, got %d", c.wanMTU)
	}
	if err := c.frpFlags(); err != nil {
		return nil, err
	}
	if c.wanRTT > 0 && !set["tcp-bytes"] {
		*tcpBytes = wanDefaultTCPBytes
	}
	if c.tcpBytes, err = parseSize(*tcpBytes); err != nil {
		return nil, fmt.Errorf("-tcp-bytes: %w", err)
	}
	if c.memConnectors, err = parseCounts(*memConns); err != nil {
		return nil, fmt.Errorf("-mem-connectors: %w", err)
	}
	switch {
	case c.duration <= 0:
		return nil, fmt.Errorf("-duration must be positive, got %v", c.duration)
	case c.runs < 1 || c.runs > 100:
		return nil, fmt.Errorf("-runs must be between 1 and 100, got %d", c.runs)
	case c.clients < 1 || c.clients > 4096:
		return nil, fmt.Errorf("-clients must be between 1 and 4096, got %d", c.clients)
	case c.pacedFraction < 0 || c.pacedFraction > 1:
		return nil, fmt.Errorf("-paced must be between 0 and 1, got %v", c.pacedFraction)
	case c.latencyClients < 0 || c.latencyClients > 4096:
		return nil, fmt.Errorf("-latency-clients must be between 0 and 4096, got %d", c.latencyClients)
	case c.h2Conns < 1 || c.h2Conns > c.clients:
		return nil, fmt.Errorf("-h2-conns must be between 1 and -clients (%d), got %d", c.clients, c.h2Conns)
	case c.h2loadConns < 1 || c.h2loadConns > 1024 || c.h2loadStreams < 1 || c.h2loadStreams > 1000:
		return nil, fmt.Errorf("-h2load-conns must be between 1 and 1024 and -h2load-streams between 1 and 1000, got %d and %d", c.h2loadConns, c.h2loadStreams)
	case c.tcpStreams < 1 || c.tcpStreams > 256:
		return nil, fmt.Errorf("-tcp-streams must be between 1 and 256, got %d", c.tcpStreams)
	case c.ttfbConns < 1 || c.ttfbConns > 100000:
		return nil, fmt.Errorf("-ttfb-conns must be between 1 and 100000, got %d", c.ttfbConns)
	case c.memGroupSize < 0:
		return nil, fmt.Errorf("-mem-group-size must not be negative, got %d", c.memGroupSize)
	case c.dataReadBuffer < 0 || c.dataReadBuffer > benchconfig.MaxDataReadBuffer:
		return nil, fmt.Errorf("-data-read-buffer must be 0 to %d bytes, got %d", benchconfig.MaxDataReadBuffer, c.dataReadBuffer)
	case c.memParallel < 1:
		return nil, fmt.Errorf("-mem-parallel must be positive, got %d", c.memParallel)
	case c.memTransport != "tcp" && c.memTransport != "quic":
		return nil, fmt.Errorf(`-mem-transport must be "tcp" or "quic", got %q`, c.memTransport)
	case c.memProto != "http" && c.memProto != "tcp":
		return nil, fmt.Errorf(`-mem-proto must be "http" or "tcp", got %q`, c.memProto)
	case c.memProto == "tcp" && c.memGroupSize == 0:
		return nil, errors.New("-mem-proto tcp needs groups (-mem-group-size > 0): each TCP group takes one of the edge's 100 ports")
	case c.noisyRetries < 0:
		return nil, fmt.Errorf("-noisy-retries must not be negative, got %d", c.noisyRetries)
	case c.lbRequests < 1 || c.lbRequests > 1_000_000:
		return nil, fmt.Errorf("-lb-requests must be between 1 and 1000000, got %d", c.lbRequests)
	case c.lbKeys < 1 || c.lbKeys > 1_000_000:
		return nil, fmt.Errorf("-lb-keys must be between 1 and 1000000, got %d", c.lbKeys)
	case c.lbMembers < 2 || c.lbMembers > 100:
		return nil, fmt.Errorf("-lb-members must be between 2 and 100, got %d", c.lbMembers)
	case c.killFor <= 0:
		return nil, fmt.Errorf("-kill-for must be positive, got %v", c.killFor)
	case c.edgeMode != "child" && c.edgeMode != "inproc":
		return nil, fmt.Errorf(`-edge must be "child" or "inproc", got %q`, c.edgeMode)
	case c.edgeMode == "inproc" && c.cpuprofile != "" && c.selfProfile != "":
		return nil, errors.New("-cpuprofile with -edge inproc profiles this whole process already; drop -client-cpuprofile")
	}
	return c, nil
}

// processLayout checks -layout and the flags that depend on it; set names the flags given.
func (c *config) processLayout(set map[string]bool, control string) error {
	switch c.layout {
	case layoutShared:
		switch {
		case set["control"]:
			return errors.New("-control applies to -layout processes only")
		case set["wan-rtt"] || set["wan-json"]:
			return errors.New("-wan-rtt and -wan-json apply to -layout processes only")
		case set["data-read-buffer"]:
			return errors.New("-data-read-buffer applies to -layout processes only")
		case c.has("cold"):
			return errors.New(`-only: scenario "cold" runs with -layout processes -wan-rtt only`)
		}
		return nil
	case layoutProcesses:
	default:
		return fmt.Errorf("-layout must be %q or %q, got %q", layoutShared, layoutProcesses, c.layout)
	}
	if err := c.wanFlags(set); err != nil {
		return err
	}
	scenarios := procScenarios
	if c.wanRTT > 0 {
		scenarios = wanScenarios
	}
	if !set["only"] {
		c.scenarios = scenarios
	}
	for _, s := range c.scenarios {
		if !slices.Contains(scenarios, s) {
			if c.wanRTT > 0 {
				return fmt.Errorf("-only: scenario %q does not run with -wan-rtt (it has %s)", s, strings.Join(scenarios, ", "))
			}
			return fmt.Errorf("-only: scenario %q does not run in -layout processes (it has %s)", s, strings.Join(procScenarios, ", "))
		}
	}
	switch control {
	case "plain":
		c.controls = []bool{false}
	case "tls":
		c.controls = []bool{true}
	case "both":
		c.controls = []bool{false, true}
	default:
		return fmt.Errorf(`-control must be "plain", "tls" or "both", got %q`, control)
	}
	switch {
	case set["edge"]:
		return errors.New("-edge does not apply to -layout processes (the edge is examples/edge in its own process)")
	case c.cpuprofile != "":
		return errors.New("-cpuprofile does not apply to -layout processes (the edge is examples/edge, which has no profiling flag)")
	}
	return nil
}

func parseScenarios(s string) ([]string, error) {
	want := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		if !slices.Contains(allScenarios, name) && !slices.Contains(wanScenarios, name) {
			return nil, fmt.Errorf("-only: unknown scenario %q (want some of %s; with -wan-rtt some of %s)", name, strings.Join(allScenarios, ", "), strings.Join(wanScenarios, ", "))
		}
		want[name] = true
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("-only: no scenario named (want some of %s)", strings.Join(allScenarios, ", "))
	}
	var out []string
	for _, name := range slices.Concat(allScenarios, []string{"cold"}) { // cold: -wan-rtt only
		if want[name] {
			out = append(out, name)
		}
	}
	return out, nil
}

// parseSize parses a byte count such as "1GiB", "64KiB", "1.5MB" or "4096".
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(s)
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := map[string]float64{
		"": 1, "b": 1,
		"kb": 1e3, "mb": 1e6, "gb": 1e9,
		"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
	}[unit]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q in %q (want B, KiB, MiB, GiB, KB, MB or GB)", unit, s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("%q is not a size (e.g. 1GiB, 64KiB, 4096)", s)
	}
	n := f * mult
	if n < 1 || n > 1<<40 {
		return 0, fmt.Errorf("size %q out of range (1 B to 1 TiB)", s)
	}
	return int64(n), nil
}

// parseCounts parses a comma-separated list of positive counts.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 1_000_000 {
			return nil, fmt.Errorf("%q is not a count between 1 and 1000000", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no count given")
	}
	return out, nil
}

// bench holds what every scenario needs.
type bench struct {
	cfg      *config
	log      *zap.Logger
	progress io.Writer
	// linkHook, when set, is called for every port that stands for the link between an edge
	// and its connectors in -layout processes (see linkHook); nil leaves the links alone.
	linkHook linkHook
	// wan is the WAN scenario's link inside its namespace (-wan-rtt); nil otherwise.
	wan *wanLink
}

// say prints a progress line to stderr (the table goes to stdout at the end).
func (b *bench) say(format string, args ...any) {
	fmt.Fprintf(b.progress, "bench: "+format+"\n", args...)
}

// edgeOptions returns the options of the edge for one scenario.
func (b *bench) edgeOptions(scenario string) edgeOptions {
	o := edgeOptions{tcpPorts: pickPortRange(), verbose: b.cfg.verbose}
	if p := b.cfg.cpuprofile; p != "" {
		ext := filepath.Ext(p)
		o.cpuprofile = strings.TrimSuffix(p, ext) + "-" + scenario + ext
	}
	return o
}

// run parses args, runs the chosen scenarios and prints the table to stdout (and Markdown
// to -markdown). Progress goes to stderr. It returns the report, or an error when a
// scenario could not be carried out (a target that is missed is not an error: it is a
// FAIL in the table).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (*report, error) {
	return runWith(ctx, args, stdout, stderr, nil)
}

// runWith is run with a link hook for -layout processes (nil: none).
func runWith(ctx context.Context, args []string, stdout, stderr io.Writer, hook linkHook) (*report, error) {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		return nil, err
	}
	limit, err := raiseFileLimit()
	if err != nil {
		return nil, fmt.Errorf("raising the open-file limit: %w", err)
	}
	if cfg.has("mem") {
		perConnector := uint64(1) // its control connection
		if cfg.memProto == "tcp" {
			perConnector += uint64(memDataConnsPerSession)
		}
		for _, n := range cfg.memConnectors {
			if cfg.memProto == "tcp" && (n+cfg.memGroupSize-1)/cfg.memGroupSize > memTCPPorts {
				return nil, fmt.Errorf("-mem-proto tcp: %d connectors in groups of %d need more than the edge's %d TCP ports", n, cfg.memGroupSize, memTCPPorts)
			}
			if need := uint64(n)*perConnector + 1024; need > limit {
				return nil, fmt.Errorf("-mem-connectors %d needs about %d open files in this process and in the edge, but the limit is %d (raise ulimit -n)", n, need, limit)
			}
		}
	}
	if cfg.selfProfile != "" {
		f, err := os.Create(cfg.selfProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	log := zap.NewNop()
	if cfg.verbose {
		zc := zap.NewDevelopmentConfig()
		zc.OutputPaths, zc.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
		if log, err = zc.Build(); err != nil {
			return nil, err
		}
		defer func() { _ = log.Sync() }()
	}
	b := &bench{cfg: cfg, log: log, progress: stderr, linkHook: hook}
	rep := newReport(cfg)
	if cfg.layout == layoutProcesses {
		if cfg.wanRTT > 0 {
			inside, err := b.wanSetUp(ctx, stdout, stderr)
			if err != nil || !inside {
				return nil, err
			}
			defer b.wan.close()
		}
		b.say("layout processes: %s", strings.Join(cfg.scenarios, ", "))
		if err := b.runProcesses(ctx, rep); err != nil {
			return rep, err
		}
		if err := b.wan.writeJSON(cfg.wanJSON, rep.proc); err != nil {
			return rep, err
		}
		return rep, b.finish(rep, stdout)
	}
	scenarios := map[string]func(context.Context, *report) error{
		"http":  b.runHTTP,
		"h2":    b.runH2,
		"tcp":   b.runTCP,
		"ttfb":  b.runTTFB,
		"churn": b.runChurn,
		"lb":    b.runLB,
		"mem":   b.runMem,
	}
	for _, name := range cfg.scenarios {
		start := time.Now()
		b.say("scenario %s", name)
		if err := scenarios[name](ctx, rep); err != nil {
			return rep, fmt.Errorf("scenario %s: %w", name, err)
		}
		b.say("scenario %s done in %s", name, time.Since(start).Round(100*time.Millisecond))
	}
	return rep, b.finish(rep, stdout)
}

// finish prints the tables to stdout and writes -markdown.
func (b *bench) finish(rep *report, stdout io.Writer) error {
	cfg := b.cfg
	rep.elapsed = time.Since(rep.started)
	bw := bufio.NewWriter(stdout)
	if err := rep.writeText(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if cfg.markdown != "" {
		if err := rep.writeMarkdownFile(cfg.markdown); err != nil {
			return fmt.Errorf("writing %s: %w", cfg.markdown, err)
		}
		b.say("wrote %s", cfg.markdown)
	}
	return nil
}
