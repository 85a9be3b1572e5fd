// Command connector runs a Warren connector configured by a YAML file:
//
//	go run ./examples/connector start --config examples/connector/config.example.yml
//
// It dials the edge named by the file's server key (or the first that answers of the edges
// its servers key lists), registers every tunnel of the file in order, and prints one line
// per tunnel to stdout:
//
//	tunnel a: http://pool.localhost:8080 -> 127.0.0.1:3000 (group web)
//	tunnel db: tcp://localhost:20000 (port 20000) -> 127.0.0.1:5432
//
// It then runs until SIGINT or SIGTERM, when it drains every tunnel (in-flight requests
// finish, bounded by drain_timeout_secs; the log counts the streams left) and exits 0. A
// lost connection to the edge is retried in the background (with servers, starting with the
// next edge of the list); a tunnel the edge rejects after such a reconnect is reported on
// stderr while the others keep running.
//
// A running connector listens on a control socket (a Unix socket, mode 0600: --socket,
// else the file's control_socket, else $XDG_RUNTIME_DIR/warren-connector.sock, else
// ~/.warren/connector.sock). The same binary talks to it:
//
//	connector status [--json]                       tunnels, URLs, health, streams, edge
//	connector attach --subdomain pool --group web --group-key-file key.txt 8080
//	connector detach pool-8080                      drains, counting the streams down
//
// SIGHUP reloads the file: tunnels added to it register, removed ones drain, changed ones
// register anew before the old registration drains. `connector check --config FILE`
// validates a file without connecting.
//
// Exit codes: 0 after a signal; 1 when the edge cannot be reached (with servers: when none
// of them answers within 30 seconds), refuses the token,
// rejects a tunnel at start (its message is printed verbatim on stderr), ends the session
// for good, or another connector holds the control socket; 2 for bad usage or a bad
// configuration file. check exits 1 for a bad file; status, attach and detach exit 1 when
// the connector is not running or refuses the request.
//
// --config defaults to ~/.warren/config.yml. Logs go to stderr as JSON at info level; -v
// switches to a human-readable debug log.
//
// It is a thin wrapper: package tunnel/config reads the file into the session's options
// and the tunnels' registrations, and package connectorcmd (internal to this example) holds
// the running tunnels, the control socket and the commands that talk to it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warren-tunnel/warren/examples/connector/internal/connectorcmd"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: connector start [-v] [--config FILE] [--socket PATH] [--socket-mode MODE]")
	fmt.Fprintln(w, "       connector status [--json] [--socket PATH]")
	fmt.Fprintln(w, "       connector attach [--name NAME] [--proto P] [--subdomain SUB] [--group G --group-key-file FILE] [--health tcp|http] PORT")
	fmt.Fprintln(w, "       connector detach [--timeout SECS] NAME")
	fmt.Fprintln(w, "       connector check [--config FILE]")
	fmt.Fprintln(w, "")
	fmt.Fprintln(w, "  start   connect to the edge and serve the tunnels of the configuration file")
	fmt.Fprintln(w, "          (default file: ~/.warren/config.yml); SIGHUP reloads the file")
	fmt.Fprintln(w, "  status  show the running connector's tunnels (--json for scripts)")
	fmt.Fprintln(w, "  attach  add a tunnel to the running connector and print its URL")
	fmt.Fprintln(w, "  detach  drain a tunnel of the running connector, then remove it")
	fmt.Fprintln(w, "  check   validate a configuration file")
	fmt.Fprintln(w, "")
	fmt.Fprintln(w, "Run \"connector COMMAND -h\" for a command's flags.")
}

// run is the whole command; ctx ends on SIGINT or SIGTERM.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	stderr = &lockedWriter{w: stderr} // the log and the tunnel watchers share it
	stdout = &lockedWriter{w: stdout} // the tunnel lines of start, attach and reload
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "start":
		return runStart(ctx, args[1:], stdout, stderr)
	case "status":
		return connectorcmd.Status(args[1:], stdout, stderr)
	case "attach":
		return connectorcmd.Attach(args[1:], stdout, stderr)
	case "detach":
		return connectorcmd.Detach(args[1:], stdout, stderr)
	case "check":
		return connectorcmd.Check(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	}
	usage(stderr)
	return 2
}

