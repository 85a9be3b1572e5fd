package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// startEdgeOn is startEdge with a control listener the test chose (wrapped in TLS when cfg
// has a TLSConfig).
func startEdgeOn(t *testing.T, ctl net.Listener, cfg ServerConfig) *testEdge {
	t.Helper()
	cfg.Domain = testDomain
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	pub := listenLoopback(t)
	cfg.Public.URLHTTPPort = pub.Addr().(*net.TCPAddr).Port
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	e := &testEdge{Server: srv, t: t, controlAddr: ctl.Addr().String(), publicAddr: pub.Addr().String()}
	if cfg.TLSConfig != nil {
		ctl = tls.NewListener(ctl, cfg.TLSConfig)
	}
	e.served.Go(func() { _ = srv.Serve(ctl) })
	e.served.Go(func() { _ = srv.ServePublic(pub) })
	e.client = publicClient(e.publicAddr)
	t.Cleanup(func() {
		e.client.CloseIdleConnections()
		require.NoError(t, srv.Close())
		e.served.Wait()
	})
	return e
}

// deadAddr returns a loopback address nothing listens on (connections are refused).
func deadAddr(t *testing.T) string {
	l := listenLoopback(t)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// serves reports whether e answers a request for sub with the backend named want.
func serves(e *testEdge, sub, want string) bool {
	resp, err := e.client.Get(e.url(sub, "/"))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && strings.HasPrefix(string(body), want)
}

func serversOpts(t *testing.T, logs *logBuffer) []Option {
	log := zaptest.NewLogger(t)
	if logs != nil {
		log = logs.logger()
	}
	return []Option{WithLogger(log), WithBackoff(10*time.Millisecond, 100*time.Millisecond)}
}

// TestDialServersMovesToTheNextEdgeWhenItsEdgeCloses: the connector attaches to the first
// edge; when that edge goes away the session moves to the second, registers its tunnel there
// and serves requests from it, without the tunnel ending.
func TestDialServersMovesToTheNextEdgeWhenItsEdgeCloses(t *testing.T) {
	var logs logBuffer
	a, b := startEdge(t, ServerConfig{}), startEdge(t, ServerConfig{})
	back := backend(t, "app")
	sess, err := DialServers(ctxT(t), []string{a.controlAddr, b.controlAddr}, serversOpts(t, &logs)...)
	require.NoError(t, err)
	defer sess.Close()
	require.Equal(t, a.controlAddr, sess.Server(), "the first edge that answers")
	require.Equal(t, a.controlAddr, sess.ServerAddr())

	tun, err := sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(back.URL))
	require.NoError(t, err)
	require.True(t, serves(a, "app", "app /"))
	status, _ := b.get("app", "/")
	require.Equal(t, http.StatusNotFound, status, "the second edge has no member yet")

	require.NoError(t, a.Close())
	require.Eventually(t, func() bool { return serves(b, "app", "app /") }, 10*time.Second, 10*time.Millisecond,
		"the tunnel serves from the second edge")
	require.Equal(t, b.controlAddr, sess.Server())
	require.True(t, sess.Connected())
	require.Equal(t, 1, sess.Reconnects())
	require.Contains(t, logs.String(), "moved to another edge")
	select {
	case <-tun.Done():
		t.Fatalf("the tunnel ended on the move: %v", tun.Err())
	default:
	}
}

// TestDialServersOrderAndWrapAround: a dead first address is skipped at the first
// connection; after a loss the edge after the lost one is tried first, even when the lost
// one is back at once, and the list wraps around at its end.
func TestDialServersOrderAndWrapAround(t *testing.T) {
	dead := deadAddr(t)
	a := &restartableEdge{t: t, control: "127.0.0.1:0", public: "127.0.0.1:0"}
	a.start()
	defer func() { a.stop() }()
	b := startEdge(t, ServerConfig{})
	sess, err := DialServers(ctxT(t), []string{dead, a.control, b.controlAddr}, serversOpts(t, nil)...)
	require.NoError(t, err)
	defer sess.Close()
	require.Equal(t, a.control, sess.Server(), "the dead first address was skipped")

	// a restarts at once: the session still goes to b, the edge after a.
	a.stop()
	a.start()
	require.Eventually(t, func() bool { return sess.Connected() && sess.Server() == b.controlAddr }, 10*time.Second, 5*time.Millisecond)

	// b goes: after b comes the dead address (wrapping around), then a, which answers.
	require.NoError(t, b.Close())
	require.Eventually(t, func() bool { return sess.Connected() && sess.Server() == a.control }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 2, sess.Reconnects())
}

