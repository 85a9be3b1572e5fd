package tunnel

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/throttle"
	"github.com/warren-tunnel/warren/internal/wire"
)

// mustStaticTokens is NewStaticTokens for tokens known to be long enough.
func mustStaticTokens(t testing.TB, tokens []string, tenants map[string]string) *StaticTokens {
	t.Helper()
	a, err := NewStaticTokens(tokens, tenants)
	require.NoError(t, err)
	return a
}

// dialFrom connects to addr from the loopback address ip (127.0.0.0/8 all lives on lo).
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// helloFrom says hello with token from the loopback address ip and returns the edge's answer:
// a Welcome or an Error. A welcomed session stays open until the test ends.
func helloFrom(t *testing.T, ip, addr, token string) wire.Message {
	t.Helper()
	sess, err := yamux.Client(dialFrom(t, ip, addr), mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	ctrl, err := sess.OpenStream()
	require.NoError(t, err)
	_ = ctrl.SetDeadline(time.Now().Add(10 * time.Second))
	// The edge may answer and close before yamux reports the write done, which yamux then
	// reports as failed: the answer, read below, tells.
	_ = wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version, Token: token})
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	return m
}

func requireErrorCode(t *testing.T, m wire.Message, code string) *wire.Error {
	t.Helper()
	e, ok := m.(*wire.Error)
	require.True(t, ok, "want an %s error, got %#v", code, m)
	require.Equal(t, code, e.Code, e.Message)
	return e
}

// closedAtOnce returns how many of conns the edge closes within a second (it has nothing to
// send first), reading them all at once.
func closedAtOnce(conns ...net.Conn) int {
	var n atomic.Int32
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(make([]byte, 1))
			if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}

func TestShortTokensAreRefused(t *testing.T) {
	_, err := NewStaticTokens([]string{"0123456789abcdef", "short-secret"}, nil)
	require.EqualError(t, err, "tunnel: token 1 is 12 characters long; a token needs at least 16")
	_, err = NewStaticTokens(nil, map[string]string{"acme": "0123456789abcdef", "globex": "tiny"})
	require.EqualError(t, err, `tunnel: the token of tenant "globex" is 4 characters long; a token needs at least 16`)
	_, err = NewStaticTokens([]string{""}, nil)
	require.Error(t, err, "an empty token is a short one")
	_, err = NewStaticTokens([]string{"0123456789abcdef"}, map[string]string{"acme": "ééééééééééééééée"})
	require.NoError(t, err, "16 characters are enough, whatever their bytes")
	// The admin token's length is checked by admin.New (tunnel/admin's TestShortAdminTokenIsRefused).
}

// Guessing tokens on the control port: failures from one address are delayed, then refused
// without their token being checked (on the admin API too: tunnel/admin's
// TestControlTokenGuessingBlocksTheAdminAPI); other addresses are not affected; the log gets
// a line per address, not per try.
func TestControlTokenGuessingIsThrottled(t *testing.T) {
	const good = "good-connector-token"
	static := mustStaticTokens(t, []string{good}, nil)
	var checked atomic.Int32
	auth := AuthenticatorFunc(func(ctx context.Context, token string) (string, error) {
		checked.Add(1)
		return static.Authenticate(ctx, token)
	})
	core, logs := observer.New(zapcore.InfoLevel)
	e := startEdge(t, ServerConfig{Auth: auth, Logger: zap.New(core),
		PreAuth: PreAuthLimits{MaxAuthFailuresPerIP: 3, AuthFailureDelay: 100 * time.Millisecond}})

	for i, wantDelay := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond} {
		start := time.Now()
		requireErrorCode(t, helloFrom(t, "127.0.0.1", e.controlAddr, "guess-"+strings.Repeat("x", i)), wire.CodeUnauthorized)
		require.GreaterOrEqual(t, time.Since(start), wantDelay, "attempt %d waits before its token is checked", i+1)
	}
	require.Equal(t, int32(3), checked.Load())

	// The address is blocked: even the right token is not checked.
	ef := requireErrorCode(t, helloFrom(t, "127.0.0.1", e.controlAddr, good), wire.CodeUnavailable)
	require.Contains(t, ef.Message, "too many failed authentications from 127.0.0.1; try again in 15m")
	_, err := Dial(ctxT(t), e.controlAddr, WithToken(good), WithReconnect(false))
	require.ErrorContains(t, err, "too many failed authentications")
	require.NotErrorIs(t, err, ErrUnauthorized, "a connector behind the same address retries later")
	require.Equal(t, int32(3), checked.Load())

	// Another address is served.
	require.IsType(t, &wire.Welcome{}, helloFrom(t, "127.0.0.2", e.controlAddr, good))

	var perTry, aggregate []string
	for _, l := range logs.All() {
		switch {
		case strings.Contains(l.Message, "failed authentications"):
			aggregate = append(aggregate, l.Message)
		case strings.Contains(l.Message, "connector") && l.ContextMap()["remote"] != nil &&
			strings.HasPrefix(l.ContextMap()["remote"].(string), "127.0.0.1:"):
			perTry = append(perTry, l.Message)
		}
	}
	require.Empty(t, perTry, "no line per failed or refused attempt")
	require.Equal(t, []string{"failed authentications", "address blocked after too many failed authentications"}, aggregate)
}

