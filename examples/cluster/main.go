// Command cluster shows one pool served by two Warren edges that share their routes
// through NATS JetStream, in one process on 127.0.0.1, with no configuration files:
//
//	go run ./examples/cluster
//	go run ./examples/cluster -hold   # after step 5, keep the cluster up until Ctrl-C
//	go run ./examples/cluster -version
//
// It starts an embedded NATS server with JetStream (its store in a temporary directory),
// two edges (A and B) in one cluster, two backends and two connectors: connector 1 lists
// the edges as [A, B] and attaches to A, connector 2 lists [B, A] and attaches to B; both
// register their backend in the pool "demo" (http://demo.localhost). It then shows the
// pool as each edge's admin API lists it (every member with its edge_id), sends requests
// through edge A and through edge B and counts which backend answered (a member attached
// to the other edge is reached over the edge-to-edge link), prints /api/cluster, stops
// edge A, and shows edge B still serving while connector 1 moves to edge B and registers
// again. It exits 0 when every step behaved as described and 1 otherwise, so it doubles
// as a smoke test. The steps it prints:
//
//  1. NATS with JetStream listens (its store in a temporary directory); both edges start
//  2. Two connectors register their backend in the pool; each lists both edges
//  3. The pool as each edge's admin API lists it (GET /api/groups)
//  4. Requests through each edge reach both backends
//  5. The cluster as edge B sees it (GET /api/cluster)
//  6. Edge A stops; connector of app-1 moves to edge B, which keeps serving
//  7. Shutting down: connectors, edges, backends, NATS (its temporary directory removed)
//
// With -hold it stops after step 5 with everything up, prints the URLs to curl and "press
// Ctrl-C to stop"; the first Ctrl-C skips step 6 (the failover), runs step 7 and exits 0.
// Without -hold, a Ctrl-C ends the demo where it is (cleaning up; exit 1).
//
// The production form (a NATS cluster of its own, each edge's server.toml with a
// [cluster] table, connectors with servers: [...]) is in docs/cluster.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/warren-tunnel/warren/examples/internal/cli"
	"github.com/warren-tunnel/warren/tunnel"
)

const (
	demoToken    = "demo-token-0123456789"       // the connectors' tenant token
	adminToken   = "demo-admin-token-0123456789" // the edges' admin API token
	clusterToken = "demo-edges-secret-0123456789"
	pool         = "demo"
	// backendDelay keeps each request in flight for a while, so that concurrent requests
	// overlap, as they do in production.
	backendDelay = 30 * time.Millisecond
)

