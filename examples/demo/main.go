// Command demo shows Warren's load balancing in one process, on 127.0.0.1, with no
// configuration files:
//
//	go run ./examples/demo
//
// It starts an edge, two backends (A and B) and two connectors that put both backends in
// one pool behind http://pool.localhost. It sends requests through the edge, stops backend
// B to show the health check taking it out of rotation, restarts it to show it coming back,
// and shuts everything down. It exits non-zero if any step does not behave as described,
// so it doubles as a smoke test. While it runs, the edge's admin listener serves the live
// status page; the demo prints its URL and the tenant token to enter there.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

// run is the whole demo; it returns an error when a step misbehaves.
func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex // the edge's event hook prints from the edge's goroutines
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}

	// The edge. Both connectors present the token of one tenant ("demo"): a route belongs
	// to one tenant. The event hook names each member by the backend it forwards to.
	events := make(chan group.Event, 100)
	var names sync.Map // tunnel id → backend name
	auth, err := tunnel.NewStaticTokens(nil, map[string]string{"demo": "demo-token-0123456789"})
	if err != nil {
		return err
	}
	edge, err := tunnel.NewServer(tunnel.ServerConfig{
		Domain: "localhost",
		LoadBalancing: tunnel.LoadBalancing{
			Enabled: true,
		},
		Auth: auth,
		OnEvent: func(ev group.Event) { // in order per group: print and return
			say("    edge: %s", describe(ev, &names))
			select {
			case events <- ev:
			default:
			}
		},
	})
	if err != nil {
		return err
	}
	var serving sync.WaitGroup
	defer serving.Wait()
	defer func() { _ = edge.Close() }() // after a failure; a no-op after Shutdown
	controlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	serving.Go(func() { _ = edge.Serve(controlLn) }) // returns at Shutdown or Close
	publicLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	serving.Go(func() { _ = edge.ServePublic(publicLn) })
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	plane, err := admin.New(edge, admin.Options{})
	if err != nil {
		return err
	}
	defer plane.Close()
	serving.Go(func() { _ = edge.ServeAdmin(adminLn, plane.Handler()) })
	statusURL := "http://" + adminLn.Addr().String() + "/"

	// Two backends saying which one they are.
	a, b := &backend{name: "A"}, &backend{name: "B"}
	for _, be := range []*backend{a, b} {
		if err := be.start("127.0.0.1:0"); err != nil {
			return err
		}
		defer be.stop()
	}

	say("Warren demo: an edge, two backends and two connectors on 127.0.0.1.")
	say("Status page (live while the demo runs; token demo-token-0123456789): %s\n", statusURL)
	if err := checkStatusPage(ctx, statusURL); err != nil {
		return err
	}
	say("1. Two connectors join group \"web\" behind http://pool.localhost:%d", publicLn.Addr().(*net.TCPAddr).Port)
	var url string
	var connectors []*tunnel.Session
	for _, be := range []*backend{a, b} {
		sess, err := tunnel.Dial(ctx, controlLn.Addr().String(), tunnel.WithToken("demo-token-0123456789"))
		if err != nil {
			return err
		}
		defer func() { _ = sess.Close() }() // after a failure; a no-op after step 5
		connectors = append(connectors, sess)
		t, err := sess.Forward(ctx, tunnel.TunnelSpec{
			Subdomain: "pool", Group: "web", GroupKey: "demo-secret",
			Health: &health.Spec{Type: health.TypeTCP, Interval: 100 * time.Millisecond, Timeout: 100 * time.Millisecond, MaxFailed: 2},
		}, be.addr)
		if err != nil {
			return fmt.Errorf("connector %s: %w", be.name, err)
		}
		names.Store(t.ID(), be.name)
		url = t.URL()
	}
	if err := waitFor(ctx, events, "both members healthy", func(ev group.Event) bool { return ev.HealthyCount == 2 }); err != nil {
		return err
	}

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		// Every request goes to the edge's public listener, whatever the host: no DNS needed.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", publicLn.Addr().String())
		},
	}}
	defer client.CloseIdleConnections()

	say("\n2. Requests are shared between the two backends")
	if err := sendRequests(say, client, url, true); err != nil {
		return err
	}

	say("\n3. Stopping backend B (its connector stays); its health check takes it out of rotation")
	b.stop()
	if err := waitFor(ctx, events, "backend B unhealthy", healthEvent(&names, "B", false)); err != nil {
		return err
	}
	if err := sendRequests(say, client, url, false); err != nil {
		return err
	}

	say("\n4. Restarting backend B on %s; it returns to rotation", b.addr)
	if err := b.start(b.addr); err != nil {
		return err
	}
	if err := waitFor(ctx, events, "backend B healthy", healthEvent(&names, "B", true)); err != nil {
		return err
	}
	if err := sendRequests(say, client, url, true); err != nil {
		return err
	}

	say("\n5. Shutting down: the connectors drain their tunnels, then the edge and the backends stop")
	if err := shutdown(ctx, connectors, edge); err != nil {
		return err
	}
	a.stop()
	b.stop()
	say("   done in %s", time.Since(start).Round(10*time.Millisecond))
	return nil
}

