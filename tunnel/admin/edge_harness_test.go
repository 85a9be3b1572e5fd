package admin

// The harness of the tests that run the operator plane against a live edge (edge_*_test.go):
// an edge of package tunneltest with its Plane (New) served by the edge's ServeAdmin, and the
// helpers those tests share, adapted from package tunnel's tests to the public API.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
	"github.com/warren-tunnel/warren/webhook"
)

const testDomain = tunneltest.Domain

// adminReadTimeoutFactor is the limit the edge's ServeAdmin puts on reading a whole request,
// body included: twice ServerConfig.Public.ReadHeaderTimeout.
const adminReadTimeoutFactor = 2

// testEdge is an edge on loopback (tunneltest) with its operator plane, served by the edge's
// ServeAdmin on adminAddr.
type testEdge struct {
	*tunneltest.Edge
	t         testing.TB
	plane     *Plane
	adminAddr string
	// served are the extra admin listeners of the test (serveAdminOn); waited for after
	// the edge closed.
	served sync.WaitGroup
}

// startEdge starts an edge configured by cfg and its plane configured by o (whose Logger is
// cfg.Logger unless set, a logger to the test when neither is). Everything closes at cleanup.
func startEdge(t testing.TB, cfg tunnel.ServerConfig, o Options) *testEdge {
	t.Helper()
	e := &testEdge{t: t}
	t.Cleanup(e.served.Wait) // registered first: runs after the edge's Close
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	if o.Logger == nil {
		o.Logger = cfg.Logger.Named("admin")
	}
	e.Edge = tunneltest.NewEdge(t, cfg)
	p, err := New(e.Server, o)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	e.plane = p
	e.adminAddr = e.ServeAdmin(p.Handler())
	return e
}

// serveAdminOn serves the plane with the edge's ServeAdmin on l too, until the edge closes.
func (e *testEdge) serveAdminOn(l net.Listener) {
	e.served.Go(func() { _ = e.Server.ServeAdmin(l, e.plane.Handler()) })
}

// connect dials a connector to the edge; Close runs at cleanup.
func (e *testEdge) connect(opts ...tunnel.Option) *tunnel.Session {
	e.t.Helper()
	return tunneltest.Connect(e.t, e.Edge, opts...)
}

// get fetches a public URL and returns status and body.
func (e *testEdge) get(sub, path string) (int, string) {
	e.t.Helper()
	resp, err := e.Client.Get(e.URL(sub, path))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(b)
}

// tally sends n requests to sub and counts the answers by body prefix (the backend's name).
func (e *testEdge) tally(sub string, n int) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	for range n {
		code, body := e.get(sub, "/")
		require.Equal(e.t, http.StatusOK, code, body)
		got[strings.Fields(body)[0]]++
	}
	return got
}

// selectable counts the members of the HTTP group on sub that take new work (healthy, not
// draining); -1 when there is no such group.
func selectable(e *testEdge, sub string) func() int {
	return func() int {
		g, ok := e.Registry().LookupHTTP(sub)
		if !ok {
			return -1
		}
		_, _, n := g.Counts()
		return n
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func listenLoopback(t testing.TB) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return l
}

// backend is a loopback HTTP server that names itself in every answer.
func backend(t testing.TB, name string) *httptest.Server {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	t.Cleanup(b.Close)
	return b
}

func hostPort(u string) string { return strings.TrimPrefix(u, "http://") }

func pool(sub string) tunnel.TunnelSpec {
	return tunnel.TunnelSpec{Subdomain: sub, Group: "web", GroupKey: "shared-secret"}
}

// tcpRange gives each test its own slice of loopback ports; taken ports are skipped.
func tcpRange(lo int) group.PortRange { return group.PortRange{Lo: lo, Hi: lo + 49} }

// tcpBackend accepts connections until the test ends and runs handle on each.
func tcpBackend(t testing.TB, handle func(net.Conn)) string {
	addr, _ := stoppableTCPBackend(t, handle)
	return addr
}

// stoppableTCPBackend is tcpBackend with a stop func the test may call early (idempotent).
func stoppableTCPBackend(t testing.TB, handle func(net.Conn)) (addr string, stop func()) {
	l := listenLoopback(t)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { _ = l.Close(); wg.Wait() }) }
	t.Cleanup(stop)
	return l.Addr().String(), stop
}

// mustStaticTokens is tunnel.NewStaticTokens for tokens known to be long enough.
func mustStaticTokens(t testing.TB, tokens []string, tenants map[string]string) *tunnel.StaticTokens {
	t.Helper()
	a, err := tunnel.NewStaticTokens(tokens, tenants)
	require.NoError(t, err)
	return a
}

const (
	acmeToken   = "acme-token-0123456789"
	globexToken = "globex-token-0123456789"
	plainToken  = "plain-token-0123456789" // belongs to no tenant
)

