package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestDemo runs the demo: the pool is listed with a member on each edge by both edges,
// requests through either edge reach both backends, and once edge A stops, edge B serves
// with no failed request, the connector of app-1 re-registered on it.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out), out.String())
	text := out.String()
	t.Log(text)

	// Step 3: both edges list both members, each with its edge_id.
	pools := regexp.MustCompile(`(edge-[ab]) sees pool "demo" with 2 members:\n\s+member \S+ on edge-a, healthy=true\n\s+member \S+ on edge-b, healthy=true`).FindAllStringSubmatch(text, -1)
	require.Len(t, pools, 2, text)
	require.Equal(t, "edge-a", pools[0][1])
	require.Equal(t, "edge-b", pools[1][1])

	// Step 4: through each edge, both backends answered and nothing failed.
	counts := regexp.MustCompile(`24 requests through (edge-[ab]): app-1: (\d+), app-2: (\d+), failed: (\d+)`).FindAllStringSubmatch(text, -1)
	require.Len(t, counts, 3, text) // edge A, edge B, edge B after the failover
	for _, c := range counts {
		require.NotEqual(t, "0", c[2], c[0])
		require.NotEqual(t, "0", c[3], c[0])
		require.Equal(t, "0", c[4], c[0])
	}
	require.Equal(t, []string{"edge-a", "edge-b", "edge-b"}, []string{counts[0][1], counts[1][1], counts[2][1]})

	// Step 5: /api/cluster lists both edges holding their lease.
	require.Regexp(t, `edge edge-b at \S+: lease held, 1 member\n\s+edge edge-a at \S+: lease held, 1 member\n`, text)

	// Step 6: edge B kept serving, app-1's connector moved to it, edge A's lease is gone.
	after := regexp.MustCompile(`12 requests through edge-b right after: app-1: \d+, app-2: (\d+), failed: (\d+)`).FindStringSubmatch(text)
	require.NotNil(t, after, text)
	n, _ := strconv.Atoi(after[1])
	require.Equal(t, "0", after[2])
	require.Positive(t, n)
	require.Regexp(t, `connector of app-1 is attached to edge-b now; edge-b sees pool "demo" with 2 members:\n\s+member \S+ on edge-b, healthy=true\n\s+member \S+ on edge-b, healthy=true`, text)
	require.Regexp(t, `edge edge-a at \S+: lease expired, 0 members`, text)
	require.Contains(t, text, "done in")
}

// TestDemoHold: with hold the demo stops after step 5 with the pool served through both
// edges; the end of its context (Ctrl-C) skips the failover, shuts down (step 7) and
// returns nil with the NATS store removed.
func TestDemoHold(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- demo(ctx, out, true) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "press Ctrl-C to stop") }, 60*time.Second, 10*time.Millisecond, out.String())
	text := out.String()
	require.Contains(t, text, "5. The cluster as edge B sees it")
	require.NotContains(t, text, "6. Edge A stops")
	store := regexp.MustCompile(`\(store (\S+)\)`).FindStringSubmatch(text)
	require.NotNil(t, store, text)
	require.DirExists(t, store[1])

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the hold did not end")
	}
	text = out.String()
	require.Contains(t, text, "Ctrl-C: skipping step 6 (the failover; run without -hold to see it)")
	require.Contains(t, text, "7. Shutting down: connectors, both edges, backends, NATS (its temporary directory removed)")
	require.NotContains(t, text, "6. Edge A stops")
	require.NoDirExists(t, store[1])
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
