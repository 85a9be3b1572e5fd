package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const testDomain = "warren.test"

// testEdge is an edge serving on loopback listeners.
type testEdge struct {
	*Server
	t           testing.TB
	controlAddr string
	publicAddr  string
	// quicAddr, over QUIC (WARREN_TEST_TRANSPORT=quic, quic_test.go), is the UDP address the
	// edge accepts connectors on, and quicPKI the edge's certificate's.
	quicAddr string
	quicPKI  testPKI
	client   *http.Client
	served   sync.WaitGroup
}

func listenLoopback(t testing.TB) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return l
}

// startEdge starts an edge on loopback. Its Close runs at cleanup and every Serve returns.
func startEdge(t testing.TB, cfg ServerConfig) *testEdge {
	t.Helper()
	if cfg.Domain == "" {
		cfg.Domain = testDomain
	}
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	ctl, pub := listenLoopback(t), listenLoopback(t)
	if cfg.Public.URLHTTPPort == 0 {
		// Known before the first registration: a tunnel's URL does not change when the
		// public listener starts serving (ServePublic runs in a goroutine below).
		cfg.Public.URLHTTPPort = pub.Addr().(*net.TCPAddr).Port
	}
	pki, quic := quicEdgeConfig(t, &cfg)
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	e := &testEdge{Server: srv, t: t}
	e.controlAddr, e.publicAddr = ctl.Addr().String(), pub.Addr().String()
	if quic != nil {
		e.serveQUIC(quic, pki)
	}
	for _, sv := range []struct {
		l     net.Listener
		serve func(net.Listener) error
	}{{ctl, srv.Serve}, {pub, srv.ServePublic}} {
		e.served.Go(func() {
			err := sv.serve(sv.l)
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		})
	}
	e.client = publicClient(e.publicAddr)
	t.Cleanup(func() {
		e.client.CloseIdleConnections()
		require.NoError(t, srv.Close())
		e.served.Wait()
	})
	return e
}

// publicClient returns an HTTP client that sends every request to addr, whatever the URL's
// host, the way DNS would for *.warren.test.
func publicClient(addr string) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Client{
		Timeout: 20 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, addr)
			},
			MaxIdleConnsPerHost: 64,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// url is the public URL of a subdomain on the test edge.
func (e *testEdge) url(sub, path string) string {
	return fmt.Sprintf("http://%s.%s%s", sub, testDomain, path)
}

// get fetches a public URL and returns status and body.
func (e *testEdge) get(sub, path string) (int, string) {
	e.t.Helper()
	resp, err := e.client.Get(e.url(sub, path))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(b)
}

// connect dials a connector to the edge over loopback; Close runs at cleanup.
func (e *testEdge) connect(opts ...Option) *Session {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	opts = append([]Option{WithLogger(zaptest.NewLogger(e.t)), WithBackoff(10*time.Millisecond, 100*time.Millisecond)}, opts...)
	s, err := Dial(ctx, e.connectorAddr(), append(e.transportOptions(), opts...)...)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
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

// serveListener serves h on a Listen tunnel until the test ends.
func serveListener(t testing.TB, l net.Listener, h http.Handler) {
	hs := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = hs.Serve(l)
	}()
	t.Cleanup(func() {
		_ = hs.Close()
		_ = l.Close()
		<-done
	})
}
