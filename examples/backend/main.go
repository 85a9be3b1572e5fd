// Command backend is an application that is its own backend behind a Warren edge: it dials
// the edge, registers an HTTP tunnel served in-process (Session.Listen, no local port), and
// serves it with net/http. It is what an app embedding a self-registering backend links, and
// its test keeps that small: no NATS, bbolt, Prometheus, protobuf or gRPC.
//
//	go run ./examples/backend -server 127.0.0.1:4040 -token "$WARREN_TOKEN" -subdomain app
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/warren-tunnel/warren/examples/internal/cli"
	"github.com/warren-tunnel/warren/tunnel"
)

func main() {
	server := flag.String("server", "127.0.0.1:4040", "the edge's control `address`")
	token := flag.String("token", os.Getenv("WARREN_TOKEN"), "the connector `token` (default $WARREN_TOKEN)")
	subdomain := flag.String("subdomain", "app", "the tunnel's `subdomain`")
	version := cli.VersionFlag(flag.CommandLine)
	flag.Parse()
	if *version {
		fmt.Println(cli.Version("backend"))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal shuts the server down and drains the tunnel (requests in flight
	// finish, up to 10 s); a second one ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	if err := run(ctx, *server, *token, *subdomain); err != nil {
		fmt.Fprintln(os.Stderr, "backend:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, server, token, subdomain string) error {
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sess, err := tunnel.Dial(dialCtx, server, tunnel.WithToken(token))
	if err != nil {
		return err
	}
	defer sess.Close() // drains: requests in flight finish first
	ln, err := sess.Listen(ctx, tunnel.TunnelSpec{Subdomain: subdomain})
	if err != nil {
		return err
	}
	fmt.Println("serving", ln.URL())
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s, %s %s\n", subdomain, r.Method, r.URL.Path)
		}),
	}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
