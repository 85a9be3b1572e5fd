package tunneltest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

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
	answers := func(n int) map[string]int {
		got := map[string]int{}
		for range n {
			resp, err := e.Client.Get(e.URL("app", "/"))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got[string(body)]++
		}
		return got
	}
	fmt.Println(answers(10))
	members[0].Shutdown(context.Background()) // the drain: in-flight requests finish, then the edge removes it
	fmt.Println(answers(10))
	// Output:
	// map[a:5 b:5]
	// map[b:10]
}
