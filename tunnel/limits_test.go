package tunnel

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/internal/wire"
)

func TestRegistrationFloodIsRateLimited(t *testing.T) {
	e := startEdge(t, ServerConfig{Limits: Limits{MaxTunnelsPerSession: 100, RegisterRate: 1, RegisterBurst: 10}})
	b := backend(t, "b")
	good := e.connect()
	_, err := good.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	_, ctrl := rawControl(t, e.controlAddr)
	hello(t, ctrl)
	for i := range 50 {
		require.NoError(t, wire.WriteFrame(ctrl, &wire.Register{Req: uint32(i), Proto: "http", Label: fmt.Sprintf("flood%d", i)}))
	}
	registered, limited := 0, 0
	for range 50 {
		m, err := wire.ReadFrame(ctrl)
		require.NoError(t, err)
		switch m := m.(type) {
		case *wire.Registered:
			registered++
		case *wire.Rejected:
			require.Equal(t, wire.CodeLimit, m.Code)
			require.Contains(t, m.Message, "registering faster than")
			limited++
		}
	}
	require.Equal(t, 10, registered, "the burst is accepted")
	require.Equal(t, 40, limited, "the rest is refused, the session stays up")
	code, _ := e.get("app", "/")
	require.Equal(t, http.StatusOK, code)
}

func TestMaxTunnelsPerSession(t *testing.T) {
	e := startEdge(t, ServerConfig{Limits: Limits{MaxTunnelsPerSession: 2}})
	sess := e.connect()
	for i := range 2 {
		_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: fmt.Sprint("t", i)}, "127.0.0.1:9")
		require.NoError(t, err)
	}
	_, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "t3"}, "127.0.0.1:9")
	require.ErrorIs(t, err, ErrLimit)
	require.ErrorContains(t, err, "max_tunnels_per_session")
}

// TestFloodOnOneGroupDoesNotStarveAnother: with a per-member concurrency cap, a group whose
// backend hangs fills its members' slots and answers 503 beyond them, while another group
// keeps serving.
func TestFloodOnOneGroupDoesNotStarveAnother(t *testing.T) {
	e := startEdge(t, ServerConfig{LoadBalancing: LoadBalancing{Enabled: true, MaxConcurrentPerMember: 3}})
	release := make(chan struct{})
	var inFlight sync.WaitGroup
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Done()
		<-release
		_, _ = io.WriteString(w, "late")
	}))
	defer hang.Close()
	defer close(release)
	fine := backend(t, "fine")
	_, err := e.connect().Forward(ctxT(t), pool("flooded"), hostPort(hang.URL))
	require.NoError(t, err)
	_, err = e.connect().Forward(ctxT(t), pool("calm"), hostPort(fine.URL))
	require.NoError(t, err)

	inFlight.Add(3)
	var done sync.WaitGroup
	for range 3 {
		done.Go(func() {
			code, _ := e.get("flooded", "/")
			require.Equal(t, http.StatusOK, code)
		})
	}
	inFlight.Wait() // the flooded member's three slots are taken
	resp, err := e.client.Get(e.url("flooded", "/"))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.True(t, strings.Contains(string(body), "concurrency limit"), "%s", body)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))

	for range 10 {
		code, body := e.get("calm", "/")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, "fine /", body)
	}
	release <- struct{}{}
	release <- struct{}{}
	release <- struct{}{}
	done.Wait()
}
