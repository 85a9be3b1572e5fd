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
//
//	go run ./examples/demo -hold      # after step 4, keep everything up until Ctrl-C
//	go run ./examples/demo -version
//
// With -hold the edge, both backends, both connectors and the status page stay up after
// the requests of step 4: the demo prints the URLs to try and "press Ctrl-C to stop", and
// the first Ctrl-C runs step 5 (the shutdown) and exits 0. Without -hold a Ctrl-C ends the
// demo at once (exit 1: it did not run to the end).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/warren-tunnel/warren/examples/internal/cli"
	"github.com/warren-tunnel/warren/group"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
)

func main() {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	hold := fs.Bool("hold", false, "after step 4 keep the edge, backends, connectors and status page up until Ctrl-C, then shut down")
	version := cli.VersionFlag(fs)
	fs.SetOutput(os.Stdout) // -h: the usage is the answer asked for
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: demo [-hold] [-version]\n\nRuns Warren's load-balancing demo on 127.0.0.1 and exits 0 when every step behaved.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2) // the flag package printed the error and the usage
	}
	if fs.NArg() != 0 {
		fs.Usage()
		os.Exit(2)
	}
	if *version {
		fmt.Println(cli.Version("demo"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runHold(ctx, os.Stdout, *hold)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

// run is the whole demo without a hold; it returns an error when a step misbehaves.
func run(ctx context.Context, out io.Writer) error { return runHold(ctx, out, false) }

// runHold is the whole demo; with hold it waits for ctx to end after step 4, then shuts
// down.
func runHold(ctx context.Context, out io.Writer, hold bool) error {
	held := ctx                                             // its end (Ctrl-C) ends the hold
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second) // the steps are bounded, the hold is not
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
	if hold {
		say("\nHolding: the edge, both backends, both connectors and the status page stay up. Try:")
		say("   curl -H 'Host: pool.localhost' http://%s/", publicLn.Addr())
		say("   status page: %s (token demo-token-0123456789)", statusURL)
		say("press Ctrl-C to stop")
		<-held.Done()
		ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
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
