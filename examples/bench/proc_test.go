package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// init lets the test binary play the process layout's hidden roles (backend, relay, load
// generator): the tool re-executes os.Executable(), which under "go test" is this binary,
// and TestMain only knows the edge's subcommand.
func init() {
	if code, ok := procRoleMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); ok {
		os.Exit(code)
	}
}

// TestProcessLayout runs -layout processes tiny, with plain and TLS control connections,
// and checks that every path measured something real — streams checksummed, first bytes
// received, requests answered, CPU read from the edge and relay processes — that the
// net/http proxy floor ran in the HTTP figure and in no other, that the tables carry every
// row and column, that the link hook saw each link port, and that no child is left.
func TestProcessLayout(t *testing.T) {
	t.Cleanup(stopProcChildren)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	md := filepath.Join(t.TempDir(), "bench.md")
	var stdout, stderr bytes.Buffer
	args := []string{"-layout", "processes", "-control", "both", "-runs", "1", "-duration", "300ms", "-clients", "4",
		"-tcp-bytes", "2MiB", "-tcp-streams", "2", "-ttfb-conns", "10", "-noisy-retries", "0", "-markdown", md}

	var mu sync.Mutex
	hooked, undone := map[int]bool{}, map[int]bool{}
	hook := func(_ context.Context, port int) (func() error, error) {
		// Called before the edge or relay B listens on the port.
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			_ = c.Close()
		}
		mu.Lock()
		defer mu.Unlock()
		hooked[port] = err != nil
		return func() error { mu.Lock(); defer mu.Unlock(); undone[port] = true; return nil }, nil
	}
	rep, err := runWith(ctx, args, &stdout, &stderr, hook)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	require.Zero(t, runningProcChildren(), "every child process was stopped")

	s := rep.proc
	require.NotNil(t, s)
	require.Len(t, s.paths, 7, "Warren, io.Copy relays, 64 KiB relays, each plain and TLS; direct")
	httpFloor := []procPath{{kind: copyHTTP}, {kind: copyHTTP, tls: true}}
	require.Len(t, s.httpPaths, 9, "the paths and the net/http proxy, plain and TLS")
	for _, p := range httpFloor {
		require.Contains(t, s.httpPaths, p)
		require.NotContains(t, s.paths, p, "the net/http proxy is measured in the HTTP figure only")
		require.NotContains(t, s.tcp1, p)
		require.NotContains(t, s.tcpN, p)
		require.NotContains(t, s.ttfb, p)
	}
	for _, p := range s.paths {
		for name, figs := range map[string]map[procPath]*procTCPFig{"1 stream": s.tcp1, "2 streams": s.tcpN} {
			f := figs[p]
			require.Len(t, f.bps, 1, "%s, %s", p, name)
			require.Positive(t, f.bps[0], "%s, %s", p, name)
		}
		require.Equal(t, 1, s.tcp1[p].verified, "%s: the stream was checksummed", p)
		require.Equal(t, 2, s.tcpN[p].verified, "%s: both streams were checksummed", p)
		tf := s.ttfb[p]
		require.Zero(t, tf.failed, p.String())
		require.Equal(t, 10, tf.total, p.String())
		require.Positive(t, tf.med[0], p.String())
		require.Less(t, tf.med[0], float64(5*time.Second), p.String())
		want := 2 // relay A, relay B
		switch p.kind {
		case "warren":
			want = 3 // the edge and its two connectors
		case "direct":
			want = 0
		}
		require.Len(t, s.tcp1[p].cpu[0], want, p.String())
	}
	for _, p := range s.httpPaths {
		h := s.http[p]
		require.NotNil(t, h, p.String())
		require.Positive(t, h.ok, "%s: requests answered", p)
		require.Zero(t, h.failed, "%s: no failed request: %v", p, h.failures)
		require.Positive(t, h.rps[0], p.String())
		require.Positive(t, h.p99[0], p.String())
		require.GreaterOrEqual(t, h.p99[0], h.p50[0], p.String())
		require.Equal(t, 4, h.dials, "%s: each client kept one connection", p)
		if p.kind == "direct" {
			require.Len(t, h.cpuPerReq[0], 2, "direct: the two backends' CPU, the net/http server floor")
			continue
		}
		want := 2 // relay A, relay B
		if p.kind == "warren" {
			want = 3 // the edge and its two connectors
		}
		require.Len(t, h.cpuPerReq[0], want, p.String())
		if p.kind == "warren" || p.kind == copyHTTP {
			// /proc counts in 10 ms ticks: 300 ms of requests through the edge, or through
			// the net/http proxy, take more.
			require.Positive(t, h.cpuPerReq[0][0], "%s: the edge's or proxy's CPU per request was read", p)
		}
	}
	// Two edges' control ports and six relay B ports (io.Copy, 64 KiB, net/http proxy; plain
	// and TLS) went through the hook before anything listened on them, and each hook was
	// undone.
	require.Len(t, hooked, 8)
	for port, free := range hooked {
		require.True(t, free, "port %d was not listened on yet when the hook ran", port)
		require.True(t, undone[port], "the hook for port %d was undone", port)
	}

	out := stdout.String()
	for _, want := range []string{"Process layout, TCP", "Process layout, TCP time to first byte", "Process layout, HTTP tiny responses",
		"1 stream, plain", "1 stream, TLS", "2 streams, plain", "2 streams, TLS", "requests/s, plain", "requests/s, TLS",
		"latency p99, TLS", "CPU per request, edge / relay A, plain", "dial → first byte, median, TLS", "relays, io.Copy (splice)",
		"net/http proxy relay A", "net/http proxy, TLS", "CPU per request, the net/http backend answering it"} {
		require.Contains(t, out, want)
	}
	b, err := os.ReadFile(md)
	require.NoError(t, err)
	require.Contains(t, string(b), "-layout processes")
	require.Contains(t, string(b), "| 1 stream, TLS |")
	// Only the HTTP table has the net/http proxy's column, and its rows fill it.
	require.Equal(t, 1, strings.Count(string(b), "| relays, 64 KiB buffers | net/http proxy | direct |"))
	require.Equal(t, 2, strings.Count(string(b), "| relays, 64 KiB buffers | direct |"), "TCP and first byte")
	for _, ctl := range []string{"plain", "TLS"} {
		var rps, cpu []string
		for l := range strings.Lines(string(b)) {
			cells := strings.Split(strings.TrimSpace(l), " | ")
			switch cells[0] {
			case "| requests/s, " + ctl:
				rps = cells
			case "| CPU per request, edge / relay A, " + ctl:
				cpu = cells
			}
		}
		require.Len(t, rps, len(procHTTPCols)+1, ctl)
		require.Regexp(t, `^[1-9][0-9]* req/s$`, rps[4], "net/http proxy, %s: requests/s", ctl)
		require.Len(t, cpu, len(procHTTPCols)+1, ctl)
		require.Regexp(t, `^[1-9][0-9.]* (µs|ms)$`, cpu[4], "net/http proxy, %s: relay A's CPU per request", ctl)
	}
	require.Equal(t, strings.Count(out, "== Process layout"), 3)
}

// TestProcessLayoutFlags checks the refusals of flags that do not fit the process layout.
func TestProcessLayoutFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-layout", "procs"}, "-layout must be"},
		{[]string{"-layout", "processes", "-control", "udp"}, "-control must be"},
		{[]string{"-control", "tls"}, "-control applies to -layout processes only"},
		{[]string{"-layout", "processes", "-only", "mem"}, `scenario "mem" does not run in -layout processes`},
		{[]string{"-layout", "processes", "-edge", "inproc"}, "-edge does not apply"},
	} {
		_, err := parseConfig(tc.args, &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, tc.args)
	}
	c, err := parseConfig([]string{"-layout", "processes"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, procScenarios, c.scenarios)
	require.Equal(t, []bool{false, true}, c.controls)
}
