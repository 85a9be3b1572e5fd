package tunnel

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// BenchmarkHTTPInMemory measures the edge's HTTP path with no sockets: Server.Handler, the
// member transport, yamux over net.Pipe, and an in-process backend behind Listen.
func BenchmarkHTTPInMemory(b *testing.B) {
	srv, err := NewServer(ServerConfig{Domain: testDomain})
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Close() })
	sess, err := Dial(ctxT(b), "in-memory", WithDialer(srv.DialContext))
	require.NoError(b, err)
	b.Cleanup(func() { _ = sess.Close() })
	ln, err := sess.Listen(ctxT(b), TunnelSpec{Subdomain: "app"})
	require.NoError(b, err)
	serveListener(b, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	h := srv.Handler()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "http://app."+testDomain+"/", nil))
			if rec.Code != http.StatusOK {
				b.Errorf("status %d", rec.Code)
				return
			}
		}
	})
}

// BenchmarkHTTPLoopback measures a keep-alive client → edge → connector → backend round trip
// over loopback sockets, against the same backend directly.
func BenchmarkHTTPLoopback(b *testing.B) {
	e := startEdge(b, ServerConfig{Logger: zap.NewNop()})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	b.Cleanup(be.Close)
	_, err := e.connect(WithLogger(zap.NewNop())).Forward(ctxT(b), TunnelSpec{Subdomain: "app"}, hostPort(be.URL))
	require.NoError(b, err)
	run := func(b *testing.B, client *http.Client, url string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := client.Get(url)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	b.Run("tunnel", func(b *testing.B) { run(b, e.client, e.url("app", "/")) })
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(direct.CloseIdleConnections)
	b.Run("direct", func(b *testing.B) { run(b, direct, be.URL+"/") })
}

// BenchmarkTCPStream measures one TCP stream's throughput through a tunnel (64 KiB writes to a
// backend that discards), against the same backend directly.
func BenchmarkTCPStream(b *testing.B) {
	e := startEdge(b, ServerConfig{Logger: zap.NewNop(), TCP: TCPTunnels{Ports: tcpRange(45000), BindHost: "127.0.0.1"}})
	sink := tcpBackend(b, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	tun, err := e.connect(WithLogger(zap.NewNop())).Forward(ctxT(b), TunnelSpec{Proto: ProtoTCP}, sink)
	require.NoError(b, err)
	chunk := make([]byte, 64<<10)
	run := func(b *testing.B, addr string) {
		c, err := net.Dial("tcp", addr)
		require.NoError(b, err)
		defer c.Close()
		b.SetBytes(int64(len(chunk)))
		b.ResetTimer()
		for range b.N {
			if _, err := c.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("tunnel", func(b *testing.B) { run(b, net.JoinHostPort("127.0.0.1", strconv.Itoa(tun.Port()))) })
	b.Run("direct", func(b *testing.B) { run(b, sink) })
}

// BenchmarkIdleTCPConnMemory reports the memory (heap and goroutine stacks) that idle TCP
// connections through a tunnel hold, edge and connector together (both in this process), per
// connection. Run it with -benchtime 1x in a fresh process: later iterations reuse pooled
// buffers that the first one allocated.
func BenchmarkIdleTCPConnMemory(b *testing.B) {
	e := startEdge(b, ServerConfig{Logger: zap.NewNop(), TCP: TCPTunnels{Ports: tcpRange(45100), BindHost: "127.0.0.1"}})
	echo := tcpBackend(b, func(c net.Conn) { _, _ = io.Copy(c, c) })
	tun, err := e.connect(WithLogger(zap.NewNop())).Forward(ctxT(b), TunnelSpec{Proto: ProtoTCP}, echo)
	require.NoError(b, err)
	measureIdleTCPConns(b, tun.Port())
}

// measureIdleTCPConns opens 200 connections to the TCP tunnel on port, each carrying one round
// trip, lets them sit idle (past idleShrinkAfter: the idle state is what is measured) and
// reports the heap and stacks they hold, per connection.
func measureIdleTCPConns(b *testing.B, port int) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	const conns = 200
	for range b.N {
		before := heapInUse()
		var cs []net.Conn
		for range conns {
			c, err := net.Dial("tcp", addr)
			require.NoError(b, err)
			// One round trip so that the connection is fully set up and has carried data.
			_, err = c.Write(make([]byte, 32<<10))
			require.NoError(b, err)
			_, err = io.ReadFull(c, make([]byte, 32<<10))
			require.NoError(b, err)
			cs = append(cs, c)
		}
		time.Sleep(2 * time.Second) // no event marks "idle": the measured state is time passed
		after := heapInUse()
		b.ReportMetric(float64(after-before)/conns, "B/idle-conn")
		for _, c := range cs {
			c.Close()
		}
	}
}

func heapInUse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}
