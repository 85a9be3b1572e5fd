package cluster

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel"
)

// BenchmarkClusterHTTP measures a request served by a local member next to one forwarded
// edge-to-edge, in one run: two edges in a cluster on one embedded NATS, the pool's only
// member attached to edge a; "local" sends requests to edge a, "forwarded" to edge b (which
// carries each over its link to a), "direct" to the backend. 32 keep-alive clients, tiny
// responses; p50 and p99 are reported with the rate.
//
//	go test -run '^$' -bench BenchmarkClusterHTTP -benchtime 5s ./tunnel/cluster
func BenchmarkClusterHTTP(b *testing.B) {
	nodes := startNATSCluster(b, 1)
	quiet := func(c *tunnel.ServerConfig) { c.Logger = zap.NewNop() }
	ea := startClusterEdge(b, nodes, "a", clusterOpts{edit: quiet, lease: 5 * time.Second})
	eb := startClusterEdge(b, nodes, "b", clusterOpts{edit: quiet, lease: 5 * time.Second})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	b.Cleanup(be.Close)
	_, err := ea.connect(tunnel.WithLogger(zap.NewNop())).Forward(ctxT(b), clusterPool("k"), hostPort(be.URL))
	require.NoError(b, err)
	eb.waitMembers(b, "pool", map[string]int{"a": 1})
	run := func(b *testing.B, client *http.Client, url string) {
		var mu sync.Mutex
		var lat []time.Duration
		b.SetParallelism(16) // 32 clients on 2 cores
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			var mine []time.Duration
			for pb.Next() {
				start := time.Now()
				resp, err := client.Get(url)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
		b.StopTimer()
		if len(lat) == 0 {
			return
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(len(lat))/b.Elapsed().Seconds(), "req/s")
	}
	b.Run("local", func(b *testing.B) { run(b, ea.Client, ea.URL("pool", "/")) })
	b.Run("forwarded", func(b *testing.B) { run(b, eb.Client, eb.URL("pool", "/")) })
	direct := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Cleanup(direct.CloseIdleConnections)
	b.Run("direct", func(b *testing.B) { run(b, direct, be.URL+"/") })
}
