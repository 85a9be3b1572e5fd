package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/internal/mux"
	"github.com/warren-tunnel/warren/internal/wire"
)

// BenchmarkEdgeHTTP measures the edge's share of a tiny HTTP/1.1 request to a member over a
// pooled keep-alive stream: the HTTP ingress (routing, forwarding headers, the reverse
// proxy, the member exchange) with no public socket, and a fake connector that answers on
// the stream itself (its parsing of the request is counted too).
func BenchmarkEdgeHTTP(b *testing.B) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	c := startConnector(b, wire.AckOK, answerHTTP)
	tun := NewTunnel(b.Context(), "m1", group.ProtoHTTP, c.edge, &c.key)
	b.Cleanup(tun.Close)
	_, err := reg.Join(group.JoinRequest{ID: "m1", Proto: group.ProtoHTTP, Label: "pool", Group: "pool", Value: tun})
	if err != nil {
		b.Fatal(err)
	}
	benchHandler(b, NewHTTP(benchConfig(reg)))
}

// BenchmarkEdgeHTTPUnknownLength is BenchmarkEdgeHTTP with a response of unknown length (a
// chunked body, as a streaming or gRPC backend's): the stall watch treats such a response's
// body as it cannot treat one whose length it knows.
func BenchmarkEdgeHTTPUnknownLength(b *testing.B) {
	reg := group.NewRegistry(group.Config{LoadBalancing: true})
	c := startConnector(b, wire.AckOK, answerChunked)
	tun := NewTunnel(b.Context(), "m1", group.ProtoHTTP, c.edge, &c.key)
	b.Cleanup(tun.Close)
	_, err := reg.Join(group.JoinRequest{ID: "m1", Proto: group.ProtoHTTP, Label: "pool", Group: "pool", Value: tun})
	if err != nil {
		b.Fatal(err)
	}
	benchHandler(b, NewHTTP(benchConfig(reg)))
}

// answerChunked is answerHTTP with the tunnel's ID as a chunked body.
func answerChunked(_ *connector, st mux.Stream, env wire.Envelope) {
	br := bufio.NewReader(st)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if _, err := fmt.Fprintf(st, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n",
			len(env.TunnelID), env.TunnelID); err != nil {
			return
		}
	}
}

// benchConfig is the ingress's configuration as an edge runs it by default, with the stall
// timeout and budgets of its responses (tunnel.ServerConfig's defaults).
func benchConfig(reg *group.Registry) Config {
	return Config{Registry: reg, Domain: testDomain, ResponseStallTimeout: time.Minute,
		StalledBytesPerConn: 16 << 20, StalledBytesPerClient: 32 << 20, StalledBytes: 256 << 20}
}

// benchHandler sends the same small GET through h b.N times and reports, besides the
// allocations, the process's CPU time per request (user and system, every goroutine: the
// fake connector's too), which the machine's other load does not inflate as it does the
// wall time.
func benchHandler(b *testing.B, h http.Handler) {
	req := httptest.NewRequest(http.MethodGet, "http://pool."+testDomain+"/path?q=1", nil)
	req.RemoteAddr = "192.0.2.7:40000"
	req.Header.Set("User-Agent", "bench")
	req.Header.Set("Accept", "*/*")
	b.ReportAllocs()
	start := cpuTime()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d", rec.Code)
		}
	}
	b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// cpuTime is the CPU time this process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
