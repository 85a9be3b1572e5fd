// Command connector runs a Warren connector configured by a YAML file:
//
//	go run ./examples/connector start --config examples/connector/config.example.yml
//
// It dials the edge named by the file's server key, registers every tunnel of the file in
// order, and prints one line per tunnel to stdout:
//
//	tunnel a: http://pool.localhost:8080 -> 127.0.0.1:3000 (group web)
//	tunnel db: tcp://localhost:20000 (port 20000) -> 127.0.0.1:5432
//
// It then runs until SIGINT or SIGTERM, when it drains every tunnel (in-flight requests
// finish, bounded by drain_timeout_secs) and exits 0. A lost connection to the edge is
// retried in the background; a tunnel the edge rejects after such a reconnect is reported
// on stderr while the others keep running.
//
// Exit codes: 0 after a signal; 1 when the edge cannot be reached, refuses the token,
// rejects a tunnel at start (its message is printed verbatim on stderr), or ends the
// session for good; 2 for bad usage or a bad configuration file.
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
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warren-tunnel/warren/examples/internal/config"
	"github.com/warren-tunnel/warren/health"
	"github.com/warren-tunnel/warren/tunnel"
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
	fmt.Fprintln(w, "usage: connector start [-v] [--config FILE]")
	fmt.Fprintln(w, "")
	fmt.Fprintln(w, "  start   connect to the edge and serve the tunnels of the configuration file")
	fmt.Fprintln(w, "          (default file: ~/.warren/config.yml)")
}

// run is the whole command; ctx ends on SIGINT or SIGTERM.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	stderr = &lockedWriter{w: stderr} // the log and the tunnel watchers share it
	if len(args) == 0 || args[0] != "start" {
		usage(stderr)
		return 2
	}
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr); fs.PrintDefaults() }
	path := fs.String("config", "", "the connector's configuration `file` (default ~/.warren/config.yml)")
	verbose := fs.Bool("v", false, "human-readable debug logging instead of JSON at info level")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		usage(stderr)
		return 2
	}
	if *path == "" {
		p, err := config.DefaultClientPath()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		*path = p
	}
	cfg, err := config.LoadClient(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	opts := []tunnel.Option{tunnel.WithToken(cfg.AuthToken), tunnel.WithDrainTimeout(cfg.DrainTimeout)}
	if cfg.TLS.Enabled {
		tc, err := tlsConfig(cfg.TLS)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cfg.File, err)
			return 2
		}
		opts = append(opts, tunnel.WithTLS(tc))
	}
	log := newLogger(stderr, *verbose)
	defer func() { _ = log.Sync() }()
	opts = append(opts, tunnel.WithLogger(log))

	startCtx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	sess, err := tunnel.Dial(startCtx, cfg.Server, opts...)
	if err != nil {
		if ctx.Err() != nil {
			return 0 // interrupted while connecting
		}
		fmt.Fprintln(stderr, "connector:", err)
		return 1
	}
	defer func() { _ = sess.Close() }()

	tunnels := make([]*tunnel.Tunnel, 0, len(cfg.Tunnels))
	for _, tc := range cfg.Tunnels {
		t, err := sess.Forward(startCtx, tunnelSpec(tc), tc.LocalAddr())
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintln(stderr, tunnelError(tc.Name, err))
			return 1
		}
		tunnels = append(tunnels, t)
		fmt.Fprintln(stdout, tunnelLine(tc, t))
	}
	cancel()

	// Watch each tunnel: one rejected after a reconnect is reported, the others run on.
	ended := make(chan struct{}, len(tunnels))
	var watchers sync.WaitGroup
	defer func() {
		_ = sess.Close() // ends every tunnel, so every watcher returns
		watchers.Wait()
	}()
	for i, t := range tunnels {
		name := cfg.Tunnels[i].Name
		watchers.Go(func() {
			<-t.Done()
			// When the whole session stopped, its error is reported once, below.
			if err := t.Err(); err != nil && sess.Err() == nil {
				fmt.Fprintln(stderr, tunnelError(name, err))
				ended <- struct{}{}
			}
		})
	}

	for live := len(tunnels); ; {
		select {
		case <-ctx.Done():
			log.Info("signal received; draining tunnels", zap.Duration("drain_timeout", cfg.DrainTimeout))
			_ = sess.Close()
			return 0
		case <-sess.Done():
			fmt.Fprintln(stderr, "connector:", sess.Err())
			return 1
		case <-ended:
			if live--; live == 0 {
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
	return spec
}

// tlsConfig builds the TLS settings for the connection to the edge: the system roots or
// the ca_path bundle; verification is skipped only when the file says so.
func tlsConfig(c config.ClientTLS) (*tls.Config, error) {
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
