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
// finish, bounded by drain_timeout_secs; the log counts the streams left) and exits 0. An
// edge that is not reachable yet when it starts (connection refused, a name that does not
// resolve, a timeout) is dialled again with the backoff of a reconnect, each failure
// logged, so that the connector may start before the edge; --fail-fast exits 1 at the
// first failed dial instead. A lost connection to the edge is retried in the background
// (with servers, starting with the next edge of the list); a tunnel the edge rejects after
// such a reconnect is logged while the others keep running.
//
// Quick tunnels need no file (the PORT is a port of 127.0.0.1, or HOST:PORT); they print
// the public URL alone on one line of stdout and run until Ctrl-C, then drain:
//
//	connector http 3000 --server edge.example.com:4040 --token-file token.txt --subdomain app
//	connector tcp 5432 --server edge.example.com:4040 --token-file token.txt
//
// A running connector listens on a control socket (a Unix socket, mode 0600: --socket,
// else the file's control_socket, else $XDG_RUNTIME_DIR/warren-connector.sock, else
// ~/.warren/connector.sock). The same binary talks to it:
//
//	connector status [--json]                       tunnels, URLs, health, streams, edge
//	connector attach --subdomain pool --group web --group-key-file key.txt 8080
//	connector detach pool-8080                      drains, counting the streams down
//	connector reload                                reloads the file, prints what applied
//
// status and reload find the socket by reading only the control_socket key of --config, so
// they work while the file has errors (status then warns that the running connector keeps
// the configuration it loaded). SIGHUP, or `connector reload`, reloads the file: tunnels
// added to it register, removed ones drain, changed ones register anew before the old
// registration drains; a file with errors changes nothing (reload prints them, exit 1).
// `connector check --config FILE` validates a file without connecting.
//
// Exit codes: 0 after a signal; 1 when the edge cannot be reached (--fail-fast), refuses
// the token,
// rejects a tunnel at start (its message is printed verbatim on stderr), ends the session
// for good, or another connector holds the control socket; 2 for bad usage or a bad
// configuration file. check exits 1 for a bad file; status, attach, detach and reload exit
// 1 when the connector is not running or refuses the request.
//
// --config defaults to ~/.warren/config.yml. Logs go to stderr through one zap logger:
// --log-level debug|info|warn|error (default info) and --log-format console|json (default
// console when stderr is a terminal, JSON otherwise); -v is --log-level debug --log-format
// console. `connector version` (also -version, --version) prints the version.
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

	"github.com/warren-tunnel/warren/examples/connector/internal/connectorcmd"
	"github.com/warren-tunnel/warren/examples/internal/cli"

	// transport: quic in the connector's file.
	_ "github.com/warren-tunnel/warren/tunnel/quic"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The first signal starts the drain; a second one ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	code := runTerm(ctx, os.Args[1:], os.Stdout, os.Stderr, cli.IsTerminal(os.Stderr))
	stop()
	os.Exit(code)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: connector start [--config FILE] [--fail-fast] [--socket PATH] [--socket-mode MODE] [--log-level L] [--log-format F] [-v]")
	fmt.Fprintln(w, connectorcmd.QuickUsage)
	fmt.Fprintln(w, "       connector status [--json] [--config FILE | --socket PATH]")
	fmt.Fprintln(w, "       connector reload [--config FILE | --socket PATH]")
	fmt.Fprintln(w, "       connector attach [--name NAME] [--proto P] [--subdomain SUB] [--group G --group-key-file FILE] [--health tcp|http] PORT")
	fmt.Fprintln(w, "       connector detach [--timeout SECS] NAME")
	fmt.Fprintln(w, "       connector check [--config FILE]")
	fmt.Fprintln(w, "       connector version")
	fmt.Fprintln(w, "")
	fmt.Fprintln(w, "  start   connect to the edge and serve the tunnels of the configuration file")
	fmt.Fprintln(w, "          (default file: ~/.warren/config.yml); SIGHUP reloads the file")
	fmt.Fprintln(w, "  http    one HTTP tunnel to a local port, no file: prints its URL, runs until Ctrl-C")
	fmt.Fprintln(w, "  tcp     one TCP tunnel to a local port, no file: prints its URL, runs until Ctrl-C")
	fmt.Fprintln(w, "  status  show the running connector's tunnels (--json for scripts)")
	fmt.Fprintln(w, "  reload  make the running connector reload its file; prints what applied")
	fmt.Fprintln(w, "  attach  add a tunnel to the running connector and print its URL")
	fmt.Fprintln(w, "  detach  drain a tunnel of the running connector, then remove it")
	fmt.Fprintln(w, "  check   validate a configuration file")
	fmt.Fprintln(w, "  version print the version")
	fmt.Fprintln(w, "")
	fmt.Fprintln(w, "Run \"connector COMMAND -h\" for a command's flags.")
}

// run is the whole command; ctx ends on SIGINT or SIGTERM. Logs are JSON unless asked.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runTerm(ctx, args, stdout, stderr, false)
}

// runTerm is run, told whether stderr is a terminal (the log format's default).
func runTerm(ctx context.Context, args []string, stdout, stderr io.Writer, terminal bool) int {
	stderr = &lockedWriter{w: stderr} // the log and the tunnel watchers share it
	stdout = &lockedWriter{w: stdout} // the tunnel lines of start, attach and reload
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "start":
		return runStart(ctx, args[1:], stdout, stderr, terminal)
	case "http", "tcp":
		return connectorcmd.Quick(ctx, args[0], args[1:], stdout, stderr, terminal)
	case "status":
		return connectorcmd.Status(args[1:], stdout, stderr)
	case "reload":
		return connectorcmd.Reload(args[1:], stdout, stderr)
	case "attach":
		return connectorcmd.Attach(args[1:], stdout, stderr)
	case "detach":
		return connectorcmd.Detach(args[1:], stdout, stderr)
	case "check":
		return connectorcmd.Check(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, cli.Version("connector"))
		return 0
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	}
	usage(stderr)
	return 2
}

// runStart is `connector start`.
func runStart(ctx context.Context, args []string, stdout, stderr io.Writer, terminal bool) int {
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr); fs.PrintDefaults() }
	path := fs.String("config", "", "the connector's configuration `file` (default ~/.warren/config.yml)")
	verbose := fs.Bool("v", false, "human-readable debug logging: --log-level debug --log-format console")
	failFast := fs.Bool("fail-fast", false, "exit 1 at the first failed dial of the edge instead of retrying until it answers")
	socketFlag := fs.String("socket", "", "control socket `path` (default: control_socket of the file, else one per file in $XDG_RUNTIME_DIR or ~/.warren)")
	modeFlag := fs.String("socket-mode", "0600", "permissions of the control socket, in `octal`")
	var lf cli.LogFlags
	lf.Register(fs)
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
	if *verbose {
		lf.Verbose()
	}
	log, err := lf.Logger(stderr, terminal)
	if err != nil {
		fmt.Fprintln(stderr, "connector:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	cfg, opts, err := connectorcmd.Load(*path)
	if err != nil {
		cli.LogLines(log, err)
		return 2
	}
	log.Info("connector starting", zap.String("version", cli.Version("connector")), zap.String("config", cfg.File))
	return connectorcmd.Run(ctx, connectorcmd.Start{Cfg: cfg, Opts: opts, Socket: *socketFlag, Mode: os.FileMode(mode),
		FailFast: *failFast, Log: log, Stdout: stdout})
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
