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
// -pid-file PATH writes the edge's process id to PATH once every listener is bound, and
// removes it when the edge exits; a PATH naming a live edge process is refused (exit 1).
// "edge reload -pid-file PATH [-config FILE]" sends that edge SIGHUP, without pgrep: it
// first checks FILE as -check does (errors: printed, exit 1, nothing sent), and makes sure
// (on Linux, by /proc/PID/cmdline) that the process is an edge.
//
// With a [cluster] table the edge joins a cluster: it connects to NATS before it listens
// (when it cannot reach NATS it does not start, and exits 2), listens for the other edges on
// cluster.peer_addr (or peer_port) as well, and leaves the cluster gracefully when it shuts
// down. -check does not connect to NATS.
//
// Exit codes: 0 after a signal, 1 when a listener fails, 2 for bad flags or a bad
// configuration file (the message names the file, the line and the key).
//
// Logs go to stderr through one zap logger: --log-level debug|info|warn|error (default
// info) and --log-format console|json (default console when stderr is a terminal, JSON
// otherwise); -v is --log-level debug --log-format console. -version prints the version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/examples/edge/internal/edgecmd"
	"github.com/warren-tunnel/warren/examples/internal/cli"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
	"github.com/warren-tunnel/warren/tunnel/store/boltstore"

	// Connectors over QUIC ([server] quic_port).
	_ "github.com/warren-tunnel/warren/tunnel/quic"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runWith(ctx, stop, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command. ctx ends on the first signal; stop restores the default
// signal behaviour so that a second signal kills the process during the drain.
func run(ctx context.Context, stop func(), args []string, stderr io.Writer) int {
	return runWith(ctx, stop, args, os.Stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: edge [-config server.toml] [-pid-file PATH] [--log-level LEVEL] [--log-format console|json] [-v]")
	fmt.Fprintln(w, "       edge -check [-config server.toml]")
	fmt.Fprintln(w, "       edge reload -pid-file PATH [-config server.toml]")
	fmt.Fprintln(w, "       edge -version")
}

// runWith is run with stdout (where -check says "ok") given.
func runWith(ctx context.Context, stop func(), args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "reload" {
		return edgecmd.Reload(args[1:], stdout, stderr, checkFile)
	}
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "server.toml", "the edge's configuration `file`")
	verbose := fs.Bool("v", false, "human-readable debug logging: --log-level debug --log-format console")
	check := fs.Bool("check", false, "validate the configuration file, print \"ok\" or its errors, and exit (0 or 1)")
	pidPath := fs.String("pid-file", "", "write the process id to this `file` once listening (removed on exit), for \"edge reload\"")
	debugAddr := fs.String("debug-addr", "", "serve Go's runtime profiles (/debug/pprof/: goroutines, heap, ...) on this loopback `address`, e.g. 127.0.0.1:6060")
	version := cli.VersionFlag(fs)
	var lf cli.LogFlags
	lf.Register(fs)
	fs.Usage = func() { usage(stderr); fs.PrintDefaults() }
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
	switch {
	case *version:
		fmt.Fprintln(stdout, cli.Version("edge"))
		return 0
	case *check:
		return runCheck(*path, stdout, stderr)
	case *verbose:
		lf.Verbose()
	}
	log, err := lf.Logger(stderr, cli.IsTerminal(stderr))
	if err != nil {
		fmt.Fprintln(stderr, "edge:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	if *debugAddr != "" {
		stopDebug, err := serveDebug(*debugAddr, log)
		if err != nil {
			log.Error(err.Error())
			return 2
		}
		defer stopDebug()
	}
	return serve(ctx, stop, *path, *pidPath, log)
}

// serve runs the edge of the file at path until ctx ends.
func serve(ctx context.Context, stop func(), path, pidPath string, log *zap.Logger) int {
	edge, err := config.LoadEdge(path, log)
	if err != nil {
		cli.LogLines(log, err)
		return 2
	}
	// The route store is opened once, for the edge that runs: not by -check, not on SIGHUP
	// (a second Open of the directory would find it locked by the first).
	if edge.StateDir != "" {
		if edge.Config.Store, err = boltstore.Open(edge.StateDir); err != nil {
			log.Error(fmt.Sprintf("%s: %v", edge.File, err))
			return 2
		}
	}
	srv, err := tunnel.NewServer(edge.Config)
	if err != nil {
		if edge.Config.Store != nil {
			_ = edge.Config.Store.Close()
		}
		log.Error(fmt.Sprintf("%s: %v", edge.File, err))
		return 2
	}
	sc := edge.Config
	log.Info("edge starting", zap.String("version", cli.Version("edge")),
		zap.String("control", sc.ControlAddr), zap.String("http", orOff(sc.Public.HTTPAddr)),
		zap.String("https", orOff(sc.Public.HTTPSAddr)), zap.String("quic", orOff(sc.QUICAddr)), zap.String("admin", orOff(edge.AdminAddr)),
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
	ls, err := edgecmd.Listen(srv, edge, log)
	if err != nil {
		_ = srv.Close()
		log.Error("edge stopped", zap.Error(err))
		return 1
	}
	defer ls.Close()
	if pidPath != "" {
		pf, stale, err := edgecmd.CreatePIDFile(pidPath)
		if err != nil {
			ls.Close()
			_ = srv.Close()
			log.Error("edge stopped", zap.Error(err))
			return 1
		}
		if stale != "" {
			log.Warn(stale)
		}
		defer pf.Remove()
		log.Info("pid file written", zap.String("pid_file", pidPath), zap.Int("pid", os.Getpid()))
	}
	served := make(chan error, 8)
	serving := ls.Serve(served)

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
				reloads.Go(func() { defer reloading.Unlock(); edgecmd.ApplyReload(edge, srv, path, log) })
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
	if err := edgecmd.ShutdownCounting(sctx, srv, log); err != nil {
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

// checkFile loads the file at path as the edge would (the TLS key pairs and the tokens
// included) without listening, opening the state directory or connecting to NATS.
func checkFile(path string) error {
	_, err := config.LoadEdge(path, zap.NewNop())
	return err
}

// runCheck is "edge -check": checkFile, printing "ok" or the file's errors.
func runCheck(path string, stdout, stderr io.Writer) int {
	if err := checkFile(path); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	return 0
}

func orOff(addr string) string {
	if addr == "" {
		return "off"
	}
	return addr
}
