package connectorcmd

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// Start is what a running connector needs: the file (or the one-liner's configuration,
// built in memory) and how to run it.
type Start struct {
	Cfg  *config.Connector
	Opts []tunnel.Option // the session's options from the file; Run adds the logger
	// Socket is --socket and Mode its permissions; NoSocket runs without a control socket
	// (the one-liners).
	Socket   string
	Mode     fs.FileMode
	NoSocket bool
	// FailFast exits at the first failed dial of the edge instead of retrying it with the
	// reconnect backoff until it answers.
	FailFast bool
	Log      *zap.Logger
	Stdout   io.Writer // the tunnel lines
	// Line formats the line printed when a tunnel is registered (nil: "tunnel NAME: URL ->
	// LOCAL"); Verify, when set, refuses a registration that is not what was asked for (its
	// error ends the start, exit 1).
	Line   func(config.Tunnel, *tunnel.Tunnel) string
	Verify func(config.Tunnel, *tunnel.Tunnel) error
}

// Run is a running connector: it dials the edges of s.Cfg (retrying until one answers, or
// once with FailFast), registers every tunnel, serves the control socket and SIGHUP, and
// drains when ctx ends. It returns the exit code: 0 after ctx ended; 1 when the edge could
// not be reached (FailFast), refused the token or a tunnel, ended the session for good,
// or another connector holds the control socket.
func Run(ctx context.Context, s Start) int {
	cfg, log := s.Cfg, s.Log
	var ln *net.UnixListener
	socket := ""
	if !s.NoSocket {
		var err error
		if ln, socket, err = OpenControlSocket(s.Socket, cfg, s.Mode, log); err != nil {
			log.Error("connector: " + err.Error())
			return 1
		}
	}
	closeSocket := func() {
		if ln != nil {
			_ = ln.Close()
			_ = os.Remove(socket)
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	sess, err := dialEdges(ctx, cfg, s.Opts, s.FailFast, log)
	if err != nil {
		closeSocket()
		if ctx.Err() != nil {
			return 0 // interrupted while connecting
		}
		log.Error("connector: " + err.Error())
		return 1
	}
	dctx, dcancel := context.WithCancel(context.Background())
	d := NewDaemon(dctx, sess, cfg, socket, log, s.Stdout)
	d.line, d.verify = s.Line, s.Verify
	ctl := NewControlServer(d, ln, socket)
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			dcancel()
			ctl.Close(false)
			d.Wait()
		}
	}
	defer func() {
		_ = sess.Close() // ends every tunnel, so every watcher returns
		stopAll()
		closeSocket()
	}()

	startCtx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	for _, tc := range cfg.Tunnels {
		if err := d.Start(startCtx, tc); err != nil {
			if ctx.Err() != nil {
				return 0
			}
			log.Error(TunnelError(tc.Name, err))
			return 1
		}
	}
	cancel()
	ctl.Start()
	if ln != nil {
		log.Info("control socket ready", zap.String("socket", socket))
	}

	for {
		select {
		case <-ctx.Done():
			log.Info("signal received; draining tunnels", zap.Duration("drain_timeout", cfg.DrainTimeout))
			d.Shutdown()
			stopAll()
			return 0
		case <-sess.Done():
			log.Error("connector: " + sess.Err().Error())
			return 1
		case <-hup:
			if cfg.File == "" {
				log.Warn("SIGHUP: this connector has no configuration file to reload")
				continue
			}
			log.Info("SIGHUP: reloading the configuration", zap.String("file", cfg.File))
			d.ReloadInBackground()
		case <-d.Failed():
			if d.LiveCount() == 0 {
				log.Error("connector: no tunnel left")
				return 1
			}
		}
	}
}

// dialEdges connects to the edges of cfg. Unless failFast, an edge that does not answer
// (connection refused, a name that does not resolve, a timeout) is dialled again with the
// session's reconnect backoff until one answers or ctx ends, each failure logged; with
// failFast the first failed dial is the error. A refused token ends it at once either way.
func dialEdges(ctx context.Context, cfg *config.Connector, opts []tunnel.Option, failFast bool, log *zap.Logger) (*tunnel.Session, error) {
	edges := cfg.DialAddrs() // host:port each, also for websocket URLs
	if !failFast {
		log.Info("connecting to the edge; retrying until it answers (--fail-fast exits instead)", zap.Strings("edges", edges))
		return tunnel.DialServers(ctx, edges, append(opts, tunnel.WithLogger(log))...)
	}
	if len(edges) == 1 {
		return tunnel.Dial(ctx, edges[0], append(opts, tunnel.WithLogger(log))...)
	}
	// Several edges: each is tried once, in order; the first that answers is the session's.
	// The session's first attempt logs each failure: the one of the last edge ends the dial.
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	last := edges[len(edges)-1]
	watch := zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return &failWatch{Core: c, onFail: func(server string, err error) {
			if server == last || strings.HasPrefix(server, last+" (") {
				cancel(err)
			}
		}}
	})
	sess, err := tunnel.DialServers(fctx, edges, append(opts, tunnel.WithLogger(log.WithOptions(watch)))...)
	if err != nil && ctx.Err() == nil {
		if cause := context.Cause(fctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return nil, cause
		}
	}
	return sess, err
}

// failWatch is a zap core that tells onFail of each "connect failed" entry of a session's
// first connection (its server and error) before writing it.
type failWatch struct {
	zapcore.Core
	onFail func(server string, err error)
}

func (w *failWatch) With(fields []zapcore.Field) zapcore.Core {
	return &failWatch{Core: w.Core.With(fields), onFail: w.onFail}
}

func (w *failWatch) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "connect failed" {
		return ce.AddCore(e, w)
	}
	return w.Core.Check(e, ce)
}

func (w *failWatch) Write(e zapcore.Entry, fields []zapcore.Field) error {
	var server string
	var err error
	for _, f := range fields {
		switch {
		case f.Key == "server":
			server = f.String
		case f.Type == zapcore.ErrorType:
			err, _ = f.Interface.(error)
		}
	}
	var werr error
	if w.Core.Enabled(e.Level) {
		werr = w.Core.Write(e, fields)
	}
	if err != nil {
		w.onFail(server, err)
	}
	return werr
}
