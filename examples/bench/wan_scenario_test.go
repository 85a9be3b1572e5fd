package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/examples/bench/internal/wan"
)

// TestWANScenario runs -layout processes -wan-rtt tiny (when this machine can: root, ip,
// iptables) and checks that the delayed link really adds the round trip to every path that
// crosses it and to none other, that every path carried its requests and its checksummed
// stream, and that no process or namespace of the run is left behind.
func TestWANScenario(t *testing.T) {
	if err := wan.Check(); err != nil {
		t.Skipf("the WAN scenario cannot run here: %v", err)
	}
	t.Cleanup(stopProcChildren)
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	const rtt = 20 * time.Millisecond
	figs := filepath.Join(t.TempDir(), "wan.json")
	var stdout, stderr bytes.Buffer
	args := []string{"-layout", "processes", "-wan-rtt", rtt.String(), "-control", "plain", "-runs", "1", "-duration", "400ms",
		"-clients", "4", "-tcp-bytes", "1MiB", "-noisy-retries", "0", "-wan-json", figs}
	start := time.Now()
	_, err := runWith(ctx, args, &stdout, &stderr, nil)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	t.Logf("the WAN scenario took %s", time.Since(start).Round(100*time.Millisecond))

	b, err := os.ReadFile(figs)
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	var got wanFigures
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, rtt, got.RTT)
	require.Len(t, got.Paths, 4, "Warren, relays io.Copy, plain TCP over the link, direct")
	for name, f := range got.Paths {
		require.Zero(t, f.HTTPFailed, name)
		require.Positive(t, f.TCP1BPS, "%s: the stream went through", name)
		require.GreaterOrEqual(t, f.HTTPNP99, f.HTTPNP50, name)
		if strings.HasPrefix(name, "Warren") {
			// A request that opens a new member stream crosses the link too.
			require.GreaterOrEqual(t, f.ColdMedian, rtt, "%s: a request on a new member stream", name)
			require.Less(t, f.ColdMedian, 4*rtt, name)
		}
		if name == "direct" {
			// The link is the only slow part: the direct path does not cross it.
			require.Less(t, f.HTTP1P50, rtt/2, "direct does not cross the link")
			continue
		}
		// A request crosses the link once each way: at least one round trip, and with a
		// keep-alive connection (Warren: a stream on the control connection) not many more.
		require.GreaterOrEqual(t, f.HTTP1P50, rtt, "%s: the link adds its round trip", name)
		require.Less(t, f.HTTP1P50, 4*rtt, "%s: the link adds about one round trip, not a stall", name)
	}
	out := stdout.String()
	for _, want := range []string{"WAN: 20ms round trip", "HTTP 1 client, p50, plain", "HTTP 4 clients, p99, plain", "1 TCP stream, plain",
		"plain TCP over the link", "kernel TCP buffer limits", "tcp_wmem", "HTTP request on a new member stream"} {
		require.Contains(t, out, want)
	}

	// Nothing is left: no child of this process, no namespace of this process, no process
	// that ran in one.
	require.Zero(t, runningProcChildren())
	prefix := fmt.Sprintf("warren-wan-%d-", os.Getpid())
	entries, err := os.ReadDir("/run/netns")
	if err == nil {
		for _, e := range entries {
			require.False(t, strings.HasPrefix(e.Name(), prefix), "namespace %s was left", e.Name())
		}
	}
	procs, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, p := range procs {
		env, err := os.ReadFile(filepath.Join("/proc", p.Name(), "environ"))
		if err != nil {
			continue // not a process, or gone
		}
		require.NotContains(t, string(env), wan.EnvNetns+"="+prefix, "process %s of the WAN run was left running", p.Name())
	}
}

// TestWANScenarioFlags checks the refusals of the WAN scenario's flags.
func TestWANScenarioFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-wan-rtt", "50ms"}, "apply to -layout processes only"},
		{[]string{"-layout", "processes", "-wan-rtt", "1ms"}, "-wan-rtt must be between"},
		{[]string{"-layout", "processes", "-wan-rtt", "-50ms"}, "-wan-rtt must be between"},
		{[]string{"-layout", "processes", "-wan-json", "x.json"}, "-wan-json needs -wan-rtt"},
		{[]string{"-layout", "processes", "-wan-rtt", "50ms", "-only", "ttfb"}, `scenario "ttfb" does not run with -wan-rtt`},
		{[]string{"-only", "cold"}, `scenario "cold" runs with -layout processes -wan-rtt only`},
		{[]string{"-layout", "processes", "-only", "cold"}, `scenario "cold" does not run in -layout processes`},
	} {
		_, err := parseConfig(tc.args, &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, tc.args)
	}
	c, err := parseConfig([]string{"-layout", "processes", "-wan-rtt", "50ms"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, wanScenarios, c.scenarios)
	require.Equal(t, int64(64<<20), c.tcpBytes, "the WAN scenario's default stream")
	c, err = parseConfig([]string{"-layout", "processes", "-wan-rtt", "50ms", "-tcp-bytes", "8MiB", "-control", "tls"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, int64(8<<20), c.tcpBytes)
	require.Equal(t, []bool{true}, c.controls)
}
