package tunnel_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/warren-tunnel/warren/tunnel"
)

// A connector given two edges attaches to the first; when that edge goes away, it moves to
// the second and registers its tunnel there. (The edges are in memory here: the dialer picks
// one by address; a real connector dials "host:port" addresses over the network.)
func ExampleDialServers() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	edges := map[string]*tunnel.Server{}
	for _, name := range []string{"edge-a", "edge-b"} {
		edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "example.test"})
		if err != nil {
			log.Fatal(err)
		}
		defer edge.Close()
		edges[name] = edge
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return edges[addr].DialContext(ctx, network, addr)
	}

	sess, err := tunnel.DialServers(ctx, []string{"edge-a", "edge-b"}, tunnel.WithDialer(dial),
		tunnel.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close()
	ln, err := sess.Listen(ctx, tunnel.TunnelSpec{Subdomain: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	})}
	go backend.Serve(ln)
	defer backend.Close()
	fmt.Println("attached to", sess.Server())

	edges["edge-a"].Close()
	for ctx.Err() == nil {
		rec := httptest.NewRecorder()
		edges["edge-b"].Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://hello.example.test/", nil))
		if rec.Code == http.StatusOK {
			fmt.Println("attached to", sess.Server(), "and serving:", rec.Body.String())
			break
		}
		time.Sleep(10 * time.Millisecond) // the move takes a moment
	}
	// Output:
	// attached to edge-a
	// attached to edge-b and serving: hello
}
