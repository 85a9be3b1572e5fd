package tunnel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

func TestBackoffGrowsWithJitterAndCaps(t *testing.T) {
	s := &Session{opts: defaultDialOptions()}
	s.opts.backoffMin, s.opts.backoffMax = 100*time.Millisecond, 2*time.Second
	for n, base := range []time.Duration{100, 200, 400, 800, 1600, 2000, 2000, 2000} {
		base *= time.Millisecond
		for range 50 {
			d := s.backoff(n)
			require.GreaterOrEqual(t, d, base*8/10, "attempt %d", n)
			require.LessOrEqual(t, d, base*12/10, "attempt %d", n)
		}
	}
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[s.backoff(3)] = true
	}
	require.Greater(t, len(seen), 1, "delays are jittered")
}

// TestTransientFailuresAreRetriedAndLogged: while the edge is down, every failed attempt is
// logged and the session keeps trying; when the edge is back the tunnel is re-registered.
func TestTransientFailuresAreRetriedAndLogged(t *testing.T) {
	var logs logBuffer
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	r.start()
	b := backend(t, "b")
	sess, err := Dial(ctxT(t), r.control, WithLogger(logs.logger()), WithBackoff(5*time.Millisecond, 20*time.Millisecond))
	require.NoError(t, err)
	defer sess.Close()
	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)

	r.stop()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "reconnect failed") >= 5 }, 10*time.Second, 5*time.Millisecond,
		"each failed attempt is logged")
	select {
	case <-sess.Done():
		t.Fatal("the session gave up on a transient failure")
	default:
	}
	r.start()
	defer r.stop()
	require.Eventually(t, func() bool { return tun.ID() != "" && r.cur.registry.LookupHTTP("app") != nil }, 10*time.Second, 5*time.Millisecond)
}

// TestBackoffResetsAfterAHealthyPeriod: a connection that stayed up for the healthy period
// starts the next reconnect from the shortest delay again.
func TestBackoffResetsAfterAHealthyPeriod(t *testing.T) {
	var logs logBuffer
	r := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	r.start()
	sess, err := Dial(ctxT(t), r.control, WithLogger(logs.logger()), WithBackoff(5*time.Millisecond, 5*time.Second),
		withHealthyPeriod(50*time.Millisecond))
	require.NoError(t, err)
	defer sess.Close()

	// Down long enough for several attempts: the delay grows.
	r.stop()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "reconnect failed") >= 5 }, 10*time.Second, 5*time.Millisecond)
	r.start()
	require.Eventually(t, func() bool { c, _ := sess.liveConn(ctxT(t)); return c != nil }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // stay connected past the healthy period (the condition under test)
	before := strings.Count(logs.String(), "reconnect failed")

	r.stop()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "reconnect failed") > before }, 10*time.Second, time.Millisecond)
	out := logs.String()
	last := out[strings.LastIndex(out, "reconnect failed"):]
	require.Contains(t, strings.SplitN(last, "\n", 2)[0], `"attempt":1,`, "the first retry after a healthy period is attempt 1 again")
	r.start()
	r.stop()
}

// TestLateRegisteredIsDeregistered: when the edge answers a registration after the caller
// gave up, the connector deregisters the tunnel instead of leaving an orphan member.
func TestLateRegisteredIsDeregistered(t *testing.T) {
	l := listenLoopback(t)
	defer l.Close()
	edgeDone := make(chan wire.Message, 1)
	gaveUp := make(chan struct{})
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		mux, err := yamux.Server(c, mux.ServerConfig(zap.NewNop(), 10*time.Second))
		if err != nil {
			return
		}
		defer mux.Close()
		ctrl, err := mux.AcceptStream()
		if err != nil {
			return
		}
		_, _ = wire.ReadFrame(ctrl) // hello
		_ = wire.WriteFrame(ctrl, &wire.Welcome{Version: wire.Version, SessionID: "fake"})
		m, err := wire.ReadFrame(ctrl)
		if err != nil {
			return
		}
		reg := m.(*wire.Register)
		<-gaveUp // answer after the caller's deadline
		_ = wire.WriteFrame(ctrl, &wire.Registered{Req: reg.Req, TunnelID: "late", URL: "http://x"})
		m, err = wire.ReadFrame(ctrl)
		if err == nil {
			edgeDone <- m
		}
		close(edgeDone)
	}()
	sess, err := Dial(ctxT(t), l.Addr().String(), WithReconnect(false))
	require.NoError(t, err)
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = sess.Forward(ctx, TunnelSpec{Subdomain: "slow"}, "127.0.0.1:9")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(gaveUp)
	select {
	case m := <-edgeDone:
		require.Equal(t, &wire.Deregister{TunnelID: "late"}, m)
	case <-time.After(10 * time.Second):
		t.Fatal("the connector did not deregister the late tunnel")
	}
}