// Silent connections from one address cannot take the edge's file descriptors: past the
// per-address cap (default 16) they are closed at once, and others are still served.
func TestPreAuthConnectionsPerAddressAreCapped(t *testing.T) {
	// A long hello timeout: the silent connections stay until the test closes them.
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: time.Minute}})
	var conns []net.Conn
	for range 20 {
		conns = append(conns, dialFrom(t, "127.0.0.1", e.controlAddr))
	}
	require.Equal(t, 4, closedAtOnce(conns...), "16 are kept, the others closed at once")
	require.IsType(t, &wire.Welcome{}, helloFrom(t, "127.0.0.2", e.controlAddr, ""), "another address is served")

	for _, c := range conns {
		_ = c.Close()
	}
	require.Eventually(t, func() bool {
		total, _ := e.preAuth.Held(throttle.Key{})
		return total == 0
	}, 5*time.Second, 10*time.Millisecond, "a connection that leaves frees its place")
	require.IsType(t, &wire.Welcome{}, helloFrom(t, "127.0.0.1", e.controlAddr, ""))
}

// The total cap holds across addresses; a connection counts until its Hello is accepted, and
// sessions already up are not affected.
func TestPreAuthConnectionsInAllAreCapped(t *testing.T) {
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: time.Minute, MaxConns: 6, MaxConnsPerIP: 3}})
	b := backend(t, "b")
	up := e.connect()
	_, err := up.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(b.URL))
	require.NoError(t, err)
	for range 10 {
		require.IsType(t, &wire.Welcome{}, helloFrom(t, "127.0.0.1", e.controlAddr, ""), "welcomed sessions hold no place")
	}

	var conns []net.Conn
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		for range 3 {
			conns = append(conns, dialFrom(t, ip, e.controlAddr))
		}
	}
	require.Eventually(t, func() bool {
		total, _ := e.preAuth.Held(throttle.Key{})
		return total == 6
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, closedAtOnce(dialFrom(t, "127.0.0.3", e.controlAddr)), "over the total cap")
	code, body := e.get("app", "/")
	require.Equal(t, http.StatusOK, code, "an established session keeps serving")
	require.Equal(t, "b /", body)
	require.Zero(t, closedAtOnce(conns...))
}

func TestHelloTimeoutDefaultsToFiveSeconds(t *testing.T) {
	var cfg ServerConfig
	require.NoError(t, cfg.setDefaults())
	require.Equal(t, 5*time.Second, cfg.PreAuth.HelloTimeout)
	require.Equal(t, 256, cfg.PreAuth.MaxConns)
	require.Equal(t, 16, cfg.PreAuth.MaxConnsPerIP)
	require.Equal(t, 10, cfg.PreAuth.MaxAuthFailuresPerIP)
}

// The hello timeout bounds the control stream and the Hello together, from the accept: a
// connector cannot take one timeout for each.
func TestHelloTimeoutCountsFromTheAccept(t *testing.T) {
	const timeout = time.Second
	e := startEdge(t, ServerConfig{PreAuth: PreAuthLimits{HelloTimeout: timeout}})
	sess, err := yamux.Client(dialFrom(t, "127.0.0.1", e.controlAddr), mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	defer sess.Close()
	// The slow connector under test: each step comes within the timeout of the one before,
	// the Hello well after the timeout from the accept.
	time.Sleep(timeout * 4 / 10)
	ctrl, err := sess.OpenStream()
	require.NoError(t, err)
	time.Sleep(timeout * 8 / 10)
	_ = wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version})
	_ = ctrl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if m, err := wire.ReadFrame(ctrl); err == nil {
		ef := requireErrorCode(t, m, wire.CodeProtocol)
		require.Contains(t, ef.Message, "reading hello")
	}
	select {
	case <-sess.CloseChan():
	case <-time.After(5 * time.Second):
		t.Fatal("the edge kept a connection that did not say hello in time")
	}
}
