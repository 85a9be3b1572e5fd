// Command edge runs a Warren edge configured by a server.toml file:
//
//	go run ./examples/edge -config examples/edge/server.example.toml
//
// It is a thin wrapper: package tunnel/config reads the file into a tunnel.ServerConfig (and
// what goes around it: the admin plane's address and token, the state directory, the
// cluster), and the edge is served with tunnel.Server.ListenAndServe. SIGINT or SIGTERM
// shuts the edge down gracefully (bounded by limits.drain_timeout_secs; the log counts the
// streams left) and exits 0; a second signal during that drain ends the process at once.
//
// SIGHUP reads the file again without dropping a connector (config.Edge.Reload): connector
// tokens and tenants, the TLS certificate and key files, the tenant quotas (the [limits]
// defaults and each tenant's own) and limits.max_tunnels_per_session, and the [[endpoints]]
// with their policies apply at once, each logged as "applied: …". A lowered quota applies to
// the next session, registration or event stream: nothing already held is taken back. Every
// other changed setting (ports, bind, domain, region, state_dir, TLS on or off,
// require_auth, admin_token, the other [limits], [load_balancing], [cluster]) is logged as
// "not applied: key (old -> new): reason" and keeps its running value until a restart. A
// file that does not load, or that the edge refuses, changes nothing.
//
// "edge -check -config FILE" validates a file: "ok" and exit 0, or its line-numbered errors
// and exit 1.
//
// With a [cluster] table the edge joins a cluster: it connects to NATS before it listens
// (when it cannot reach NATS it does not start, and exits 2), listens for the other edges on
// cluster.peer_addr (or peer_port) as well, and leaves the cluster gracefully when it shuts
// down. -check does not connect to NATS.
//
// Exit codes: 0 after a signal, 1 when a listener fails, 2 for bad flags or a bad
// configuration file (the message names the file, the line and the key).
//
// Logs go to stderr as JSON at info level; -v switches to a human-readable debug log.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/admin"
	"github.com/warren-tunnel/warren/tunnel/config"
	"github.com/warren-tunnel/warren/tunnel/store/boltstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, stop, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command. ctx ends on the first signal; stop restores the default
// signal behaviour so that a second signal kills the process during the drain.
func run(ctx context.Context, stop func(), args []string, stderr io.Writer) int {
	return runWith(ctx, stop, args, os.Stdout, stderr)
}

// runWith is run with stdout (where -check says "ok") given.
func runWith(ctx context.Context, stop func(), args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "server.toml", "the edge's configuration `file`")
	verbose := fs.Bool("v", false, "human-readable debug logging instead of JSON at info level")
	check := fs.Bool("check", false, "validate the configuration file, print \"ok\" or its errors, and exit (0 or 1)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: edge [-v] [-config server.toml]\n       edge -check [-config server.toml]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return 2
	}
	if *check {
		return runCheck(*path, stdout, stderr)
	}

	log := newLogger(stderr, *verbose)
	defer func() { _ = log.Sync() }()
	edge, err := config.LoadEdge(*path, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	// The route store is opened once, for the edge that runs: not by -check, not on SIGHUP
	// (a second Open of the directory would find it locked by the first).
	if edge.StateDir != "" {
		if edge.Config.Store, err = boltstore.Open(edge.StateDir); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", edge.File, err)
			return 2
		}
	}
	srv, err := tunnel.NewServer(edge.Config)
	if err != nil {
		if edge.Config.Store != nil {
			_ = edge.Config.Store.Close()
		}
		fmt.Fprintf(stderr, "%s: %v\n", edge.File, err)
		return 2
	}
	sc := edge.Config
	log.Info("edge starting",
		zap.String("control", sc.ControlAddr), zap.String("http", orOff(sc.Public.HTTPAddr)),
		zap.String("https", orOff(sc.Public.HTTPSAddr)), zap.String("admin", orOff(edge.AdminAddr)),
		zap.String("tcp_ports", fmt.Sprintf("%d-%d", sc.TCP.Ports.Lo, sc.TCP.Ports.Hi)),
		zap.Bool("tls", sc.TLSConfig != nil), zap.Bool("load_balancing", sc.LoadBalancing.Enabled),
		zap.String("domain", sc.Domain), zap.String("region", sc.RegionID))
	if cl := edge.ClusterConfig; cl != nil {
		id := cl.EdgeID
		if id == "" {
			id = "(the host name)"
		}
		log.Info("edge joined the cluster", zap.String("edge_id", id), zap.String("advertise", cl.Advertise),
			zap.String("peer_addr", cl.PeerAddr), zap.Int("nats_urls", len(cl.NATSURLs)), zap.String("bucket", cl.Bucket),
			zap.Duration("lease", cl.LeaseTTL), zap.Bool("peer_tls", cl.PeerTLS != nil))
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	served, serving := make(chan error, 2), 1
	if edge.AdminAddr != "" {
		plane, err := serveAdmin(srv, edge, log, served)
		if err != nil {
			_ = srv.Close()
			log.Error("edge stopped", zap.Error(err))
			return 1
		}
		defer plane.Close()
		serving++
	}
	go func() { served <- srv.ListenAndServe() }()

	var reloading sync.Mutex
	var reloads sync.WaitGroup
	defer reloads.Wait() // a reload reads within 5 s, then ends
wait:
	for {
		select {
		case err := <-served: // a listener failed before any signal
			_ = srv.Close()
			log.Error("edge stopped", zap.Error(err))
			return 1
		case <-hup: // off this loop, so that a SIGTERM is heard whatever the file does
			if reloading.TryLock() {
				reloads.Go(func() { defer reloading.Unlock(); reload(edge, srv, *path, log) })
			} else {
				log.Warn("SIGHUP: the previous reload is still running; this one is skipped")
			}
		case <-ctx.Done():
			break wait
		}
	}
	stop()
	log.Info("shutting down", zap.Duration("drain_timeout", sc.Timeouts.Drain))
	sctx, cancel := context.WithTimeout(context.Background(), sc.Timeouts.Drain)
	defer cancel()
	if err := shutdownCounting(sctx, srv, log); err != nil {
		log.Warn("drain did not finish in time; connections were closed", zap.Error(err))
	}
	for range serving {
		if err := <-served; !errors.Is(err, tunnel.ErrServerClosed) {
			log.Warn("listener error during shutdown", zap.Error(err))
		}
	}
	log.Info("edge stopped")
	return 0
}

