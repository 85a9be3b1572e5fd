package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/wire"
)

// flushGate holds the first flush of each of n responses until all n wait there, then
// for hold more: what an HTTP/2 server whose goroutines do not get the CPU does to its
// handlers' flushes, for every response on a connection at once.
type flushGate struct {
	n, arrived int
	hold       time.Duration
	mu         sync.Mutex
	open       chan struct{}
}

func newFlushGate(n int, hold time.Duration) *flushGate {
	return &flushGate{n: n, hold: hold, open: make(chan struct{})}
}

func (g *flushGate) wait() {
	g.mu.Lock()
	g.arrived++
	if g.arrived == g.n {
		time.AfterFunc(g.hold, func() { close(g.open) })
	}
	g.mu.Unlock()
	select {
	case <-g.open:
	case <-time.After(10 * time.Second): // a gate that never fills must not hang the test
	}
}

// gatedWriter is a public response writer whose first flush waits at its gate.
type gatedWriter struct {
	http.ResponseWriter
	gate   *flushGate
	waited bool
}

func (w *gatedWriter) FlushError() error {
	if !w.waited {
		w.waited = true
		w.gate.wait()
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *gatedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// h2cClient is a public client that speaks HTTP/2 with prior knowledge to addr, on one
// connection.
func h2cClient(t *testing.T, addr string) *http.Client {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}, TLSClientConfig: &tls.Config{}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// TestSmallResponsesHeldUpTogetherAreNotCut: many small responses of unknown length (as
// gRPC's unary answers: a flushed message, then trailers) on one HTTP/2 connection whose
// flushes are all held up well past the stall grace at once (as on a CPU-starved edge,
// where a flush waits for the server's writer goroutine) are all delivered: their members
// have finished, so what they may hold at the edge is the little they have left, not a
// member stream's window each, and the connection's budget is not spent on them. Before,
// each was charged a whole window (1 MiB for an h2c member, 4 MiB for a yamux one), and all
// but the first 16 (or 4) were reset.
func TestSmallResponsesHeldUpTogetherAreNotCut(t *testing.T) {
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		_, _ = io.WriteString(w, "echo "+r.URL.Query().Get("m"))
		http.NewResponseController(w).Flush()
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	}))
	for _, proto := range []string{wire.BackendH2C, wire.BackendHTTP1} {
		t.Run(proto, func(t *testing.T) {
			const n = 50
			stats := newStats()
			stats.ResponsesCut = new(CutCounts)
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second, Stats: stats,
				ResponseStallTimeout: time.Minute, StalledBytesPerConn: 16 << 20, StalledBytesPerClient: 32 << 20,
				StalledBytes: 256 << 20})
			c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
			tun := NewTunnel(context.Background(), "m", group.ProtoHTTP, c.edge, &c.key)
			tun.SetBackendProtocol(proto)
			t.Cleanup(tun.Close)
			_, err := reg.Join(group.JoinRequest{ID: "m", Proto: group.ProtoHTTP, Label: "pool", Group: "pool", Value: tun})
			require.NoError(t, err)

			gate := newFlushGate(n, 300*time.Millisecond)
			pub := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(&gatedWriter{ResponseWriter: w, gate: gate}, r)
			}))
			client := h2cClient(t, pub.Listener.Addr().String())

			var wg sync.WaitGroup
			errs := make(chan error, n)
			for i := range n {
				wg.Go(func() {
					resp, err := client.Get(fmt.Sprintf("http://pool.%s/call?m=c%d", testDomain, i))
					if err != nil {
						errs <- err
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					switch {
					case err != nil:
						errs <- fmt.Errorf("call %d: %w", i, err)
					case resp.ProtoMajor != 2:
						errs <- fmt.Errorf("call %d over %s", i, resp.Proto)
					case string(b) != fmt.Sprint("echo c", i) || resp.Trailer.Get("Grpc-Status") != "0":
						errs <- fmt.Errorf("call %d: got %q, trailers %v", i, b, resp.Trailer)
					}
				})
			}
			wg.Wait()
			close(errs)
			var failed []error
			for err := range errs {
				if err != nil {
					failed = append(failed, err)
				}
			}
			require.Empty(t, failed, "%d of %d calls failed", len(failed), n)
			require.Equal(t, map[string]uint64{"conn_budget": 0, "edge_budget": 0, "ip_budget": 0, "stall_timeout": 0},
				stats.ResponsesCut.ByReason())
			require.Zero(t, h.StalledBytes())
		})
	}
}

// TestQuietResponseCutDuringItsReadAhead: a stalled response whose member sends nothing
// more is charged its window once its read-ahead has waited probeWait, and cut over its
// connection's budget while the read-ahead still waits for the member: the client's stream
// is reset, which ends the request and with it the member's exchange (the backend's
// request ends) and the read-ahead's wait, before the blocked flush even returns; no
// goroutine is left (goleak).
func TestQuietResponseCutDuringItsReadAhead(t *testing.T) {
	backendDone := make(chan struct{}, 2)
	be := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first event")
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		backendDone <- struct{}{}
	}))
	for _, proto := range []string{wire.BackendH2C, wire.BackendHTTP1} {
		t.Run(proto, func(t *testing.T) {
			stats := newStats()
			stats.ResponsesCut = new(CutCounts)
			reg := group.NewRegistry(group.Config{LoadBalancing: true})
			h := NewHTTP(Config{Registry: reg, Domain: testDomain, OpenTimeout: 2 * time.Second, Stats: stats,
				ResponseStallTimeout: time.Minute, StalledBytesPerConn: 512 << 10})
			c := startConnector(t, wire.AckOK, pipeTo(be.Listener.Addr().String()))
			tun := NewTunnel(context.Background(), "m", group.ProtoHTTP, c.edge, &c.key)
			tun.SetBackendProtocol(proto)
			t.Cleanup(tun.Close)
			_, err := reg.Join(group.JoinRequest{ID: "m", Proto: group.ProtoHTTP, Label: "pool", Group: "pool", Value: tun})
			require.NoError(t, err)

			gate := newFlushGate(1, stallGrace+probeWait+300*time.Millisecond)
			pub := h2cBackend(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(&gatedWriter{ResponseWriter: w, gate: gate}, r)
			}))
			start := time.Now()
			resp, err := h2cClient(t, pub.Listener.Addr().String()).Get("http://pool." + testDomain + "/events")
			if err == nil { // the head may come before the reset, or not
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			require.ErrorContains(t, err, "INTERNAL_ERROR")
			require.GreaterOrEqual(t, time.Since(start), stallGrace+probeWait, "cut before its read-ahead had its time")
			require.Equal(t, uint64(1), stats.ResponsesCut.ConnBudget.Load())
			select {
			case <-backendDone:
			case <-time.After(10 * time.Second):
				t.Fatal("the backend's request did not end")
			}
			require.Zero(t, h.StalledBytes())
		})
	}
}
