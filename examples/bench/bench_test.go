package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary play the edge child process: the tool re-executes
// os.Executable() with the "edge" subcommand, which under "go test" is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == edgeCommand {
		os.Exit(edgeMain(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario at tiny sizes and checks that each measured something real:
// requests answered, streams checksummed, connectors registered and reachable, and that no
// edge process is left behind.
func TestSmoke(t *testing.T) {
	t.Cleanup(stopChildren)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	md := filepath.Join(t.TempDir(), "bench.md")
	var stdout, stderr bytes.Buffer
	args := []string{"-duration", "200ms", "-runs", "1", "-clients", "4", "-tcp-bytes", "1MiB", "-tcp-streams", "2",
		"-ttfb-conns", "20", "-h2-conns", "2", "-mem-connectors", "40", "-mem-group-size", "10", "-mem-parallel", "40", "-kill-for", "300ms", "-noisy-retries", "0", "-markdown", md,
		// h2load's table has a test of its own (TestH2load): it takes whole seconds.
		"-h2load", "",
		// mem: 40 connectors dial at once from one address, over the edge's default cap on
		// control connections waiting to authenticate per address (16): the bench's edge
		// must not take its own load for a flood.
		// lb: 10 members and 1,000 keys keep the keys moved (binomial, mean 10 %, sd 0.95 pp)
		// more than 5 sd below the 1/10 + 5 pp bound, at 2,000 sequential requests.
		"-lb-requests", "100", "-lb-keys", "1000", "-lb-members", "10"}
	rep, err := run(ctx, args, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())

	require.Len(t, rep.http, 4, "tiny and 64 KiB at -clients, tiny paced at -clients, tiny at -latency-clients")
	require.Equal(t, 1, rep.http[3].clients)
	require.False(t, rep.http[3].targets, "the targets are set at -clients")
	require.Len(t, rep.http[0].relay, 1, "the first workload also ran through two plain relays")
	require.Positive(t, rep.http[0].relay[0].ok)
	require.Zero(t, rep.http[0].relay[0].failed)
	paced := rep.http[2]
	require.InDelta(t, 0.5*rep.http[0].tunnel[0].rps(), paced.rate, 1e-6, "paced at half the tunnel's closed-loop rate")
	for _, r := range []loadResult{paced.tunnel[0], paced.direct[0]} {
		require.LessOrEqual(t, float64(r.requests()), paced.rate*r.elapsed.Seconds()+4, "the clients kept to the pace")
	}
	for _, h := range rep.http {
		require.Len(t, h.tunnel, 1)
		require.Len(t, h.direct, 1)
		require.Positive(t, h.tunnel[0].ok, "%s: requests answered through the tunnel", h.name)
		require.Positive(t, h.direct[0].ok, "%s: requests answered directly", h.name)
		require.Zero(t, h.tunnel[0].failed+h.tunnel[0].warmupFailed, "%s: no failure under plain load: %v", h.name, h.tunnel[0].failures)
		require.Len(t, h.tunnel[0].lat, h.tunnel[0].ok, "every answered request has its latency")
	}

	require.Len(t, rep.h2, 3, "HTTP/2 through an HTTP/1.1 member and an h2c member, gRPC")
	for i, want := range []struct {
		member string
		grpc   bool
	}{{"HTTP/1.1", false}, {"h2c", false}, {"h2c", true}} {
		h := rep.h2[i]
		require.Equal(t, want.member, h.member, h.name)
		require.Equal(t, want.grpc, h.grpc, h.name)
		require.Equal(t, 4, h.clients, "%s: the -clients request loops", h.name)
		require.Equal(t, 2, h.conns, "%s: on -h2-conns connections", h.name)
		require.Len(t, h.tunnel, 1)
		require.Len(t, h.direct, 1)
		for _, r := range []loadResult{h.tunnel[0], h.direct[0]} {
			require.Positive(t, r.rps(), "%s: answered", h.name)
			require.Zero(t, r.failed+r.warmupFailed, "%s: no failure: %v", h.name, r.failures)
			require.Len(t, r.lat, r.ok, "%s: every answer has its latency", h.name)
			require.Positive(t, r.pct(0.99), h.name)
			require.Less(t, r.pct(0.99), 10*time.Second, h.name)
		}
		require.Equal(t, []int{2}, h.tunnelDials, "%s: the loops shared 2 connections to the edge", h.name)
		require.Equal(t, []int{2}, h.directDials, "%s: the loops shared 2 connections to the backends", h.name)
	}

	require.Len(t, rep.tcp, 2, "1 stream and 2 streams")
	require.Len(t, rep.tcp[0].relay, 1, "the single stream also went through two plain relays")
	require.Positive(t, rep.tcp[0].relay.median())
	require.Empty(t, rep.tcp[1].relay)
	for _, s := range rep.tcp {
		require.Equal(t, 2*s.streams, s.verified, "every stream checksummed on both paths")
		require.Positive(t, s.tunnel.median())
		require.Positive(t, s.direct.median())
	}

	require.NotNil(t, rep.ttfb)
	require.Zero(t, rep.ttfb.failed)
	require.Equal(t, 40, rep.ttfb.total)
	require.Positive(t, rep.ttfb.tunnelMed.median())

	require.Len(t, rep.churn, 3, "kill, rolling restart, kill with the idempotent retry on")
	for _, c := range rep.churn {
		require.Len(t, c.runs, 1)
		_, total := c.totals()
		require.Positive(t, total, "%s: load ran during the disruption", c.name)
	}
	require.Len(t, rep.churn[1].runs[0].events, 3, "each of the 3 members restarted")
	require.False(t, rep.churn[0].retry)
	require.True(t, rep.churn[2].retry)
	// The load is GETs: with the idempotent retry on, a request whose backend was killed
	// after its handler received it goes to another member instead of failing.
	require.Zero(t, rep.churn[2].killed(), "with the retry on, no failed request had reached the killed backend's handler: %v", rep.churn[2].runs[0].classes)

	require.NotNil(t, rep.lb)
	require.Len(t, rep.lb.splits, 2, "weights 3:1 and 1:1:2")
	for _, sp := range rep.lb.splits {
		require.Len(t, sp.counts, 1)
		served := 0
		for i := range sp.weights {
			served += sp.counts[0][i]
			require.LessOrEqual(t, sp.errPP(0, i), 5.0, "weights %s, member %d: %v requests per member", sp.name(), i+1, sp.counts[0])
		}
		require.Equal(t, 100, served, "every request served by a member of the pool")
	}
	require.Len(t, rep.lb.keys, 1)
	k := rep.lb.keys[0]
	require.Equal(t, 10, k.members)
	require.Equal(t, 1000, k.keys)
	require.Positive(t, k.onLeaver, "the member that left had keys")
	require.LessOrEqual(t, k.movedFrac(), 1.0/10+0.05, "keys moved: %d of %d", k.moved, k.keys)
	require.Zero(t, k.movedStaying, "no key moved off a member that stayed")
	require.Equal(t, k.onLeaver, k.moved, "exactly the keys of the member that left moved")
	require.Len(t, k.after, 9)
	require.Len(t, rep.lb.rotations, 1)
	rf, rt := rep.lb.rotationTotals()
	require.Positive(t, rt, "load ran during the key rotation")
	require.Zero(t, rf, "no request failed during the key rotation: %v", rep.lb.rotations[0].classes)
	require.True(t, rep.lb.rotations[0].oldRefused(), "the old key is refused after the rotation: %v", rep.lb.rotations[0].oldRefuse)
	require.GreaterOrEqual(t, len(rep.lb.rotations[0].events), 4, "3 members rotated, and the rotation's length")

	require.Len(t, rep.mem, 1)
	m := rep.mem[0]
	require.Equal(t, 40, m.connected)
	require.Equal(t, 40, m.registered)
	require.Equal(t, 4, m.groups, "40 connectors in groups of 10")
	require.Equal(t, m.checked, m.reachable, "every checked route answered")
	require.Greater(t, m.members.HeapInuse, m.base.HeapInuse, "the sessions cost the edge memory")
	require.Greater(t, m.members.Goroutines, m.base.Goroutines)

	out := stdout.String()
	for _, title := range []string{"HTTP, tiny responses", "HTTP, 64 KiB responses", "HTTP/2, tiny responses", "gRPC unary calls", "TCP bulk", "TCP time to first byte", "Churn", "Load-balancing policies", "Edge memory"} {
		require.Contains(t, out, "== "+title)
	}
	require.Contains(t, out, "restarted, idempotent retry on", "the retry-on kill has its row next to the other")
	for _, metric := range []string{"requests/s, HTTP/1.1 member", "requests/s, h2c member", "latency p99, h2c member", "calls/s", "failed calls (all runs)"} {
		require.Contains(t, out, "\n"+metric+" ", "the h2 scenario's rows")
	}
	b, err := os.ReadFile(md)
	require.NoError(t, err)
	require.Contains(t, string(b), "- Command: `go -C examples/bench run . -duration 200ms -runs 1")
	require.Contains(t, string(b), "- Machine: ")
	require.Contains(t, string(b), "- Code: ")
	require.Contains(t, string(b), "| requests/s |")
	require.Contains(t, string(b), "## Load-balancing policies")
	require.Contains(t, string(b), "## HTTP/2, tiny responses (3 B), h2c to the edge: 4 request loops on 2 connection(s)")
	require.Contains(t, string(b), "| requests/s, h2c member |")
	require.Contains(t, string(b), "| failed requests (all runs), HTTP/1.1 member | 0 of ")
	require.Contains(t, string(b), "| calls/s |")
	require.Contains(t, string(b), "| failed calls (all runs) | 0 of ")
	require.Contains(t, string(b), "| share of 100 sequential requests, weights 3:1: member 1 (weight 3) |")
	require.Contains(t, string(b), "| keys that changed member when 1 of 10 members left")
	require.Contains(t, string(b), "| failed requests (all runs), group key rotated by a rolling restart of 3 members")

	children.Lock()
	defer children.Unlock()
	require.Empty(t, children.m, "every edge process was stopped")
}

// TestPacedLoad: paced clients start requests at the given rate, never faster, and an answer
// that comes late delays the requests behind it, which count the delay in their latency.
func TestPacedLoad(t *testing.T) {
	var slow atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slow.Swap(false) {
			time.Sleep(100 * time.Millisecond) // one stall: the requests due meanwhile wait
		}
		_, _ = io.WriteString(w, "abc")
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o := loadOptions{clients: 2, rate: 200, expectLen: 3, targets: []loadTarget{{url: srv.URL}}}
	r, err := runLoad(ctx, o, 0, 500*time.Millisecond, func() { slow.Store(true) })
	require.NoError(t, err)
	require.Zero(t, r.failed)
	require.LessOrEqual(t, float64(r.requests()), 200*r.elapsed.Seconds()+2, "never faster than the pace")
	require.GreaterOrEqual(t, float64(r.requests()), 0.5*200*r.elapsed.Seconds(), "kept roughly to the pace")
	// The stalled client's next requests were due during the stall (every 10 ms): several
	// of them count tens of milliseconds, not the microseconds they took once sent.
	var delayed int
	for _, l := range r.lat {
		if time.Duration(l) >= 20*time.Millisecond {
			delayed++
		}
	}
	require.GreaterOrEqual(t, delayed, 3, "latencies: p50 %v, max %v", r.pct(0.5), r.pct(1))
}

// TestOnly runs just the TCP scenario with the edge in this process.
func TestOnlyInProcess(t *testing.T) {
	t.Cleanup(stopChildren)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout bytes.Buffer
	rep, err := run(ctx, []string{"-only", "tcp", "-edge", "inproc", "-runs", "2", "-tcp-bytes", "300KiB", "-tcp-streams", "1", "-noisy-retries", "0"}, &stdout, &bytes.Buffer{})
	require.NoError(t, err)
	require.Len(t, rep.tcp, 1, "-tcp-streams 1 runs the single-stream workload once")
	require.Len(t, rep.tcp[0].tunnel, 2)
	require.Equal(t, 4, rep.tcp[0].verified)
	require.Empty(t, rep.http)
	require.NotContains(t, stdout.String(), "edge CPU", "no CPU figure for an in-process edge")
}

// Example runs the time-to-first-byte scenario at a tiny size, as
// "go -C examples/bench run . -only ttfb -runs 1 -ttfb-conns 20" does, and reads its report.
func Example() {
	rep, err := run(context.Background(), []string{"-only", "ttfb", "-runs", "1", "-ttfb-conns", "20", "-noisy-retries", "0"}, io.Discard, io.Discard)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d of %d new connections failed\n", rep.ttfb.failed, rep.ttfb.total)
	// Output: 0 of 40 new connections failed
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-only", "http,disk"}, `unknown scenario "disk"`},
		{[]string{"-only", ","}, "no scenario named"},
		{[]string{"-tcp-bytes", "1XB"}, `unknown unit "xb"`},
		{[]string{"-tcp-bytes", "GiB"}, "is not a size"},
		{[]string{"-tcp-bytes", "0"}, "out of range"},
		{[]string{"-mem-connectors", "10,-1"}, `"-1" is not a count`},
		{[]string{"-runs", "0"}, "-runs must be between 1 and 100"},
		{[]string{"-duration", "-1s"}, "-duration must be positive"},
		{[]string{"-latency-clients", "-1"}, "-latency-clients must be between 0 and 4096"},
		{[]string{"-h2-conns", "0"}, "-h2-conns must be between 1 and -clients (32)"},
		{[]string{"-clients", "4", "-h2-conns", "5"}, "-h2-conns must be between 1 and -clients (4)"},
		{[]string{"-noisy-retries", "-1"}, "-noisy-retries must not be negative"},
		{[]string{"-layout", "processes", "-data-read-buffer", "-1"}, "-data-read-buffer must be 0 to 268435456 bytes, got -1"},
		{[]string{"-layout", "processes", "-data-read-buffer", "268435457"}, "-data-read-buffer must be 0 to 268435456 bytes"},
		{[]string{"-data-read-buffer", "4096"}, "-data-read-buffer applies to -layout processes only"},
		{[]string{"-mem-proto", "udp"}, `-mem-proto must be "http" or "tcp"`},
		{[]string{"-mem-proto", "tcp", "-mem-group-size", "0"}, "-mem-proto tcp needs groups"},
		{[]string{"-edge", "remote"}, `-edge must be "child" or "inproc"`},
		{[]string{"-lb-members", "1"}, "-lb-members must be between 2 and 100"},
		{[]string{"-lb-keys", "0"}, "-lb-keys must be between 1 and 1000000"},
		{[]string{"-lb-requests", "0"}, "-lb-requests must be between 1 and 1000000"},
		{[]string{"-mem-connectors", "1000000"}, "open files"},
		{[]string{"-edge", "inproc", "-cpuprofile", "a", "-client-cpuprofile", "b"}, "drop -client-cpuprofile"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	} {
		_, err := run(context.Background(), tc.args, &bytes.Buffer{}, &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, "args %v", tc.args)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "64KiB": 64 << 10, "1.5MB": 1_500_000, "4096": 4096, "2 mib": 2 << 20, "10b": 10} {
		got, err := parseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
}

func TestPercentileAndMedian(t *testing.T) {
	sorted := make([]int64, 1000)
	for i := range sorted {
		sorted[i] = int64(i + 1)
	}
	require.Equal(t, time.Duration(500), percentile(sorted, 0.5))
	require.Equal(t, time.Duration(990), percentile(sorted, 0.99))
	require.Equal(t, time.Duration(999), percentile(sorted, 0.999))
	require.Equal(t, time.Duration(1000), percentile(sorted, 1))
	require.Zero(t, percentile(nil, 0.5))
	require.Equal(t, 2.0, median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, median([]float64{4, 1, 3, 2}))
}

// TestClassify checks how failed requests of a kill are sorted: by which backend life
// received them, and by when they ran relative to the kill.
func TestClassify(t *testing.T) {
	kill := time.Now()
	at := func(ms int) time.Time { return kill.Add(time.Duration(ms) * time.Millisecond) }
	killed := &backendInstance{seen: []string{"1", "2"}}
	live := &backendInstance{seen: []string{"3"}}
	fs := []failure{
		{id: 1, start: at(-2), end: at(1), err: "502"},  // read by the killed backend, in flight
		{id: 2, start: at(-1), end: at(1), err: "502"},  // same
		{id: 3, start: at(-1), end: at(2), err: "EOF"},  // a live backend read it
		{id: 4, start: at(-1), end: at(1), err: "502"},  // nobody read it, in flight
		{id: 5, start: at(1), end: at(2), err: "502"},   // nobody read it, after the kill
		{id: 6, start: at(-5), end: at(-4), err: "503"}, // before the kill
	}
	got := map[string]int{}
	for _, c := range classify(fs, kill, killed, []*backendInstance{killed, live}) {
		got[c.what()] = c.n
		require.NotEmpty(t, c.why(false))
		require.NotEmpty(t, c.why(true))
	}
	require.Equal(t, map[string]int{
		"reached the killed backend's handler, in flight at the disruption": 2,
		"reached a live backend's handler, in flight at the disruption":     1,
		"reached no backend's handler, in flight at the disruption":         1,
		"reached no backend's handler, started after the disruption":        1,
		"reached no backend's handler, ended before the disruption":         1,
	}, got)
	require.True(t, strings.Contains(classify(fs[:2], kill, killed, nil)[0].String(), "2 reached the killed backend's handler"))
}

// TestMemTCP: connectors with TCP tunnels each keep their idle data connections to the edge
// (a control connection and memDataConnsPerSession sockets per connector on the edge), and
// the edge spends no goroutine on an idle data connection: per connector, as many goroutines
// as an HTTP tunnel's connector costs (4), not one more per socket.
func TestMemTCP(t *testing.T) {
	t.Cleanup(stopChildren)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	rep, err := run(ctx, []string{"-only", "mem", "-runs", "1", "-mem-proto", "tcp", "-mem-connectors", "30", "-mem-group-size", "10", "-mem-parallel", "30"}, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	require.Len(t, rep.mem, 1)
	m := rep.mem[0]
	require.Equal(t, 30, m.registered)
	require.Equal(t, 3, m.groups, "30 connectors in groups of 10")
	require.Equal(t, m.checked, m.reachable, "every checked TCP route answered")
	perConn := float64(m.fdsMembers-m.fdsBase) / 30
	require.InDelta(t, 1+memDataConnsPerSession, perConn, 0.5, "edge sockets per connector: its control connection and its idle data connections")
	gor := float64(m.members.Goroutines-m.base.Goroutines) / 30
	require.Less(t, gor, 4.5, "edge goroutines per connector: none for an idle data connection")
	require.Contains(t, stdout.String(), "edge open files (sockets) per connector")
}

// TestH2load runs the h2 scenario's HTTPS table as `-only h2` does with h2load installed:
// h2load against Warren's HTTPS listener, the stock Go reverse proxy and a backend, for both
// member protocols, every request answered.
func TestH2load(t *testing.T) {
	if _, err := exec.LookPath("h2load"); err != nil {
		if os.Getenv("WARREN_REQUIRE_H2LOAD") == "1" {
			t.Fatal("h2load is not installed (Debian: nghttp2-client) and WARREN_REQUIRE_H2LOAD=1 (CI)")
		}
		t.Skip("h2load is not installed (Debian: nghttp2-client); set WARREN_REQUIRE_H2LOAD=1 to fail instead")
	}
	t.Cleanup(stopChildren)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	rep, err := run(ctx, []string{"-only", "h2", "-runs", "1", "-duration", "1s", "-clients", "4", "-h2-conns", "2",
		"-h2load-conns", "2", "-h2load-streams", "8", "-noisy-retries", "0"}, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	require.NotNil(t, rep.h2load)
	require.Empty(t, rep.h2load.note)
	require.Len(t, rep.h2load.workloads, 2, "HTTP/1.1 member and h2c member")
	for _, w := range rep.h2load.workloads {
		for _, p := range []h2loadPath{h2loadWarren, h2loadProxy, h2loadDirect} {
			rs := w.runs[p]
			require.Len(t, rs, 1, "%s member, %s", w.member, p)
			require.Positive(t, rs[0].done, "%s member, %s: requests answered", w.member, p)
			require.Zero(t, rs[0].failed, "%s member, %s", w.member, p)
			if p != h2loadDirect {
				require.Positive(t, rs[0].cpu, "%s member, %s: the edge's or proxy's CPU was read", w.member, p)
			}
		}
	}
	require.Contains(t, stdout.String(), "HTTP/2 over TLS with h2load")
}