// serveAdmin serves the edge's operator plane (package tunnel/admin: /healthz, /metrics,
// /api, the status page) on the edge's admin address, sending the end of its serving to
// served.
func serveAdmin(srv *tunnel.Server, edge *config.Edge, log *zap.Logger, served chan<- error) (*admin.Plane, error) {
	plane, err := admin.New(srv, admin.Options{Token: edge.AdminToken, Hosts: edge.AdminHosts, Logger: log.Named("admin")})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", edge.AdminAddr)
	if err != nil {
		plane.Close()
		return nil, fmt.Errorf("listen %s (admin): %w", edge.AdminAddr, err)
	}
	log.Info("listening", zap.String("listener", "admin"), zap.Stringer("addr", l.Addr()), zap.Bool("tls", false))
	go func() { served <- srv.ServeAdmin(l, plane.Handler()) }()
	return plane, nil
}

// reload is SIGHUP: it reads the file at path again and applies it to srv, logging what it
// applied and what it did not. A file that does not load, or that the edge refuses, changes
// nothing.
func reload(edge *config.Edge, srv *tunnel.Server, path string, log *zap.Logger) {
	log.Info("SIGHUP: reloading the configuration", zap.String("file", path))
	next, err := config.LoadServer(path)
	var changes []config.Change
	if err == nil {
		changes, err = edge.Reload(srv, next)
	}
	applied := 0
	for _, c := range changes {
		if c.Applied {
			log.Info("applied: " + c.String())
			applied++
		}
	}
	for _, c := range changes {
		if !c.Applied {
			log.Warn("not applied: " + c.String())
		}
	}
	if err != nil {
		log.Error("reload failed; the running configuration is kept", zap.String("errors", err.Error()))
		return
	}
	log.Info("configuration reloaded", zap.Int("applied", applied), zap.Int("not_applied", len(changes)-applied))
}

// runCheck is "edge -check": it loads the file as the edge would (the TLS key pairs and the
// tokens included) without listening, opening the state directory or connecting to NATS.
func runCheck(path string, stdout, stderr io.Writer) int {
	if _, err := config.LoadEdge(path, zap.NewNop()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	return 0
}

// shutdownCounting is srv.Shutdown(ctx), logging the streams still open as they finish.
func shutdownCounting(ctx context.Context, srv *tunnel.Server, log *zap.Logger) error {
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	count := func() int64 {
		var n int64
		for _, g := range srv.Registry().Groups() {
			for _, m := range g.Members {
				n += m.Active
			}
		}
		return n
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	last := int64(-1)
	for {
		if n := count(); n != last {
			last = n
			streams := "streams"
			if n == 1 {
				streams = "stream"
			}
			log.Info(fmt.Sprintf("draining: %d %s left", n, streams), zap.Int64("streams_left", n))
		}
		select {
		case err := <-done:
			if err == nil && last != 0 {
				log.Info("draining: 0 streams left", zap.Int64("streams_left", 0))
			}
			return err
		case <-tick.C:
		}
	}
}

func orOff(addr string) string {
	if addr == "" {
		return "off"
	}
	return addr
}

// newLogger returns a JSON logger at info level, or with verbose a human-readable one at
// debug level, writing to w.
func newLogger(w io.Writer, verbose bool) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	enc, level := zapcore.NewJSONEncoder(ec), zapcore.InfoLevel
	if verbose {
		enc, level = zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.DebugLevel
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), level))
}
