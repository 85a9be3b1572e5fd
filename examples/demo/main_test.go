package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
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

// TestDemo runs the whole demo: run itself fails when a step misbehaves (a request fails,
// the pool is not shared, B is not taken out of rotation or does not come back).
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, &out))
	s := out.String()
	require.Contains(t, s, "backend A: 20, backend B: 0, failed: 0", "step 3 sends everything to A")
	require.Contains(t, s, "backend B is UNHEALTHY", "the event hook prints the health transition")
	require.Contains(t, s, "connection refused", "with the probe's reason")
	require.Contains(t, s, `group "web" is gone`, "shutdown drains both members")
	require.Regexp(t, `(?m)^Status page \(live while the demo runs; token demo-token-0123456789\): http://127\.0\.0\.1:\d+/$`, s,
		"the demo prints the status page's URL")
}

// TestDemoCancelled checks that an interrupted demo stops promptly with an error.
func TestDemoCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, &out) }()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after its context was cancelled")
	}
}

// TestDemoHold: with hold, the demo keeps everything up after step 4 (the pool answers
// through the edge) until its context ends, then shuts down and returns nil.
func TestDemoHold(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- runHold(ctx, out, true) }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "press Ctrl-C to stop") }, 20*time.Second, 10*time.Millisecond, out.String())
	m := regexp.MustCompile(`curl -H 'Host: pool.localhost' http://(\S+)/`).FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	req, err := http.NewRequest(http.MethodGet, "http://"+m[1]+"/", nil)
	require.NoError(t, err)
	req.Host = "pool.localhost"
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	require.NoError(t, err, "the pool is served while the demo holds")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "hello from backend")
	require.NotContains(t, out.String(), "5. Shutting down")

	cancel() // Ctrl-C
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the hold did not end")
	}
	require.Contains(t, out.String(), "5. Shutting down")
	require.Contains(t, out.String(), "done in")
}

// syncBuffer is a bytes.Buffer the demo writes while the test reads it.
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