// TestDialServersTriesEveryAddressOfAName: a host name with several addresses stands for
// each of them, resolved again after a loss; TLS verifies the edge by that name, not by
// the address dialled.
func TestDialServersTriesEveryAddressOfAName(t *testing.T) {
	pki := newTestPKI(t) // its certificate names edge.test (and 127.0.0.1 only)
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
	l1 := listenLoopback(t)
	port := l1.Addr().(*net.TCPAddr).Port
	l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port))
	if err != nil {
		_ = l1.Close()
		t.Skipf("cannot listen on 127.0.0.2:%d: %v", port, err)
	}
	a := startEdgeOn(t, l1, ServerConfig{TLSConfig: tlsCfg})
	b := startEdgeOn(t, l2, ServerConfig{TLSConfig: tlsCfg})

	var lookups atomic.Int32
	lookup := func(_ context.Context, host string) ([]string, error) {
		lookups.Add(1)
		if host != "edge.test" {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return []string{"127.0.0.3", "127.0.0.1", "127.0.0.2"}, nil // nothing listens on the first
	}
	name := fmt.Sprintf("edge.test:%d", port)
	opts := append(serversOpts(t, nil), WithTLS(&tls.Config{RootCAs: pki.pool}), withLookup(lookup))
	sess, err := DialServers(ctxT(t), []string{name}, opts...)
	require.NoError(t, err)
	defer sess.Close()
	require.Equal(t, name, sess.Server())
	require.Equal(t, a.controlAddr, sess.ServerAddr())
	back := backend(t, "app")
	_, err = sess.Forward(ctxT(t), TunnelSpec{Subdomain: "app"}, hostPort(back.URL))
	require.NoError(t, err)
	require.True(t, serves(a, "app", "app /"))
	before := lookups.Load()

	require.NoError(t, a.Close())
	require.Eventually(t, func() bool { return serves(b, "app", "app /") }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, b.controlAddr, sess.ServerAddr(), "127.0.0.2 comes after the lost 127.0.0.1 (verified as edge.test)")
	require.Greater(t, lookups.Load(), before, "the name is resolved again for the reconnect")
}

// TestDialServersRefusals: a refused token ends DialServers at once (the next edge is not
// asked), at the first connection and on a reconnect; a passing refusal (the edge cannot
// check tokens now) moves on to the next edge.
func TestDialServersRefusals(t *testing.T) {
	var asked atomic.Int32
	counting := AuthenticatorFunc(func(context.Context, string) (string, error) { asked.Add(1); return "", nil })
	strict := startEdge(t, ServerConfig{Auth: AuthenticatorFunc(func(_ context.Context, token string) (string, error) {
		if token != "good" {
			return "", ErrUnauthorized
		}
		return "", nil
	})})
	open := startEdge(t, ServerConfig{Auth: counting})
	unavailable := startEdge(t, ServerConfig{Auth: AuthenticatorFunc(func(context.Context, string) (string, error) {
		return "", errors.New("token service down")
	})})

	_, err := DialServers(ctxT(t), []string{strict.controlAddr, open.controlAddr}, append(serversOpts(t, nil), WithToken("bad"))...)
	require.ErrorIs(t, err, ErrUnauthorized)
	require.Zero(t, asked.Load(), "a refused token is not tried on the next edge")

	var logs logBuffer
	sess, err := DialServers(ctxT(t), []string{unavailable.controlAddr, open.controlAddr}, serversOpts(t, &logs)...)
	require.NoError(t, err)
	require.Equal(t, open.controlAddr, sess.Server())
	require.Contains(t, logs.String(), "authentication unavailable")
	require.NoError(t, sess.Close())

	// On a reconnect: the good token works on strict; once strict is gone, the next edge
	// refuses it and the session stops for good.
	other := startEdge(t, ServerConfig{Auth: AuthenticatorFunc(func(context.Context, string) (string, error) { return "", ErrUnauthorized })})
	sess, err = DialServers(ctxT(t), []string{strict.controlAddr, other.controlAddr}, append(serversOpts(t, nil), WithToken("good"))...)
	require.NoError(t, err)
	defer sess.Close()
	require.NoError(t, strict.Close())
	select {
	case <-sess.Done():
	case <-ctxT(t).Done():
		t.Fatal("the session kept going after a refused token")
	}
	require.ErrorIs(t, sess.Err(), ErrUnauthorized)
}