func main() {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.SetOutput(os.Stdout) // -h: the usage is the answer asked for
	hold := fs.Bool("hold", false, "after step 5 keep the cluster up (NATS, both edges, backends, connectors) until Ctrl-C; then skip the failover (step 6), shut down (step 7) and exit 0")
	version := cli.VersionFlag(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: cluster [-hold] [-version]\n\nRuns Warren's cluster demo (7 steps) on 127.0.0.1 and exits 0 when every step behaved.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if *version {
		fmt.Println(cli.Version("cluster"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal ends the hold (or the run) and the demo cleans up; a second one
	// ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	if err := demo(ctx, os.Stdout, *hold); err != nil {
		fmt.Fprintln(os.Stderr, "cluster demo failed:", err)
		os.Exit(1)
	}
}

// run is the whole demo without a hold; it returns an error when a step misbehaves.
func run(ctx context.Context, out io.Writer) error { return demo(ctx, out, false) }

// demo runs the steps; with hold it waits for ctx to end after step 5, then shuts down.
func demo(ctx context.Context, out io.Writer, hold bool) error {
	start := time.Now()
	say := func(format string, args ...any) { fmt.Fprintf(out, format+"\n", args...) }
	base := ctx // what the steps run under: ctx, and after a hold the shutdown's own bound
	// Each phase is bounded; the whole demo takes a few seconds.
	phase := func() (context.Context, context.CancelFunc) { return context.WithTimeout(base, 20*time.Second) }
	pctx, pcancel := phase()
	defer func() { pcancel() }()

	say("Warren cluster demo: NATS with JetStream, two edges, two backends and two connectors on 127.0.0.1.")

	// NATS with JetStream, its store in a temporary directory.
	ns, storeDir, err := startNATS()
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(storeDir)
	}()
	say("\n1. NATS with JetStream listens on %s (store %s)", ns.ClientURL(), storeDir)

	edgeA, err := startEdge("edge-a", ns.ClientURL())
	if err != nil {
		return err
	}
	defer edgeA.close()
	edgeB, err := startEdge("edge-b", ns.ClientURL())
	if err != nil {
		return err
	}
	defer edgeB.close()
	for _, e := range []*edge{edgeA, edgeB} {
		say("   %s: control %s, public http %s, admin %s, edge-to-edge %s", e.id, e.control, e.public, e.admin, e.peer)
	}

	backends := map[string]*backend{}
	for _, name := range []string{"app-1", "app-2"} {
		b, err := startBackend(name)
		if err != nil {
			return err
		}
		defer b.stop()
		backends[name] = b
	}

	say("\n2. Two connectors register their backend in pool %q; each lists both edges", pool)
	sessions, err := startConnectors(pctx, say, backends, edgeA, edgeB)
	defer func() {
		for _, s := range sessions {
			_ = s.Close()
		}
	}()
	if err != nil {
		return err
	}

	say("\n3. The pool as each edge's admin API lists it (GET /api/groups)")
	want := map[string]int{"edge-a": 1, "edge-b": 1}
	for _, e := range []*edge{edgeA, edgeB} {
		members, err := e.waitPool(pctx, want)
		if err != nil {
			return err
		}
		say("   %s sees pool %q with %d members:", e.id, pool, len(members))
		printMembers(say, members)
	}

	say("\n4. Requests through each edge reach both backends (%s each, 4 at a time)", backendDelay)
	for _, e := range []*edge{edgeA, edgeB} {
		if err := sendThrough(pctx, say, e); err != nil {
			return err
		}
	}

	say("\n5. The cluster as edge B sees it (GET /api/cluster)")
	info, err := edgeB.cluster(pctx)
	if err != nil {
		return err
	}
	printCluster(say, info)

	if hold {
		printTryURLs(say, edgeA, edgeB)
		<-ctx.Done()
		pcancel()
		base = context.Background()
		pctx, pcancel = phase()
		say("\nCtrl-C: skipping step 6 (the failover; run without -hold to see it)")
		return shutdown(pctx, say, sessions, start, edgeA, edgeB)
	}

	say("\n6. Edge A stops (Close, which leaves the cluster at once; the members of an edge that")
	say("   crashed would leave the others' view within its lease, 3 s here); connector of app-1 moves to edge B")
	edgeA.close()
	if err := failover(pctx, say, edgeB, sessions[0]); err != nil {
		return err
	}

	return shutdown(pctx, say, sessions, start, edgeB)
}

// shutdown is step 7: the connectors drain, the edges still up shut down; the backends
// and NATS (with its temporary directory) stop as demo returns.
func shutdown(ctx context.Context, say func(string, ...any), sessions []*tunnel.Session, start time.Time, edges ...*edge) error {
	names := map[int]string{1: "edge B", 2: "both edges"}[len(edges)]
	say("\n7. Shutting down: connectors, %s, backends, NATS (its temporary directory removed)", names)
	for _, s := range sessions {
		if err := s.Close(); err != nil {
			return fmt.Errorf("closing a connector: %w", err)
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 15*time.Second) // generous: CI runs every package at once
	defer scancel()
	for _, e := range edges {
		if err := e.srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("%s shutdown: %w", e.id, err)
		}
		e.close()
	}
	say("   done in %s", time.Since(start).Round(10*time.Millisecond))
	return nil
}