func tenantAuth(t testing.TB) tunnel.Authenticator {
	return mustStaticTokens(t, []string{plainToken}, map[string]string{"acme": acmeToken, "globex": globexToken})
}

// switchable is a health check the test turns on and off. Its check returns at once; the
// timeout is generous so that a loaded machine (a starved goroutine) never fails it.
type switchable struct{ down atomic.Bool }

func (s *switchable) spec() *health.Spec {
	return &health.Spec{Type: health.TypeFunc, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second, MaxFailed: 1,
		Check: func(context.Context) error {
			if s.down.Load() {
				return errors.New("switched off")
			}
			return nil
		}}
}

// receiver records the alerts POSTed to it.
type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []webhook.Payload
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var p webhook.Payload
		if err := json.Unmarshal(body, &p); err != nil || req.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad alert", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, p)
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) alerts() []webhook.Payload {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]webhook.Payload(nil), r.got...)
}

// rawControl opens a yamux session and a control stream to the edge by hand, so that a test
// can write anything on it.
func rawControl(t *testing.T, addr string) (*yamux.Session, net.Conn) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	sess, err := yamux.Client(c, mux.ClientConfig(zap.NewNop()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close() })
	st, err := sess.OpenStream()
	require.NoError(t, err)
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	return sess, st
}

// rawMember registers one tunnel over a hand-made control stream, so that no prober runs
// and the test alone decides the member's health: it writes wire.Health frames on the
// stream, which the edge handles in order (setHealth). It returns the tunnel id and the
// stream, whose deadline is lifted.
func rawMember(t *testing.T, e *testEdge, token string, reg *wire.Register) (string, net.Conn) {
	t.Helper()
	_, ctrl := rawControl(t, e.ControlAddr)
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Hello{Version: wire.Version, Token: token}))
	m, err := wire.ReadFrame(ctrl)
	require.NoError(t, err)
	require.IsType(t, &wire.Welcome{}, m)
	require.NoError(t, wire.WriteFrame(ctrl, reg))
	m, err = wire.ReadFrame(ctrl)
	require.NoError(t, err)
	r, ok := m.(*wire.Registered)
	require.True(t, ok, "registration answered with %#v", m)
	_ = ctrl.SetDeadline(time.Time{})
	return r.TunnelID, ctrl
}

// setHealth reports the raw member id healthy or not on its control stream.
func setHealth(t testing.TB, ctrl net.Conn, id string, healthy bool, reason string) {
	t.Helper()
	require.NoError(t, wire.WriteFrame(ctrl, &wire.Health{TunnelID: id, Healthy: healthy, Reason: reason}))
}

// probedRegister is a registration of an HTTP pool member with a TCP probe.
func probedRegister(sub, groupName, key string) *wire.Register {
	h := sha256.Sum256([]byte(key))
	return &wire.Register{Req: 1, Proto: group.ProtoHTTP, Label: sub, Group: groupName, KeyHash: hex.EncodeToString(h[:]),
		Health: &wire.HealthInfo{Kind: "tcp"}}
}

// apiClient calls an edge's admin listener over loopback, one connection per request.
type apiClient struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newAPIClient(t *testing.T, addr string) *apiClient {
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &apiClient{t: t, base: "http://" + addr, hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// get sends GET path with token as bearer token ("" for none).
func (c *apiClient) get(token, path string) (int, http.Header, []byte) {
	c.t.Helper()
	return c.do(http.MethodGet, token, path)
}

func (c *apiClient) do(method, token, path string) (int, http.Header, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	require.NoError(c.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.hc.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, resp.Header, body
}

// getJSON fetches path, requires 200 and decodes the answer.
func getJSON[T any](c *apiClient, token, path string) T {
	c.t.Helper()
	code, h, body := c.get(token, path)
	require.Equal(c.t, http.StatusOK, code, "GET %s: %s", path, body)
	require.Equal(c.t, "application/json", h.Get("Content-Type"))
	var v T
	require.NoError(c.t, json.Unmarshal(body, &v), "%s", body)
	return v
}

// requireError checks an error answer: its status, and that it is JSON.
func requireError(t *testing.T, c *apiClient, token, path string, status int) string {
	t.Helper()
	code, h, body := c.get(token, path)
	require.Equal(t, status, code, "GET %s: %s", path, body)
	require.Equal(t, "application/json", h.Get("Content-Type"))
	var e struct{ Error string }
	require.NoError(t, json.Unmarshal(body, &e), "%s", body)
	require.NotEmpty(t, e.Error)
	return e.Error
}

func tunnelsByID(ts []TunnelInfo) map[string]TunnelInfo {
	out := map[string]TunnelInfo{}
	for _, t := range ts {
		out[t.ID] = t
	}
	return out
}

func memberIDs(g GroupInfo) []string {
	var ids []string
	for _, m := range g.Members {
		ids = append(ids, m.ID)
	}
	return ids
}

func keysOf[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