// sendRequests sends 20 requests to url and checks that both backends served them (shared)
// or only A.
func sendRequests(say func(string, ...any), client *http.Client, url string, shared bool) error {
	tally, failed := map[string]int{}, 0
	for range 20 {
		if who, err := get(client, url); err != nil {
			failed++
		} else {
			tally[who]++
		}
	}
	say("   20 requests to %s: backend A: %d, backend B: %d, failed: %d", url, tally["A"], tally["B"], failed)
	switch {
	case failed > 0:
		return fmt.Errorf("%d requests failed", failed)
	case shared && (tally["A"] < 5 || tally["B"] < 5):
		return errors.New("expected both backends to share the requests")
	case !shared && tally["A"] != 20:
		return errors.New("expected every request on backend A")
	}
	return nil
}

// healthEvent matches the edge's event of the member of backend name (names: tunnel id →
// backend name) turning healthy or unhealthy.
func healthEvent(names *sync.Map, name string, healthy bool) func(group.Event) bool {
	return func(ev group.Event) bool {
		who, _ := names.Load(ev.Member.ID)
		return ev.Kind == group.EventHealth && who == name && ev.Healthy == healthy
	}
}

// shutdown closes the connectors, whose tunnels drain, then shuts the edge down.
func shutdown(ctx context.Context, connectors []*tunnel.Session, edge *tunnel.Server) error {
	for _, sess := range connectors {
		if err := sess.Close(); err != nil {
			return fmt.Errorf("closing a connector: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := edge.Shutdown(ctx); err != nil {
		return fmt.Errorf("edge shutdown: %w", err)
	}
	return nil
}

// describe turns an edge event into a sentence.
func describe(ev group.Event, names *sync.Map) string {
	who := "a new member"
	if name, ok := names.Load(ev.Member.ID); ok {
		who = "backend " + name.(string)
	}
	switch {
	case ev.Kind == group.EventJoined:
		return fmt.Sprintf("%s joined group %q (%d of %d healthy): %s", who, ev.Group.Name, ev.HealthyCount, ev.MemberCount, ev.Reason)
	case ev.Kind == group.EventHealth:
		state := map[bool]string{true: "healthy", false: "UNHEALTHY"}[ev.Healthy]
		return fmt.Sprintf("%s is %s (%d of %d healthy): %s", who, state, ev.HealthyCount, ev.MemberCount, ev.Reason)
	case ev.Kind == group.EventDraining:
		return fmt.Sprintf("%s is draining: no new requests (%d of %d members take traffic)", who, ev.SelectableCount, ev.MemberCount)
	case ev.GroupRemoved:
		return fmt.Sprintf("%s left; group %q is gone", who, ev.Group.Name)
	default:
		return fmt.Sprintf("%s %s (%d remaining)", who, ev.Kind, ev.MemberCount)
	}
}

// waitFor waits until the edge reports an event matching ok.
func waitFor(ctx context.Context, events <-chan group.Event, what string, ok func(group.Event) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		select {
		case ev := <-events:
			if ok(ev) {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

// checkStatusPage checks that the edge's admin listener serves its status page.
func checkStatusPage(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("status page: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		return fmt.Errorf("status page: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	return nil
}

// get sends one request and returns the name of the backend that answered.
func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("status %s", resp.Status)
	}
	return strings.TrimPrefix(strings.TrimSpace(string(body)), "hello from backend "), err
}

// backend is a plain net/http server that says which one it is.
type backend struct {
	name, addr string
	srv        *http.Server
	done       chan struct{} // closed when srv's Serve has returned
}

func (b *backend) start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("backend %s: %w", b.name, err)
	}
	b.addr, b.done = ln.Addr().String(), make(chan struct{})
	b.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "hello from backend %s\n", b.name)
	})}
	go func() { defer close(b.done); _ = b.srv.Serve(ln) }()
	return nil
}

// stop closes the server and waits for it; it is idempotent.
func (b *backend) stop() {
	if b.srv != nil {
		_ = b.srv.Close()
		<-b.done
		b.srv = nil
	}
}
