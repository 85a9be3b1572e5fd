package tunneltest_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
)

// TestMain checks that nothing of an edge or a connector outlives the tests and the example.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exampleT stands in for a test's *testing.T in the runnable example: it keeps the cleanups
// and runs them at the end, logs nowhere, and panics on a failure.
type exampleT struct {
	testing.TB // a nil interface: what tunneltest calls is below
	cleanups   []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (t *exampleT) Helper()                      {}
func (t *exampleT) Name() string                 { return "Example" }
func (t *exampleT) Cleanup(f func())             { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Logf(string, ...any)          {}
func (t *exampleT) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (t *exampleT) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (t *exampleT) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }

// cleanup runs the cleanups, last registered first, as the testing package does.
func (t *exampleT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// An edge of tunneltest serves its HTTP tunnels to its Client by host name, its TCP groups
// on loopback ports, and a handler with its ServeAdmin; when the test that started it ends,
// the edge, its listeners and its connectors are closed, and nothing of them is left.
func TestEdgeServesAndEndsWithItsTest(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var e *tunneltest.Edge
	t.Run("edge", func(t *testing.T) {
		e = tunneltest.NewEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}, TCP: tunnel.TCPTunnels{Ports: group.PortRange{Lo: 46100, Hi: 46149}}})
		require.Equal(t, tunneltest.Domain, e.Domain)
		b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "%s %s", r.Host, r.URL.Path) }))
		t.Cleanup(b.Close)
		sess := tunneltest.Connect(t, e)
		app, err := sess.Forward(t.Context(), tunnel.TunnelSpec{Subdomain: "app"}, b.Listener.Addr().String())
		require.NoError(t, err)
		_, port, _ := net.SplitHostPort(e.PublicAddr)
		require.Equal(t, "http://app."+tunneltest.Domain+":"+port, app.URL(), "the public listener's port is in the URL")

		resp, err := e.Client.Get(e.URL("app", "/x"))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "app."+tunneltest.Domain+" /x", string(body))

		echo, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = echo.Close() })
		go func() {
			for {
				c, err := echo.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
			}
		}()
		db, err := sess.Forward(t.Context(), tunnel.TunnelSpec{Proto: tunnel.ProtoTCP, Group: "db", GroupKey: "k"}, echo.Addr().String())
		require.NoError(t, err)
		c, err := e.DialTCP(t.Context(), db.Port())
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.WriteString(c, "ping")
		require.NoError(t, err)
		got := make([]byte, 4)
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		require.Equal(t, "ping", string(got))

		admin := e.ServeAdmin(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "operator "+r.URL.Path) }))
		resp, err = http.Get("http://" + admin + "/status")
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, "operator /status", string(body))
		http.DefaultClient.CloseIdleConnections()
	})
	require.True(t, e.Operator().ShuttingDown(), "the edge closed with its test")
	for _, addr := range []string{e.ControlAddr, e.PublicAddr} {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		require.Error(t, err, "%s still listens", addr)
	}
	_, err := e.Client.Get(e.URL("app", "/"))
	require.Error(t, err, "the client's dial goes to a closed listener")
	e.Client.CloseIdleConnections()
}
