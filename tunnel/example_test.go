package tunnel_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/warren-tunnel/warren/tunnel"
)

// An edge and a connector in one process with no sockets: the connector attaches through the
// edge's DialContext, serves an in-process handler through Listen, and a public request goes
// through the edge's Handler.
func Example() {
	ctx := context.Background()
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "example.test"})
	if err != nil {
		log.Fatal(err)
	}
	defer edge.Close()

	sess, err := tunnel.Dial(ctx, "in-memory", tunnel.WithDialer(edge.DialContext))
	if err != nil {
		log.Fatal(err)
	}
	defer sess.Close()
	ln, err := sess.Listen(ctx, tunnel.TunnelSpec{Subdomain: "hello"})
	if err != nil {
		log.Fatal(err)
	}
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the backend, you asked for %s", r.URL.Path)
	})}
	go backend.Serve(ln)
	defer backend.Close()

	rec := httptest.NewRecorder()
	edge.Handler().ServeHTTP(rec, httptest.NewRequest("GET", ln.URL()+"/world", nil))
	fmt.Println(ln.URL())
	fmt.Println(rec.Code, rec.Body.String())
	// Output:
	// http://hello.example.test
	// 200 hello from the backend, you asked for /world
}

// Two connectors join one pool; requests alternate between them, and a wrong key is rejected
// with the edge's message.
func ExampleSession_Forward() {
	ctx := context.Background()
	edge, err := tunnel.NewServer(tunnel.ServerConfig{Domain: "example.test", LoadBalancing: tunnel.LoadBalancing{Enabled: true}})
	if err != nil {
		log.Fatal(err)
	}
	defer edge.Close()

	for _, name := range []string{"A", "B"} {
		b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
		defer b.Close()
		sess, err := tunnel.Dial(ctx, "in-memory", tunnel.WithDialer(edge.DialContext))
		if err != nil {
			log.Fatal(err)
		}
		defer sess.Close()
		spec := tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "shared-secret-for-this-pool"}
		if _, err := sess.Forward(ctx, spec, strings.TrimPrefix(b.URL, "http://")); err != nil {
			log.Fatal(err)
		}
	}
	var got []string
	for range 4 {
		rec := httptest.NewRecorder()
		edge.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "http://pool.example.test/", nil))
		got = append(got, rec.Body.String())
	}
	fmt.Println(got)

	intruder, err := tunnel.Dial(ctx, "in-memory", tunnel.WithDialer(edge.DialContext))
	if err != nil {
		log.Fatal(err)
	}
	defer intruder.Close()
	_, err = intruder.Forward(ctx, tunnel.TunnelSpec{Subdomain: "pool", Group: "web", GroupKey: "guess"}, "127.0.0.1:1")
	fmt.Println(err)
	// Output:
	// [A B A B]
	// tunnel: group key does not match for subdomain 'pool'
}
