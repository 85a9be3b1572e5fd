package connectorcmd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"

	"go.uber.org/zap"

	"github.com/warren-tunnel/warren/tunnel"
	"github.com/warren-tunnel/warren/tunnel/config"
)

// Load reads the connector's file at path ("" for config.DefaultConnectorPath) and the
// options of its session (its TLS files loaded, as a start needs them).
func Load(path string) (*config.Connector, []tunnel.Option, error) {
	if path == "" {
		p, err := config.DefaultConnectorPath()
		if err != nil {
			return nil, nil, err
		}
		path = p
	}
	cfg, err := config.LoadConnector(path)
	if err != nil {
		return nil, nil, err
	}
	opts, err := cfg.DialOptions()
	if err != nil {
		return nil, nil, err
	}
	return cfg, opts, nil
}

// Check is `connector check ARGS`: it loads a configuration file as start would and
// returns the exit code, 1 for a bad file.
func Check(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", "connector check [--config FILE]", stderr)
	path := fs.String("config", "", "the configuration `file` to check (default ~/.warren/config.yml)")
	if code, ok := parseOrExit(fs, args, 0); !ok {
		return code
	}
	cfg, _, err := Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1 // the file is bad: check's answer, not a usage error
	}
	fmt.Fprintf(stdout, "%s: ok (%d tunnels)\n", cfg.File, len(cfg.Tunnels))
	return 0
}

// OpenControlSocket listens on the connector's control socket: path when given (--socket),
// else the file's control_socket, else the file's default one (DefaultControlSocket). It
// comes before anything is registered, so that a second connector on one socket stops
// there. The default socket is optional: where it cannot be made (no writable home, say)
// the connector runs without one (a nil listener and path "", logged), as it did before it
// had one; a socket given, or another connector on it (ErrAlreadyRunning), is an error.
func OpenControlSocket(path string, cfg *config.Connector, mode fs.FileMode, log *zap.Logger) (*net.UnixListener, string, error) {
	explicit := true
	if path == "" {
		path = cfg.ControlSocket
	}
	if path == "" {
		explicit = false
		p, err := DefaultControlSocket(cfg.File)
		if err != nil {
			log.Warn("no control socket", zap.Error(err))
			return nil, "", nil
		}
		path = p
	}
	ln, err := ListenControl(path, mode)
	switch {
	case err == nil:
		return ln, path, nil
	case explicit || errors.Is(err, ErrAlreadyRunning):
		return nil, "", err
	}
	log.Warn("no control socket; status, attach and detach are unavailable", zap.Error(err))
	return nil, "", nil
}
