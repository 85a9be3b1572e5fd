package main

import (
	"bytes"
	"context"
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
