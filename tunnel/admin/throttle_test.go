package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/throttle"
)

// fakeClock is a manual clock for the throttle.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

const (
	testAdminToken  = "admin-token-0123456789"
	testTenantToken = "acme-token-0123456789"
)

// throttledPlane is a Plane whose token checks Config.Throttle limits; checked counts the
// tenant tokens it checked.
func throttledPlane(t *testing.T, th *throttle.Auth, done <-chan struct{}, checked *int) *Plane {
	t.Helper()
	var mu sync.Mutex
	p, err := newPlane(config{
		View:       group.NewRegistry(group.Config{}).View(),
		URL:        func(g group.Info) string { return "http://" + g.Label + ".example.test" },
		AdminToken: testAdminToken,
		Authenticate: func(_ context.Context, token string) (string, error) {
			mu.Lock()
			*checked++
			mu.Unlock()
			if token == testTenantToken {
				return "acme", nil
			}
			return "", ErrInvalidToken
		},
		Throttle: th,
		Done:     done,
		Metrics:  prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func call(p *Plane, remote, token string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/api/groups", nil)
	req.RemoteAddr = remote
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	p.Handler().ServeHTTP(rec, req)
	return rec
}

// Guessing tokens on the admin API: each failure from an address makes its next attempt
// wait longer, and after MaxFailures the address gets 429 without its token being checked
// (the admin token included) until the block ends; other addresses, and other IPv6 /64s, are
// not affected; a request with no token is not a guess.
func TestAdminTokenGuessingIsThrottled(t *testing.T) {
	clk := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	var slept []time.Duration
	th := throttle.NewAuth(throttle.AuthConfig{MaxFailures: 3, Block: 15 * time.Minute, Now: clk.Now,
		Sleep: func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }})
	checked := 0
	p := throttledPlane(t, th, nil, &checked)
	const attacker = "192.0.2.1:40000"

	for range 5 {
		require.Equal(t, http.StatusUnauthorized, call(p, attacker, "").Code)
	}
	for range 3 {
		require.Equal(t, http.StatusUnauthorized, call(p, attacker, "guessed-token-0000000").Code)
	}
	require.Equal(t, []time.Duration{250 * time.Millisecond, 500 * time.Millisecond}, slept)
	require.Equal(t, 3, checked)

	rec := call(p, attacker, testAdminToken)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "900", rec.Header().Get("Retry-After"))
	var body struct{ Error string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	require.Equal(t, "too many failed authentications from 192.0.2.1; try again in 15m0s", body.Error)
	require.Equal(t, http.StatusTooManyRequests, call(p, "192.0.2.1:40001", testTenantToken).Code)
	require.Equal(t, 3, checked, "a blocked address's tokens are not checked")
	require.Equal(t, http.StatusOK, call(p, "192.0.2.2:40000", testAdminToken).Code)

	for range 3 {
		require.Equal(t, http.StatusUnauthorized, call(p, "[2001:db8:0:1::1]:1", "guessed-token-0000000").Code)
	}
	require.Equal(t, http.StatusTooManyRequests, call(p, "[2001:db8:0:1::ffff]:1", testAdminToken).Code, "one /64")
	require.Equal(t, http.StatusOK, call(p, "[2001:db8:0:2::1]:1", testAdminToken).Code)

	clk.Advance(15 * time.Minute)
	require.Equal(t, http.StatusOK, call(p, attacker, testAdminToken).Code, "the block ends")
	require.Equal(t, http.StatusOK, call(p, attacker, testTenantToken).Code)
}

// The wait before a token is checked ends when the edge shuts down: 503 at once.
func TestAdminThrottleWaitEndsWhenTheEdgeShutsDown(t *testing.T) {
	th := throttle.NewAuth(throttle.AuthConfig{Delay: time.Hour, MaxDelay: time.Hour})
	done := make(chan struct{})
	checked := 0
	p := throttledPlane(t, th, done, &checked)
	require.Equal(t, http.StatusUnauthorized, call(p, "192.0.2.1:1", "guessed-token-0000000").Code)
	close(done)
	rec := call(p, "192.0.2.1:1", testAdminToken)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, 1, checked)
}
