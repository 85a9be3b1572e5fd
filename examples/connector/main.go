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
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// startTimeout bounds connecting to the edge and registering the tunnels.
const startTimeout = 30 * time.Second

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
		return runStatus(args[1:], stdout, stderr)
	case "attach":
		return runAttach(args[1:], stdout, stderr)
	case "detach":
		return runDetach(args[1:], stdout, stderr)
	case "check":
		return runCheck(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	}
	usage(stderr)
	return 2
}

// loadConfig reads the configuration file (path "" is the default) and checks its TLS
// settings load; errors are printed.
func loadConfig(path string, stderr io.Writer) (*config.Connector, int) {
	if path == "" {
		p, err := config.DefaultConnectorPath()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, 2
		}
		path = p
	}
	cfg, err := config.LoadConnector(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, 2
	}
	if cfg.TLS.Enabled {
		if _, err := tlsConfig(cfg.TLS); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cfg.File, err)
			return nil, 2
		}
	}
	return cfg, 0
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
	cfg, code := loadConfig(*path, stderr)
	if cfg == nil {
		return code
	}
	opts := []tunnel.Option{tunnel.WithToken(cfg.AuthToken), tunnel.WithDrainTimeout(cfg.DrainTimeout), tunnel.WithDataReadBuffer(cfg.DataReadBuffer)}
	if cfg.TLS.Enabled {
		tc, _ := tlsConfig(cfg.TLS) // loadConfig checked it
		opts = append(opts, tunnel.WithTLS(tc))
	}
	log := newLogger(stderr, *verbose)
	defer func() { _ = log.Sync() }()
	opts = append(opts, tunnel.WithLogger(log))

	// The control socket comes first: a second connector on the same socket stops here,
	// before it registers anything.
	// The default one is optional: where it cannot be made (no writable home, say) the
	// connector runs without it, as it did before it had one.
	socket, explicit := *socketFlag, true
	if socket == "" {
		socket = cfg.ControlSocket
	}
	if socket == "" {
		explicit = false
		if socket, err = config.DefaultControlSocket(cfg.File); err != nil {
			log.Warn("no control socket", zap.Error(err))
		}
	}
	var ln *net.UnixListener
	if socket != "" {
		ln, err = listenControl(socket, os.FileMode(mode))
		switch {
		case err == nil:
		case explicit || errors.Is(err, errAlreadyRunning):
			fmt.Fprintln(stderr, "connector:", err)
			return 1
		default:
			log.Warn("no control socket; status, attach and detach are unavailable", zap.Error(err))
			socket = ""
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
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
	d := newDaemon(dctx, sess, cfg, log, stdout, stderr)
	d.socket = socket
	ctl := newControlServer(d, ln, socket)
	stopped := false
	stopAll := func(wait bool) {
		if stopped {
			return
		}
		stopped = true
		dcancel()
		ctl.close(wait)
		d.wg.Wait()
	}
	defer func() {
		_ = sess.Close() // ends every tunnel, so every watcher returns
		stopAll(false)
	}()

	for _, tc := range cfg.Tunnels {
		e, err := d.register(startCtx, tc, false)
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintln(stderr, tunnelError(tc.Name, err))
			return 1
		}
		d.insert(e)
	}
	cancel()
	ctl.start()
	log.Info("control socket ready", zap.String("socket", socket))

	for {
		select {
		case <-ctx.Done():
			log.Info("signal received; draining tunnels", zap.Duration("drain_timeout", cfg.DrainTimeout))
			d.shutdown()
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
			d.wg.Go(func() { d.reload(next) })
		case <-d.failed:
			if d.liveCount() == 0 {
				fmt.Fprintln(stderr, "connector: no tunnel left")
				return 1
			}
		}
	}
}

// tunnelSpec turns one tunnel of the file into its registration.
func tunnelSpec(t config.Tunnel) tunnel.TunnelSpec {
	spec := tunnel.TunnelSpec{
		Proto:     t.Proto,
		Subdomain: t.Subdomain,
		Group:     t.Group,
		GroupKey:  t.GroupKey,
	}
	if t.Proto == tunnel.ProtoTCP {
		spec.Name = t.Name
	}
	if h := t.HealthCheck; h != nil {
		spec.Health = &health.Spec{
			Type:      health.Type(h.Type),
			Path:      h.Path,
			Interval:  h.Interval,
			Timeout:   h.Timeout,
			MaxFailed: h.MaxFailed,
			AnyStatus: !h.Expect2xx,
		}
		spec.AlertWebhook = h.AlertWebhook
	}
	spec.Weight, spec.Priority, spec.SlowStart = t.Weight, t.Priority, t.SlowStart
	spec.Affinity, spec.RetryIdempotent = t.Affinity, t.RetryIdempotent
	spec.PreviousGroupKeys = t.PreviousGroupKeys
	spec.BackendProtocol = t.BackendProtocol
	return spec
}

// tlsConfig builds the TLS settings for the connection to the edge: the system roots or
// the ca_path bundle; verification is skipped only when the file says so.
func tlsConfig(c config.ConnectorTLS) (*tls.Config, error) {
	tc := &tls.Config{
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.InsecureSkipVerify, // only an explicit "true" in the file
		MinVersion:         tls.VersionTLS12,
	}
	if c.CAPath != "" {
		pem, err := os.ReadFile(c.CAPath)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_path: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_path: %s holds no PEM certificate", c.CAPath)
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// tunnelLine is the line printed once a tunnel is registered.
func tunnelLine(c config.Tunnel, t *tunnel.Tunnel) string {
	line := fmt.Sprintf("tunnel %s: %s", c.Name, t.URL())
	if t.Port() != 0 {
		line += fmt.Sprintf(" (port %d)", t.Port())
	}
	line += " -> " + c.LocalAddr()
	if g := t.Group(); g != "" {
		line += fmt.Sprintf(" (group %s)", g)
	}
	return line
}

// tunnelError says why a tunnel failed; a rejection carries the edge's message verbatim.
func tunnelError(name string, err error) string {
	if rej, ok := errors.AsType[*tunnel.RejectedError](err); ok {
		return fmt.Sprintf("tunnel %s rejected: %s", name, rej.Message)
	}
	return fmt.Sprintf("tunnel %s: %v", name, err)
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