// runStart is `connector start`.
func runStart(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr); fs.PrintDefaults() }
	path := fs.String("config", "", "the connector's configuration `file` (default ~/.warren/config.yml)")
	verbose := fs.Bool("v", false, "human-readable debug logging instead of JSON at info level")
	socketFlag := fs.String("socket", "", "control socket `path` (default: control_socket of the file, else one per file in $XDG_RUNTIME_DIR or ~/.warren)")
	modeFlag := fs.String("socket-mode", "0600", "permissions of the control socket, in `octal`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		usage(stderr)
		return 2
	}
	mode, err := strconv.ParseUint(*modeFlag, 8, 32)
	if err != nil || mode > 0o777 {
		fmt.Fprintf(stderr, "connector: --socket-mode %q is not an octal permission such as 0600\n", *modeFlag)
		return 2
	}
	cfg, opts, err := connectorcmd.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := newLogger(stderr, *verbose)
	defer func() { _ = log.Sync() }()
	opts = append(opts, tunnel.WithLogger(log))
	ln, socket, err := connectorcmd.OpenControlSocket(*socketFlag, cfg, os.FileMode(mode), log)
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return 1
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	startCtx, cancel := context.WithTimeout(ctx, connectorcmd.StartTimeout)
	defer cancel()
	var sess *tunnel.Session
	if cfg.Servers != nil {
		sess, err = tunnel.DialServers(startCtx, cfg.Servers, opts...)
	} else {
		sess, err = tunnel.Dial(startCtx, cfg.Server, opts...)
	}
	if err != nil {
		if ln != nil {
			_ = ln.Close()
			_ = os.Remove(socket)
		}
		if ctx.Err() != nil {
			return 0 // interrupted while connecting
		}
		fmt.Fprintln(stderr, "connector:", err)
		return 1
	}
	dctx, dcancel := context.WithCancel(context.Background())
	d := connectorcmd.NewDaemon(dctx, sess, cfg, socket, log, stdout, stderr)
	ctl := connectorcmd.NewControlServer(d, ln, socket)
	stopped := false
	stopAll := func(wait bool) {
		if stopped {
			return
		}
		stopped = true
		dcancel()
		ctl.Close(wait)
		d.Wait()
	}
	defer func() {
		_ = sess.Close() // ends every tunnel, so every watcher returns
		stopAll(false)
	}()

	for _, tc := range cfg.Tunnels {
		if err := d.Start(startCtx, tc); err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintln(stderr, connectorcmd.TunnelError(tc.Name, err))
			return 1
		}
	}
	cancel()
	ctl.Start()
	log.Info("control socket ready", zap.String("socket", socket))

	for {
		select {
		case <-ctx.Done():
			log.Info("signal received; draining tunnels", zap.Duration("drain_timeout", cfg.DrainTimeout))
			d.Shutdown()
			stopAll(false)
			return 0
		case <-sess.Done():
			fmt.Fprintln(stderr, "connector:", sess.Err())
			return 1
		case <-hup:
			next, err := config.LoadConnector(cfg.File)
			if err != nil {
				log.Error("reload failed; the running configuration is kept", zap.String("errors", err.Error()))
				fmt.Fprintln(stderr, err)
				continue
			}
			log.Info("SIGHUP: reloading the configuration", zap.String("file", cfg.File))
			d.Reload(next)
		case <-d.Failed():
			if d.LiveCount() == 0 {
				fmt.Fprintln(stderr, "connector: no tunnel left")
				return 1
			}
		}
	}
}

// newLogger returns a JSON logger at info level, or with verbose a human-readable one at
// debug level, writing to w, which must be safe for concurrent use.
func newLogger(w io.Writer, verbose bool) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	enc, level := zapcore.NewJSONEncoder(ec), zapcore.InfoLevel
	if verbose {
		enc, level = zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.DebugLevel
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), level))
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
