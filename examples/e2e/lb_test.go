package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// killableBackend is httpBackend that can be stopped: its port then refuses connections.
func killableBackend(t *testing.T, name string) (port int, kill func()) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port, srv.Close
}

func metrics(t *testing.T, e *edge) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", e.admin), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	return string(body)
}

// Weights, priority tiers, idempotent retry and outlier ejection, set in the connectors' YAML and the edge's
// server.toml and run by the example mains.
func TestLoadBalancingPoliciesThroughTheMains(t *testing.T) {
	e := startEdge(t, false, "outlier_ejection = true", "retry_idempotent = true")
	portA, killA := killableBackend(t, "backend-a")
	portB := httpBackend(t, "backend-b")
	portC := httpBackend(t, "backend-c")
	member := func(name string, port int, extra ...string) *proc {
		p := startConnector(t, "connector-"+name, e, token, tunnelConf{name: name, proto: "http", subdomain: "pool",
			group: "web", key: groupKey, localPort: port, extra: extra})
		p.line(t, "tunnel "+name+": ")
		return p
	}
	member("a", portA, "weight: 3")
	member("b", portB)
	member("c", portC, "priority: 1")

	c := publicClient(t, e)
	counts := tally(t, c, 400)
	t.Logf("weights 3:1 and a backup tier: %v", counts)
	require.Zero(t, counts["backend-c"], "the backup tier takes nothing while the first has a healthy member")
	require.InDelta(t, 0.75, float64(counts["backend-a"])/400, 0.05, "%v", counts)

	// a's backend dies: a request on one of its pooled streams fails before any answer
	// (retried on b: GET is idempotent), a new stream to it cannot be opened (retried on b),
	// and after 5 failures in a row a is ejected, its probe-less health notwithstanding.
	killA()
	counts = tally(t, c, 40)
	require.Equal(t, map[string]int{"backend-b": 40}, counts)
	require.Contains(t, metrics(t, e), `warren_member_ejections_total{group="web",region="local"} 1`)
}

// A rolling key rotation through the mains loses no request, and the old key is refused
// once every member has the new one.
func TestKeyRotationThroughTheMains(t *testing.T) {
	e := startEdge(t, false)
	conf := func(name, key string, port int, extra ...string) tunnelConf {
		return tunnelConf{name: name, proto: "http", subdomain: "pool", group: "web", key: key, localPort: port, extra: extra}
	}
	var old []*proc
	for _, name := range []string{"a", "b"} {
		p := startConnector(t, "connector-"+name, e, token, conf(name, "key-1", httpBackend(t, "backend-"+name)))
		p.line(t, "tunnel "+name+": ")
		old = append(old, p)
	}

	c := publicClient(t, e)
	var sent, failed atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sent.Add(1)
			resp, err := c.Get("http://pool.localhost/")
			if err != nil {
				failed.Add(1)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
		}
	}()
	for i, name := range []string{"a2", "b2"} {
		p := startConnector(t, "connector-"+name, e, token,
			conf(name, "key-2", httpBackend(t, "backend-"+name), "previous_group_keys: [key-1]"))
		p.line(t, "tunnel "+name+": ")
		old[i].signal(t, syscall.SIGTERM)
		require.Equal(t, 0, old[i].wait(t))
	}
	// Traffic still flows once every member has the new key.
	n := sent.Load() + 20
	require.Eventually(t, func() bool { return sent.Load() >= n }, waitTimeout, time.Millisecond)
	close(stop)
	<-done
	t.Logf("%d requests during the rotation, %d failed", sent.Load(), failed.Load())
	require.Positive(t, sent.Load())
	require.Zero(t, failed.Load(), "no request fails during a rotation")

	late := startConnector(t, "connector-late", e, token, conf("late", "key-1", httpBackend(t, "late")))
	require.Equal(t, 1, late.wait(t))
	require.Contains(t, late.stderr.String(), "group key does not match for subdomain 'pool'")
	require.True(t, strings.Contains(tallyString(t, c), "backend-"), "the pool still serves")
}

func tallyString(t *testing.T, c *http.Client) string {
	return fmt.Sprint(tally(t, c, 4))
}

// Cookie affinity and slow start, set in the connectors' YAML.
func TestAffinityAndSlowStartThroughTheMains(t *testing.T) {
	e := startEdge(t, false)
	for _, name := range []string{"a", "b", "c"} {
		p := startConnector(t, "connector-"+name, e, token, tunnelConf{name: name, proto: "http", subdomain: "pool",
			group: "web", key: groupKey, localPort: httpBackend(t, "backend-"+name), extra: []string{"affinity: cookie"}})
		p.line(t, "tunnel "+name+": ")
	}
	c := publicClient(t, e)
	get := func(cookie string) (body, setCookie string) {
		req, err := http.NewRequest(http.MethodGet, "http://pool.localhost/", nil)
		require.NoError(t, err)
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return string(b), resp.Header.Get("Set-Cookie")
	}
	first, set := get("")
	require.Contains(t, set, "warren_affinity=")
	cookie := strings.SplitN(set, ";", 2)[0]
	for range 20 {
		body, _ := get(cookie)
		require.Equal(t, first, body, "a client with the affinity cookie stays on its member")
	}

	// A member in a long slow start takes a small share next to one at full weight.
	full := startConnector(t, "connector-full", e, token, tunnelConf{name: "full", proto: "http", subdomain: "ramp",
		group: "ramp", key: groupKey, localPort: httpBackend(t, "full")})
	full.line(t, "tunnel full: ")
	slow := startConnector(t, "connector-slow", e, token, tunnelConf{name: "slow", proto: "http", subdomain: "ramp",
		group: "ramp", key: groupKey, localPort: httpBackend(t, "slow"), extra: []string{"slow_start_secs: 600"}})
	slow.line(t, "tunnel slow: ")
	counts := map[string]int{}
	for range 200 {
		resp, err := c.Get("http://ramp.localhost/")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		counts[string(b)]++
	}
	t.Logf("a member at the start of a 600 s slow start next to one at full weight: %v", counts)
	require.Less(t, counts["slow"], 10, "%v", counts)
}
