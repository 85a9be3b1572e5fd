// Package tunneltest runs Warren edges and connectors inside a test, in the style of
// net/http/httptest: NewEdge starts an edge on loopback listeners, with an *http.Client whose
// requests reach its tunnels by host name and a dialer for its TCP groups; Connect dials a
// connector to it. Everything is closed by t.Cleanup, and nothing of it outlives the test.
package tunneltest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/warren-tunnel/warren/tunnel"
)

// Domain is the edge's domain unless the configuration names another: an HTTP tunnel with
// subdomain "app" is http://app.warren.test.
const Domain = "warren.test"

// Edge is an edge serving on loopback listeners for the length of a test.
type Edge struct {
	*tunnel.Server
	// ControlAddr is where connectors dial; PublicAddr serves public HTTP.
	ControlAddr, PublicAddr string
	// Client sends every request to PublicAddr, whatever its URL's host, as DNS would send
	// *.Domain there: Client.Get(e.URL("app", "/")) reaches the tunnel "app".
	Client *http.Client
	// Domain is the edge's ServerConfig.Domain.
	Domain string

	t      testing.TB
	served sync.WaitGroup
}

// NewEdge starts an edge configured by cfg on loopback, serving connectors and public HTTP,
// and closes it when the test ends. Unset, cfg.Domain is Domain, cfg.Logger logs to t,
// cfg.TCP.BindHost is 127.0.0.1 and cfg.Public.URLHTTPPort is the public listener's port.
func NewEdge(t testing.TB, cfg tunnel.ServerConfig) *Edge {
	t.Helper()
	if cfg.Domain == "" {
		cfg.Domain = Domain
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	if cfg.TCP.BindHost == "" {
		cfg.TCP.BindHost = "127.0.0.1"
	}
	ctl, pub := listen(t), listen(t)
	if cfg.Public.URLHTTPPort == 0 {
		// Known before the first registration: a tunnel's URL does not change when the
		// public listener starts serving.
		cfg.Public.URLHTTPPort = pub.Addr().(*net.TCPAddr).Port
	}
	srv, err := tunnel.NewServer(cfg)
	if err != nil {
		_ = ctl.Close()
		_ = pub.Close()
		t.Fatalf("tunneltest: NewServer: %v", err)
	}
	e := &Edge{Server: srv, ControlAddr: ctl.Addr().String(), PublicAddr: pub.Addr().String(), Domain: cfg.Domain, t: t}
	e.serve(ctl, srv.Serve)
	e.serve(pub, srv.ServePublic)
	tr := &http.Transport{DialContext: e.dialPublic, MaxIdleConnsPerHost: 64}
	e.Client = &http.Client{
		Transport: tr,
		Timeout:   20 * time.Second,
		// A test looks at redirects itself.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		if err := srv.Close(); err != nil {
			t.Errorf("tunneltest: Close: %v", err)
		}
		e.served.Wait()
	})
	return e
}

// ServeAdmin serves h (an operator plane, package tunnel/admin) on a loopback listener with the
// edge's ServeAdmin until the edge closes, and returns its address.
func (e *Edge) ServeAdmin(h http.Handler) string {
	e.t.Helper()
	l := listen(e.t)
	e.serve(l, func(l net.Listener) error { return e.Server.ServeAdmin(l, h) })
	return l.Addr().String()
}

// URL is the public URL of path on the HTTP tunnel with subdomain sub.
func (e *Edge) URL(sub, path string) string {
	return fmt.Sprintf("http://%s.%s%s", sub, e.Domain, path)
}

// DialTCP dials the edge's public TCP port port (a TCP group's), on loopback.
func (e *Edge) DialTCP(ctx context.Context, port int) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// Connect dials a connector to e with opts (after a logger to the test and a short backoff,
// which opts may replace) and closes it when the test ends.
func Connect(t testing.TB, e *Edge, opts ...tunnel.Option) *tunnel.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]tunnel.Option{tunnel.WithLogger(zaptest.NewLogger(t)), tunnel.WithBackoff(10*time.Millisecond, 100*time.Millisecond)}, opts...)
	s, err := tunnel.Dial(ctx, e.ControlAddr, opts...)
	if err != nil {
		t.Fatalf("tunneltest: Dial: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *Edge) serve(l net.Listener, serve func(net.Listener) error) {
	e.served.Go(func() {
		if err := serve(l); !errors.Is(err, tunnel.ErrServerClosed) {
			e.t.Errorf("tunneltest: serving %s: %v", l.Addr(), err)
		}
	})
}

func (e *Edge) dialPublic(ctx context.Context, network, _ string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	return d.DialContext(ctx, network, e.PublicAddr)
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tunneltest: listen: %v", err)
	}
	return l
}
