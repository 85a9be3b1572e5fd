package tunneltest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/tunneltest"
)

// A pool of two members, each a connector forwarding to a backend of its own: requests are
// shared between them; once one member is drained (or closed), they all go to the other.
// In a test, t is the test's *testing.T and the cleanups run by themselves.
func Example() {
	t := newExampleT()
	defer t.cleanup()

	e := tunneltest.NewEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}})
	spec := tunnel.TunnelSpec{Subdomain: "app", Group: "web", GroupKey: "pool-key"}
	var members []*tunnel.Tunnel
	for _, name := range []string{"a", "b"} {
		b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
		t.Cleanup(b.Close)
		m, err := tunneltest.Connect(t, e).Forward(context.Background(), spec, b.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	fmt.Println(answers(t, e, 10))
	members[0].Shutdown(context.Background()) // the drain: in-flight requests finish, then the edge removes it
	fmt.Println(answers(t, e, 10))
	// Output:
	// map[a:5 b:5]
	// map[b:10]
}

// A failover: each connector probes its backend; when backend "a" stops, its member leaves
// the rotation within one probe and every request goes to "b", none of them failing.
func Example_failover() {
	t := newExampleT()
	defer t.cleanup()

	e := tunneltest.NewEdge(t, tunnel.ServerConfig{LoadBalancing: tunnel.LoadBalancing{Enabled: true}})
	probe := &health.Spec{Type: health.TypeTCP, Interval: 20 * time.Millisecond, MaxFailed: 1}
	spec := tunnel.TunnelSpec{Subdomain: "app", Group: "web", GroupKey: "pool-key", Health: probe}
	backends := map[string]*httptest.Server{}
	for _, name := range []string{"a", "b"} {
		b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, name) }))
		t.Cleanup(b.Close)
		backends[name] = b
		if _, err := tunneltest.Connect(t, e).Forward(context.Background(), spec, b.Listener.Addr().String()); err != nil {
			t.Fatal(err)
		}
	}
	healthy := func(want int) { // members start unhealthy, until their first probe passes
		for i := 0; i < 500; i++ {
			g, _ := e.Registry().LookupHTTP("app")
			if len(slices.DeleteFunc(g.Members, func(m group.MemberInfo) bool { return !m.Healthy })) == want {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("the members' health did not change")
	}
	healthy(2)
	backends["a"].Close()
	healthy(1)
	fmt.Println(answers(t, e, 10))
	// Output:
	// map[b:10]
}

// answers sends n requests to the tunnel "app" of e and counts the answers: the body of a 200,
// the status line of anything else.
func answers(t *exampleT, e *tunneltest.Edge, n int) map[string]int {
	got := map[string]int{}
	for range n {
		resp, err := e.Client.Get(e.URL("app", "/"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body = []byte(resp.Status)
		}
		got[string(body)]++
	}
	return got
}