// TestDialServersWaitsForAnEdge: while no edge answers, DialServers goes over the list again
// after the backoff delay; it connects once an edge is up, and gives up when ctx ends,
// naming every edge it tried.
func TestDialServersWaitsForAnEdge(t *testing.T) {
	dead1, dead2 := deadAddr(t), deadAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := DialServers(ctx, []string{dead1, dead2}, serversOpts(t, nil)...)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, dead1)
	require.ErrorContains(t, err, dead2)

	// Dial keeps its single pass.
	_, err = Dial(ctxT(t), dead1, serversOpts(t, nil)...)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded)

	var logs logBuffer
	a := &restartableEdge{t: t, control: dead2, public: "127.0.0.1:0"}
	type result struct {
		s   *Session
		err error
	}
	got := make(chan result, 1)
	dctx := ctxT(t)
	go func() {
		s, err := DialServers(dctx, []string{dead1, dead2}, serversOpts(t, &logs)...)
		got <- result{s, err}
	}()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "connect failed") >= 4 }, 10*time.Second, 5*time.Millisecond,
		"whole passes are tried again")
	a.start()
	defer a.stop()
	r := <-got
	require.NoError(t, r.err)
	require.Equal(t, dead2, r.s.Server())
	require.NoError(t, r.s.Close())
}

// TestDialServersRefusesBadInput: an empty list or an empty address is refused, not dialled.
func TestDialServersRefusesBadInput(t *testing.T) {
	for _, addrs := range [][]string{nil, {}, {"127.0.0.1:1", ""}, {" "}} {
		_, err := DialServers(ctxT(t), addrs)
		require.ErrorIs(t, err, ErrInvalid, "%q", addrs)
	}
}

// TestServersCandidates: the pass order over resolved names, with duplicates dropped and a
// name that does not resolve kept for the dialer; rotation starts after the lost address
// or, when a new lookup no longer lists it, at the next edge.
func TestServersCandidates(t *testing.T) {
	s := &Session{servers: []string{"a.test:1", "10.0.0.9:1", "b.test:1", "gone.test:1"}, log: zap.NewNop()}
	s.opts = defaultDialOptions()
	var mu sync.Mutex
	answers := map[string][]string{"a.test": {"10.0.0.1", "10.0.0.2"}, "b.test": {"10.0.0.2", "10.0.0.3"}}
	s.opts.lookup = func(_ context.Context, host string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		if ips, ok := answers[host]; ok {
			return ips, nil
		}
		return nil, errors.New("no such host")
	}
	var got []string
	cands := s.candidates(context.Background())
	for _, c := range cands {
		got = append(got, c.String())
	}
	require.Equal(t, []string{"a.test:1 (10.0.0.1:1)", "a.test:1 (10.0.0.2:1)", "10.0.0.9:1", "b.test:1 (10.0.0.3:1)", "gone.test:1"}, got)
	require.Equal(t, "a.test", cands[1].host, "TLS verifies the name")

	require.Equal(t, 2, rotation(cands, cands[1]))
	require.Equal(t, 0, rotation(cands, cands[4]), "wraps around")
	lost := candidate{server: "a.test:1", addr: "10.0.0.7:1", index: 0}
	require.Equal(t, 2, rotation(cands, lost), "an address no longer listed: the next edge")
	lost = candidate{server: "gone.test:1", addr: "10.0.0.8:1", index: 3}
	require.Equal(t, 0, rotation(cands, lost))
}
